package reconciler_test

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
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
	if !r.LastApplyFull() {
		t.Error("a first program is not reported full (kubeproxy_sync_full_proxy_rules_duration_seconds)")
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
	if reconciler.IncrementalApplies(r) != inc+1 || r.LastApplyFull() {
		t.Errorf("the view was rebuilt: the Apply after the re-read was not incremental (reported full: %v)", r.LastApplyFull())
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

// randomDriftState is a random state of 3 to 10 frontends, IPv4 and
// IPv6, of every kind, with backends drawn from a few addresses (so that
// services share them), source ranges, two scopes and session affinity.
func randomDriftState(rng *rand.Rand) *model.State {
	st := model.NewState()
	for i := range 3 + rng.IntN(8) {
		fe := vip(i + 1)
		v6 := rng.IntN(4) == 0
		if v6 {
			fe.Addr = netip.AddrFrom16([16]byte{0xfd, 0, 15: byte(i + 1)})
		}
		pick := func() []model.Backend {
			var bs []model.Backend
			for range rng.IntN(5) {
				b := be(0, 1+rng.IntN(8), model.TCP)
				if v6 {
					b.Addr = netip.AddrFrom16([16]byte{0xfd, 1, 15: b.Addr.As4()[3]})
				}
				bs = append(bs, b)
			}
			return bs
		}
		s := svc(fe, fmt.Sprint("s", i), pick()...)
		s.Kind = []model.FrontendKind{model.ClusterIP, model.NodePort, model.LoadBalancer}[rng.IntN(3)]
		if s.Kind == model.LoadBalancer && rng.IntN(2) == 0 {
			s.SourceRanges = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
			if v6 {
				s.SourceRanges = []netip.Prefix{netip.MustParsePrefix("2001:db8::/32")}
			}
		}
		if s.Kind != model.ClusterIP && rng.IntN(3) == 0 {
			s.ExternalLocal, s.TwoScopes = true, true
			s.InternalBackends = model.SortBackends(pick())
		}
		if rng.IntN(4) == 0 {
			s.AffinityTimeout = time.Hour
		}
		st.Services.Set(fe, s)
	}
	return st
}

// randomDrift changes ks as 1 to 8 changes of TestRecheckFindsDrift's
// kinds would, on entries chosen at random: some of what it writes names
// what other entries name (a backend address another id holds, a
// frontend another rev_nat entry is for, a master's service id).
func randomDrift(rng *rand.Rand, ks *reconciler.KernelState) {
	pickKey := func(keys []reconciler.Frontend) (reconciler.Frontend, bool) {
		if len(keys) == 0 {
			return reconciler.Frontend{}, false
		}
		slices.SortFunc(keys, reconciler.Frontend.Compare)
		return keys[rng.IntN(len(keys))], true
	}
	masters := func() []reconciler.Frontend { return slices.Collect(maps.Keys(ks.Masters)) }
	backendIDs := slices.Sorted(maps.Keys(ks.Backends))
	anyBackend := func() reconciler.BackendID {
		if len(backendIDs) == 0 || rng.IntN(5) == 0 {
			return reconciler.BackendID(500 + rng.IntN(3))
		}
		return backendIDs[rng.IntN(len(backendIDs))]
	}
	anyAddr := func() model.L4Addr {
		if len(backendIDs) > 0 && rng.IntN(2) == 0 {
			return ks.Backends[backendIDs[rng.IntN(len(backendIDs))]]
		}
		return be(0, 1+rng.IntN(10), model.TCP).L4Addr
	}
	anyFrontend := func() reconciler.Frontend {
		if fe, ok := pickKey(masters()); ok && rng.IntN(2) == 0 {
			return fe
		}
		return reconciler.DefaultScope(vip(20 + rng.IntN(3)))
	}
	for range 1 + rng.IntN(8) {
		switch rng.IntN(17) {
		case 0: // master changed
			if fe, ok := pickKey(masters()); ok {
				m := ks.Masters[fe]
				switch rng.IntN(3) {
				case 0:
					m.Flags ^= 0x80
				case 1:
					m.Count++
				default:
					m.ID = ks.Masters[anyFrontend()].ID
				}
				ks.Masters[fe] = m
			}
		case 1: // master removed
			if fe, ok := pickKey(masters()); ok {
				delete(ks.Masters, fe)
			}
		case 2: // extra master
			if fe, ok := pickKey(masters()); ok {
				ks.Masters[reconciler.DefaultScope(vip(20+rng.IntN(3)))] = ks.Masters[fe]
			}
		case 3, 4, 5: // slot changed, removed, extra
			fe, ok := pickKey(slices.Collect(maps.Keys(ks.Slots)))
			if !ok {
				continue
			}
			slots := ks.Slots[fe]
			ss := slices.Sorted(maps.Keys(slots))
			if len(ss) == 0 {
				continue
			}
			s := ss[rng.IntN(len(ss))]
			switch rng.IntN(3) {
			case 0:
				slots[s] = anyBackend()
			case 1:
				delete(slots, s)
			default:
				slots[ss[len(ss)-1]+1] = anyBackend()
			}
		case 6: // backend changed
			if len(backendIDs) > 0 {
				ks.Backends[backendIDs[rng.IntN(len(backendIDs))]] = anyAddr()
			}
		case 7: // backend removed
			if len(backendIDs) > 0 {
				delete(ks.Backends, backendIDs[rng.IntN(len(backendIDs))])
			}
		case 8: // extra backend
			ks.Backends[reconciler.BackendID(500+rng.IntN(3))] = anyAddr()
		case 9, 10: // rev_nat changed, removed
			ids := slices.Sorted(maps.Keys(ks.RevNat))
			if len(ids) == 0 {
				continue
			}
			id := ids[rng.IntN(len(ids))]
			if rng.IntN(2) == 0 {
				ks.RevNat[id] = anyFrontend()
			} else {
				delete(ks.RevNat, id)
			}
		case 11: // extra rev_nat
			ks.RevNat[reconciler.ServiceID(300+rng.IntN(3))] = anyFrontend()
		case 12, 13: // source range changed or removed, extra
			fe := anyFrontend().L4Addr
			if ps := ks.SourceRanges[fe]; len(ps) > 0 && rng.IntN(2) == 0 {
				ks.SourceRanges[fe] = ps[1:]
			} else if fe.Addr.Is4() {
				ks.SourceRanges[fe] = append(ps, netip.MustParsePrefix("203.0.113.0/24"))
			}
		case 14: // service IP removed
			if len(ks.ServiceIPs) > 0 {
				i := rng.IntN(len(ks.ServiceIPs))
				ks.ServiceIPs = slices.Delete(ks.ServiceIPs, i, i+1)
			}
		case 15: // extra service IP
			if a := anyFrontend().Addr; !slices.Contains(ks.ServiceIPs, a) {
				ks.ServiceIPs = append(ks.ServiceIPs, a)
			}
		case 16: // a whole frontend's slots removed
			if fe, ok := pickKey(slices.Collect(maps.Keys(ks.Slots))); ok {
				delete(ks.Slots, fe)
			}
		}
	}
	if ks.SourceRanges == nil {
		ks.SourceRanges = map[model.L4Addr][]netip.Prefix{}
	}
}

// canonical prints ks with every id replaced by what it names: a
// master's service id by its rev_nat entry's frontend, a slot's backend
// id by the backend's address. Two maps programmed alike under other ids
// print the same.
func canonical(ks *reconciler.KernelState) string {
	var lines []string
	for fe, m := range ks.Masters {
		rn, ok := ks.RevNat[m.ID]
		lines = append(lines, fmt.Sprintf("master %s rev_nat=%v/%s count=%d flags=%#x affinity=%d", fe, ok, rn, m.Count, m.Flags, m.AffinityTimeout))
	}
	for fe, slots := range ks.Slots {
		for s, id := range slots {
			a, ok := ks.Backends[id]
			lines = append(lines, fmt.Sprintf("slot %s %d %v/%s", fe, s, ok, a))
		}
	}
	for _, a := range ks.Backends {
		lines = append(lines, "backend "+a.String())
	}
	for _, fe := range ks.RevNat {
		lines = append(lines, "rev_nat "+fe.String())
	}
	for fe, ps := range ks.SourceRanges {
		for _, p := range ps {
			lines = append(lines, fmt.Sprintf("range %s %s", fe, p))
		}
	}
	for _, a := range ks.ServiceIPs {
		lines = append(lines, "ip "+a.String())
	}
	slices.SortFunc(lines, cmp.Compare)
	return strings.Join(lines, "\n")
}

// TestRepairMatchesRebuild: random states (frontends of every kind, both
// families, sharing backends), drifted by 1 to 8 random changes of the
// maps of every kind, some naming what other entries name. The re-read
// brings the drift into the view entry by entry and makes the view a
// rebuild from a dump makes; the Apply then leaves the maps as after a
// rebuild, repaired, and so does the Apply of another state after it.
// Maps programmed alike may differ in an id the Apply allocated: the
// repair keeps the id allocators as they were, where a rebuild made them
// anew from the ids in the maps; then what the ids name must match.
func TestRepairMatchesRebuild(t *testing.T) {
	seeds := uint64(300)
	if testing.Short() {
		seeds = 50
	}
	otherIDs := 0
	for seed := range seeds {
		rng := rand.New(rand.NewPCG(seed, 14))
		st, next := randomDriftState(rng), randomDriftState(rng)
		var fs [2]*fakedp.Fake
		var rs [2]*reconciler.Reconciler
		var ks *reconciler.KernelState
		for i := range 2 {
			fs[i] = fakedp.New(1<<16, 1<<20, 1<<20)
			rs[i] = reconciler.New(fs[i], nil)
			mustApply(t, rs[i], st)
			if i == 0 {
				ks, _ = fs[0].Dump()
				randomDrift(rng, ks)
			}
			fs[i].Seed(ks)
		}
		reconciler.RebuildOnDrift(rs[1])
		outcome, err := reconciler.RecheckNow(rs[0])
		if err != nil || outcome == "rebuilt" {
			t.Fatalf("seed %d: re-read %s (%v), want the drift repaired entry by entry", seed, outcome, err)
		}
		if _, err := reconciler.RecheckNow(rs[1]); err != nil {
			t.Fatal(err)
		}
		if got, want := reconciler.ViewString(rs[0]), reconciler.ViewString(rs[1]); got != want {
			t.Fatalf("seed %d: maps\n%s\nthe view the repair made:\n%s\na rebuild's:\n%s", seed, ks, got, want)
		}
		for round, s := range []*model.State{st, next} {
			for i := range 2 {
				mustApply(t, rs[i], s)
			}
			got, _ := fs[0].Dump()
			want, _ := fs[1].Dump()
			if got.String() != want.String() {
				if canonical(got) != canonical(want) {
					t.Fatalf("seed %d, round %d: drift\n%s\nmaps after the repair:\n%s\nafter a rebuild:\n%s", seed, round, ks, got, want)
				}
				otherIDs++
			}
			checkProgrammed(t, fs[0], s)
			if v := fs[0].Check(); len(v) > 0 {
				t.Fatalf("seed %d, round %d: %v", seed, round, v)
			}
			if !reconciler.MapsMatchView(rs[0]) {
				t.Fatalf("seed %d, round %d: the maps do not match the view", seed, round)
			}
		}
	}
	t.Logf("%d of %d Applies allocated other ids than after a rebuild", otherIDs, 2*seeds)
}

// TestRecheckRebuildsMassDrift: maps that drifted in more entries than a
// re-read repairs one by one (emptied, or filled with entries nobody
// wrote) have the view rebuilt from a dump, with the refresh hook around
// it, and are repaired all the same.
func TestRecheckRebuildsMassDrift(t *testing.T) {
	for _, c := range []struct {
		name   string
		tamper func(ks *reconciler.KernelState)
	}{
		{"emptied", func(ks *reconciler.KernelState) { *ks = reconciler.KernelState{} }},
		{"extra backends", func(ks *reconciler.KernelState) {
			for i := range 5000 {
				ks.Backends[reconciler.BackendID(20000+i)] = be(200+i/250, 1+i%250, model.UDP).L4Addr
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := fakedp.New(1<<16, 1<<20, 1<<20) // its invariants checked at the end: at every write, 5,000 entries are slow
			r, d, hooks := hooked(f)
			st := bigState(500, 10)
			mustApply(t, r, st)
			ks, _ := f.Dump()
			c.tamper(ks)
			f.Seed(ks)
			refreshNow(r)
			mustApply(t, r, st)
			checkRebuilt(t, r, f, st, d.dumps, *hooks)
		})
	}
}

// walkHook is a datapath that calls before(n) ahead of its n-th Walk,
// and whose next walk fails if fail is set.
type walkHook struct {
	reconciler.Datapath
	walks  int
	before func(n int)
	fail   bool
}

func (w *walkHook) Walk(v reconciler.KernelVisitor) error {
	w.walks++
	w.before(w.walks)
	if w.fail {
		w.fail = false
		return errors.New("injected")
	}
	return w.Datapath.Walk(v)
}

// TestRecheckRebuildsWhenMapsMoveBetweenWalks: a slot deleted behind the
// reconciler's back, and another one between the re-read's two walks:
// the second walk finds two missing where the first counted one, and the
// view is rebuilt from a dump (the hook around it), then repaired.
func TestRecheckRebuildsWhenMapsMoveBetweenWalks(t *testing.T) {
	f := fakedp.New(1<<16, 1<<20, 1<<20)
	fe := reconciler.DefaultScope(vip(1))
	w := &walkHook{Datapath: f, before: func(int) {}}
	r, d, hooks := hooked(w)
	st := bigState(4, 3)
	mustApply(t, r, st)
	if err := f.DeleteSlot(fe, 3); err != nil {
		t.Fatal(err)
	}
	w.walks = 0
	w.before = func(n int) {
		if n == 2 {
			if err := f.DeleteSlot(fe, 2); err != nil {
				t.Fatal(err)
			}
		}
	}
	refreshNow(r)
	mustApply(t, r, st)
	checkRebuilt(t, r, f, st, d.dumps, *hooks)
}

// hooked returns a reconciler over dp, its dumps counted, and the calls
// of its refresh hook.
func hooked(dp reconciler.Datapath) (*reconciler.Reconciler, *dumpCounter, *int) {
	d := &dumpCounter{Datapath: dp}
	r := reconciler.New(d, nil)
	hooks := new(int)
	r.SetRefreshHook(func() { *hooks++ })
	return r, d, hooks
}

// checkRebuilt checks that r's last Apply rebuilt its view from one dump
// (dumps), with the refresh hook around it (hooks), and left f holding
// st, as the view says.
func checkRebuilt(t *testing.T, r *reconciler.Reconciler, f *fakedp.Fake, st *model.State, dumps, hooks int) {
	t.Helper()
	if dumps != 1 || hooks != 2 || reconciler.Repairs(r) != 0 {
		t.Errorf("dumps %d, hook calls %d, repairs %d: want the view rebuilt from one dump, the hook around it",
			dumps, hooks, reconciler.Repairs(r))
	}
	checkProgrammed(t, f, st)
	if v := f.Check(); len(v) > 0 {
		t.Errorf("after the repair: %d violations, the first %s", len(v), v[0])
	}
	if !reconciler.MapsMatchView(r) {
		t.Error("the maps do not match the view after the repair")
	}
}
