package reconciler_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
	"github.com/sluice-lb/sluice/pkg/reconciler/fakedp"
)

// recheckState is ClusterIPs (service IPs), a LoadBalancer with source
// ranges and an IPv6 frontend: every map the re-read compares.
func recheckState() *model.State {
	st := bigState(4, 3)
	st.Services.Set(lb(1, "lb", []string{"192.0.2.0/24", "198.51.100.7/32"}, be(20, 1, model.TCP)).Frontend,
		lb(1, "lb", []string{"192.0.2.0/24", "198.51.100.7/32"}, be(20, 1, model.TCP)))
	v6 := model.L4Addr{Addr: netip.MustParseAddr("fd00::96:1"), Port: 80, Proto: model.TCP}
	st.Services.Set(v6, svc(v6, "six",
		model.Backend{L4Addr: model.L4Addr{Addr: netip.MustParseAddr("fd00::1:1"), Port: 8080, Proto: model.TCP}},
		model.Backend{L4Addr: model.L4Addr{Addr: netip.MustParseAddr("fd00::1:2"), Port: 8080, Proto: model.TCP}}))
	return st
}

// refreshNow makes r's next Apply re-read the maps.
func refreshNow(r *reconciler.Reconciler) {
	r.SetRefreshInterval(time.Nanosecond)
	time.Sleep(time.Millisecond)
}

// TestRecheckWithoutDrift: a re-read of maps that hold what the view says
// compares them as it walks them: no dump, no hook, no write, the view
// kept (the next Apply of a state made from the last one is still
// incremental), and next to no allocation.
func TestRecheckWithoutDrift(t *testing.T) {
	f := newFake(t)
	d := &dumpCounter{Datapath: f}
	r := reconciler.New(d, nil)
	hooks := 0
	r.SetRefreshHook(func() { hooks++ })
	st := recheckState()
	st.Gen = model.NewGeneration()
	mustApply(t, r, st)
	if !reconciler.MapsMatchView(r) {
		t.Fatal("the maps do not match the view right after an Apply")
	}
	f.ResetCounts()
	refreshNow(r)
	next := &model.State{Services: st.Services, Gen: model.NewGeneration(), BaseGen: st.Gen}
	inc := reconciler.IncrementalApplies(r)
	mustApply(t, r, next)
	if d.dumps != 0 || hooks != 0 || f.Writes() != 0 {
		t.Errorf("re-read without drift: %d dumps, %d hook calls, %d writes; want none", d.dumps, hooks, f.Writes())
	}
	if reconciler.Rechecks(r) != 1 || f.Walks() < 2 {
		t.Errorf("rechecks %d, walks %d: the re-read did not walk the maps", reconciler.Rechecks(r), f.Walks())
	}
	if reconciler.IncrementalApplies(r) != inc+1 {
		t.Error("the view was rebuilt: the Apply after the re-read was not incremental")
	}
	checkProgrammed(t, f, st)

	if raceEnabled {
		return // the race detector's build allocates in places
	}
	big := bigState(1000, 10)
	r2 := reconciler.New(fakedp.New(1<<16, 1<<20, 1<<20), nil)
	mustApply(t, r2, big)
	allocs := testing.AllocsPerRun(5, func() {
		if !reconciler.MapsMatchView(r2) {
			t.Fatal("drift found in untouched maps")
		}
	})
	t.Logf("%.0f allocations a re-read of 1,000 x 10", allocs)
	// A dump and a view of 1,000 x 10 make thousands.
	if allocs > 20 {
		t.Errorf("a re-read of 1,000 Services x 10 without drift allocates %.0f times, want at most 20", allocs)
	}
}

// TestRecheckFindsDrift: every kind of entry changed, removed or added
// behind the reconciler's back is found by the re-read, which then
// rebuilds the view from a dump (calling the hook around it) as the
// re-read always did, and the next Apply repairs it.
func TestRecheckFindsDrift(t *testing.T) {
	fe := reconciler.DefaultScope(vip(1))
	lbFE := lb(1, "", nil).Frontend
	for _, c := range []struct {
		name   string
		tamper func(ks *reconciler.KernelState)
	}{
		{"master changed", func(ks *reconciler.KernelState) {
			m := ks.Masters[fe]
			m.Flags ^= 0x80
			ks.Masters[fe] = m
		}},
		{"master removed", func(ks *reconciler.KernelState) { delete(ks.Masters, fe) }},
		{"extra master", func(ks *reconciler.KernelState) {
			ks.Masters[reconciler.DefaultScope(vip(99))] = ks.Masters[fe]
		}},
		{"slot changed", func(ks *reconciler.KernelState) { ks.Slots[fe][1], ks.Slots[fe][2] = ks.Slots[fe][2], ks.Slots[fe][1] }},
		{"slot removed", func(ks *reconciler.KernelState) { delete(ks.Slots[fe], 3) }},
		{"extra slot", func(ks *reconciler.KernelState) { ks.Slots[fe][4] = ks.Slots[fe][1] }},
		{"backend changed", func(ks *reconciler.KernelState) {
			id := ks.Slots[fe][1]
			ks.Backends[id] = be(9, 9, model.UDP).L4Addr
		}},
		{"backend removed", func(ks *reconciler.KernelState) { delete(ks.Backends, ks.Slots[fe][1]) }},
		{"extra backend", func(ks *reconciler.KernelState) { ks.Backends[777] = be(9, 9, model.UDP).L4Addr }},
		{"rev_nat changed", func(ks *reconciler.KernelState) {
			ks.RevNat[ks.Masters[fe].ID] = reconciler.DefaultScope(vip(98))
		}},
		{"rev_nat removed", func(ks *reconciler.KernelState) { delete(ks.RevNat, ks.Masters[fe].ID) }},
		{"extra rev_nat", func(ks *reconciler.KernelState) { ks.RevNat[999] = reconciler.DefaultScope(vip(98)) }},
		{"source range changed", func(ks *reconciler.KernelState) {
			ks.SourceRanges[lbFE][0] = netip.MustParsePrefix("203.0.113.0/24")
		}},
		{"source range removed", func(ks *reconciler.KernelState) { ks.SourceRanges[lbFE] = ks.SourceRanges[lbFE][:1] }},
		{"extra source range", func(ks *reconciler.KernelState) {
			ks.SourceRanges[vip(2)] = []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}
		}},
		{"service IP removed", func(ks *reconciler.KernelState) { ks.ServiceIPs = ks.ServiceIPs[1:] }},
		{"extra service IP", func(ks *reconciler.KernelState) {
			ks.ServiceIPs = append(ks.ServiceIPs, netip.MustParseAddr("10.96.200.1"))
		}},
		{"IPv6 master changed", func(ks *reconciler.KernelState) {
			six := reconciler.DefaultScope(model.L4Addr{Addr: netip.MustParseAddr("fd00::96:1"), Port: 80, Proto: model.TCP})
			m := ks.Masters[six]
			m.Count = 1
			ks.Masters[six] = m
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			// Removing a backend a slot names breaks the fake's
			// invariants, which its next write reports: the fake
			// checks none in that case.
			broken := c.name == "backend removed"
			f := newFake(t)
			if broken {
				f = fakedp.New(1<<16, 1<<20, 1<<20)
			}
			d := &dumpCounter{Datapath: f}
			r := reconciler.New(d, nil)
			var hooks []int // the dumps each hook call saw
			r.SetRefreshHook(func() { hooks = append(hooks, d.dumps) })
			st := recheckState()
			mustApply(t, r, st)
			ks, err := f.Dump()
			if err != nil {
				t.Fatal(err)
			}
			c.tamper(ks)
			f.Seed(ks)
			if reconciler.MapsMatchView(r) {
				t.Fatal("drift not found")
			}
			refreshNow(r)
			mustApply(t, r, st)
			if d.dumps != 1 || len(hooks) != 2 || hooks[0] != 0 || hooks[1] != 1 || reconciler.Rechecks(r) != 0 {
				t.Errorf("dumps %d, hook calls saw %v dumps, rechecks %d: want the view rebuilt from one dump, the hook around it",
					d.dumps, hooks, reconciler.Rechecks(r))
			}
			checkProgrammed(t, f, st)
			if v := f.Check(); len(v) != 0 && !broken {
				t.Errorf("after the repair: %v", v)
			}
			if !reconciler.MapsMatchView(r) {
				t.Error("the maps do not match the view after the repair")
			}
			restartWritesNothing(t, f, st)
		})
	}
}
