package reconciler_test

import (
	"bytes"
	"log/slog"
	"net/netip"
	"strings"
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

// driftCase is a way to change the maps behind the reconciler's back:
// tamper changes a dump of recheckState's maps, which are then seeded
// with it.
type driftCase struct {
	name   string
	tamper func(ks *reconciler.KernelState)
}

// driftCases are an entry of each kind changed, removed and added: 18.
func driftCases() []driftCase {
	fe := reconciler.DefaultScope(vip(1))
	lbFE := lb(1, "", nil).Frontend
	return []driftCase{
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
	}
}

// drifted returns a reconciler that programmed recheckState into a fake,
// whose maps then drifted as c says (behind its back), with the re-read
// due at its next Apply, and the fake and the dumps it was asked for (its
// invariants checked at the end of the test if repaired). A
// reference one (rebuild) rebuilds its view from a dump on any drift, as
// every re-read that found drift did before the repair entry by entry.
func drifted(t *testing.T, c driftCase, rebuild, repaired bool) (*reconciler.Reconciler, *fakedp.Fake, *dumpCounter) {
	return driftedLogging(t, c, rebuild, repaired, nil)
}

// driftedLogging is drifted with a reconciler that logs to log.
func driftedLogging(t *testing.T, c driftCase, rebuild, repaired bool, log *slog.Logger) (*reconciler.Reconciler, *fakedp.Fake, *dumpCounter) {
	t.Helper()
	f := newFake(t)
	if c.name == "backend removed" || !repaired {
		// Removing a backend a slot names breaks the fake's
		// invariants, which its next write reports: the fake checks
		// none in that case, nor when the test leaves it unrepaired.
		f = fakedp.New(1<<16, 1<<20, 1<<20)
	}
	d := &dumpCounter{Datapath: f}
	r := reconciler.New(d, log)
	if rebuild {
		reconciler.RebuildOnDrift(r)
	}
	mustApply(t, r, recheckState())
	ks, err := f.Dump()
	if err != nil {
		t.Fatal(err)
	}
	c.tamper(ks)
	f.Seed(ks)
	refreshNow(r)
	return r, f, d
}

// TestRecheckFindsDrift: every kind of entry changed, removed or added
// behind the reconciler's back is found by the re-read, which brings
// what the maps hold for it into the view (no dump, no hook): the view
// it makes is the one a rebuild from a dump made (the reference), and
// the next Apply leaves the maps exactly as after that rebuild, repaired.
func TestRecheckFindsDrift(t *testing.T) {
	for _, c := range driftCases() {
		t.Run(c.name, func(t *testing.T) {
			st := recheckState()
			// The view the re-read makes, against a rebuild's.
			r, _, _ := drifted(t, c, false, false)
			ref, _, _ := drifted(t, c, true, false)
			if reconciler.MapsMatchView(r) {
				t.Fatal("drift not found")
			}
			for _, x := range []struct {
				r    *reconciler.Reconciler
				want string
			}{{r, "repaired"}, {ref, "rebuilt"}} {
				if got, err := reconciler.RecheckNow(x.r); err != nil || got != x.want {
					t.Fatalf("re-read: %s (%v), want %s", got, err, x.want)
				}
			}
			if got, want := reconciler.ViewString(r), reconciler.ViewString(ref); got != want {
				t.Errorf("the view the repair made:\n%s\nthe view a rebuild from a dump made:\n%s", got, want)
			}
			if !reconciler.MapsMatchView(r) {
				t.Error("the maps do not match the view the repair made")
			}

			// Re-read and repaired by an Apply, against the reference.
			var logged bytes.Buffer
			r, f, d := driftedLogging(t, c, false, true, slog.New(slog.NewTextHandler(&logged, nil)))
			hooks := 0
			r.SetRefreshHook(func() { hooks++ })
			ref, fref, dref := drifted(t, c, true, true)
			mustApply(t, r, st)
			mustApply(t, ref, st)
			if d.dumps != 0 || hooks != 0 || reconciler.Repairs(r) != 1 || reconciler.Rechecks(r) != 0 {
				t.Errorf("dumps %d, hook calls %d, repairs %d, rechecks %d: want the drift repaired entry by entry, once",
					d.dumps, hooks, reconciler.Repairs(r), reconciler.Rechecks(r))
			}
			if line := logged.String(); !strings.Contains(line, "Datapath maps drifted from the reconciler's view, repairing the entries that differ") {
				t.Errorf("the repair logged %q, want a line saying the maps drifted", line)
			}
			if dref.dumps != 1 {
				t.Errorf("the reference dumped the maps %d times, want 1", dref.dumps)
			}
			if got, want := f.String(), fref.String(); got != want {
				t.Errorf("maps after the repair:\n%s\nafter a rebuild from a dump:\n%s", got, want)
			}
			if got, want := reconciler.ViewString(r), reconciler.ViewString(ref); got != want {
				t.Errorf("view after the repair:\n%s\nafter a rebuild from a dump:\n%s", got, want)
			}
			if got, want := r.Stats(), ref.Stats(); got.Services != want.Services || got.Backends != want.Backends ||
				got.ServiceEntries != want.ServiceEntries || got.RevNat != want.RevNat ||
				got.SourceRanges != want.SourceRanges || got.ServiceIPs != want.ServiceIPs || got.Backends6 != want.Backends6 {
				t.Errorf("stats after the repair %+v, after a rebuild %+v", got, want)
			}
			checkProgrammed(t, f, st)
			if v := f.Check(); len(v) != 0 && c.name != "backend removed" {
				t.Errorf("after the repair: %v", v)
			}
			if !reconciler.MapsMatchView(r) {
				t.Error("the maps do not match the view after the repair")
			}
			restartWritesNothing(t, f, st)
		})
	}
}
