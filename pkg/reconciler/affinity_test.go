package reconciler_test

import (
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
	"github.com/sluice-lb/sluice/pkg/reconciler/fakedp"
)

// Session affinity in the reconciler: the timeout reaches the master (a
// restart writes nothing), and the session affinity entries follow the
// frontend's slots: moved with a backend that moves down into a hole,
// before the master's count would end them; deleted for backends that
// leave, and for whole frontends that go or lose their affinity (or have
// their timeout shortened).

func withAffinity(s *model.Service, d time.Duration) *model.Service {
	s.AffinityTimeout = d
	return s
}

func TestMasterAffinity(t *testing.T) {
	f := newFake(t)
	r := reconciler.New(f, nil)
	bs := []model.Backend{be(1, 1, model.TCP), be(1, 2, model.TCP)}
	np := model.L4Addr{Addr: vip(2).Addr, Port: 30080, Proto: model.TCP}
	nodePort := withAffinity(svc(np, "web", bs...), 10800*time.Second)
	nodePort.Kind = model.NodePort

	for _, c := range []struct {
		name    string
		timeout time.Duration
		flags   uint8
		seconds uint32
	}{
		{"three hours", 3 * time.Hour, reconciler.FlagAffinity, 10800},
		{"a second", time.Second, reconciler.FlagAffinity, 1},
		{"below a second: one", 300 * time.Millisecond, reconciler.FlagAffinity, 1},
		{"a day and a half second: rounded up", 24*time.Hour + 500*time.Millisecond, reconciler.FlagAffinity, 86401},
		{"none", 0, 0, 0},
	} {
		cip := withAffinity(svc(vip(1), "web", bs...), c.timeout)
		mustApply(t, r, state(cip, nodePort))
		ks, _ := f.Dump()
		want := reconciler.Master{ID: ks.Masters[reconciler.DefaultScope(vip(1))].ID, Count: 2, Flags: c.flags, AffinityTimeout: c.seconds}
		if got := ks.Masters[reconciler.DefaultScope(vip(1))]; got != want {
			t.Errorf("%s: master %+v, want %+v", c.name, got, want)
		}
		// The same state again: nothing to write.
		f.ResetCounts()
		mustApply(t, r, state(cip, nodePort))
		if n := f.Writes(); n != 0 {
			t.Errorf("%s: applying again wrote %d entries", c.name, n)
		}
	}
	ks, _ := f.Dump()
	if got := ks.Masters[reconciler.DefaultScope(np)]; got.Flags != reconciler.FlagExternal|reconciler.FlagAffinity || got.AffinityTimeout != 10800 {
		t.Errorf("NodePort master %+v: want external, affinity 10800 s", got)
	}

	// A restart: restored from the maps, the same state writes nothing.
	cip := withAffinity(svc(vip(1), "web", bs...), time.Hour)
	mustApply(t, r, state(cip, nodePort))
	f.ResetCounts()
	r2 := reconciler.New(f, nil)
	if err := r2.Restore(); err != nil {
		t.Fatal(err)
	}
	mustApply(t, r2, state(cip, nodePort))
	if n := f.Writes(); n != 0 || len(f.AffinityFixes()) != 0 {
		t.Errorf("restart: %d writes, affinity fixes %v; want none", n, f.AffinityFixes())
	}
}

// TestAffinityFollowsSlots: what the datapath's session affinity entries
// need when a frontend's backends change, and when.
func TestAffinityFollowsSlots(t *testing.T) {
	f := newRecordingFake(t)
	r := reconciler.New(f, nil)
	l4 := vip(1)
	fe := reconciler.DefaultScope(l4)
	b := func(j int) model.Backend { return be(1, j, model.TCP) }
	aff := func(d time.Duration, bs ...model.Backend) *model.State {
		return state(withAffinity(svc(l4, "web", bs...), d))
	}
	mustApply(t, r, aff(time.Hour, b(1), b(2), b(3), b(4)))
	ks, _ := f.Dump()
	id := func(j int) reconciler.BackendID {
		for _, x := range ks.Slots[fe] {
			if ks.Backends[x] == b(j).L4Addr {
				return x
			}
		}
		t.Fatalf("backend %d not programmed", j)
		return 0
	}
	slot := func(j int) uint32 {
		for s, x := range ks.Slots[fe] {
			if x == id(j) {
				return s
			}
		}
		return 0
	}
	if slot(1) != 1 || slot(4) != 4 {
		t.Fatalf("slots %v: want backend j in slot j", ks.Slots[fe])
	}
	id1, id4 := id(1), id(4)
	if fx := f.AffinityFixes(); len(fx) != 0 {
		t.Errorf("first program: affinity fixes %v, want none", fx)
	}

	// Backend 1 leaves: backend 4 moves into slot 1; its entries move
	// with it after it is written there and before the master's count
	// drops below slot 4; backend 1's are deleted once all is done.
	f.ResetCounts()
	mustApply(t, r, aff(time.Hour, b(2), b(3), b(4)))
	var order []string
	for _, op := range f.Ops {
		order = append(order, op.String())
	}
	want := []string{
		"UpsertSlot 10.96.0.1:80/TCP[1]=" + itoa(id4),
		"FixAffinity [{10.96.0.1:80/TCP " + itoa(id4) + " 1}]",
		"UpsertMaster 10.96.0.1:80/TCP id=1 count=3 flags=0x20 affinity=3600s",
		"DeleteSlot 10.96.0.1:80/TCP[4]",
		"DeleteBackend " + itoa(id1),
		"FixAffinity [{10.96.0.1:80/TCP " + itoa(id1) + " 0}]",
	}
	if !slices.Equal(order, want) {
		t.Errorf("shrink: operations\n%v\nwant\n%v", order, want)
	}

	// A backend joins into the new slot: nothing moves or leaves.
	f.ResetCounts()
	mustApply(t, r, aff(time.Hour, b(2), b(3), b(4), b(5)))
	if fx := f.AffinityFixes(); len(fx) != 0 {
		t.Errorf("growth: affinity fixes %v, want none", fx)
	}
	// A longer timeout keeps the entries (they expire sooner than they
	// would now, then follow the new one); a shorter one drops them all.
	mustApply(t, r, aff(2*time.Hour, b(2), b(3), b(4), b(5)))
	if fx := f.AffinityFixes(); len(fx) != 0 {
		t.Errorf("longer timeout: affinity fixes %v, want none", fx)
	}
	mustApply(t, r, aff(time.Minute, b(2), b(3), b(4), b(5)))
	if fx := f.AffinityFixes(); !slices.Equal(fx, []reconciler.AffinityFix{{Frontend: fe}}) {
		t.Errorf("shorter timeout: affinity fixes %v, want the whole frontend's", fx)
	}
	// Losing affinity: the frontend's entries go.
	f.ResetCounts()
	mustApply(t, r, aff(0, b(2), b(3), b(4), b(5)))
	if fx := f.AffinityFixes(); !slices.Equal(fx, []reconciler.AffinityFix{{Frontend: fe}}) {
		t.Errorf("affinity off: affinity fixes %v, want the whole frontend's", fx)
	}
	// Without affinity, backends come and go with no fixes.
	f.ResetCounts()
	mustApply(t, r, aff(0, b(3), b(5)))
	mustApply(t, r, aff(0, b(1), b(3), b(5), b(6)))
	if fx := f.AffinityFixes(); len(fx) != 0 {
		t.Errorf("no affinity: affinity fixes %v, want none", fx)
	}
	// Affinity back, then the frontend goes: its entries go.
	mustApply(t, r, aff(time.Hour, b(1), b(3), b(5), b(6)))
	f.ResetCounts()
	mustApply(t, r, state())
	if fx := f.AffinityFixes(); !slices.Equal(fx, []reconciler.AffinityFix{{Frontend: fe}}) {
		t.Errorf("frontend removed: affinity fixes %v, want the whole frontend's", fx)
	}
}

// TestAffinityFixFailures: deleting entries that failed is retried by the
// next Apply (which reports the failure meanwhile); moving them is best
// effort (its clients select afresh), and does not fail the frontend.
func TestAffinityFixFailures(t *testing.T) {
	f := newFake(t)
	r := reconciler.New(f, nil)
	fe := reconciler.DefaultScope(vip(1))
	b := func(j int) model.Backend { return be(1, j, model.TCP) }
	aff := func(bs ...model.Backend) *model.State {
		return state(withAffinity(svc(fe.L4Addr, "web", bs...), time.Hour))
	}
	mustApply(t, r, aff(b(1), b(2), b(3)))

	broken := errors.New("no")
	var failed []fakedp.Op
	f.Fail = func(op fakedp.Op) error {
		if op.Kind == fakedp.OpFixAffinity {
			failed = append(failed, op)
			return broken
		}
		return nil
	}
	// Backend 1 leaves, backend 3 moves into slot 1: both fixes fail.
	err := r.Apply(aff(b(2), b(3)))
	if !errors.Is(err, broken) || r.InSync() {
		t.Fatalf("Apply = %v, in sync %v; want the deletion's failure reported", err, r.InSync())
	}
	if len(failed) != 2 || failed[0].Fixes[0].Slot == 0 || failed[1].Fixes[0].Slot != 0 {
		t.Fatalf("failed fixes %v: want the move, then the deletion", failed)
	}
	ks, _ := f.Dump()
	if m := ks.Masters[fe]; m.Count != 2 {
		t.Errorf("master %+v: the frontend was not programmed", m)
	}
	// Next time only the deletion is retried, and succeeds.
	gone := failed[1].Fixes
	f.Fail = nil
	mustApply(t, r, aff(b(2), b(3)))
	if fx := f.AffinityFixes(); !slices.Equal(fx, gone) {
		t.Errorf("retry: affinity fixes %v, want %v", fx, gone)
	}
}

// TestAffinityTwoScopes: an affine frontend of two scopes has affinity in
// both (internal clients are as stuck as external ones), and each scope's
// entries are moved and deleted under its own master key: its backends
// and slots are its own.
func TestAffinityTwoScopes(t *testing.T) {
	f := newRecordingFake(t)
	r := reconciler.New(f, nil)
	b := func(j int) model.Backend { return be(1, j, model.TCP) }
	two := func(d time.Duration, external, internal []model.Backend) *model.State {
		return state(withAffinity(twoScopes(external, internal), d))
	}
	s := twoScopes(nil, nil)
	ext := reconciler.DefaultScope(s.Frontend)
	in := reconciler.Frontend{L4Addr: s.Frontend, Scope: reconciler.ScopeInternal}

	mustApply(t, r, two(time.Hour, []model.Backend{b(1)}, []model.Backend{b(1), b(2), b(3)}))
	ks, _ := f.Dump()
	for fe, flags := range map[reconciler.Frontend]uint8{
		ext: reconciler.FlagExternal | reconciler.FlagLocal | reconciler.FlagTwoScopes | reconciler.FlagAffinity,
		in:  reconciler.FlagExternal | reconciler.FlagLocal | reconciler.FlagAffinity,
	} {
		if m := ks.Masters[fe]; m.Flags != flags || m.AffinityTimeout != 3600 {
			t.Errorf("%s: master %+v, want flags %#x, affinity 3600 s", fe, m, flags)
		}
	}
	idOf := func(j int) reconciler.BackendID {
		for id, a := range ks.Backends {
			if a == b(j).L4Addr {
				return id
			}
		}
		t.Fatalf("backend %d not programmed", j)
		return 0
	}
	id1, id3 := idOf(1), idOf(3)

	// Backend 1 leaves the internal scope (it stays in the external
	// one): backend 3 moves into its slot, and only the internal scope's
	// entries are fixed.
	f.ResetCounts()
	mustApply(t, r, two(time.Hour, []model.Backend{b(1)}, []model.Backend{b(2), b(3)}))
	want := []reconciler.AffinityFix{{Frontend: in, Backend: id3, Slot: 1}, {Frontend: in, Backend: id1}}
	if fx := f.AffinityFixes(); !slices.Equal(fx, want) {
		t.Errorf("internal shrink: affinity fixes %v, want %v", fx, want)
	}

	// Affinity off: both scopes' entries go (in frontend order: the
	// internal scope first).
	f.ResetCounts()
	mustApply(t, r, two(0, []model.Backend{b(1)}, []model.Backend{b(2), b(3)}))
	want = []reconciler.AffinityFix{{Frontend: in}, {Frontend: ext}}
	if fx := f.AffinityFixes(); !slices.Equal(fx, want) {
		t.Errorf("affinity off: affinity fixes %v, want %v", fx, want)
	}

	// Affinity back, then externalTrafficPolicy Cluster: the internal
	// scope goes, and its entries with it.
	mustApply(t, r, two(time.Hour, []model.Backend{b(1)}, []model.Backend{b(2), b(3)}))
	f.ResetCounts()
	one := withAffinity(twoScopes([]model.Backend{b(1), b(2)}, nil), time.Hour)
	one.ExternalLocal, one.TwoScopes = false, false
	mustApply(t, r, state(one))
	want = []reconciler.AffinityFix{{Frontend: in}}
	if fx := f.AffinityFixes(); !slices.Equal(fx, want) {
		t.Errorf("one scope: affinity fixes %v, want %v", fx, want)
	}
	if v := f.Violations(); len(v) > 0 {
		t.Errorf("violations: %v", v)
	}
}

func itoa(id reconciler.BackendID) string { return strconv.FormatUint(uint64(id), 10) }
