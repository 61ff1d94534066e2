package datapath

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/model"
)

// The tests of this file follow a source-NATed flow that a new program
// starts while a start migrates sluice_conntrack (ctmigpause_test.go's
// setting): its port reservation goes into the new sluice_conntrack (a
// port's uniqueness needs the one map), which the previous agent's
// programs, still on the hooks not switched yet, do not see. Its first
// reply met by one of them is run as the hook runs it: the migration shim
// first (it is in front of every program during the switch), then the
// previous agent's program.

// migSNATCase is a resize of ctmigpause_test.go's table: the three kinds
// of conntrack migration.
type migSNATCase struct {
	name   string
	resize func(*Config)
	est    bool // sluice_conntrack migrated (else both agents use it)
}

var migSNATCases = []migSNATCase{
	{"conntrack", func(c *Config) { c.MaxConntrack = 8192 }, true},
	{"conntrack-new", func(c *Config) { c.MaxConntrackNew = 8192 }, false},
	{"both", func(c *Config) { c.MaxConntrack, c.MaxConntrackNew = 8192, 8192 }, true},
}

// runShim runs d's migration shim on in, as the hook runs it in front of
// the program that follows, and fails unless it lets the packet go on.
func runShim(t *testing.T, d *Datapath, ifindex int, in []byte) {
	t.Helper()
	if v, _ := runOn(t, d.shim.SluiceMigTc, ifindex, in); v != uint32(0xffffffff) {
		t.Fatalf("migration shim verdict %d, want TC_ACT_UNSPEC", int32(v))
	}
}

// tcProgs returns d's tc programs of the family (IPv6's are tail-called
// from the entry programs, through the pinned array, which holds the
// previous agent's until the switch: run directly).
func tcProgs(d *Datapath, v6 bool) (ingress, egress *ebpf.Program) {
	if v6 {
		return d.tc.Sluice6Ingress, d.tc.Sluice6Egress
	}
	return d.TCIngress(), d.TCEgress()
}

// snatResizeNode is snatNode's node (the SNAT range one port wide) with
// the previous agent d1 on it, and d2, opened with resize's sizes: the
// start migrating conntrack, its links not switched yet.
func snatResizeNode(t *testing.T, v6 bool, resize func(*Config)) (d1, d2 *Datapath, ifindex int, np model.L4Addr, be testBackend) {
	t.Helper()
	var bpffs string
	base := func(dir string) Config {
		bpffs = dir
		return configWith(smallConfig, oneSNATPort)(dir)
	}
	d1, ifindex, np, be = snatNode(t, v6, base)
	cfg := configWith(smallConfig, oneSNATPort)(bpffs)
	resize(&cfg)
	d2 = openTest(t, cfg)
	if shim, _ := d2.migrating(); !shim {
		t.Fatal("migrating() = false: want the shims")
	}
	return d1, d2, ifindex, np, be
}

// TestResizeMasqueradedFlowAnsweredByOldProgram: during a resize, a
// NodePort flow to a remote endpoint, source-NATed to the node with the
// only SNAT port (oneSNATPort) by the new ingress program, has its
// SYN-ACK met by the previous agent's ingress program (another device's,
// not switched yet; here the same program run on eth0). The reply is
// translated back to the client, from the NodePort: the shim in front
// copies the reservation the old map lacks back into it (mig_copy_back).
// Before, the old program found nothing under <backend -> node:port> and
// let the SYN-ACK through untranslated, to the node. The flow goes on
// with its port through the new programs, during and after the switch;
// and while it holds the port, no other flow gets it, from the new
// programs or (the reservation now in its map) from the old ones.
func TestResizeMasqueradedFlowAnsweredByOldProgram(t *testing.T) {
	testutil.Privileged(t)
	for _, tc := range migSNATCases {
		t.Run(tc.name, func(t *testing.T) {
			forFamilies(t, func(t *testing.T, v6 bool) {
				d1, d2, ifindex, np, be := snatResizeNode(t, v6, tc.resize)
				newIngress, _ := tcProgs(d2, v6)
				oldIngress, _ := tcProgs(d1, v6)
				const cport, port = 43000, 62000
				node := ofFamily(np.Addr, nsNodeIP, nsNodeIP6).String()
				client := nsClient(cport, np)

				syn := client
				syn.TCPFlags = tcpSYN_
				runShim(t, d2, ifindex, syn.Bytes())
				if v, out := runOn(t, newIngress, ifindex, syn.Bytes()); v != tcActRedirect || outSrc(out) != node || outSport(out) != port {
					t.Fatalf("SYN at the new ingress: verdict %d from %s:%d, want %d from %s:%d", v, outSrc(out), outSport(out), tcActRedirect, node, port)
				}
				sa := replyFrom(be, port, tcpSA)
				runShim(t, d2, ifindex, sa.Bytes())
				if v, out := runOn(t, oldIngress, ifindex, sa.Bytes()); v != tcActRedirect || outSrc(out) != np.Addr.String() ||
					outSport(out) != np.Port || outDst(out) != client.Src.String() || outDport(out) != cport {
					t.Fatalf("SYN-ACK at the previous agent's ingress: verdict %d, %s:%d -> %s:%d; want %d, %s -> %s:%d",
						v, outSrc(out), outSport(out), outDst(out), outDport(out), tcActRedirect, np, client.Src, cport)
				}

				// Another client's flow to the same endpoint: no port
				// left, at the new ingress or at the old one.
				other := nsClient(cport, np)
				other.Src, other.TCPFlags = addr(twinAddr(v6, "172.16.0.30")), tcpSYN_
				for _, p := range []struct {
					who  string
					prog *ebpf.Program
				}{{"new", newIngress}, {"previous agent's", oldIngress}} {
					runShim(t, d2, ifindex, other.Bytes())
					if v, out := runOn(t, p.prog, ifindex, other.Bytes()); v == tcActRedirect && outSport(out) == port {
						t.Errorf("another flow's SYN at the %s ingress took port %d, which the first flow holds", p.who, port)
					}
				}

				ack := client
				ack.TCPFlags = tcpACK
				for _, when := range []string{"during the switch", "after it"} {
					if when == "after it" {
						if err := d2.AttachDevices([]string{"eth0"}); err != nil {
							t.Fatal(err)
						}
						newIngress, _ = tcProgs(d2, v6)
					} else {
						runShim(t, d2, ifindex, ack.Bytes())
					}
					if v, out := runOn(t, newIngress, ifindex, ack.Bytes()); v != tcActRedirect || outSrc(out) != node || outSport(out) != port {
						t.Errorf("%s: the client's ACK at the new ingress: verdict %d from %s:%d, want %d from %s:%d", when, v, outSrc(out), outSport(out), tcActRedirect, node, port)
					}
					r := replyFrom(be, port, tcpACK)
					if when != "after it" {
						runShim(t, d2, ifindex, r.Bytes())
					}
					if v, out := runOn(t, newIngress, ifindex, r.Bytes()); v != tcActRedirect || outSrc(out) != np.Addr.String() ||
						outDst(out) != client.Src.String() || outDport(out) != cport {
						t.Errorf("%s: a reply at the new ingress: verdict %d, %s -> %s:%d; want %d, %s -> %s:%d",
							when, v, outSrc(out), outDst(out), outDport(out), tcActRedirect, np.Addr, client.Src, cport)
					}
				}
				rev := ctKeyOf(be.addr.Addr.String(), be.addr.Port, node, port, model.TCP, ctReverse)
				if e, ok := ctLookup(t, d2.Maps(), rev); !ok || e.flags&ctFlagReplied == 0 || e.flags&ctFlagSNAT == 0 {
					t.Errorf("after the switch, the port reservation %+v (found %v), want it answered", e, ok)
				}
			})
		})
	}
}

// TestResizeRemappedFlowAnsweredByOldEgress: during a resize, a flow
// that the new ingress program remaps to another client port (its reply
// tuple is an established flow's of another Service sharing the
// endpoint: lb4_remap) has its first reply met by the previous agent's
// egress program (links switch ingress first while sluice_conntrack is
// migrated). The reply is translated: from the second Service, to the
// client's own port. Before, the old egress found no entry under
// <backend -> client:62000>, and the reply went out untranslated. Then
// the flow goes on from its port, during and after the switch, and the
// first flow keeps its own. The same with a lapsed entry of a finished
// flow under that tuple in the previous agent's map: the shim reaps it
// first (left there, it kept the reservation out and the reply went out
// untranslated).
func TestResizeRemappedFlowAnsweredByOldEgress(t *testing.T) {
	testutil.Privileged(t)
	for _, tc := range migSNATCases {
		t.Run(tc.name, func(t *testing.T) {
			forFamilies(t, func(t *testing.T, v6 bool) {
				for _, proto := range []model.Protocol{model.TCP, model.UDP} {
					t.Run(proto.String(), func(t *testing.T) {
						testRemapDuringResize(t, tc, v6, proto, false)
					})
				}
				if tc.est {
					t.Run("UDP, a lapsed entry in the old map", func(t *testing.T) {
						testRemapDuringResize(t, tc, v6, model.UDP, true)
					})
				}
			})
		})
	}
}

// plantLapsed puts an entry under k into the established table est that
// lapsed a second ago (dead, not claimed): another flow's, finished.
func plantLapsed(t *testing.T, est *ebpf.Map, k ctK) {
	t.Helper()
	now, err := monotonicNow()
	if err != nil {
		t.Fatal(err)
	}
	exp := now - uint64(time.Second)
	if k.v6() {
		key := k.k6()
		err = est.Update(&key, &tcCt6Entry{Expires: exp, Flags: ctFlagReplied}, ebpf.UpdateNoExist)
	} else {
		key := k.k4()
		err = est.Update(&key, &sockCt4Entry{Expires: exp, Flags: ctFlagReplied}, ebpf.UpdateNoExist)
	}
	if err != nil {
		t.Fatalf("plant a lapsed entry under %s: %v", k, err)
	}
}

// remapNode is the remap tests' setting, in a namespace of its own: the
// previous agent (d1, the SNAT range one port wide) on a device, two
// Services (vip1, vip2) sharing one endpoint (be), and one client port's
// flows to each (f1, f2), the first established by d1's programs.
type remapNode struct {
	d1           *Datapath
	bpffs        string
	be           testBackend
	vip1, vip2   model.L4Addr
	f1, f2       flow
	syn, ack, sa uint8 // TCP's flags; 0 for UDP
}

// The remap tests' client port, and the one port of the SNAT range (the
// second flow's, remapped).
const remapCport, remapPort = 47300, 62000

func newRemapNode(t *testing.T, v6 bool, proto model.Protocol, name, dev string, veths ...[2]string) *remapNode {
	t.Helper()
	r := &remapNode{bpffs: testPinDir(t), syn: tcpSYN_, ack: tcpACK, sa: tcpSA}
	ns := topology.NewNS(t, name)
	ns.Enter(t)
	addVeths(t, veths...)
	r.d1 = openTest(t, configWith(smallConfig, oneSNATPort)(r.bpffs))
	must(t, r.d1.AttachDevices([]string{dev}))
	a := twinOf(v6)
	r.be = testBackend{71, l4(a("10.1.7.1"), 8080, proto)}
	r.vip1, r.vip2 = l4(a("10.96.0.70"), 80, proto), l4(a("10.96.0.71"), 80, proto)
	addService(t, r.d1.Maps(), 1, r.vip1, r.be)
	addService(t, r.d1.Maps(), 2, r.vip2, r.be)
	r.f1 = flow{a("10.0.7.1"), remapCport, r.vip1}
	r.f2 = r.f1
	r.f2.fe = r.vip2
	if proto == model.UDP {
		r.syn, r.ack, r.sa = 0, 0, 0
	}
	oldIngress, oldEgress := tcProgs(r.d1, v6)
	passes(t, nil, oldIngress, r.f1.pkt(r.syn).Bytes(), "first flow")
	passes(t, nil, oldEgress, r.reply(r.f1, remapCport, r.sa), "first flow's reply")
	return r
}

// reply is f's endpoint's answer, to port dport.
func (r *remapNode) reply(f flow, dport uint16, flags uint8) []byte {
	p := f.from(r.be.addr, flags)
	p.DstPort = dport
	return p.Bytes()
}

// passes runs in through shim's migration shim (if shim is not nil),
// then prog, which must let it go on (TC_ACT_OK); it returns the packet's
// source address and ports as sent.
func passes(t *testing.T, shim *Datapath, prog *ebpf.Program, in []byte, what string) (src string, sport, dport uint16) {
	t.Helper()
	if shim != nil {
		runShim(t, shim, 0, in)
	}
	v, out, err := runProgErr(prog, in)
	if err != nil || v != tcActOK {
		t.Fatalf("%s: verdict %d (%v), want %d", what, v, err, tcActOK)
	}
	return outSrc(out), outSport(out), outDport(out)
}

// testRemapDuringResize is TestResizeRemappedFlowAnsweredByOldEgress's
// case; lapsed: the previous agent's sluice_conntrack holds a lapsed
// entry under the remapped flow's reply tuple (a finished flow's, which
// no agent's GC has deleted yet), which the shim reaps to put the
// reservation there.
func testRemapDuringResize(t *testing.T, tc migSNATCase, v6 bool, proto model.Protocol, lapsed bool) {
	r := newRemapNode(t, v6, proto, "migsnat", "sl-r", [2]string{"sl-r", "sl-s"})
	d1, f1, f2, vip1, vip2, be := r.d1, r.f1, r.f2, r.vip1, r.vip2, r.be
	syn, ack, sa, reply := r.syn, r.ack, r.sa, r.reply
	const cport, remapped = remapCport, remapPort
	_, oldEgress := tcProgs(d1, v6)

	cfg := configWith(smallConfig, oneSNATPort)(r.bpffs)
	tc.resize(&cfg)
	d2 := openTest(t, cfg)
	if shim, _ := d2.migrating(); !shim {
		t.Fatal("migrating() = false: want the shims")
	}
	newIngress, newEgress := tcProgs(d2, v6)
	// through runs in through d2's shim (if shim), then prog.
	through := func(prog *ebpf.Program, shim bool, in []byte, what string) (src string, sport, dport uint16) {
		t.Helper()
		if shim {
			return passes(t, d2, prog, in, what)
		}
		return passes(t, nil, prog, in, what)
	}
	if _, sp, _ := through(newIngress, true, f2.pkt(syn).Bytes(), "second flow at the new ingress"); sp != remapped {
		t.Fatalf("second flow at the new ingress leaves from port %d, want %d (remapped)", sp, remapped)
	}
	if lapsed {
		// The previous agent's table (the pin names the new one now).
		est := d1.tc.SluiceConntrackV2
		if v6 {
			est = d1.tc.Sluice6ConntrackV1
		}
		plantLapsed(t, est, ctKeyOf(be.addr.Addr.String(), be.addr.Port, f2.client, remapped, proto, ctReverse))
	}
	if src, sp, dp := through(oldEgress, true, reply(f2, remapped, sa), "second flow's reply at the previous agent's egress"); src != vip2.Addr.String() || sp != vip2.Port || dp != cport {
		t.Fatalf("second flow's reply at the previous agent's egress: from %s:%d to port %d, want from %s to port %d", src, sp, dp, vip2, cport)
	}
	for _, switched := range []bool{false, true} {
		when := map[bool]string{false: "during the switch", true: "after it"}[switched]
		if switched {
			if err := d2.AttachDevices([]string{"sl-r"}); err != nil {
				t.Fatal(err)
			}
		}
		if _, sp, _ := through(newIngress, !switched, f2.pkt(ack).Bytes(), when+": second flow's next packet"); sp != remapped {
			t.Errorf("%s: second flow's next packet leaves from port %d, want %d", when, sp, remapped)
		}
		if src, _, dp := through(newEgress, !switched, reply(f2, remapped, ack), when+": second flow's next reply"); src != vip2.Addr.String() || dp != cport {
			t.Errorf("%s: second flow's next reply from %s to port %d, want from %s to port %d", when, src, dp, vip2.Addr, cport)
		}
		if _, sp, _ := through(newIngress, !switched, f1.pkt(ack).Bytes(), when+": first flow's next packet"); sp != cport {
			t.Errorf("%s: first flow's next packet leaves from port %d, want its own %d", when, sp, cport)
		}
		if src, _, _ := through(newEgress, !switched, reply(f1, cport, ack), when+": first flow's next reply"); src != vip1.Addr.String() {
			t.Errorf("%s: first flow's next reply from %s, want %s", when, src, vip1.Addr)
		}
	}
}

// TestFailedResizeStartKeepsRemappedFlow: the undo of a start that fails
// after it updated a link (sl-c's link pin is a directory: AttachDevices
// fails there, sl-a's ingress runs the new program; the shims stay in
// front until the undo is done) with the remapped flow of
// TestResizeRemappedFlowAnsweredByOldEgress made meanwhile: its first
// reply, at the previous agent's egress, is translated (the shim copies
// the reservation back), and once the previous programs run everywhere
// again (Abort: the new maps' flows carried back, carryBack) the flow
// goes on through them from its port, its replies translated, the other
// flow on its own port. Before, the first reply went out untranslated.
func TestFailedResizeStartKeepsRemappedFlow(t *testing.T) {
	testutil.Privileged(t)
	forFamilies(t, func(t *testing.T, v6 bool) {
		for _, proto := range []model.Protocol{model.TCP, model.UDP} {
			t.Run(proto.String(), func(t *testing.T) {
				testRemapFailedStart(t, v6, proto)
			})
		}
	})
}

func testRemapFailedStart(t *testing.T, v6 bool, proto model.Protocol) {
	r := newRemapNode(t, v6, proto, "migsnatfail", "sl-a", [2]string{"sl-a", "sl-a1"}, [2]string{"sl-c", "sl-c1"})
	bpffs, f1, f2, vip2 := r.bpffs, r.f1, r.f2, r.vip2
	ack, sa, reply := r.ack, r.sa, r.reply
	const cport, remapped = remapCport, remapPort
	oldIngress, oldEgress := tcProgs(r.d1, v6)

	must(t, os.Mkdir(filepath.Join(bpffs, "sluice", "links", "tcx_ingress_sl-c"), 0o700))
	cfg := configWith(smallConfig, oneSNATPort)(bpffs)
	cfg.MaxConntrack = 8192
	d2, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	aborted := false
	t.Cleanup(func() {
		if !aborted {
			_ = d2.Abort()
		}
	})
	if err := d2.AttachDevices([]string{"sl-a", "sl-c"}); err == nil {
		t.Fatal("AttachDevices with sl-c's link pin a directory succeeded")
	}
	newIngress, _ := tcProgs(d2, v6)
	if _, sp, _ := passes(t, d2, newIngress, f2.pkt(r.syn).Bytes(), "second flow at the new ingress"); sp != remapped {
		t.Fatalf("second flow at the new ingress leaves from port %d, want %d (remapped)", sp, remapped)
	}
	if src, sp, dp := passes(t, d2, oldEgress, reply(f2, remapped, sa), "second flow's reply at the previous agent's egress"); src != vip2.Addr.String() || sp != vip2.Port || dp != cport {
		t.Fatalf("second flow's reply at the previous agent's egress: from %s:%d to port %d, want from %s to port %d", src, sp, dp, vip2, cport)
	}
	aborted = true
	must(t, d2.Abort())
	must(t, os.Remove(filepath.Join(bpffs, "sluice", "links", "tcx_ingress_sl-c")))

	for i := range 2 {
		if _, sp, _ := passes(t, nil, oldIngress, f2.pkt(ack).Bytes(), "after the failed start: second flow's next packet"); sp != remapped {
			t.Errorf("after the failed start (%d): second flow's next packet leaves from port %d, want %d", i, sp, remapped)
		}
		if src, _, dp := passes(t, nil, oldEgress, reply(f2, remapped, ack), "after the failed start: second flow's next reply"); src != vip2.Addr.String() || dp != cport {
			t.Errorf("after the failed start (%d): second flow's next reply from %s to port %d, want from %s to port %d", i, src, dp, vip2.Addr, cport)
		}
		if _, sp, _ := passes(t, nil, oldIngress, f1.pkt(ack).Bytes(), "after the failed start: first flow's next packet"); sp != cport {
			t.Errorf("after the failed start (%d): first flow's next packet leaves from port %d, want its own %d", i, sp, cport)
		}
	}
}

// TestResizeClosedReservationStaysOut: the shim copies back only a live
// reservation of a flow not seen closed. A closed flow's reservation
// (RST, or FIN both ways), still in the new map for its close timeout,
// may have been superseded in the old map on purpose (an old program's
// new flow on the client's port, ct_supersede), so that the closed flow's
// stragglers find nothing there: a straggler of the backend, met by the
// previous agent's program, must not bring it back. The same reservation
// not closed is copied (TestResizeMasqueradedFlowAnsweredByOldProgram).
func TestResizeClosedReservationStaysOut(t *testing.T) {
	testutil.Privileged(t)
	forFamilies(t, func(t *testing.T, v6 bool) {
		d1, d2, ifindex, np, be := snatResizeNode(t, v6, func(c *Config) { c.MaxConntrack = 8192 })
		newIngress, _ := tcProgs(d2, v6)
		const cport, port = 43000, 62000
		node := ofFamily(np.Addr, nsNodeIP, nsNodeIP6).String()
		syn := nsClient(cport, np)
		syn.TCPFlags = tcpSYN_
		runShim(t, d2, ifindex, syn.Bytes())
		if v, out := runOn(t, newIngress, ifindex, syn.Bytes()); v != tcActRedirect || outSport(out) != port {
			t.Fatalf("SYN at the new ingress: verdict %d from port %d, want %d from %d", v, outSport(out), tcActRedirect, port)
		}
		rev := ctKeyOf(be.addr.Addr.String(), be.addr.Port, node, port, model.TCP, ctReverse)
		// Each agent's own handle: the pinned maps are the new ones.
		est, oldEst := d2.tc.SluiceConntrackV2, d1.tc.SluiceConntrackV2
		if v6 {
			est, oldEst = d2.tc.Sluice6ConntrackV1, d1.tc.Sluice6ConntrackV1
		}
		if rev.v6() {
			key, e := rev.k6(), tcCt6Entry{}
			must(t, est.Lookup(&key, &e))
			e.Flags |= ctFlagRST
			must(t, est.Put(&key, &e))
		} else {
			key, e := rev.k4(), sockCt4Entry{}
			must(t, est.Lookup(&key, &e))
			e.Flags |= ctFlagRST
			must(t, est.Put(&key, &e))
		}
		runShim(t, d2, ifindex, replyFrom(be, port, tcpACK).Bytes())
		var err error
		if rev.v6() {
			key, e := rev.k6(), tcCt6Entry{}
			err = oldEst.Lookup(&key, &e)
		} else {
			key, e := rev.k4(), sockCt4Entry{}
			err = oldEst.Lookup(&key, &e)
		}
		if !errors.Is(err, ebpf.ErrKeyNotExist) {
			t.Fatalf("the closed flow's reservation in the previous agent's map after its straggler: lookup %v, want none", err)
		}
	})
}
