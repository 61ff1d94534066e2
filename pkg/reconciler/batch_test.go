package reconciler_test

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
	"github.com/sluice-lb/sluice/pkg/reconciler/fakedp"
)

// mixedState is n services of every shape programFresh handles:
// ClusterIPs, LoadBalancers with source ranges, NodePorts with two scopes,
// and backends shared between services.
func mixedState(n int) *model.State {
	st := model.NewState()
	for i := range n {
		s := svc(vip(i), fmt.Sprint("svc-", i), be(i, 1, model.TCP), be(i%5, 2, model.TCP), be(i%3, 3, model.TCP))
		switch i % 4 {
		case 1:
			s.Kind = model.LoadBalancer
			s.SourceRanges = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
		case 2:
			s.Kind = model.NodePort
			s.ExternalLocal, s.TwoScopes = true, true
			s.InternalBackends = model.SortBackends([]model.Backend{be(i, 1, model.TCP), be(i, 9, model.TCP)})
		}
		st.Services.Set(s.Frontend, s)
	}
	return st
}

// TestFreshBatches: new frontends are programmed in one batch per map,
// and end up exactly as programmed one write at a time.
func TestFreshBatches(t *testing.T) {
	st := mixedState(40)
	batched, rb, n := programsAsOneWriteAtATime(t, st, func(*reconciler.Reconciler) {})
	// Backends, rev_nat, slots, masters, service IPs.
	if n != 5 {
		t.Errorf("%d batches, want 5", n)
	}

	// Removing them all deletes backends and rev_nat entries in batches.
	batched.ResetCounts()
	mustApply(t, rb, model.NewState())
	checkProgrammed(t, batched, model.NewState())
	if n := batched.Batches(); n != 2 {
		t.Errorf("%d batches to delete, want 2 (backends, rev_nat)", n)
	}
}

// TestFreshBatchesInChunks: a first program larger than a chunk is
// programmed chunk after chunk (the batches' copies of the entries stay
// small), exactly as one write at a time; chunks of 7 of the 50
// frontends end between the two scopes of a NodePort's address, which
// go together.
func TestFreshBatchesInChunks(t *testing.T) {
	_, _, n := programsAsOneWriteAtATime(t, mixedState(40), func(r *reconciler.Reconciler) { reconciler.SetFreshChunk(r, 7) })
	// Five batches a chunk, 6 or 7 chunks (some 8 long), fewer when a
	// chunk's backends or service IPs are all written already.
	if n < 25 || n > 35 {
		t.Errorf("%d batches, want 5 for each of 6-7 chunks", n)
	}
}

// programsAsOneWriteAtATime programs st from empty with a reconciler
// set up by setup, and checks it wrote what one writing one entry at a
// time writes, and that a restart over it writes nothing. It returns the
// fake, the reconciler and how many batches programming took.
func programsAsOneWriteAtATime(t *testing.T, st *model.State, setup func(*reconciler.Reconciler)) (*fakedp.Fake, *reconciler.Reconciler, int) {
	t.Helper()
	batched, single := newFake(t), newFake(t)
	rb, rs := reconciler.New(batched, nil), reconciler.New(single, nil)
	setup(rb)
	reconciler.SetBatchMin(rs, 0)
	mustApply(t, rb, st)
	mustApply(t, rs, st)
	checkProgrammed(t, batched, st)
	if got, want := batched.String(), single.String(); got != want {
		t.Errorf("batched programming differs:\n%s\none write at a time:\n%s", got, want)
	}
	if n := single.Batches(); n != 0 {
		t.Errorf("%d batches with batching off", n)
	}
	if bw, sw := batched.Writes(), single.Writes(); bw != sw {
		t.Errorf("%d entries written in batches, %d one at a time", bw, sw)
	}
	n := batched.Batches()
	restartWritesNothing(t, batched, st)
	return batched, rb, n
}

// TestFreshBatchFails fails one entry inside each batch in turn: the
// batch stops there (the fake checks the invariants after every entry),
// only the frontends that entry belongs to fail, the others are
// programmed, and the next Apply converges; in one chunk and in chunks of
// 7 frontends (a backend that failed in one chunk is written again for
// the next).
func TestFreshBatchFails(t *testing.T) {
	for _, chunk := range []int{0, 7} {
		for _, kind := range []fakedp.OpKind{fakedp.OpUpsertBackend, fakedp.OpUpsertRevNat, fakedp.OpUpsertSlot, fakedp.OpUpsertMaster, fakedp.OpUpsertServiceIP} {
			for _, nth := range []int{1, 7, 20} {
				freshBatchFails(t, chunk, kind, nth)
			}
		}
	}
}

func freshBatchFails(t *testing.T, chunk int, kind fakedp.OpKind, nth int) {
	t.Run(fmt.Sprintf("chunk%d/%s#%d", chunk, kind, nth), func(t *testing.T) {
		st := mixedState(40)
		f := newFake(t)
		r := reconciler.New(f, nil)
		if chunk > 0 {
			reconciler.SetFreshChunk(r, chunk)
		}
		seen, inBatch := 0, false
		f.Fail = func(op fakedp.Op) error {
			if op.Kind == kind && op.Batch {
				if seen++; seen == nth {
					inBatch = true
					return errors.New("injected")
				}
			}
			return nil
		}
		err := r.Apply(st)
		if !inBatch {
			t.Fatalf("no batch entry %d of %s: %v", nth, kind, err)
		}
		if err == nil || !strings.Contains(err.Error(), "injected") || !strings.Contains(err.Error(), "service default/svc-") {
			t.Fatalf("err = %v, want the injected error naming a service", err)
		}
		// A backend shared by several services fails them all;
		// anything else fails one frontend (or both scopes of
		// one). Every other frontend is programmed (a service IP
		// fails after its master).
		failed := 0
		for _, e := range errs(err) {
			var fe *reconciler.FrontendError
			if !errors.As(e, &fe) {
				t.Errorf("not a frontend's error: %v", e)
			}
			failed++
		}
		if kind != fakedp.OpUpsertBackend && failed > 2 {
			t.Errorf("%d frontends failed: %v", failed, err)
		}
		const frontends = 50 // 40 services, 10 of them with two scopes
		ok := len(programmed(t, f))
		if kind == fakedp.OpUpsertServiceIP {
			ok -= failed
		}
		if ok+failed != frontends {
			t.Errorf("%d frontends programmed and %d failed, of %d", ok, failed, frontends)
		}
		recoversAfterFailure(t, f, r, st)
	})
}

// errs unwraps a joined error.
func errs(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// TestFirstProgramAllocatesLittleBeyondItsView: a first program of
// 10,000 Services x 10 allocates its view and, beyond it, what it must
// hold at once (a desired frontend each, 112 bytes, with its sort key
// and its place in the list of changes, 24) and one chunk's batches:
// no copy of the whole state, no list grown by append, no chunk's
// batches of thousands of frontends (they held 4.7 MB at 4,096 x 10).
// The collector does not run during the agent's first program: what it
// allocates is on top of the agent's heap at its peak.
func TestFirstProgramAllocatesLittleBeyondItsView(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's build allocates more (see raceEnabled)")
	}
	const n = 10000
	st := sizedState(n, func(int) int { return 10 })
	r := reconciler.New(fakedp.Nop{}, nil)
	if err := r.Restore(); err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	if err := r.Apply(st); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	allocated := after.TotalAlloc - before.TotalAlloc
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(r)
	runtime.KeepAlive(st)
	view := after.HeapAlloc - min(after.HeapAlloc, before.HeapAlloc)
	beyond := int64(allocated) - int64(view)
	t.Logf("allocated %d bytes, the view %d: %d bytes a frontend beyond it", allocated, view, beyond/n)
	// 1.5 MiB: a chunk's batches (1,024 frontends x 10: slots of 48
	// bytes, backends of 40, their frontends' pointers) and the rest.
	if limit := int64(n*(112+24) + 3<<19); beyond > limit {
		t.Errorf("a first program of %d frontends allocated %d bytes beyond its view of %d, want at most %d", n, beyond, view, limit)
	}
}

// unorderedState is n services whose backends come unsorted and with
// duplicates, as a state not made by the sources may have them (they sort
// theirs), shared between services; every third a NodePort with two
// scopes, its internal backends unsorted too. It returns the state and,
// of each frontend, the backends it wants: its own, sorted, each once.
func unorderedState(n int) (*model.State, map[reconciler.Frontend][]model.L4Addr) {
	st := model.NewState()
	want := map[reconciler.Frontend][]model.L4Addr{}
	ordered := func(bs []model.Backend) []model.L4Addr {
		var as []model.L4Addr
		for _, b := range bs {
			as = append(as, b.L4Addr)
		}
		slices.SortFunc(as, model.L4Addr.Compare)
		return slices.Compact(as)
	}
	for i := range n {
		s := &model.Service{
			Name:     model.ServicePortName{Namespace: "default", Name: fmt.Sprint("svc-", i)},
			Kind:     model.ClusterIP,
			Frontend: vip(i),
			Backends: []model.Backend{be(i, 3, model.TCP), be(i%4, 1, model.TCP), be(i, 3, model.TCP), be(i, 2, model.TCP), be(i%4, 1, model.TCP), be(i, 7, model.TCP)},
		}
		if i%3 == 1 {
			s.Kind, s.TwoScopes, s.ExternalLocal = model.NodePort, true, true
			s.InternalBackends = []model.Backend{be(i, 9, model.TCP), be(i%4, 1, model.TCP), be(i, 9, model.TCP), be(i, 2, model.TCP)}
			want[reconciler.Frontend{L4Addr: s.Frontend, Scope: reconciler.ScopeInternal}] = ordered(s.InternalBackends)
		}
		want[reconciler.Frontend{L4Addr: s.Frontend, Scope: reconciler.ScopeDefault}] = ordered(s.Backends)
		st.Services.Set(s.Frontend, s)
	}
	return st, want
}

// TestFreshUnorderedBackends: a first program of services whose backends
// come unsorted and with duplicates (unorderedState), in maps with room
// for exactly what they come to without the duplicates and in roomy
// ones, batched (in one chunk and in chunks of 3) and one write at a
// time: every frontend's
// slots name its backends each once, each id the address the backends
// map holds for it (the fake checks its invariants after every write),
// the batches write what one write at a time writes, and the services'
// slices are as they were. programFresh orders a frontend's backends,
// checks them and takes their ids in one walk: this fails if it checks
// them before it orders them (the duplicates do not fit), takes ids
// without ordering them (a slot for each duplicate), or writes a backend
// with another one's id.
func TestFreshUnorderedBackends(t *testing.T) {
	for _, tc := range []struct {
		chunk int
		exact bool // room for exactly the backends and entries wanted, else plenty
	}{{0, true}, {3, true}, {0, false}, {3, false}} {
		chunk := tc.chunk
		t.Run(fmt.Sprintf("chunk%d/exact=%v", chunk, tc.exact), func(t *testing.T) {
			st, want := unorderedState(20)
			given := map[model.L4Addr][2][]model.Backend{}
			addrs, entries := map[model.L4Addr]bool{}, 0
			for a, s := range st.Services.All() {
				given[a] = [2][]model.Backend{slices.Clone(s.Backends), slices.Clone(s.InternalBackends)}
			}
			for _, bs := range want {
				entries += 1 + len(bs)
				for _, a := range bs {
					addrs[a] = true
				}
			}
			var fakes []*fakedp.Fake
			for _, batched := range []bool{true, false} {
				f := newFake(t)
				if tc.exact {
					f = newFakeSized(t, len(want), len(addrs), entries)
				}
				r := reconciler.New(f, nil)
				if chunk > 0 {
					reconciler.SetFreshChunk(r, chunk)
				}
				if !batched {
					reconciler.SetBatchMin(r, 0)
				}
				mustApply(t, r, st)
				if got := programmed(t, f); !maps.EqualFunc(got, want, slices.Equal) {
					t.Errorf("batched %v: programmed\n%v\nwant\n%v", batched, got, want)
				}
				if n := f.Batches(); (n > 0) != batched {
					t.Errorf("batched %v: %d batches", batched, n)
				}
				restartWritesNothing(t, f, st)
				fakes = append(fakes, f)
			}
			if got, want := fakes[0].String(), fakes[1].String(); got != want {
				t.Errorf("batched programming differs:\n%s\none write at a time:\n%s", got, want)
			}
			for a, s := range st.Services.All() {
				if g := given[a]; !slices.Equal(s.Backends, g[0]) || !slices.Equal(s.InternalBackends, g[1]) {
					t.Errorf("%s: the service's backends changed to %v, %v from %v, %v", a, s.Backends, s.InternalBackends, g[0], g[1])
				}
			}
		})
	}
}
