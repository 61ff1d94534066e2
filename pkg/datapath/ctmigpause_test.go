package datapath

import (
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/model"
)

// TestResizeNewFlowAnsweredByOldEgress: while a start resizes
// sluice_conntrack (and not sluice_ct_new), the links switch ingress
// first (migrating), so a flow a new ingress program starts may have its
// first reply met by the previous agent's egress program, which looks in
// the old sluice_conntrack only. This load's new flows go to
// sluice_ct_new, which both share, until every hook runs the new programs
// (ct_admit_paused): the old egress translates the reply. Before, the new
// flow went half-open into the new sluice_conntrack and the reply left
// with the backend's address (a UDP exchange lost in
// TestFailedResizeStartUnderLoad). Once AttachDevices has switched the
// hooks, new flows go half-open into sluice_conntrack again, and a start
// that fails after that pauses them again before it puts the previous
// programs back. With sluice_ct_new resized instead, sluice_conntrack is
// the shared map: no pause, and the old egress finds the flow half-open
// there (paused, it would be in the new LRU, which the old programs do not
// see); with both resized nothing is shared, and nothing is paused.
func TestResizeNewFlowAnsweredByOldEgress(t *testing.T) {
	testutil.Privileged(t)
	for _, tc := range []struct {
		name          string
		resize        func(*Config)
		paused, lru   bool // the pause, and so the new flow in sluice_ct_new
		oldEgressOK   bool // the old egress finds the flow (else not checked)
		wantEgress1st bool
	}{
		{"conntrack", func(c *Config) { c.MaxConntrack = 8192 }, true, true, true, false},
		{"conntrack-new", func(c *Config) { c.MaxConntrackNew = 8192 }, false, false, true, true},
		{"both", func(c *Config) { c.MaxConntrack, c.MaxConntrackNew = 8192, 8192 }, false, false, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			forFamilies(t, func(t *testing.T, v6 bool) {
				bpffs := testPinDir(t)
				ns := topology.NewNS(t, "migpause")
				ns.Enter(t)
				addVeths(t, [2]string{"sl-r", "sl-s"})
				d1 := openTest(t, smallConfig(bpffs))
				if err := d1.AttachDevices([]string{"sl-r"}); err != nil {
					t.Fatal(err)
				}
				a, vip := twinOf(v6), twinL4(v6, vipUDP)
				be := testBackend{46, l4(a("10.1.4.6"), 5353, model.UDP)}
				addService(t, d1.Maps(), 1, vip, be)

				cfg := smallConfig(bpffs)
				tc.resize(&cfg)
				d2 := openTest(t, cfg)
				if shim, egressFirst := d2.migrating(); !shim || egressFirst != tc.wantEgress1st {
					t.Fatalf("migrating() = %v, %v: want the shims, egress first %v", shim, egressFirst, tc.wantEgress1st)
				}
				paused := func(d *Datapath) uint8 {
					t.Helper()
					var v uint8
					if err := d.tc.CtAdmitPaused.Get(&v); err != nil {
						t.Fatalf("read ct_admit_paused: %v", err)
					}
					return v
				}
				if p1, p2 := paused(d1), paused(d2); p1 != 0 || p2 != boolU8(tc.paused) {
					t.Errorf("ct_admit_paused: previous agent's %d, new agent's %d; want 0, %d", p1, p2, boolU8(tc.paused))
				}
				// The family's programs (IPv6's are tail-called; run
				// directly).
				progs := func(d *Datapath) (ingress, egress *ebpf.Program) {
					if v6 {
						return d.tc.Sluice6Ingress, d.tc.Sluice6Egress
					}
					return d.TCIngress(), d.TCEgress()
				}
				newIngress, _ := progs(d2)
				_, oldEgress := progs(d1)
				m := d2.Maps()

				f := flow{a("10.0.70.1"), 22000, vip}
				if _, dst := sendOK(t, func() (uint32, []byte, error) { return runProgErr(newIngress, f.pkt(0).Bytes()) },
					"datagram at the new ingress"); dst != be.addr.Addr.String() {
					t.Fatalf("datagram to %s, want %s", dst, be.addr.Addr)
				}
				for _, k := range []ctK{f.fwdKey(), f.revKey(be.addr)} {
					if _, ok := ctInTable(t, m, k, tc.lru); !ok {
						t.Errorf("%s: not in the new agent's %s", k, map[bool]string{false: "sluice_conntrack", true: "sluice_ct_new"}[tc.lru])
					}
					if e, ok := ctInTable(t, m, k, !tc.lru); ok {
						t.Errorf("%s: also in the new agent's %s: %+v", k, map[bool]string{true: "sluice_conntrack", false: "sluice_ct_new"}[tc.lru], e)
					}
				}
				if tc.oldEgressOK {
					if src, _ := sendOK(t, func() (uint32, []byte, error) { return runProgErr(oldEgress, f.from(be.addr, 0).Bytes()) },
						"answer at the previous agent's egress"); src != f.fe.Addr.String() {
						t.Errorf("answer at the previous agent's egress leaves from %s, want the VIP %s", src, f.fe.Addr)
					}
				}

				if err := d2.AttachDevices([]string{"sl-r"}); err != nil {
					t.Fatal(err)
				}
				if p := paused(d2); p != 0 {
					t.Fatalf("after the switch, ct_admit_paused %d, want 0", p)
				}
				g := flow{a("10.0.70.1"), 22001, vip}
				sendOK(t, func() (uint32, []byte, error) { return runProgErr(newIngress, g.pkt(0).Bytes()) }, "datagram after the switch")
				if e, ok := ctInTable(t, m, g.fwdKey(), false); !ok || e.flags&ctFlagReplied != 0 {
					t.Errorf("after the switch, a new flow's forward entry in sluice_conntrack %+v (found %v), want it half-open there", e, ok)
				}
				// The start fails after the switch (as Abort undoes it):
				// paused again, before the links get the old programs.
				j := d2.pins
				d2.pins = nil
				if err := j.undo(); err != nil {
					t.Fatal(err)
				}
				if p := paused(d2); p != boolU8(tc.paused) {
					t.Errorf("after the failed start's undo, ct_admit_paused %d, want %d", p, boolU8(tc.paused))
				}
			})
		})
	}
}
