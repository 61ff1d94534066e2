package datapath

import (
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// TestTCRetiredFrontendKeepsEstablished: a frontend removed by the
// reconciler keeps its established TCP flows, as kube-proxy's conntrack
// does (its rules match `ct state new` only): its master is retired
// (pkg/reconciler/retired.go), and tc follows a flow's forward entry under
// it, while a new connection to it passes untranslated, as to no
// frontend. Two removals: a NodePort renumbered (the old port's flow
// reset by the node's stack before: its data went up untranslated) and a
// ClusterIP's Service deleted (its data routed on untranslated, or
// dropped as an unallocated service CIDR address). Once the retired
// master is past its timeout the next Apply deletes it, and the flow's
// data passes untranslated, as on removal before.
func TestTCRetiredFrontendKeepsEstablished(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		a := twinOf(v6)
		be := testBackend{addr: l4(a("10.1.9.1"), 8080, model.TCP)}
		np := l4(a("192.168.9.10"), 30080, model.TCP)
		renumbered := l4(a("192.168.9.10"), 30081, model.TCP)
		cip := twinL4(v6, l4("10.96.9.1", 80, model.TCP))
		service := func(kind model.FrontendKind, fe model.L4Addr) *model.Service {
			s := clusterIP(fe, be.addr)
			s.Kind = kind
			return s
		}
		for _, c := range []struct {
			name        string
			fe          model.L4Addr
			before, now []*model.Service
		}{
			{"NodePort renumbered", np, []*model.Service{service(model.NodePort, np)}, []*model.Service{service(model.NodePort, renumbered)}},
			{"ClusterIP's Service deleted", cip, []*model.Service{service(model.ClusterIP, cip)}, nil},
		} {
			t.Run(c.name, func(t *testing.T) {
				d := newTestDatapath(t)
				r := reconciler.New(d.Maps(), nil)
				r.SetRetireTimeout(time.Hour)
				apply := func(svcs []*model.Service) {
					t.Helper()
					st := model.NewState()
					for _, s := range svcs {
						st.Services.Set(s.Frontend, s)
					}
					if err := r.Apply(st); err != nil {
						t.Fatalf("Apply: %v", err)
					}
				}
				apply(c.before)
				f := flow{a("10.0.9.3"), 45100, c.fe}
				be := establish(t, d, f, be)

				apply(c.now)
				if _, ok := r.Retired()[reconciler.DefaultScope(c.fe)]; !ok {
					t.Fatalf("%s not retired: %v", c.fe, r.Retired())
				}
				if v, dst := sendTo(t, d.TCIngress(), f.pkt(tcpACK)); v != tcActOK || dst != be.addr.Addr.String() {
					t.Errorf("established flow's data: verdict %d to %s, want %d to the backend %s", v, dst, tcActOK, be.addr.Addr)
				}
				if v, out := runProg(t, d.TCEgress(), f.from(be.addr, tcpACK).Bytes()); v != tcActOK || outSrc(out) != c.fe.Addr.String() || outSport(out) != c.fe.Port {
					t.Errorf("established flow's reply: verdict %d from %s:%d, want %d from %s", v, outSrc(out), outSport(out), tcActOK, c.fe)
				}
				fresh := flow{a("10.0.9.3"), 45101, c.fe}
				if v, dst := sendTo(t, d.TCIngress(), fresh.pkt(tcpSYN_)); v != tcActOK || dst != c.fe.Addr.String() {
					t.Errorf("new connection: verdict %d to %s, want %d untranslated (to %s)", v, dst, tcActOK, c.fe.Addr)
				}
				if _, ok := ctLookup(t, d.Maps(), fresh.fwdKey()); ok {
					t.Error("new connection to the retired frontend: a conntrack entry made")
				}
				for _, s := range c.now {
					g := flow{a("10.0.9.3"), 45102, s.Frontend}
					if v, dst := sendTo(t, d.TCIngress(), g.pkt(tcpSYN_)); v != tcActOK || dst != be.addr.Addr.String() {
						t.Errorf("new connection to %s: verdict %d to %s, want the backend", s.Frontend, v, dst)
					}
				}

				// Past its timeout: deleted by the next Apply.
				r.SetRetireTimeout(time.Nanosecond)
				apply(c.now)
				if len(r.Retired()) != 0 {
					t.Fatalf("past the timeout: still retired: %v", r.Retired())
				}
				if v, dst := sendTo(t, d.TCIngress(), f.pkt(tcpACK)); v != tcActOK || dst != c.fe.Addr.String() {
					t.Errorf("past the timeout, the flow's data: verdict %d to %s, want %d untranslated (to %s)", v, dst, tcActOK, c.fe.Addr)
				}
			})
		}
	})
}

// TestSockRetiredFrontendIsNone: at the socket a retired frontend is no
// frontend (lookup_live_service): a connect to a removed ClusterIP passes
// untranslated, as to any address no Service holds, where a master of
// count 0 would refuse it (ECONNREFUSED). connect4's and connect6's dry
// runs, which are the real hooks' code.
func TestSockRetiredFrontendIsNone(t *testing.T) {
	d, bpffs := newTestDatapathAt(t)
	joinSockCgroup(t, d)
	ns := topology.NewNS(t, "srt")
	// One reconciler, as one agent: ids are one space over both families.
	r := reconciler.New(d.Maps(), nil)
	r.SetRetireTimeout(time.Hour)
	forFamilies(t, func(t *testing.T, v6 bool) {
		vip := twinL4(v6, l4("10.96.9.2", 80, model.TCP))
		st := model.NewState()
		st.Services.Set(vip, clusterIP(vip, twinL4(v6, l4("10.1.9.2", 8080, model.TCP))))
		if err := r.Apply(st); err != nil {
			t.Fatal(err)
		}
		req := SocketExplainRequest{To: netip.AddrPortFrom(vip.Addr, vip.Port), Proto: unix.IPPROTO_TCP}
		if e := sockExplainIn(t, d, bpffs, ns, req); !e.Frontend || !e.DNAT {
			t.Fatalf("live frontend: %+v", e)
		}
		if err := r.Apply(model.NewState()); err != nil {
			t.Fatal(err)
		}
		if _, ok := r.Retired()[reconciler.DefaultScope(vip)]; !ok {
			t.Fatalf("%s not retired: %v", vip, r.Retired())
		}
		if e := sockExplainIn(t, d, bpffs, ns, req); e.Frontend || e.DNAT || e.Verdict != "pass" {
			t.Fatalf("retired frontend: %+v, want no frontend (pass)", e)
		}
	})
}
