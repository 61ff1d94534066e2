package datapath

// The backend slots of the frontends (issue 14, forty-third pass). A
// frontend's master is an entry of its family's services hash; its slots
// 1..count are entries slots_base..slots_base+count-1 of the family's
// slots array (bpf/lib/structs.h), in a range the agent allocates
// (slotalloc.go). The array is mapped into the agent read-write, and the
// slots are written as memory: a 32-bit atomic store each, no system
// call, where the services hash took an insert per slot (0.24-0.36 s of
// kernel time for the 300,000 slots of a first program of 30,000
// Services x 10).
//
// slotTable keeps, per family, each frontend's range. The reconciler's
// Datapath is unchanged: UpsertSlot writes into the frontend's range,
// allocating it at the frontend's first slot (its master comes after),
// or a larger one when the slot is beyond it. A move keeps make before
// break: the new range gets the slots the old one has and the new slot,
// then the master in the kernel is written with the new base (a hash
// update: a program reads the old element or the new one, count and base
// together), and the old range is kept for slotQuarantine before another
// frontend gets it. On start the table is rebuilt from the masters
// (rebuildSlots): their bases and counts are the ranges in use.

import (
	"errors"
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// slotStride is the bytes of an entry of a slots array: the kernel rounds
// an array's values up to 8 bytes; the __u32 is the first 4.
const slotStride = 8

// slotEntries is the size of each family's slots array for cfg: twice
// the service entries, so that MaxServiceEntries slots fit in ranges of
// power-of-two capacities (each at most twice what it holds).
func slotEntries(cfg Config) int { return 2 * cfg.MaxServiceEntries }

// slotEntry is a frontend's entry of a slotTable.
type slotEntry struct {
	r slotRange // cap 0: no range (no slot written, or drift)
	// master: the kernel has the frontend's master (written by
	// UpsertMaster or read back), whose base a move rewrites.
	master bool
	// count is the slots its master says it has, as the agent wrote it
	// or read it back, where it names the range (0 for none): the sum
	// of the table's counts is its slots in use (slotTable.inUse).
	count uint32
}

// packedSlot is a slotEntry in 8 bytes, as a slotTable holds it: the
// base in the high 32 bits, the count in bits 9-25 (at most 65535), the
// master in bit 8, and in the low byte bits.Len32 of the capacity (0 for
// none, k+1 for 2^k: a range's capacity is a power of two).
type packedSlot uint64

const (
	packedMaster     = 1 << 8
	packedCountShift = 9
	packedCountMask  = 1<<17 - 1
)

func (e slotEntry) pack() packedSlot {
	p := packedSlot(e.r.base)<<32 | packedSlot(e.count&packedCountMask)<<packedCountShift | packedSlot(bits.Len32(e.r.cap))
	if e.master {
		p |= packedMaster
	}
	return p
}

func (p packedSlot) entry() slotEntry {
	e := slotEntry{r: slotRange{base: uint32(p >> 32)}, master: p&packedMaster != 0,
		count: uint32(p>>packedCountShift) & packedCountMask}
	if l := uint8(p); l > 0 {
		e.r.cap = 1 << (l - 1)
	}
	return e
}

// slotTable is a family's slots array and the ranges of its frontends.
type slotTable struct {
	mu    sync.Mutex
	arr   *ebpf.Map
	name  string
	a     *lazyArray // the array, mapped read-write a window at a time
	words []uint32   // a's words: entry i is words[2*i]
	n     uint32     // entries
	alloc *slotAlloc
	v6    bool // its frontends are IPv6 (mapSlots6)
	// used is the sum of the entries' counts: the slots the masters
	// name (inUse).
	used int
	// ranges are the frontends' entries, packed (an IPv4 frontend and
	// its entry take 16 bytes a slot: fifty-first pass).
	ranges reconciler.FrontendMap[packedSlot]
}

// entry returns fe's entry, and whether it has one.
func (t *slotTable) entry(fe reconciler.Frontend) (slotEntry, bool) {
	p, ok := t.ranges.Get(fe)
	return p.entry(), ok
}

func (t *slotTable) setEntry(fe reconciler.Frontend, e slotEntry) { t.ranges.Put(fe, e.pack()) }

// openSlotTable maps the array arr read-write; the table has no ranges.
func openSlotTable(arr *ebpf.Map, name string) (*slotTable, error) {
	if arr == nil {
		return nil, nil
	}
	if arr.ValueSize() != 4 || arr.Type() != ebpf.Array {
		return nil, fmt.Errorf("%s: %s of %d-byte values, want an array of __u32", name, arr.Type(), arr.ValueSize())
	}
	n := arr.MaxEntries()
	a, err := mapLazy(arr, int(n)*slotStride)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	t := &slotTable{arr: arr, name: name, a: a, words: a.words(), n: n, alloc: newSlotAlloc(n),
		v6: name == mapSlots6}
	t.alloc.onFree = t.zero
	return t, nil
}

// array is the slots array, nil for no table.
func (t *slotTable) array() *ebpf.Map {
	if t == nil {
		return nil
	}
	return t.arr
}

// close unmaps the array.
func (t *slotTable) close() error {
	if t == nil {
		return nil
	}
	return closeWords(t.a, &t.words)
}

// unlock releases the windows mapped under the lock (arraymem.go), then
// the lock: every load and store is in a range mapRange mapped since the
// lock was taken.
func (t *slotTable) unlock() {
	_ = t.a.release() // a window left mapped only counts in the RSS
	t.mu.Unlock()
}

// mapRange maps the windows of r (arraymem.go), before r's entries are
// read or written.
func (t *slotTable) mapRange(r slotRange) error {
	if r.cap == 0 {
		return nil
	}
	return t.a.ensure(2*int(r.base), 2*int(r.base+r.cap-1))
}

func (t *slotTable) load(i uint32) uint32     { return atomic.LoadUint32(&t.words[2*uint64(i)]) }
func (t *slotTable) store(i uint32, v uint32) { atomic.StoreUint32(&t.words[2*uint64(i)], v) }

// zero empties the entries of r; nothing if r cannot be mapped (the
// allocator's onFree: a move zeroes the range it gets again anyway).
func (t *slotTable) zero(r slotRange) {
	if t.mapRange(r) != nil {
		return
	}
	for i := range r.cap {
		t.store(r.base+i, 0)
	}
}

// rebase is how a move rewrites the base of a frontend's master in the
// kernel: to base, the rest as the kernel has it, if it has it.
type rebaseFunc func(fe reconciler.Frontend, base uint32) error

// write writes ids into slots first.. of fe, moving it to a larger range
// if they are beyond its own (rebase rewrites its master). On error
// nothing the kernel reads has changed.
func (t *slotTable) write(fe reconciler.Frontend, first uint32, ids []reconciler.BackendID, rebase rebaseFunc) error {
	if len(ids) == 0 {
		return nil
	}
	last := first + uint32(len(ids)) - 1
	e, ok := t.entry(fe)
	if !ok || last > e.r.cap {
		return t.move(fe, e, ok, last, first, ids, rebase)
	}
	if err := t.mapRange(e.r); err != nil {
		return fmt.Errorf("slots of %s: %w", fe, err)
	}
	for j, id := range ids {
		t.store(e.r.base+first-1+uint32(j), uint32(id))
	}
	return nil
}

// move gives fe a range of at least count entries: the slots of its old
// one copied, then ids into slots first.. (none if ids is empty), the
// other entries emptied, then its master (if the kernel has one) moved
// there, then the old range quarantined.
//
// The new range is no program's yet (a range leaves the quarantine only
// when no program reads it; the master that names it is written after,
// by a system call whose hash update is a store-release, ordered after
// these): each of its entries is written once, by a plain store, where
// emptying it first and then writing its slots took an atomic store
// (XCHG on amd64) for each of both (fifty-first pass).
func (t *slotTable) move(fe reconciler.Frontend, e slotEntry, had bool, count, first uint32, ids []reconciler.BackendID, rebase rebaseFunc) error {
	nr, err := t.alloc.alloc(max(count, e.r.cap+1))
	if err != nil {
		return fmt.Errorf("slots of %s (%d): %s: %w", fe, count, t.name, err)
	}
	if err := errors.Join(t.mapRange(nr), t.mapRange(e.r)); err != nil {
		t.alloc.retire(nr)
		return fmt.Errorf("slots of %s (%d): %w", fe, count, err)
	}
	w := t.words[2*uint64(nr.base) : 2*uint64(nr.base+nr.cap)]
	for i := range e.r.cap {
		w[2*i] = t.load(e.r.base + i)
	}
	// ids go to [lo, hi); the entries above the old range's and out of
	// it are emptied: empty already, but for a range a rebuild found
	// free (after drift, or slots above a master's count).
	lo, hi := nr.cap, nr.cap
	if len(ids) > 0 {
		lo, hi = first-1, first-1+uint32(len(ids))
	}
	for i := e.r.cap; i < nr.cap; i++ {
		if i < lo || i >= hi {
			w[2*i] = 0
		}
	}
	for j, id := range ids {
		w[2*(lo+uint32(j))] = uint32(id)
	}
	if had && e.master {
		if err := rebase(fe, nr.base); err != nil {
			t.alloc.retire(nr)
			return fmt.Errorf("move the slots of %s to %d: %w", fe, nr.base, err)
		}
	}
	t.alloc.retire(e.r)
	t.setEntry(fe, slotEntry{r: nr, master: e.master, count: e.count})
	return nil
}

// forMaster returns the base to write in fe's master of count slots,
// moving fe to a range that holds them if its own does not (the
// reconciler writes the slots first: not seen but after drift).
func (t *slotTable) forMaster(fe reconciler.Frontend, count uint32, rebase rebaseFunc) (uint32, error) {
	e, ok := t.entry(fe)
	if count > e.r.cap {
		if err := t.move(fe, e, ok, count, 0, nil, rebase); err != nil {
			return 0, err
		}
		e, _ = t.entry(fe)
	}
	if !e.master || e.count != count {
		t.used += int(count) - int(e.count)
		e.master, e.count = true, count
		t.setEntry(fe, e)
	}
	return e.r.base, nil
}

// clear empties slot of fe (>= 1); a slot beyond its range is empty.
func (t *slotTable) clear(fe reconciler.Frontend, slot uint32) error {
	if e, ok := t.entry(fe); ok && slot >= 1 && slot <= e.r.cap {
		if err := t.mapRange(e.r); err != nil {
			return err
		}
		t.store(e.r.base+slot-1, 0)
	}
	return nil
}

// drop forgets fe, whose master is deleted: its range is quarantined.
func (t *slotTable) drop(fe reconciler.Frontend) {
	if e, ok := t.entry(fe); ok {
		t.alloc.retire(e.r)
		t.used -= int(e.count)
		t.ranges.Delete(fe)
	}
}

// release quarantines fe's range, as drop does, once the kernel has its
// master retired (count 0, FlagRetired: reconciler/retired.go), which
// would otherwise hold the range for as long as it stays retired (a
// 5,000-slot frontend, 8,192 entries for hours). No program reads a slot
// of a master of count 0, and a frontend written again gets a new range
// (write, move) before its master names it. fe keeps its entry, a master
// of no range, for that move to rebase.
func (t *slotTable) release(fe reconciler.Frontend) {
	e, ok := t.entry(fe)
	if !ok || e.r.cap == 0 {
		return
	}
	t.alloc.retire(e.r)
	t.used -= int(e.count)
	t.setEntry(fe, slotEntry{master: e.master})
}

// inUse returns the slots in use, the sum of the counts of the masters
// the table knows (the scrape's fill of the slots arrays, mapFill),
// and false for no table.
func (t *slotTable) inUse() (int, bool) {
	if t == nil {
		return 0, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.used, true
}

// walk gives f the slots, not empty, of every frontend's range, until f
// returns false; it fails only if a range cannot be mapped.
func (t *slotTable) walk(f func(fe reconciler.Frontend, slot uint32, id reconciler.BackendID) bool) error {
	for fe, p := range t.ranges.All() {
		e := p.entry()
		if t.a.count > walkWindows {
			_ = t.a.release() // a window left mapped only counts in the RSS
		}
		if err := t.mapRange(e.r); err != nil {
			return fmt.Errorf("slots of %s: %w", fe, err)
		}
		for i := range e.r.cap {
			if id := t.load(e.r.base + i); id != 0 {
				if !f(fe, i+1, reconciler.BackendID(id)) {
					return nil
				}
			}
		}
	}
	return nil
}

// walkWindows is how many windows a walk keeps mapped before it releases
// them: a walk reads every range, in no order.
const walkWindows = 8

// checkMaster compares a master read from the kernel with the table: a
// master whose base is not its frontend's range (changed behind the
// agent's back) loses the range, so that the reconciler, finding no
// slots, writes them into a new one and moves the master there.
func (t *slotTable) checkMaster(fe reconciler.Frontend, base, count uint32) {
	e, ok := t.entry(fe)
	if ok && (count == 0 || e.r.base == base && count <= e.r.cap) {
		if !e.master || e.count != count {
			t.used += int(count) - int(e.count)
			e.master, e.count = true, count
			t.setEntry(fe, e)
		}
		return
	}
	if ok {
		t.alloc.retire(e.r)
		t.used -= int(e.count)
	}
	t.setEntry(fe, slotEntry{master: true})
}

// rebuild fills the table from the masters of the kernel: each range
// in use is a master's base and count (the smallest range that holds
// it). A range out of the array or overlapping another is drift: its
// frontend keeps no range, and gets a new one when the reconciler writes
// its slots.
func (t *slotTable) rebuild(masters map[reconciler.Frontend][2]uint32) {
	fes := make([]reconciler.Frontend, 0, len(masters))
	used := make([]slotRange, 0, len(masters))
	t.ranges = t.makeRanges(len(masters))
	t.used = 0
	for fe, bc := range masters {
		if bc[1] == 0 {
			t.setEntry(fe, slotEntry{master: true})
			continue
		}
		fes = append(fes, fe)
		used = append(used, slotRange{base: bc[0], cap: slotCap(bc[1])})
	}
	a, bad := rebuildSlotAlloc(t.n, used)
	a.onFree = t.zero
	t.alloc = a
	for i, fe := range fes {
		if bad[i] {
			t.setEntry(fe, slotEntry{master: true})
			continue
		}
		t.setEntry(fe, slotEntry{r: used[i], master: true, count: masters[fe][1]})
		t.used += int(masters[fe][1])
	}
}

var _ reconciler.FrontendPresizer = (*Maps)(nil)

// PresizeFrontends makes room in each family's table for the ranges of
// a first program's frontends (reconciler.FrontendPresizer): a table
// that has none yet is made anew with room for them.
func (m *Maps) PresizeFrontends(n4, n6 int) {
	m.slots4.presize(n4)
	m.slots6.presize(n6)
}

// presize makes t's ranges room for n frontends, if it has none yet.
func (t *slotTable) presize(n int) {
	if t == nil || n <= 0 {
		return
	}
	t.mu.Lock()
	defer t.unlock()
	if t.ranges.Len() == 0 {
		t.ranges = t.makeRanges(n)
	}
}

// makeRanges returns ranges with room for n frontends of t's family.
func (t *slotTable) makeRanges(n int) reconciler.FrontendMap[packedSlot] {
	if t.v6 {
		return reconciler.MakeFrontendMap[packedSlot](0, n)
	}
	return reconciler.MakeFrontendMap[packedSlot](n, 0)
}

// slotTableOf returns fe's family's table.
func (m *Maps) slotTableOf(fe reconciler.Frontend) *slotTable {
	if is6(fe.Addr) {
		return m.slots6
	}
	return m.slots4
}

// rebaseMaster rewrites the base of fe's master in the kernel, the rest
// as the kernel has it; a frontend without a master has nothing to move.
func (m *Maps) rebaseMaster(fe reconciler.Frontend, base uint32) error {
	k, err := serviceKey(fe, 0)
	if err != nil {
		return err
	}
	var v sockLb4Service
	if is6(fe.Addr) {
		k6 := lb6Key(k, fe.Addr)
		err = m.services6.Lookup(&k6, &v)
		if err == nil {
			v.SlotsBase = base
			err = m.services6.Update(&k6, &v, ebpf.UpdateExist)
		}
	} else {
		err = m.services.Lookup(&k, &v)
		if err == nil {
			v.SlotsBase = base
			err = m.services.Update(&k, &v, ebpf.UpdateExist)
		}
	}
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return nil
	}
	return err
}

// rebuildSlots rebuilds both families' tables from the masters in the
// kernel (Open).
func (m *Maps) rebuildSlots() error {
	for _, f := range []struct {
		t        *slotTable
		services *ebpf.Map
		v6       bool
	}{{m.slots4, m.services, false}, {m.slots6, m.services6, true}} {
		if f.t == nil || f.services == nil {
			continue
		}
		masters := map[reconciler.Frontend][2]uint32{}
		var err error
		if f.v6 {
			err = eachEntry(f.services, mapServices6, func(k *sockLb6Key, v *sockLb4Service) {
				masters[frontendOf(addrFrom16(k.Vip), k.Port, k.Proto, k.Scope)] = [2]uint32{v.SlotsBase, v.Count}
			})
		} else {
			err = eachEntry(f.services, mapServices, func(k *sockLb4Key, v *sockLb4Service) {
				masters[frontendOf(addrFromBE32(k.Vip), k.Port, k.Proto, k.Scope)] = [2]uint32{v.SlotsBase, v.Count}
			})
		}
		if err != nil {
			return err
		}
		f.t.mu.Lock()
		f.t.rebuild(masters)
		f.t.unlock()
	}
	return nil
}

func (m *Maps) closeSlots() error {
	return errors.Join(m.slots4.close(), m.slots6.close())
}

// eachMasterSlot gives f the slots, not empty, 1..count of each
// frontend of bases (its master's base and count) in the array arr,
// until f returns false. For the read-only Pinned, which has no table.
func eachMasterSlot(arr *ebpf.Map, name string, bases map[reconciler.Frontend][2]uint32,
	f func(fe reconciler.Frontend, slot uint32, id reconciler.BackendID) bool) error {
	if arr == nil || len(bases) == 0 {
		return nil
	}
	n := uint64(arr.MaxEntries())
	var keys []uint32
	type at struct {
		fe   reconciler.Frontend
		slot uint32
	}
	var ats []at
	for fe, bc := range bases {
		if uint64(bc[0])+uint64(bc[1]) > n {
			continue // drift: the programs read nothing there
		}
		for i := range bc[1] {
			keys = append(keys, bc[0]+i)
			ats = append(ats, at{fe, i + 1})
		}
	}
	ids := make([]uint32, len(keys))
	if err := arrayValues(arr, keys, ids); err != nil {
		return fmt.Errorf("dump %s: %w", name, err)
	}
	for i, id := range ids {
		if id != 0 && !f(ats[i].fe, ats[i].slot, reconciler.BackendID(id)) {
			return nil
		}
	}
	return nil
}
