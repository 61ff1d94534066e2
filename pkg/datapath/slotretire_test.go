package datapath

import (
	"net/netip"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// TestSlotTableReleaseRetired: a retired master (count 0) gives its range
// back, as a deleted one does: past the quarantine another frontend gets
// the room; the retired frontend keeps a master of no range, and written
// again it gets a new range, its master rebased there. Fails without
// release: the second frontend finds the array full.
func TestSlotTableReleaseRetired(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	tb := memSlotTable(16)
	tb.alloc.now = clock.now
	fe := func(i byte) reconciler.Frontend {
		return reconciler.DefaultScope(model.L4Addr{Addr: netip.AddrFrom4([4]byte{10, 96, 0, i}), Port: 80, Proto: model.TCP})
	}
	ids := []reconciler.BackendID{1, 2, 3, 4, 5, 6, 7, 8, 9}
	none := func(reconciler.Frontend, uint32) error { return nil }
	must(t, tb.write(fe(1), 1, ids, none))
	if _, err := tb.forMaster(fe(1), 9, none); err != nil {
		t.Fatal(err)
	}
	// Retired, as Maps.UpsertMaster does it: the master's base, then the
	// range released once the kernel has it.
	if _, err := tb.forMaster(fe(1), 0, none); err != nil {
		t.Fatal(err)
	}
	tb.release(fe(1))
	if e := tb.at(fe(1)); !e.master || e.r.cap != 0 || e.count != 0 {
		t.Fatalf("retired frontend's entry %+v, want a master of no range", e)
	}
	if got, _ := tb.inUse(); got != 0 {
		t.Errorf("%d slots in use after the retirement, want 0", got)
	}
	clock.t = clock.t.Add(2 * slotQuarantine)
	if err := tb.write(fe(2), 1, ids, none); err != nil {
		t.Fatalf("a new frontend after the retired one's quarantine: %v", err)
	}
	tb.drop(fe(2))
	clock.t = clock.t.Add(2 * slotQuarantine)
	var rebased []uint32
	rebase := func(f reconciler.Frontend, base uint32) error {
		if f == fe(1) {
			rebased = append(rebased, base)
		}
		return nil
	}
	must(t, tb.write(fe(1), 1, ids[:2], rebase))
	if e := tb.at(fe(1)); e.r.cap < 2 || len(rebased) != 1 || rebased[0] != e.r.base || tb.load(e.r.base+1) != 2 {
		t.Fatalf("the retired frontend written again: %+v, rebased to %v; want a new range, its master rebased there", e, rebased)
	}
}
