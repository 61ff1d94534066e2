package datapath

import (
	"errors"
	"iter"
	"maps"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// fakeClock is a clock a test moves.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

// overlapping reports two ranges of rs that share an entry.
func overlapping(rs map[int]slotRange) (a, b slotRange, ok bool) {
	for i, x := range rs {
		for j, y := range rs {
			if i < j && uint64(x.base) < y.end() && uint64(y.base) < x.end() {
				return x, y, true
			}
		}
	}
	return slotRange{}, slotRange{}, false
}

// TestSlotAllocRanges: ranges are aligned powers of two within the array,
// never overlap (quarantined ones included), and everything handed out
// and given back is free again once the quarantine is over: the array
// fits one range of all of it.
func TestSlotAllocRanges(t *testing.T) {
	const n = 1 << 12
	clock := &fakeClock{t: time.Unix(1000, 0)}
	a := newSlotAlloc(n)
	a.now = clock.now
	rng := rand.New(rand.NewPCG(1, 2))
	live := map[int]slotRange{}
	var retired []slotRange // in quarantine, by the clock
	for i := range 4000 {
		if len(live) > 0 && rng.IntN(3) == 0 {
			for k, r := range live {
				a.retire(r)
				retired = append(retired, r)
				delete(live, k)
				break
			}
			continue
		}
		count := 1 + rng.Uint32N(40)
		r, err := a.alloc(count)
		if errors.Is(err, errSlotsFull) {
			clock.t = clock.t.Add(2 * slotQuarantine)
			retired = nil
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if r.cap < count || r.cap&(r.cap-1) != 0 || r.base%r.cap != 0 || r.end() > n {
			t.Fatalf("alloc(%d) = %+v", count, r)
		}
		for _, q := range retired {
			if uint64(r.base) < q.end() && uint64(q.base) < r.end() {
				t.Fatalf("alloc(%d) = %+v, within quarantined %+v", count, r, q)
			}
		}
		live[i] = r
		if x, y, ok := overlapping(live); ok {
			t.Fatalf("ranges %+v and %+v overlap", x, y)
		}
	}
	for _, r := range live {
		a.retire(r)
	}
	clock.t = clock.t.Add(2 * slotQuarantine)
	if r, err := a.alloc(n / 2); err != nil || a.inUse != n/2 {
		t.Fatalf("after giving all back: alloc(%d) = %+v, %v (in use %d)", n/2, r, err, a.inUse)
	}
}

// TestSlotAllocQuarantine: a range given back is not handed out before
// slotQuarantine has passed, even when nothing else is free, and is
// after.
func TestSlotAllocQuarantine(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	a := newSlotAlloc(16)
	a.now = clock.now
	r, err := a.alloc(16)
	if err != nil {
		t.Fatal(err)
	}
	a.retire(r)
	clock.t = clock.t.Add(slotQuarantine - time.Millisecond)
	if got, err := a.alloc(1); !errors.Is(err, errSlotsFull) {
		t.Fatalf("alloc within the quarantine = %+v, %v; want full", got, err)
	}
	clock.t = clock.t.Add(time.Millisecond)
	if got, err := a.alloc(16); err != nil || got != r {
		t.Fatalf("alloc after the quarantine = %+v, %v; want %+v", got, err, r)
	}
}

// TestSlotTableMoves: a frontend that outgrows its range moves to a
// larger one with its slots, its master is rebased after the slots are
// written, and the old range keeps its slots for readers of the old
// base until the quarantine ends.
func TestSlotTableMoves(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	tb := memSlotTable(64)
	tb.alloc.now = clock.now
	fe := reconciler.DefaultScope(model.L4Addr{Addr: addr("10.96.0.1"), Port: 80, Proto: model.TCP})
	var rebased []uint32
	rebase := func(_ reconciler.Frontend, base uint32) error {
		// The new range holds every slot when the master moves.
		for i := range uint32(5) {
			if got := tb.load(base + i); got != 11+i {
				t.Errorf("slot %d in the new range at the rebase = %d", i+1, got)
			}
		}
		rebased = append(rebased, base)
		return nil
	}
	must(t, tb.write(fe, 1, []reconciler.BackendID{11, 12, 13, 14}, rebase))
	if _, err := tb.forMaster(fe, 4, rebase); err != nil {
		t.Fatal(err)
	}
	old := tb.at(fe).r
	if old.cap != 4 || len(rebased) != 0 {
		t.Fatalf("range %+v, rebased %v; want 4 entries, no rebase", old, rebased)
	}
	must(t, tb.write(fe, 5, []reconciler.BackendID{15}, rebase))
	nr := tb.at(fe).r
	if nr.cap != 8 || len(rebased) != 1 || rebased[0] != nr.base {
		t.Fatalf("after slot 5: range %+v, rebased %v", nr, rebased)
	}
	for i := range uint32(4) {
		if got := tb.load(old.base + i); got != 11+i {
			t.Errorf("old range's slot %d = %d before the quarantine ends", i+1, got)
		}
	}
	// A failed rebase changes nothing the kernel reads.
	before := tb.at(fe)
	fail := func(reconciler.Frontend, uint32) error { return errors.New("no") }
	if err := tb.write(fe, 9, []reconciler.BackendID{19}, fail); err == nil || tb.at(fe) != before {
		t.Errorf("write with a failed rebase = %v, range %+v; want an error, %+v", err, tb.at(fe), before)
	}
}

// TestSlotTableFull: a frontend that finds no room is an error naming it,
// and what is written stays.
func TestSlotTableFull(t *testing.T) {
	tb := memSlotTable(16)
	none := func(reconciler.Frontend, uint32) error { return nil }
	fe1 := reconciler.DefaultScope(model.L4Addr{Addr: addr("10.96.0.1"), Port: 80, Proto: model.TCP})
	fe2 := reconciler.DefaultScope(model.L4Addr{Addr: addr("10.96.0.2"), Port: 80, Proto: model.TCP})
	must(t, tb.write(fe1, 1, []reconciler.BackendID{1, 2, 3, 4, 5, 6, 7, 8, 9}, none))
	before := tb.at(fe1)
	err := tb.write(fe2, 1, []reconciler.BackendID{1, 2, 3, 4, 5, 6, 7, 8, 9}, none)
	if !errors.Is(err, errSlotsFull) || !strings.Contains(err.Error(), fe2.String()) {
		t.Fatalf("write beyond the array = %v; want full, naming %s", err, fe2)
	}
	if _, ok := tb.entry(fe2); ok || tb.at(fe1) != before || tb.load(before.r.base+8) != 9 {
		t.Errorf("after a full array: %+v", maps.Collect(tb.entries()))
	}
	err = tb.write(fe1, 17, []reconciler.BackendID{1}, none)
	if !errors.Is(err, errSlotsFull) || tb.at(fe1) != before {
		t.Errorf("growing beyond the array = %v, range %+v", err, tb.at(fe1))
	}
}

// TestSlotTableRebuild: the ranges are the masters' (base, count); one out
// of the array, unaligned or overlapping another is drift: no range,
// and its entries are free for others.
func TestSlotTableRebuild(t *testing.T) {
	tb := memSlotTable(64)
	fe := func(i byte) reconciler.Frontend {
		return reconciler.DefaultScope(model.L4Addr{Addr: addr("10.96.0." + string('0'+i)), Port: 80, Proto: model.TCP})
	}
	tb.rebuild(map[reconciler.Frontend][2]uint32{
		fe(1): {0, 10},  // [0, 16)
		fe(2): {16, 3},  // [16, 20)
		fe(3): {18, 2},  // overlaps fe(2)
		fe(4): {62, 4},  // beyond the array, and unaligned
		fe(5): {32, 0},  // no slots
		fe(6): {20, 7},  // unaligned for 8
		fe(7): {48, 16}, // [48, 64)
	})
	want := map[reconciler.Frontend]slotRange{fe(1): {0, 16}, fe(2): {16, 4}, fe(7): {48, 16}}
	for f, e := range tb.entries() {
		if !e.master || e.r != want[f] {
			t.Errorf("%s: %+v, want %+v", f, e, want[f])
		}
	}
	if tb.ranges.Len() != 7 || tb.alloc.inUse != 36 {
		t.Errorf("%d frontends, %d entries in use; want 7, 36", tb.ranges.Len(), tb.alloc.inUse)
	}
	// What is free is handed out, none of it in use.
	for range 7 {
		r, err := tb.alloc.alloc(4)
		if err != nil {
			t.Fatal(err)
		}
		for f, w := range want {
			if uint64(r.base) < w.end() && uint64(w.base) < r.end() {
				t.Fatalf("alloc = %+v, within %s's %+v", r, f, w)
			}
		}
	}
	if r, err := tb.alloc.alloc(1); !errors.Is(err, errSlotsFull) {
		t.Errorf("alloc of the 29th free entry = %+v, %v", r, err)
	}
}

// at returns fe's entry, the zero entry if it has none.
func (t *slotTable) at(fe reconciler.Frontend) slotEntry {
	e, _ := t.entry(fe)
	return e
}

// entries yields every frontend's entry, unpacked.
func (t *slotTable) entries() iter.Seq2[reconciler.Frontend, slotEntry] {
	return func(yield func(reconciler.Frontend, slotEntry) bool) {
		for fe, p := range t.ranges.All() {
			if !yield(fe, p.entry()) {
				return
			}
		}
	}
}

// memSlotTable is a slotTable over memory of n entries, no map.
func memSlotTable(n uint32) *slotTable {
	a := mappedMemory(make([]byte, 2*4*n))
	t := &slotTable{name: "test", a: a, words: a.words(), n: n, alloc: newSlotAlloc(n)}
	t.alloc.onFree = t.zero
	return t
}

// TestSlotTablePresize: presizing a table (a first program's hint,
// Maps.PresizeFrontends) keeps the ranges it has, and a presized table
// takes writes as before. Fails with a presize that makes the table's
// ranges anew whatever it holds: the frontend written before loses its
// range.
func TestSlotTablePresize(t *testing.T) {
	tb := memSlotTable(64)
	fe := func(i byte) reconciler.Frontend {
		return reconciler.Frontend{L4Addr: model.L4Addr{Addr: netip.AddrFrom4([4]byte{10, 96, 0, i}), Port: 80, Proto: model.TCP}}
	}
	noRebase := func(reconciler.Frontend, uint32) error { return nil }
	if err := tb.write(fe(1), 1, []reconciler.BackendID{7, 8}, noRebase); err != nil {
		t.Fatal(err)
	}
	before := tb.at(fe(1))
	tb.presize(1000)
	if got, ok := tb.entry(fe(1)); !ok || got != before {
		t.Fatalf("after presize: range of %s %+v (%v), want %+v", fe(1), got, ok, before)
	}
	empty := memSlotTable(64)
	empty.presize(1000)
	for _, tb := range []*slotTable{tb, empty} {
		if err := tb.write(fe(2), 1, []reconciler.BackendID{9}, noRebase); err != nil {
			t.Fatal(err)
		}
		e, ok := tb.entry(fe(2))
		if !ok || tb.load(e.r.base) != 9 {
			t.Errorf("slot 1 of %s after presize: range %+v (%v)", fe(2), e, ok)
		}
	}
	var none *slotTable
	none.presize(1000) // a family without a table
}
