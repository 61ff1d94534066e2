package datapath

import (
	"net/netip"
	"runtime"
	"testing"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// BenchmarkSlotTableHeap: the heap a family's slot table holds beyond its
// array after a first program of 30,000 IPv4 frontends x 10 slots
// (presized, as Maps.PresizeFrontends does): the frontends' ranges and
// the allocator's free sets (issue 14, fifty-first pass). The array is
// memory allocated before the first reading, not counted.
func BenchmarkSlotTableHeap(b *testing.B) {
	const frontends, per = 30000, 10
	fes := make([]reconciler.Frontend, frontends)
	for i := range fes {
		a := netip.AddrFrom4([4]byte{10, byte(96 + i>>16), byte(i >> 8), byte(i)})
		fes[i] = reconciler.DefaultScope(model.L4Addr{Addr: a, Port: 80, Proto: model.TCP})
	}
	ids := make([]reconciler.BackendID, per)
	for j := range ids {
		ids[j] = reconciler.BackendID(j + 1)
	}
	none := func(reconciler.Frontend, uint32) error { return nil }
	var heap, inuse float64
	for b.Loop() {
		b.StopTimer()
		tb := memSlotTable(2 * 12 * frontends)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		b.StartTimer()
		tb.presize(frontends)
		for _, fe := range fes {
			if err := tb.write(fe, 1, ids, none); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		runtime.GC()
		runtime.ReadMemStats(&after)
		runtime.KeepAlive(tb)
		heap += float64(after.HeapAlloc) - float64(before.HeapAlloc)
		inuse += float64(after.HeapInuse) - float64(before.HeapInuse)
		b.StartTimer()
	}
	n := float64(b.N)
	b.ReportMetric(heap/n/(1<<20), "table-MiB")
	b.ReportMetric(inuse/n/(1<<20), "inuse-MiB")
	b.ReportMetric(heap/n/frontends, "B/frontend")
}

// TestPackedSlotRoundTrip: a slot table's entry comes back as it was
// packed, for every capacity a range has (none, 1 to 2^16), bases from 0
// to the largest, with and without a master, counts up to 65535 slots,
// and different entries pack
// differently. Fails with the master's bit among the capacity's (bit 4:
// a master without a range reads as one of 2^15).
func TestPackedSlotRoundTrip(t *testing.T) {
	seen := map[packedSlot]slotEntry{}
	for k := -1; k <= maxSlotOrder; k++ {
		var c uint32
		if k >= 0 {
			c = 1 << k
		}
		for _, base := range []uint32{0, 1, 1 << 16, 0x7fffffff, 0x80000000, 0xffffffff} {
			for _, master := range []bool{false, true} {
				for _, count := range []uint32{0, 1, 3, 0x8000, 65535} {
					e := slotEntry{r: slotRange{base: base, cap: c}, master: master, count: count}
					p := e.pack()
					if got := p.entry(); got != e {
						t.Fatalf("%+v packs to %#x, which reads %+v", e, uint64(p), got)
					}
					if o, dup := seen[p]; dup {
						t.Fatalf("%+v and %+v pack alike, %#x", o, e, uint64(p))
					}
					seen[p] = e
				}
			}
		}
	}
}

// TestSlotTableFamilies: a table's IPv6 frontends (not packed: the
// FrontendMap's Go map) and IPv4 ones keep their ranges apart through
// writes, a move, a master and a drop, and a presized IPv6 table keeps
// what it has. Fails with a slotTable.drop that forgets nothing.
func TestSlotTableFamilies(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		tb := memSlotTable(256)
		tb.v6 = v6
		none := func(reconciler.Frontend, uint32) error { return nil }
		fe := func(i int) reconciler.Frontend {
			a := netip.AddrFrom4([4]byte{10, 96, 0, byte(i)})
			if v6 && i%2 == 0 {
				a = netip.AddrFrom16([16]byte{0xfd, 15: byte(i)})
			}
			return reconciler.Frontend{L4Addr: model.L4Addr{Addr: a, Port: 443, Proto: model.TCP}, Scope: reconciler.Scope(i % 3 / 2)}
		}
		for i := range 8 {
			ids := make([]reconciler.BackendID, i+1)
			for j := range ids {
				ids[j] = reconciler.BackendID(100*i + j + 1)
			}
			must(t, tb.write(fe(i), 1, ids, none))
		}
		tb.presize(100)
		must(t, tb.write(fe(3), 5, []reconciler.BackendID{399}, none)) // moves it to 8 entries
		if _, err := tb.forMaster(fe(2), 3, none); err != nil {
			t.Fatal(err)
		}
		tb.drop(fe(5))
		if tb.ranges.Len() != 7 {
			t.Errorf("v6 %v: %d frontends after a drop, want 7", v6, tb.ranges.Len())
		}
		for i := range 8 {
			e, ok := tb.entry(fe(i))
			if ok != (i != 5) || e.master != (i == 2) {
				t.Errorf("v6 %v: %s: %+v %v", v6, fe(i), e, ok)
			}
			if !ok {
				continue
			}
			n := uint32(i + 1)
			if i == 3 {
				n = 5
			}
			for s := range n {
				want := uint32(100*i) + s + 1
				if i == 3 && s == 4 {
					want = 399
				}
				if got := tb.load(e.r.base + s); got != want {
					t.Errorf("v6 %v: %s slot %d = %d, want %d", v6, fe(i), s+1, got, want)
				}
			}
		}
	}
}

// TestSlotTableMoveEmptiesTheRest: a range a frontend moves to holds its
// old slots, the new ones, and nothing else, though its entries held
// stale ids (a range a rebuild found free: slots above a master's count,
// drift); a master's range without slots is all empty. Fails with a
// move that does not empty the entries it writes no slot into, or that
// empties the old slots it copied.
func TestSlotTableMoveEmptiesTheRest(t *testing.T) {
	tb := memSlotTable(64)
	for i := range uint32(64) {
		tb.store(i, 0xdead)
	}
	tb.rebuild(map[reconciler.Frontend][2]uint32{}) // all free, none of it empty
	none := func(reconciler.Frontend, uint32) error { return nil }
	fe := func(i byte) reconciler.Frontend {
		return reconciler.DefaultScope(model.L4Addr{Addr: netip.AddrFrom4([4]byte{10, 96, 0, i}), Port: 80, Proto: model.TCP})
	}
	check := func(what string, f reconciler.Frontend, want []uint32) {
		t.Helper()
		e, ok := tb.entry(f)
		if !ok || e.r.cap != uint32(len(want)) {
			t.Fatalf("%s: range %+v (%v), want %d entries", what, e, ok, len(want))
		}
		for i, w := range want {
			if got := tb.load(e.r.base + uint32(i)); got != w {
				t.Errorf("%s: slot %d = %#x, want %#x", what, i+1, got, w)
			}
		}
	}
	must(t, tb.write(fe(1), 2, []reconciler.BackendID{12, 13}, none)) // slots 2-3 of a range of 4
	check("first write", fe(1), []uint32{0, 12, 13, 0})
	must(t, tb.write(fe(1), 9, []reconciler.BackendID{19, 20}, none))
	check("moved", fe(1), []uint32{0, 12, 13, 0, 0, 0, 0, 0, 19, 20, 0, 0, 0, 0, 0, 0})
	must(t, tb.write(fe(1), 3, []reconciler.BackendID{33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47}, none)) // 3-17
	check("moved over its old slots", fe(1), []uint32{0, 12, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47,
		0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	if _, err := tb.forMaster(fe(2), 3, none); err != nil {
		t.Fatal(err)
	}
	check("a master's range", fe(2), []uint32{0, 0, 0, 0})
}

// TestSlotTableInUse: a table's slots in use (the scrape's fill of the
// slots arrays) are the counts of the masters it knows: not slots
// written without a master, a master's new count, kept through a move,
// gone with a drop, the kernel's count where a master read back names
// its range and none where it does not, and a rebuild's masters' counts
// but for drift. Fails with a move that loses the count, or a drop that
// keeps it.
func TestSlotTableInUse(t *testing.T) {
	tb := memSlotTable(64)
	none := func(reconciler.Frontend, uint32) error { return nil }
	fe := func(i byte) reconciler.Frontend {
		return reconciler.DefaultScope(model.L4Addr{Addr: netip.AddrFrom4([4]byte{10, 96, 0, i}), Port: 80, Proto: model.TCP})
	}
	ids := func(n int) []reconciler.BackendID {
		out := make([]reconciler.BackendID, n)
		for i := range out {
			out[i] = reconciler.BackendID(i + 1)
		}
		return out
	}
	inUse := func(what string, want int) {
		t.Helper()
		if got, ok := tb.inUse(); !ok || got != want {
			t.Errorf("%s: %d slots in use (%v), want %d", what, got, ok, want)
		}
	}
	master := func(f reconciler.Frontend, count uint32) {
		t.Helper()
		if _, err := tb.forMaster(f, count, none); err != nil {
			t.Fatal(err)
		}
	}
	must(t, tb.write(fe(1), 1, ids(3), none))
	inUse("slots without a master", 0)
	master(fe(1), 3)
	must(t, tb.write(fe(2), 1, ids(2), none))
	master(fe(2), 2)
	inUse("two masters", 5)
	must(t, tb.write(fe(1), 4, ids(3), none)) // moves it to 8 entries
	inUse("a move before its master", 5)
	master(fe(1), 6)
	inUse("its master after the move", 8)
	master(fe(2), 1)
	inUse("a master of fewer slots", 7)
	tb.drop(fe(2))
	inUse("a master deleted", 6)
	e, _ := tb.entry(fe(1))
	tb.checkMaster(fe(1), e.r.base, 5)
	inUse("a master read back with another count", 5)
	tb.checkMaster(fe(1), e.r.base+1, 5)
	inUse("a master read back naming another range", 0)
	master(fe(3), 0)
	inUse("a master of no slots", 0)
	tb.rebuild(map[reconciler.Frontend][2]uint32{
		fe(1): {0, 10}, // [0, 16)
		fe(2): {16, 3}, // [16, 20)
		fe(3): {18, 2}, // overlaps fe(2): drift
		fe(4): {32, 0},
	})
	inUse("rebuilt", 13)
	var empty *slotTable
	if _, ok := empty.inUse(); ok {
		t.Error("a family without a table has slots in use")
	}
}

// TestMapFillSlotsFromTables: the scrape's fill of a slots array is the
// slots its masters name, from the agent's table, not its entries read
// back: a stale id in an entry no range uses (left by a crash, or a
// range in its quarantine) is not counted; a Datapath's knownEntries has
// both families. Fails with the fill counted from the array (4 slots).
func TestMapFillSlotsFromTables(t *testing.T) {
	d := newTestDatapath(t)
	applyServices(t, d, clusterIP(vipTCP, beTCP.addr, beUDP.addr), clusterIP(l4("10.96.0.11", 80, model.TCP), beTCP.addr))
	tb := d.maps.slots4
	tb.mu.Lock()
	must(t, tb.a.ensure(2*int(tb.n-1), 2*int(tb.n-1)))
	tb.store(tb.n-1, 7) // the last entry: no range of two frontends' uses it
	tb.unlock()
	if n, err := countSlots(tb.arr); err != nil || n != 4 {
		t.Fatalf("the array's entries not empty: %d, %v; want 4", n, err)
	}
	fill, err := d.MapFill()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fill {
		if f.Name == "slots" && f.Entries != 3 {
			t.Errorf("%s: %d slots in use, want 3 (the masters')", f.Pin, f.Entries)
		}
	}
	if got := d.knownEntries(); got[mapSlots] != 3 || got[mapSlots6] != 0 {
		t.Errorf("knownEntries = %v, want %s 3, %s 0", got, mapSlots, mapSlots6)
	}
}
