package reconciler_test

import (
	"cmp"
	"fmt"
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
			d := &dumpCounter{Datapath: f}
			r := reconciler.New(d, nil)
			hooks := 0
			r.SetRefreshHook(func() { hooks++ })
			st := bigState(500, 10)
			mustApply(t, r, st)
			ks, _ := f.Dump()
			c.tamper(ks)
			f.Seed(ks)
			refreshNow(r)
			mustApply(t, r, st)
			if d.dumps != 1 || hooks != 2 || reconciler.Repairs(r) != 0 {
				t.Errorf("dumps %d, hook calls %d, repairs %d: want the view rebuilt from one dump, the hook around it",
					d.dumps, hooks, reconciler.Repairs(r))
			}
			checkProgrammed(t, f, st)
			if v := f.Check(); len(v) > 0 {
				t.Errorf("after the repair: %d violations, the first %s", len(v), v[0])
			}
			if !reconciler.MapsMatchView(r) {
				t.Error("the maps do not match the view after the repair")
			}
		})
	}
}

// walkHook is a datapath that calls before(n) ahead of its n-th Walk.
type walkHook struct {
	reconciler.Datapath
	walks  int
	before func(n int)
}

func (w *walkHook) Walk(v reconciler.KernelVisitor) error {
	w.walks++
	w.before(w.walks)
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
	d := &dumpCounter{Datapath: w}
	r := reconciler.New(d, nil)
	hooks := 0
	r.SetRefreshHook(func() { hooks++ })
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
	if d.dumps != 1 || hooks != 2 || reconciler.Repairs(r) != 0 {
		t.Errorf("dumps %d, hook calls %d, repairs %d: want the view rebuilt from one dump, the hook around it",
			d.dumps, hooks, reconciler.Repairs(r))
	}
	checkProgrammed(t, f, st)
	if v := f.Check(); len(v) > 0 {
		t.Errorf("after the repair: %v", v)
	}
}
