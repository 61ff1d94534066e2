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
