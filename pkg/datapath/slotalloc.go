package datapath

// The ranges of a slots array (sluice_slots_v1, sluice6_slots_v1): each
// frontend's backend slots 1..count are entries base..base+count-1 of its
// family's array, in a range of a power-of-two capacity that slotAlloc
// hands out (bpf/lib/structs.h says how the programs read them).
//
// slotAlloc is a buddy allocator over [0, n): a range of capacity 2^k
// starts at a multiple of 2^k, and a freed range merges with its buddy
// (the other half of the range of 2^(k+1) they make) when that is free
// too, so a frontend that grows from 8 to 16 backends leaves its 8 to be
// merged back rather than a hole only another 8 fits. Every operation is
// O(log n): one free set per order, a map, where the buddy is looked up.
//
// A range given back is not free at once: a program that read the
// frontend's master a moment before its base moved may still read its
// slots from it. It waits in a quarantine for slotQuarantine (monotonic
// clock), and only then joins the free sets: by then no program run that
// read the old base is still running (a run takes microseconds).

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"time"
)

// slotQuarantine is how long a range given back waits before it is
// handed out again.
const slotQuarantine = time.Second

// maxSlotOrder bounds a range: 2^16 entries hold a frontend's at most
// 65535 slots.
const maxSlotOrder = 16

// errSlotsFull is the error of an allocation that finds no free range.
var errSlotsFull = errors.New("slots array full")

// slotRange is a range of a slots array: entries base..base+cap-1.
type slotRange struct{ base, cap uint32 }

func (r slotRange) end() uint64 { return uint64(r.base) + uint64(r.cap) }

// slotAlloc hands out the ranges of an array of n entries.
type slotAlloc struct {
	n    uint32
	free [maxSlotOrder + 1]map[uint32]struct{} // by order: the bases of free ranges
	// quarantine: ranges given back, oldest first, each free from its
	// time on.
	quarantine []quarantined
	now        func() time.Time
	// onFree, if set, is told of each range leaving the quarantine
	// before it is handed out again (slotTable empties it).
	onFree func(slotRange)
	// inUse is the entries of the ranges handed out (metrics).
	inUse uint64
}

type quarantined struct {
	r    slotRange
	free time.Time
}

// newSlotAlloc returns an allocator of n entries, all free.
func newSlotAlloc(n uint32) *slotAlloc {
	a := &slotAlloc{n: n, now: time.Now}
	for k := range a.free {
		a.free[k] = map[uint32]struct{}{}
	}
	a.freeGap(0, uint64(n))
	return a
}

// slotOrder returns the order of the smallest range that holds count
// entries (count >= 1), or false beyond maxSlotOrder.
func slotOrder(count uint32) (int, bool) {
	if count <= 1 {
		return 0, true
	}
	k := bits.Len32(count - 1)
	return k, k <= maxSlotOrder
}

// slotCap is the capacity of the range that holds count entries.
func slotCap(count uint32) uint32 {
	k, _ := slotOrder(count)
	return 1 << k
}

// freeGap adds [start, end), which no range uses, to the free sets as the
// largest aligned ranges it holds.
func (a *slotAlloc) freeGap(start, end uint64) {
	for start < end {
		k := maxSlotOrder
		for k > 0 && (start%(1<<k) != 0 || start+(1<<k) > end) {
			k--
		}
		a.free[k][uint32(start)] = struct{}{}
		start += 1 << k
	}
}

// alloc hands out a range of at least count entries (1..65536), taking
// back first the quarantined ranges whose time has come. It fails with
// errSlotsFull, changing nothing handed out, when no free range is
// large enough.
func (a *slotAlloc) alloc(count uint32) (slotRange, error) {
	want, ok := slotOrder(count)
	if !ok || count == 0 {
		return slotRange{}, fmt.Errorf("%d slots: a range holds 1 to %d", count, 1<<maxSlotOrder)
	}
	a.release()
	k := want
	for k <= maxSlotOrder && len(a.free[k]) == 0 {
		k++
	}
	if k > maxSlotOrder {
		return slotRange{}, fmt.Errorf("%w (%d entries, %d in use, %d quarantined): no free range of %d",
			errSlotsFull, a.n, a.inUse, len(a.quarantine), 1<<want)
	}
	var base uint32
	for b := range a.free[k] {
		base = b
		break
	}
	delete(a.free[k], base)
	// Split down to the order wanted: the upper halves stay free.
	for k > want {
		k--
		a.free[k][base+1<<k] = struct{}{}
	}
	a.inUse += 1 << want
	return slotRange{base: base, cap: 1 << want}, nil
}

// retire gives r back: free again after slotQuarantine.
func (a *slotAlloc) retire(r slotRange) {
	if r.cap == 0 {
		return
	}
	a.inUse -= uint64(r.cap)
	a.quarantine = append(a.quarantine, quarantined{r: r, free: a.now().Add(slotQuarantine)})
}

// release frees the quarantined ranges whose time has come. With none
// quarantined it does not read the clock (a first program allocates
// 30,000 ranges).
func (a *slotAlloc) release() {
	if len(a.quarantine) == 0 {
		return
	}
	now := a.now()
	i := 0
	for i < len(a.quarantine) && !now.Before(a.quarantine[i].free) {
		if a.onFree != nil {
			a.onFree(a.quarantine[i].r)
		}
		a.put(a.quarantine[i].r)
		i++
	}
	if i > 0 {
		a.quarantine = append(a.quarantine[:0], a.quarantine[i:]...)
	}
}

// put frees r, merged with its buddies as far as they are free.
func (a *slotAlloc) put(r slotRange) {
	k, _ := slotOrder(r.cap)
	base := r.base
	for k < maxSlotOrder {
		buddy := base ^ (1 << k)
		if _, ok := a.free[k][buddy]; !ok {
			break
		}
		delete(a.free[k], buddy)
		base &^= 1 << k
		k++
	}
	a.free[k][base] = struct{}{}
}

// rebuildSlotAlloc returns an allocator of n entries with the ranges of
// used handed out, and reports which of them it could not take: out of
// the array, not aligned to their capacity, or overlapping a range
// taken before them (used is taken in order of base, then capacity,
// largest first). Those are drift: their frontends get new ranges.
func rebuildSlotAlloc(n uint32, used []slotRange) (*slotAlloc, []bool) {
	a := &slotAlloc{n: n, now: time.Now}
	for k := range a.free {
		a.free[k] = map[uint32]struct{}{}
	}
	order := make([]int, len(used))
	for i := range order {
		order[i] = i
	}
	sortRanges(order, used)
	bad := make([]bool, len(used))
	var next uint64 // the end of the ranges taken so far
	for _, i := range order {
		r := used[i]
		if _, ok := slotOrder(r.cap); !ok || r.cap == 0 || r.cap&(r.cap-1) != 0 || r.base%r.cap != 0 ||
			r.end() > uint64(n) || uint64(r.base) < next {
			bad[i] = true
			continue
		}
		a.freeGap(next, uint64(r.base))
		next = r.end()
		a.inUse += uint64(r.cap)
	}
	a.freeGap(next, uint64(n))
	return a, bad
}

// sortRanges sorts order, indexes of rs, by base, then by capacity,
// largest first.
func sortRanges(order []int, rs []slotRange) {
	less := func(x, y int) int {
		a, b := rs[x], rs[y]
		switch {
		case a.base != b.base:
			if a.base < b.base {
				return -1
			}
			return 1
		case a.cap != b.cap:
			if a.cap > b.cap {
				return -1
			}
			return 1
		}
		return x - y
	}
	slices.SortFunc(order, less)
}
