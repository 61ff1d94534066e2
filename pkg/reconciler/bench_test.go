package reconciler_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
	"github.com/sluice-lb/sluice/pkg/reconciler/fakedp"
)

// programFresh programs st on a new fake, with room for the largest state
// the benchmarks build.
func programFresh(b *testing.B, st *model.State) (*fakedp.Fake, *reconciler.Reconciler) {
	f := fakedp.New(1<<16, 1<<20, 1<<20)
	r := reconciler.New(f, nil)
	mustApply(b, r, st)
	return f, r
}

// BenchmarkApply measures the reconciler's own cost at 10,000 services x 10
// endpoints over the in-memory fake: programming everything from empty,
// and then changing one endpoint of one service (the per-change cost,
// which must not grow with the number of services' writes).
func BenchmarkApply(b *testing.B) {
	const n, k = 10000, 10
	// initial programs n services from empty, on a new fake each time.
	initial := func(n int) func(b *testing.B) {
		return func(b *testing.B) {
			st := bigState(n, k)
			b.ReportAllocs()
			for b.Loop() {
				programFresh(b, st)
			}
		}
	}
	b.Run("initial", initial(n))
	// The initial program must grow linearly with the number of services.
	for _, n := range []int{1000, 30000} {
		b.Run(fmt.Sprintf("initial-%dk", n/1000), initial(n))
	}
	b.Run("one-endpoint-change", func(b *testing.B) {
		st := bigState(n, k)
		f, r := programFresh(b, st)
		s := st.Services[vip(42)]
		orig := slices.Clone(s.Backends)
		changed := model.SortBackends(append(slices.Clone(orig[1:]), be(42, 99, model.TCP)))
		f.ResetCounts()
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if i%2 == 0 {
				s.Backends = changed
			} else {
				s.Backends = orig
			}
			i++
			if err := r.Apply(st); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(f.Writes())/float64(i), "writes/op")
	})
	b.Run("no-change", func(b *testing.B) {
		st := bigState(n, k)
		_, r := programFresh(b, st)
		b.ReportAllocs()
		for b.Loop() {
			if err := r.Apply(st); err != nil {
				b.Fatal(err)
			}
		}
	})
}
