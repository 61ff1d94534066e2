package reconciler_test

import (
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
	"github.com/sluice-lb/sluice/pkg/reconciler/fakedp"
)

// newUDPRetiring returns a reconciler over f that retires removed TCP
// masters for an hour and UDP ones for a minute, on clock c.
func newUDPRetiring(f *fakedp.Fake, c *retiredClock) *reconciler.Reconciler {
	r := newRetiring(f, c)
	r.SetUDPRetireTimeout(time.Minute)
	return r
}

// backendAddrs returns the addresses of the backend entries f holds,
// sorted.
func backendAddrs(t *testing.T, f *fakedp.Fake) []model.L4Addr {
	t.Helper()
	ks, err := f.Dump()
	if err != nil {
		t.Fatal(err)
	}
	var out []model.L4Addr
	for _, a := range ks.Backends {
		out = append(out, a)
	}
	slices.SortFunc(out, model.L4Addr.Compare)
	return out
}

// udpLB is the UDP Service port "dns": a ClusterIP and a LoadBalancer IP,
// each serving bs (the LoadBalancer IP left out if lb is false).
func udpLB(lb bool, bs ...model.Backend) []*model.Service {
	cip := svc(model.L4Addr{Addr: netip.MustParseAddr("10.96.0.10"), Port: 53, Proto: model.UDP}, "dns", bs...)
	if !lb {
		return []*model.Service{cip}
	}
	return []*model.Service{cip, lbService("dns", bs...)}
}

// udpLBIP is the LoadBalancer IP udpLB and lbService use.
var udpLBIP = model.L4Addr{Addr: netip.MustParseAddr("203.0.113.7"), Port: 53, Proto: model.UDP}

// lbService is a LoadBalancer IP frontend of Service port name at udpLBIP.
func lbService(name string, bs ...model.Backend) *model.Service {
	s := svc(udpLBIP, name, bs...)
	s.Kind = model.LoadBalancer
	return s
}

// TestUDPRetired: a removed UDP frontend's master is retired as a TCP
// one's (count 0, FlagRetired, FlagExternal kept), and nothing is
// flushed: neither the backends its Service port still serves through
// its ClusterIP, nor those it serves no more (the whole Service deleted:
// kube-proxy cleans no frontend a Service port no longer has). The
// backends' entries stay while it is retired, held for its flows: the
// datapath follows a UDP flow only while its backend's entry is there.
// Without retirement for UDP (mayRetire TCP only) the master was deleted
// and the backends flushed; without the hold, the entries of the deleted
// Service's backends went (and were flushed).
func TestUDPRetired(t *testing.T) {
	b1, b2 := be(5, 1, model.UDP), be(5, 2, model.UDP)
	t.Run("LoadBalancerIPRemoved", func(t *testing.T) {
		f, c := newFake(t), &retiredClock{t: time.Unix(1e9, 0)}
		r := newUDPRetiring(f, c)
		mustApply(t, r, state(udpLB(true, b1, b2)...))
		live, _ := masterOf(t, f, udpLBIP)
		mustApply(t, r, state(udpLB(false, b1, b2)...))
		want := reconciler.Master{ID: live.ID, Flags: reconciler.FlagRetired | reconciler.FlagExternal}
		if m, ok := masterOf(t, f, udpLBIP); !ok || m != want {
			t.Fatalf("after the removal: master %+v (present %v), want retired %+v", m, ok, want)
		}
		if _, ok := r.Retired()[reconciler.DefaultScope(udpLBIP)]; !ok {
			t.Errorf("Retired() = %v, want %s", r.Retired(), udpLBIP)
		}
		if fl := f.Flushed(); len(fl) != 0 {
			t.Errorf("flushed %v when the LoadBalancer IP went: its ClusterIP still serves them", fl)
		}
	})
	t.Run("ServiceDeleted", func(t *testing.T) {
		f, c := newFake(t), &retiredClock{t: time.Unix(1e9, 0)}
		r := newUDPRetiring(f, c)
		other := svc(vip(1), "web", be(1, 1, model.TCP))
		mustApply(t, r, state(append(udpLB(false, b1, b2), other)...))
		mustApply(t, r, state(other))
		cip := udpLB(false)[0].Frontend
		if m, ok := masterOf(t, f, cip); !ok || m.Flags&reconciler.FlagRetired == 0 {
			t.Fatalf("after the deletion: master %+v (present %v), want it retired", m, ok)
		}
		if fl := f.Flushed(); len(fl) != 0 {
			t.Errorf("flushed %v when the Service was deleted", fl)
		}
		want := []model.L4Addr{be(1, 1, model.TCP).L4Addr, b1.L4Addr, b2.L4Addr}
		slices.SortFunc(want, model.L4Addr.Compare)
		if got := backendAddrs(t, f); !slices.Equal(got, want) {
			t.Errorf("backend entries %v, want %v (the retired master's kept for its flows)", got, want)
		}
		// The rest of the Apply's bookkeeping agrees with the maps.
		if !reconciler.MapsMatchView(r) {
			t.Error("the maps do not match the view")
		}
	})
	// A two-scope frontend (externalTrafficPolicy Local): its internal
	// scope goes with it; the internal clients' backend is held too, not
	// flushed, though only the internal scope named it.
	t.Run("TwoScopes", func(t *testing.T) {
		f, c := newFake(t), &retiredClock{t: time.Unix(1e9, 0)}
		r := newUDPRetiring(f, c)
		s := twoScopes([]model.Backend{b1}, []model.Backend{b1, b2})
		s.Frontend.Proto = model.UDP
		other := svc(vip(1), "web", be(1, 1, model.TCP))
		mustApply(t, r, state(s, other))
		mustApply(t, r, state(other))
		if m, ok := masterOf(t, f, s.Frontend); !ok || m.Flags&reconciler.FlagRetired == 0 {
			t.Fatalf("master %+v (present %v), want it retired", m, ok)
		}
		if fl := f.Flushed(); len(fl) != 0 {
			t.Errorf("flushed %v when the two-scope frontend went", fl)
		}
		if got := backendAddrs(t, f); !slices.Contains(got, b2.L4Addr) {
			t.Errorf("backend entries %v: the internal scope's %s deleted", got, b2.L4Addr)
		}
	})
}

// TestUDPRetiredExpires: a retired UDP master goes with the first Apply
// at its protocol's timeout (a minute here, where a TCP one retired at
// the same time stays for the hour), with the entries of the backends
// only it held, whose flows are then flushed (their flows have idled out
// or, deleted with the master, are translated no more); a backend the
// ClusterIP still serves is neither deleted nor flushed. Before UDP
// retirement the master was deleted and b2 flushed at the removal; with
// UDP's timeout taken from TCP's it stayed past the minute.
func TestUDPRetiredExpires(t *testing.T) {
	f, c := newFake(t), &retiredClock{t: time.Unix(1e9, 0)}
	r := newUDPRetiring(f, c)
	b1, b2 := be(5, 1, model.UDP), be(5, 2, model.UDP)
	tcp := svc(vip(1), "web", be(1, 1, model.TCP))
	keep := udpLB(false, b1)
	mustApply(t, r, state(append(udpLB(true, b1, b2), tcp)...))
	// The LoadBalancer IP and the TCP Service go; b2 leaves the
	// ClusterIP (it stopped serving: flushed, as kube-proxy cleans the
	// ClusterIP's flows to it).
	mustApply(t, r, state(keep...))
	if fl := f.Flushed(); !slices.Equal(fl, []model.L4Addr{b2.L4Addr}) {
		t.Fatalf("flushed %v at the removal, want %v", fl, b2.L4Addr)
	}
	c.t = c.t.Add(59 * time.Second)
	mustApply(t, r, state(keep...))
	if m, ok := masterOf(t, f, udpLBIP); !ok || m.Flags&reconciler.FlagRetired == 0 {
		t.Fatalf("before the UDP timeout: master %+v (present %v), want it retired", m, ok)
	}
	if got := backendAddrs(t, f); !slices.Contains(got, b2.L4Addr) {
		t.Errorf("before the UDP timeout: backend entries %v, want %s held", got, b2.L4Addr)
	}
	c.t = c.t.Add(time.Second)
	mustApply(t, r, state(keep...))
	if m, ok := masterOf(t, f, udpLBIP); ok {
		t.Fatalf("at the UDP timeout: master %+v still there", m)
	}
	if m, ok := masterOf(t, f, vip(1)); !ok || m.Flags&reconciler.FlagRetired == 0 {
		t.Errorf("at the UDP timeout: the TCP master %+v (present %v), want it retired for its hour", m, ok)
	}
	if got := backendAddrs(t, f); !slices.Equal(got, []model.L4Addr{b1.L4Addr}) {
		t.Errorf("at the UDP timeout: backend entries %v, want %v", got, b1.L4Addr)
	}
	if fl := f.Flushed(); !slices.Equal(fl, []model.L4Addr{b2.L4Addr, b2.L4Addr}) {
		t.Errorf("flushed %v, want %v at the removal and again with its entry", fl, b2.L4Addr)
	}
	if !reconciler.MapsMatchView(r) {
		t.Error("the maps do not match the view")
	}
}

// TestUDPRetiredClaimed: the address and port of a removed UDP frontend
// taken by another Service (or by the same Service port made again with
// other endpoints). The datapath checks a flow's backend, not its
// Service, so the old flows would be followed under the new master;
// kube-proxy's CleanStaleEntries deletes those whose endpoint the new
// Service port does not serve. So their backends are flushed (by
// address: their flows through the old Service's ClusterIP go too),
// whether the master is still retired or deleted already; a backend the
// new Service serves keeps its flows, as under kube-proxy. Each case
// failed without claimUDPFlows (nothing flushed).
func TestUDPRetiredClaimed(t *testing.T) {
	b1 := be(5, 1, model.UDP)
	c1 := be(6, 1, model.UDP)
	for _, tc := range []struct {
		name    string
		after   time.Duration // from the removal to the claim
		claimer *model.Service
		flushed []model.L4Addr
	}{
		{"AnotherServiceWhileRetired", 10 * time.Second, lbService("other", c1), []model.L4Addr{b1.L4Addr}},
		{"AnotherServiceAfterExpiry", 2 * time.Minute, lbService("other", c1), []model.L4Addr{b1.L4Addr}},
		{"SameServiceOtherEndpoints", 10 * time.Second, lbService("dns", c1), []model.L4Addr{b1.L4Addr}},
		{"AnotherServiceSameBackend", 10 * time.Second, lbService("other", b1), nil},
		{"SameServiceBack", 10 * time.Second, lbService("dns", b1), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, c := newFake(t), &retiredClock{t: time.Unix(1e9, 0)}
			r := newUDPRetiring(f, c)
			mustApply(t, r, state(udpLB(true, b1)...))
			mustApply(t, r, state(udpLB(false, b1)...))
			if fl := f.Flushed(); len(fl) != 0 {
				t.Fatalf("flushed %v when the LoadBalancer IP went", fl)
			}
			c.t = c.t.Add(tc.after)
			if tc.after > time.Minute {
				mustApply(t, r, state(udpLB(false, b1)...))
				if m, ok := masterOf(t, f, udpLBIP); ok {
					t.Fatalf("past the UDP timeout: master %+v still there", m)
				}
			}
			st := state(append(udpLB(false, b1), tc.claimer)...)
			mustApply(t, r, st)
			if fl := f.Flushed(); !slices.Equal(fl, tc.flushed) {
				t.Errorf("flushed %v when %s took the address, want %v", fl, tc.claimer.Name.Name, tc.flushed)
			}
			if m, ok := masterOf(t, f, udpLBIP); !ok || m.Flags&reconciler.FlagRetired != 0 {
				t.Errorf("master %+v (present %v), want a live one", m, ok)
			}
			checkProgrammed(t, f, st)
			// Claimed once: a later removal and claim start afresh.
			mustApply(t, r, st)
			if fl := f.Flushed(); len(fl) != len(tc.flushed) {
				t.Errorf("flushed %v after an Apply of the same state", fl)
			}
		})
	}
}

// TestUDPFlowsRecordsBounded: the records of removed UDP frontends whose
// masters are deleted (kept for a later claim of their addresses) are not
// bounded by retireCap (here 2, of 32 services): four of them flush
// nothing, their backends still served by their ClusterIPs (before, the
// two lowest addresses' were flushed past retireCap: the flush of a
// backend still serving, delayed, under node-address churn). They are
// bounded by the backends they hold (udpFlowsMaxBackends, here lowered to
// 3): past that the oldest records, by when their masters went, are
// evicted and their backends flushed (before, the lowest addresses'). A
// record whose backends were all flushed since goes too: a claim of its
// address flushes nothing more.
func TestUDPFlowsRecordsBounded(t *testing.T) {
	f, c := newFakeSized(t, 32, 1<<10, 1<<10), &retiredClock{t: time.Unix(1e9, 0)}
	r := newUDPRetiring(f, c)
	lbAt := func(i int) model.L4Addr {
		return model.L4Addr{Addr: netip.AddrFrom4([4]byte{203, 0, 113, byte(10 + i)}), Port: 53, Proto: model.UDP}
	}
	bs := []model.Backend{be(10, 1, model.UDP), be(11, 1, model.UDP), be(12, 1, model.UDP), be(13, 1, model.UDP)}
	// Service i: a ClusterIP and, if lb[i], a LoadBalancer IP, serving
	// bs[i]; Service 0's ClusterIP without its backend if !serving0.
	services := func(lb [4]bool, serving0 bool) *model.State {
		var svcs []*model.Service
		for i, b := range bs {
			name := string(rune('a' + i))
			cb := []model.Backend{b}
			if i == 0 && !serving0 {
				cb = nil
			}
			svcs = append(svcs, svc(model.L4Addr{Addr: netip.AddrFrom4([4]byte{10, 96, 1, byte(i)}), Port: 53, Proto: model.UDP}, name, cb...))
			if lb[i] {
				s := svc(lbAt(i), name, b)
				s.Kind = model.LoadBalancer
				svcs = append(svcs, s)
			}
		}
		return state(svcs...)
	}
	// The LoadBalancer IPs of Services 2 and 3 go first, then those of
	// 0 and 1: records 2 and 3 are the older.
	mustApply(t, r, services([4]bool{true, true, true, true}, true))
	mustApply(t, r, services([4]bool{true, true, false, false}, true))
	c.t = c.t.Add(time.Minute)
	mustApply(t, r, services([4]bool{true, true, false, false}, true))
	mustApply(t, r, services([4]bool{}, true))
	c.t = c.t.Add(time.Minute)
	mustApply(t, r, services([4]bool{}, true))
	if m, ok := masterOf(t, f, lbAt(0)); ok {
		t.Fatalf("past the UDP timeout: master %+v still there", m)
	}
	if fl := f.Flushed(); len(fl) != 0 {
		t.Fatalf("flushed %v with four records past retireCap: their ClusterIPs still serve them", fl)
	}
	if n := len(reconciler.UDPFlowRecords(r)); n != 4 {
		t.Fatalf("%d records, want 4", n)
	}
	reconciler.SetUDPFlowsCap(r, 3)
	mustApply(t, r, services([4]bool{}, true))
	if fl, want := f.Flushed(), []model.L4Addr{bs[2].L4Addr}; !slices.Equal(fl, want) {
		t.Fatalf("flushed %v with four backends recorded of 3, want the oldest record's %v", fl, want)
	}
	if _, ok := reconciler.UDPFlowRecords(r)[lbAt(2)]; ok {
		t.Errorf("record of %s kept after its eviction", lbAt(2))
	}
	// Service 0's backend leaves its ClusterIP: flushed, and its
	// record with it; a claim of its LoadBalancer IP flushes nothing
	// more. Service 3's record is claimed: its backend flushed.
	st := services([4]bool{}, false)
	mustApply(t, r, st)
	if fl := f.Flushed(); len(fl) != 2 || fl[1] != bs[0].L4Addr {
		t.Fatalf("flushed %v, want %v last", fl, bs[0].L4Addr)
	}
	for _, i := range []int{0, 3} {
		s := svc(lbAt(i), "other", be(20, 1, model.UDP))
		s.Kind = model.LoadBalancer
		st.Services.Set(s.Frontend, s)
	}
	mustApply(t, r, st)
	if fl := f.Flushed(); len(fl) != 3 || fl[2] != bs[3].L4Addr {
		t.Fatalf("flushed %v, want %v last and nothing else", fl, bs[3].L4Addr)
	}
}

// TestUDPRetiredAfterRestart: an agent restart rebuilds, from the
// datapath's conntrack (UDPFlowReader: per frontend, the backends its
// UDP flows use), which backends a removed UDP frontend's flows use.
// With its master retired, the backend only it held keeps its entry and
// is not flushed at the first sync; whether retired or deleted already,
// a frontend programmed at its address later flushes the backends its
// Service does not serve, as without the restart. A frontend restored
// live and removed by the first sync (its Service not known yet, so
// neither its standby backends) holds the backends conntrack names for
// it. Before Restore read conntrack, the first case flushed b2 at the
// first sync and each claim flushed nothing; the third flushed b3.
func TestUDPRetiredAfterRestart(t *testing.T) {
	b1, b2, b3 := be(5, 1, model.UDP), be(5, 2, model.UDP), be(5, 3, model.UDP)
	c1 := be(6, 1, model.UDP)
	claim := state(append(udpLB(false, b1), lbService("other", c1))...)
	restart := func(t *testing.T, f *fakedp.Fake, c *retiredClock) *reconciler.Reconciler {
		t.Helper()
		r := newUDPRetiring(f, c)
		if err := r.Restore(); err != nil {
			t.Fatal(err)
		}
		return r
	}
	t.Run("Retired", func(t *testing.T) {
		f, c := newFake(t), &retiredClock{t: time.Unix(1e9, 0)}
		r := newUDPRetiring(f, c)
		mustApply(t, r, state(append(udpLB(false, b1), lbService("dns", b1, b2))...))
		f.SetUDPFlows(map[model.L4Addr][]model.L4Addr{udpLBIP: {b1.L4Addr, b2.L4Addr}})
		mustApply(t, r, state(udpLB(false, b1)...))
		if fl := f.Flushed(); len(fl) != 0 {
			t.Fatalf("flushed %v at the removal", fl)
		}
		r = restart(t, f, c)
		mustApply(t, r, state(udpLB(false, b1)...))
		if m, ok := masterOf(t, f, udpLBIP); !ok || m.Flags&reconciler.FlagRetired == 0 {
			t.Fatalf("after the restart: master %+v (present %v), want it retired", m, ok)
		}
		if fl := f.Flushed(); len(fl) != 0 {
			t.Fatalf("flushed %v at the first sync after the restart, want nothing (%s held for its flows)", fl, b2.L4Addr)
		}
		if got := backendAddrs(t, f); !slices.Contains(got, b2.L4Addr) {
			t.Errorf("after the restart: backend entries %v, want %s held", got, b2.L4Addr)
		}
		mustApply(t, r, claim)
		if fl, want := f.Flushed(), []model.L4Addr{b1.L4Addr, b2.L4Addr}; !slices.Equal(fl, want) {
			t.Errorf("flushed %v when another Service took the address after the restart, want %v", fl, want)
		}
	})
	t.Run("Deleted", func(t *testing.T) {
		f, c := newFake(t), &retiredClock{t: time.Unix(1e9, 0)}
		r := newUDPRetiring(f, c)
		mustApply(t, r, state(udpLB(true, b1)...))
		f.SetUDPFlows(map[model.L4Addr][]model.L4Addr{udpLBIP: {b1.L4Addr}})
		mustApply(t, r, state(udpLB(false, b1)...))
		c.t = c.t.Add(2 * time.Minute)
		mustApply(t, r, state(udpLB(false, b1)...))
		if m, ok := masterOf(t, f, udpLBIP); ok {
			t.Fatalf("past the UDP timeout: master %+v still there", m)
		}
		r = restart(t, f, c)
		mustApply(t, r, state(udpLB(false, b1)...))
		mustApply(t, r, claim)
		if fl, want := f.Flushed(), []model.L4Addr{b1.L4Addr}; !slices.Equal(fl, want) {
			t.Errorf("flushed %v when another Service took the address after the restart, want %v", fl, want)
		}
	})
	t.Run("RemovedAtFirstSync", func(t *testing.T) {
		f, c := newFake(t), &retiredClock{t: time.Unix(1e9, 0)}
		r := newUDPRetiring(f, c)
		// b3 served and then standby (serving, terminating): its entry
		// kept for its flows.
		mustApply(t, r, state(append(udpLB(false, b1), lbService("dns", b1, b3))...))
		lb := lbService("dns", b1)
		lb.Standby = []model.L4Addr{b3.L4Addr}
		mustApply(t, r, state(append(udpLB(false, b1), lb)...))
		if got := backendAddrs(t, f); !slices.Contains(got, b3.L4Addr) {
			t.Fatalf("before the restart: backend entries %v, want %s standby", got, b3.L4Addr)
		}
		f.SetUDPFlows(map[model.L4Addr][]model.L4Addr{udpLBIP: {b1.L4Addr, b3.L4Addr}})
		r = restart(t, f, c)
		mustApply(t, r, state(udpLB(false, b1)...))
		if m, ok := masterOf(t, f, udpLBIP); !ok || m.Flags&reconciler.FlagRetired == 0 {
			t.Fatalf("master %+v (present %v), want it retired", m, ok)
		}
		if fl := f.Flushed(); len(fl) != 0 {
			t.Errorf("flushed %v at the first sync, want nothing (%s held for its flows)", fl, b3.L4Addr)
		}
		if got := backendAddrs(t, f); !slices.Contains(got, b3.L4Addr) {
			t.Errorf("backend entries %v, want %s held", got, b3.L4Addr)
		}
	})
}

// TestUDPRetireFailed: a retirement whose write of the retired master
// fails leaves the live master and no record of its flows (a record
// there, unheld at once, outlived the live master and would flush at a
// later claim what that master's own flows use); the next Apply retires
// it and holds its backends. Before, the hold came before the write and
// the record stayed.
func TestUDPRetireFailed(t *testing.T) {
	f, c := newFake(t), &retiredClock{t: time.Unix(1e9, 0)}
	r := newUDPRetiring(f, c)
	b1, b2 := be(5, 1, model.UDP), be(5, 2, model.UDP)
	mustApply(t, r, state(append(udpLB(false, b1), lbService("dns", b1, b2))...))
	live, _ := masterOf(t, f, udpLBIP)
	f.Fail = func(op fakedp.Op) error {
		if op.Kind == fakedp.OpUpsertMaster && op.Frontend.L4Addr == udpLBIP {
			return errors.New("EIO")
		}
		return nil
	}
	if err := r.Apply(state(udpLB(false, b1)...)); err == nil {
		t.Fatal("Apply with the retired master's write failing: no error")
	}
	if m, ok := masterOf(t, f, udpLBIP); !ok || m != live {
		t.Fatalf("after the failed retirement: master %+v (present %v), want the live %+v", m, ok, live)
	}
	if recs := reconciler.UDPFlowRecords(r); len(recs) != 0 {
		t.Errorf("records %v after the failed retirement, want none", recs)
	}
	f.Fail = nil
	mustApply(t, r, state(udpLB(false, b1)...))
	if m, ok := masterOf(t, f, udpLBIP); !ok || m.Flags&reconciler.FlagRetired == 0 {
		t.Fatalf("after the retry: master %+v (present %v), want it retired", m, ok)
	}
	want := []model.L4Addr{b1.L4Addr, b2.L4Addr}
	if rec := reconciler.UDPFlowRecords(r)[udpLBIP]; !rec.Held || !slices.Equal(rec.Backends, want) {
		t.Errorf("after the retry: record %+v, want %v held", rec, want)
	}
	if fl := f.Flushed(); len(fl) != 0 {
		t.Errorf("flushed %v", fl)
	}
}

// TestUDPHeldBackendsFreed: a new frontend short of backend entries
// frees a retired UDP master's room, its backends held for its flows
// with it (their flows flushed, as at the retirement's end), in the same
// Apply. Before, the backends were not counted as freeable: the new
// frontend was refused until the retirement ended.
func TestUDPHeldBackendsFreed(t *testing.T) {
	f, c := newFakeSized(t, 32, 4, 1<<10), &retiredClock{t: time.Unix(1e9, 0)}
	r := newUDPRetiring(f, c)
	b1, b2 := be(5, 1, model.UDP), be(5, 2, model.UDP)
	mustApply(t, r, state(udpLB(false, b1, b2)...))
	web := svc(model.L4Addr{Addr: vip(1).Addr, Port: 53, Proto: model.UDP}, "web",
		be(6, 1, model.UDP), be(6, 2, model.UDP), be(6, 3, model.UDP))
	st := state(web)
	mustApply(t, r, st)
	checkProgrammed(t, f, st)
	cip := udpLB(false)[0].Frontend
	if m, ok := masterOf(t, f, cip); ok {
		t.Errorf("the retired master %+v kept", m)
	}
	if fl, want := f.Flushed(), []model.L4Addr{b1.L4Addr, b2.L4Addr}; !slices.Equal(fl, want) {
		t.Errorf("flushed %v, want %v", fl, want)
	}
	// Its record went with the flush (nothing left for a claim).
	if recs := reconciler.UDPFlowRecords(r); len(recs) != 0 {
		t.Errorf("records %v, want none", recs)
	}
	if !reconciler.MapsMatchView(r) {
		t.Error("the maps do not match the view")
	}
}

// TestUDPHeldBackendsWantedNotFreeable: a new frontend short of backend
// entries by more than freeing the retired masters would give leaves
// them (a TCP one too) their flows: the backends a retired UDP master
// holds that the new frontend wants itself stay whatever goes, so they
// are no room. Before, freeable counted them: the check freed every
// retired master, and the frontend was refused all the same.
func TestUDPHeldBackendsWantedNotFreeable(t *testing.T) {
	f, c := newFakeSized(t, 32, 4, 1<<10), &retiredClock{t: time.Unix(1e9, 0)}
	r := newUDPRetiring(f, c)
	b1, b2 := be(5, 1, model.UDP), be(5, 2, model.UDP)
	tcp := svc(vip(2), "tcp", be(7, 1, model.TCP))
	mustApply(t, r, state(append(udpLB(false, b1, b2), tcp)...))
	mustApply(t, r, state())
	cip := udpLB(false)[0].Frontend
	for _, fe := range []model.L4Addr{cip, tcp.Frontend} {
		if m, ok := masterOf(t, f, fe); !ok || m.Flags&reconciler.FlagRetired == 0 {
			t.Fatalf("master of %s: %+v (present %v), want it retired", fe, m, ok)
		}
	}
	if got, want := backendAddrs(t, f), []model.L4Addr{b1.L4Addr, b2.L4Addr}; !slices.Equal(got, want) {
		t.Fatalf("backend entries %v, want %v (held for the UDP flows)", got, want)
	}
	// It wants b1 and b2 (held, in the map) and three more: one short
	// of a map of 4, and freeing the retired masters frees none of the
	// backends it wants.
	web := svc(model.L4Addr{Addr: vip(1).Addr, Port: 53, Proto: model.UDP}, "web",
		b1, b2, be(6, 1, model.UDP), be(6, 2, model.UDP), be(6, 3, model.UDP))
	if err := r.Apply(state(web)); !errors.Is(err, reconciler.ErrCapacity) {
		t.Fatalf("Apply of a Service that cannot fit: %v, want ErrCapacity", err)
	}
	for _, fe := range []model.L4Addr{cip, tcp.Frontend} {
		if m, ok := masterOf(t, f, fe); !ok || m.Flags&reconciler.FlagRetired == 0 {
			t.Errorf("master of %s after the refused Service: %+v (present %v), want it retired still", fe, m, ok)
		}
	}
	if fl := f.Flushed(); len(fl) != 0 {
		t.Errorf("flushed %v, want nothing", fl)
	}
}

// TestUDPRestoreStaleFlow: a conntrack entry whose backend id no longer
// names its address (the backend's entry deleted, and the agent gone
// before the flush) is no flow the datapath follows (ct_fwd_usable): a
// restart does not record it, and a later claim of the address does not
// flush that address (a pod may have taken it since). Before, Restore
// took every live entry: the retired master's record held b2, and the
// claim flushed it.
func TestUDPRestoreStaleFlow(t *testing.T) {
	f, c := newFake(t), &retiredClock{t: time.Unix(1e9, 0)}
	r := newUDPRetiring(f, c)
	b1, b2 := be(5, 1, model.UDP), be(5, 2, model.UDP)
	mustApply(t, r, state(append(udpLB(false, b1), lbService("dns", b1, b2))...))
	f.SetUDPFlows(map[model.L4Addr][]model.L4Addr{udpLBIP: {b1.L4Addr, b2.L4Addr}})
	mustApply(t, r, state(udpLB(false, b1)...))
	// The agent stops; b2's entry goes behind its back, its flows not
	// flushed (a crash between DeleteBackend and the flush).
	ks, err := f.Dump()
	if err != nil {
		t.Fatal(err)
	}
	var id2 reconciler.BackendID
	for id, a := range ks.Backends {
		if a == b2.L4Addr {
			id2 = id
		}
	}
	if id2 == 0 {
		t.Fatalf("no backend entry of %s (held for its flows): %v", b2.L4Addr, ks.Backends)
	}
	if err := f.DeleteBackend(id2); err != nil {
		t.Fatal(err)
	}
	r = newUDPRetiring(f, c)
	if err := r.Restore(); err != nil {
		t.Fatal(err)
	}
	mustApply(t, r, state(udpLB(false, b1)...))
	want := []model.L4Addr{b1.L4Addr}
	if rec := reconciler.UDPFlowRecords(r)[udpLBIP]; !rec.Held || !slices.Equal(rec.Backends, want) {
		t.Errorf("after the restart: record %+v, want %v held (%s's entry names a backend gone)", rec, want, b2.L4Addr)
	}
	mustApply(t, r, state(append(udpLB(false, b1), lbService("other", be(6, 1, model.UDP)))...))
	if fl := f.Flushed(); !slices.Equal(fl, want) {
		t.Errorf("flushed %v when another Service took the address, want %v", fl, want)
	}
}

// TestUDPRestorePartialRead: a read of conntrack that fails part way (a
// table whose walk a flood aborted) still gives Restore the flows it
// read: the retired master's record holds them. Before, any error
// discarded every table's flows, and b2 was deleted and flushed at the
// first sync.
func TestUDPRestorePartialRead(t *testing.T) {
	f, c := newFake(t), &retiredClock{t: time.Unix(1e9, 0)}
	r := newUDPRetiring(f, c)
	b1, b2 := be(5, 1, model.UDP), be(5, 2, model.UDP)
	mustApply(t, r, state(append(udpLB(false, b1), lbService("dns", b1, b2))...))
	f.SetUDPFlows(map[model.L4Addr][]model.L4Addr{udpLBIP: {b1.L4Addr, b2.L4Addr}})
	mustApply(t, r, state(udpLB(false, b1)...))
	f.SetUDPFlowsErr(errors.New("read sluice6_ct_new: iteration aborted"))
	r = newUDPRetiring(f, c)
	if err := r.Restore(); err != nil {
		t.Fatal(err)
	}
	mustApply(t, r, state(udpLB(false, b1)...))
	want := []model.L4Addr{b1.L4Addr, b2.L4Addr}
	if rec := reconciler.UDPFlowRecords(r)[udpLBIP]; !rec.Held || !slices.Equal(rec.Backends, want) {
		t.Errorf("after the restart: record %+v, want %v held", rec, want)
	}
	if fl := f.Flushed(); len(fl) != 0 {
		t.Errorf("flushed %v at the first sync after the restart, want nothing", fl)
	}
}

// TestUDPStandbyHeldAfterRetry: the backends only a Service's standby
// set names (b3: serving, terminating) are held at a retirement even
// when the view lost its Service: after a restart whose first
// retirement failed (the flows Restore read kept for the retry), and
// after a rebuild of the view (the Service carried over a master the
// dump shows unchanged). Before, the first Apply dropped the restored
// flows whatever happened (and nothing kept b3's entry through the
// failed Apply), and a rebuild forgot every view's Service: b3 was
// deleted and flushed.
func TestUDPStandbyHeldAfterRetry(t *testing.T) {
	b1, b3 := be(5, 1, model.UDP), be(5, 3, model.UDP)
	// standby programs udpLB's ClusterIP and the LoadBalancer IP with
	// b1 serving and b3 standby (it served them before).
	standby := func(t *testing.T, f *fakedp.Fake, r *reconciler.Reconciler) {
		t.Helper()
		mustApply(t, r, state(append(udpLB(false, b1), lbService("dns", b1, b3))...))
		lb := lbService("dns", b1)
		lb.Standby = []model.L4Addr{b3.L4Addr}
		mustApply(t, r, state(append(udpLB(false, b1), lb)...))
		f.SetUDPFlows(map[model.L4Addr][]model.L4Addr{udpLBIP: {b1.L4Addr, b3.L4Addr}})
	}
	// retired checks that the LoadBalancer IP is retired and b3 held.
	retired := func(t *testing.T, f *fakedp.Fake) {
		t.Helper()
		if m, ok := masterOf(t, f, udpLBIP); !ok || m.Flags&reconciler.FlagRetired == 0 {
			t.Fatalf("master %+v (present %v), want it retired", m, ok)
		}
		if fl := f.Flushed(); len(fl) != 0 {
			t.Errorf("flushed %v at the retirement, want nothing (%s held for its flows)", fl, b3.L4Addr)
		}
		if got := backendAddrs(t, f); !slices.Contains(got, b3.L4Addr) {
			t.Errorf("backend entries %v, want %s held", got, b3.L4Addr)
		}
	}
	t.Run("RestoreRetireFailed", func(t *testing.T) {
		f, c := newFake(t), &retiredClock{t: time.Unix(1e9, 0)}
		standby(t, f, newUDPRetiring(f, c))
		r := newUDPRetiring(f, c)
		if err := r.Restore(); err != nil {
			t.Fatal(err)
		}
		f.Fail = func(op fakedp.Op) error {
			if op.Kind == fakedp.OpUpsertMaster && op.Frontend.L4Addr == udpLBIP {
				return errors.New("EIO")
			}
			return nil
		}
		if err := r.Apply(state(udpLB(false, b1)...)); err == nil {
			t.Fatal("Apply with the retired master's write failing: no error")
		}
		f.Fail = nil
		mustApply(t, r, state(udpLB(false, b1)...))
		retired(t, f)
	})
	t.Run("Rebuilt", func(t *testing.T) {
		f, c := newFake(t), &retiredClock{t: time.Unix(1e9, 0)}
		r := newUDPRetiring(f, c)
		standby(t, f, r)
		if err := reconciler.Refresh(r); err != nil {
			t.Fatal(err)
		}
		mustApply(t, r, state(udpLB(false, b1)...))
		retired(t, f)
	})
}

// TestUDPRestoredFlowsReleasedOutOfSync: the flows Restore read at a
// live master's address keep their backends' entries only for a
// retirement that failed and is retried: an Apply out of sync (a
// frontend refused for capacity, every time) drops the others all the
// same, and b3 (standby before the restart, named by nothing after it)
// is deleted and flushed. Before, they were dropped only once an Apply
// ended in sync: b3 held its entry as long as the refusals went on, and
// the frontend refused for want of it was refused for ever.
func TestUDPRestoredFlowsReleasedOutOfSync(t *testing.T) {
	b1, b3 := be(5, 1, model.UDP), be(5, 3, model.UDP)
	c1, c2, c3, c4 := be(6, 1, model.UDP), be(6, 2, model.UDP), be(6, 3, model.UDP), be(6, 4, model.UDP)
	// restart programs, in a backend map of 4, udpLB's ClusterIP and
	// the LoadBalancer IP with b1 serving and b3 standby (with flows at
	// the LoadBalancer IP to both), and restarts.
	restart := func(t *testing.T) (*fakedp.Fake, *reconciler.Reconciler) {
		t.Helper()
		f, c := newFakeSized(t, 32, 4, 1<<10), &retiredClock{t: time.Unix(1e9, 0)}
		r := newUDPRetiring(f, c)
		mustApply(t, r, state(append(udpLB(false, b1), lbService("dns", b1, b3))...))
		lb := lbService("dns", b1)
		lb.Standby = []model.L4Addr{b3.L4Addr}
		mustApply(t, r, state(append(udpLB(false, b1), lb)...))
		f.SetUDPFlows(map[model.L4Addr][]model.L4Addr{udpLBIP: {b1.L4Addr, b3.L4Addr}})
		r = newUDPRetiring(f, c)
		if err := r.Restore(); err != nil {
			t.Fatal(err)
		}
		return f, r
	}
	// released checks that b3's entry went, its flows flushed.
	released := func(t *testing.T, f *fakedp.Fake) {
		t.Helper()
		if got := backendAddrs(t, f); slices.Contains(got, b3.L4Addr) {
			t.Errorf("backend entries %v, want %s deleted (named by nothing)", got, b3.L4Addr)
		}
		if fl, want := f.Flushed(), []model.L4Addr{b3.L4Addr}; !slices.Equal(fl, want) {
			t.Errorf("flushed %v, want %v", fl, want)
		}
	}
	t.Run("InSyncBesideFailing", func(t *testing.T) {
		f, r := restart(t)
		// The LoadBalancer IP in sync (b1 only), and another Service
		// that needs more backend entries than are left.
		big := svc(model.L4Addr{Addr: vip(1).Addr, Port: 53, Proto: model.UDP}, "big", c1, c2, c3, c4)
		st := state(append(udpLB(false, b1), lbService("dns", b1), big)...)
		for i := range 2 {
			if err := r.Apply(st); !errors.Is(err, reconciler.ErrCapacity) {
				t.Fatalf("Apply %d: %v, want ErrCapacity", i+1, err)
			}
		}
		released(t, f)
	})
	t.Run("Failing", func(t *testing.T) {
		f, r := restart(t)
		// The LoadBalancer IP wants b1 and three more: they fit only
		// without b3.
		st := state(append(udpLB(false, b1), lbService("dns", b1, c1, c2, c3))...)
		if err := r.Apply(st); !errors.Is(err, reconciler.ErrCapacity) {
			t.Fatalf("first Apply: %v, want ErrCapacity (b3 held until its end)", err)
		}
		if err := r.Apply(st); err != nil {
			t.Fatalf("second Apply: %v, want b3's room", err)
		}
		checkProgrammed(t, f, st)
		released(t, f)
	})
}
