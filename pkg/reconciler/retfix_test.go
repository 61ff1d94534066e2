package reconciler_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
	"github.com/sluice-lb/sluice/pkg/reconciler/fakedp"
)

// fullOfServices returns n TCP Services, one backend each, at vip(1..n).
func fullOfServices(n int) []*model.Service {
	out := make([]*model.Service, n)
	for i := range out {
		out[i] = svc(vip(i+1), fmt.Sprintf("s%d", i+1), be(i+1, 1, model.TCP))
	}
	return out
}

// TestRetiredFreedForNewService: with the service maps full, a Service
// deleted and another created in one Apply succeeds: the capacity check
// deletes the retired master (its time not up) with its rev_nat entry
// first. Also with the new frontends batched (programFresh), and at the
// first Apply past the timeout, where phase 1 deletes the expired master
// and its rev_nat entry would go only in phase 3. Without freeRetired
// each Apply fails with ErrCapacity ("64 in use of 64").
func TestRetiredFreedForNewService(t *testing.T) {
	for _, tc := range []struct {
		name    string
		batched bool
		after   time.Duration // from the retirement to the Apply that adds
		retired bool          // a retired master between the two
	}{
		{"single", false, 30 * time.Minute, true},
		{"batched", true, 30 * time.Minute, true},
		{"past the timeout", false, 2 * time.Hour, true},
		{"removed and added at once", false, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 64
			f, c := newFakeSized(t, n, 1<<10, 1<<10), &retiredClock{t: time.Unix(1e9, 0)}
			r := newRetiring(f, c)
			all := fullOfServices(n)
			mustApply(t, r, state(all...))
			gone := all[0].Frontend
			keep := all[1:]
			if tc.retired {
				mustApply(t, r, state(keep...))
				if m, ok := masterOf(t, f, gone); !ok || m.Flags&reconciler.FlagRetired == 0 {
					t.Fatalf("master of the removed Service: %+v (present %v), want a retired one", m, ok)
				}
				c.t = c.t.Add(tc.after)
			}
			added := []*model.Service{svc(vip(1000), "new", be(1000, 1, model.TCP))}
			if tc.batched {
				reconciler.SetBatchMin(r, 1)
				added = append(added, svc(vip(1001), "new2", be(1001, 1, model.TCP)))
				keep = keep[1:] // room for two: one more Service goes
			}
			mustApply(t, r, state(append(keep, added...)...))
			if m, ok := masterOf(t, f, gone); ok {
				t.Fatalf("the removed Service's master is still there: %+v", m)
			}
			if got := len(r.Retired()); got != 0 {
				t.Fatalf("%d retired masters after the new Service needed the room, want 0", got)
			}
			for _, s := range added {
				if m, ok := masterOf(t, f, s.Frontend); !ok || m.Count != 1 {
					t.Fatalf("the new Service %s: master %+v (present %v), want count 1", s.Frontend, m, ok)
				}
			}
		})
	}
}

// TestRetiredFreedOnlyWhenFull: with room left, a retired master stays
// when a new Service is created.
func TestRetiredFreedOnlyWhenFull(t *testing.T) {
	f, c := newFakeSized(t, 64, 1<<10, 1<<10), &retiredClock{t: time.Unix(1e9, 0)}
	r := newRetiring(f, c)
	all := fullOfServices(10)
	mustApply(t, r, state(all...))
	mustApply(t, r, state(all[1:]...))
	mustApply(t, r, state(append(all[1:], svc(vip(1000), "new", be(1000, 1, model.TCP)))...))
	if m, ok := masterOf(t, f, all[0].Frontend); !ok || m.Flags&reconciler.FlagRetired == 0 {
		t.Fatalf("master of the removed Service: %+v (present %v), want it still retired", m, ok)
	}
}

// TestRetiredPartialFinished: a retirement whose slot deletes fail (the
// master written retired, its slots left) is finished by the next Apply,
// which keeps the retired master and deletes the slots. Fails with
// removeFrontend returning at once for a retired master it keeps.
func TestRetiredPartialFinished(t *testing.T) {
	f, c := newFake(t), &retiredClock{t: time.Unix(1e9, 0)}
	r := newRetiring(f, c)
	fe, other := vip(1), vip(2)
	s := svc(fe, "web", be(1, 1, model.TCP), be(1, 2, model.TCP))
	keep := svc(other, "other", be(2, 1, model.TCP))
	mustApply(t, r, state(s, keep))
	live, _ := masterOf(t, f, fe)

	f.Fail = func(op fakedp.Op) error {
		if op.Kind == fakedp.OpDeleteSlot && op.Slot > 0 && op.Frontend.L4Addr == fe {
			return errors.New("injected")
		}
		return nil
	}
	if err := r.Apply(state(keep)); err == nil {
		t.Fatal("Apply with the slot deletes failing succeeded")
	}
	slots := func() map[uint32]reconciler.BackendID {
		ks, err := f.Dump()
		if err != nil {
			t.Fatal(err)
		}
		return ks.Slots[reconciler.DefaultScope(fe)]
	}
	if m, ok := masterOf(t, f, fe); !ok || m.Flags&reconciler.FlagRetired == 0 || len(slots()) == 0 {
		t.Fatalf("after the failed retirement: master %+v (present %v), slots %v; want retired, slots left", m, ok, slots())
	}
	f.Fail = nil
	mustApply(t, r, state(keep))
	if m, ok := masterOf(t, f, fe); !ok || m.ID != live.ID || m.Flags&reconciler.FlagRetired == 0 {
		t.Fatalf("after the next Apply: master %+v (present %v), want it still retired under %d", m, ok, live.ID)
	}
	if got := slots(); len(got) != 0 {
		t.Fatalf("after the next Apply: slots %v of the retired master left", got)
	}
}

// TestRetiredTimeKeptAcrossRecheck: a re-read of the maps that finds
// drift keeps a retired master's time, whether it rebuilds the view from
// a dump or repairs the drifted master (itself rewritten, still retired):
// its timeout is not restarted. Fails with the view rebuilt or the
// master repaired timed from the re-read.
func TestRetiredTimeKeptAcrossRecheck(t *testing.T) {
	for _, rebuild := range []bool{true, false} {
		t.Run(fmt.Sprintf("rebuild=%v", rebuild), func(t *testing.T) {
			f, c := newFake(t), &retiredClock{t: time.Unix(1e9, 0)}
			r := newRetiring(f, c)
			if rebuild {
				reconciler.RebuildOnDrift(r)
			}
			fe, other := vip(1), vip(2)
			s := svc(fe, "web", be(1, 1, model.TCP))
			s.Kind = model.NodePort
			keep := svc(other, "other", be(2, 1, model.TCP))
			mustApply(t, r, state(s, keep))
			mustApply(t, r, state(keep))
			at := r.Retired()[reconciler.DefaultScope(fe)]
			if at.IsZero() {
				t.Fatal("not retired")
			}
			c.t = c.t.Add(30 * time.Minute)
			// Drift: the retired master rewritten behind the agent's
			// back, still retired (FlagExternal lost).
			m, _ := masterOf(t, f, fe)
			m.Flags &^= reconciler.FlagExternal
			if err := f.UpsertMaster(reconciler.DefaultScope(fe), m); err != nil {
				t.Fatal(err)
			}
			want := "repaired"
			if rebuild {
				want = "rebuilt"
			}
			if got, err := reconciler.RecheckNow(r); err != nil || got != want {
				t.Fatalf("RecheckNow = %q, %v; want %q", got, err, want)
			}
			if got := r.Retired()[reconciler.DefaultScope(fe)]; !got.Equal(at) {
				t.Fatalf("retired at %v after the re-read, want %v (from the retirement)", got, at)
			}
		})
	}
}

// TestRetiredKeptWhenFreeingCannotHelp: a frontend that would not fit
// even with every retired master freed (its backends are short, or it
// is larger than the map) leaves the retired masters their flows: the
// capacity check frees them only when that makes the frontend fit.
// Before, any shortage freed them all, for nothing.
func TestRetiredKeptWhenFreeingCannotHelp(t *testing.T) {
	many := func(i, n int) []model.Backend {
		bs := make([]model.Backend, n)
		for j := range bs {
			bs[j] = be(i, j+1, model.TCP)
		}
		return bs
	}
	for _, tc := range []struct {
		name     string
		backends int
		sameTime bool // the Service removed in the Apply that adds the big one
		big      int  // backends of the Service that does not fit
	}{
		{"backends short", 10, false, 2},
		{"larger than the map, removed at once", 16, true, 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, c := newFakeSized(t, 64, tc.backends, 1<<10), &retiredClock{t: time.Unix(1e9, 0)}
			r := newRetiring(f, c)
			all := fullOfServices(tc.backends)
			mustApply(t, r, state(all...))
			gone := all[0].Frontend
			keep := all[1:]
			if !tc.sameTime {
				mustApply(t, r, state(keep...))
			}
			big := svc(vip(1000), "big", many(1000, tc.big)...)
			err := r.Apply(state(append(keep, big)...))
			if !errors.Is(err, reconciler.ErrCapacity) {
				t.Fatalf("Apply of a Service that cannot fit: %v, want ErrCapacity", err)
			}
			if m, ok := masterOf(t, f, gone); !ok || m.Flags&reconciler.FlagRetired == 0 {
				t.Fatalf("master of the removed Service: %+v (present %v), want it retired still", m, ok)
			}
		})
	}
}

// TestRetiredReaddResetsStats: a frontend written over its retired
// master (the same Service again, or another given its address) keeps
// the retired id, and its per-Service counters start from zero, as a
// new id's do (README, "Per-Service counters"): once, at the re-add.
func TestRetiredReaddResetsStats(t *testing.T) {
	f, c := newFakeSized(t, 64, 1<<10, 1<<10), &retiredClock{t: time.Unix(1e9, 0)}
	f.Record = true
	r := newRetiring(f, c)
	all := fullOfServices(2)
	mustApply(t, r, state(all...))
	mustApply(t, r, state(all[1:]...))
	f.ResetCounts()
	again := svc(all[0].Frontend, "other", be(7, 1, model.TCP))
	mustApply(t, r, state(append([]*model.Service{again}, all[1:]...)...))
	if n := f.Count(fakedp.OpResetStats); n != 1 {
		t.Fatalf("re-add over a retired master: %d counter resets, want 1", n)
	}
	f.ResetCounts()
	mustApply(t, r, state(append([]*model.Service{again}, all[1:]...)...))
	if n := f.Count(fakedp.OpResetStats); n != 0 {
		t.Fatalf("the next Apply: %d counter resets, want 0", n)
	}
}
