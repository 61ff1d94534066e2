package reconciler_test

import (
	"fmt"
	"maps"
	"net/netip"
	"runtime"
	"slices"
	"testing"

	"github.com/sluice-lb/sluice/internal/testutil"
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

// scaleState is n services with 2 to 10 backends each (service i has
// 2+i%9), the shape of the sources' scale benchmarks. Backend j of
// service i is 10.(16*(i>>16)+j+1).(i>>8).(i):8080/TCP.
func scaleState(n int) *model.State {
	st := model.NewState()
	for i := range n {
		bs := make([]model.Backend, 0, 2+i%9)
		for j := range 2 + i%9 {
			bs = append(bs, model.Backend{L4Addr: model.L4Addr{
				Addr: netip.AddrFrom4([4]byte{10, byte(16*(i>>16) + j + 1), byte(i >> 8), byte(i)}), Port: 8080, Proto: model.TCP}})
		}
		fe := scaleVIP(i)
		st.Services[fe] = svc(fe, fmt.Sprintf("svc-%d", i), bs...)
	}
	return st
}

// scaleVIP is the frontend of service i: 10.(96+i>>16).(i>>8).(i):80/TCP.
func scaleVIP(i int) model.L4Addr {
	return model.L4Addr{Addr: netip.AddrFrom4([4]byte{10, byte(96 + i>>16), byte(i >> 8), byte(i)}), Port: 80, Proto: model.TCP}
}

// BenchmarkApplyScale is issue 14's reconciler figure: N services with 2
// to 10 backends each over the in-memory fake, programmed from empty
// ("initial"), and one backend of one service changed ("one-change").
// The fake checks its invariants incrementally after every operation, so
// part of the time is the fake's.
func BenchmarkApplyScale(b *testing.B) {
	sizes := []int{30000, 100000}
	if testing.Short() {
		sizes = sizes[:1]
	}
	for _, n := range sizes {
		st := scaleState(n)
		b.Run(fmt.Sprintf("%dk/initial", n/1000), func(b *testing.B) {
			b.ReportAllocs()
			cpu0, runs := testutil.CPUTime(b), 0
			for b.Loop() {
				f := fakedp.New(1<<18, 1<<21, 1<<21)
				r := reconciler.New(f, nil)
				if err := r.Apply(st); err != nil {
					b.Fatal(err)
				}
				runs++
			}
			b.ReportMetric(float64((testutil.CPUTime(b)-cpu0).Microseconds())/1000/float64(runs), "cpu-ms/op")
		})
		// One change as the sources hand it over: a new state sharing
		// every other service, saying which frontend changed
		// (model.State.BaseGen); and without saying so (nohint), which
		// makes the reconciler compare every frontend.
		for _, hint := range []bool{true, false} {
			name := fmt.Sprintf("%dk/one-change", n/1000)
			if !hint {
				name += "-nohint"
			}
			b.Run(name, func(b *testing.B) {
				fe := scaleVIP(n / 2)
				s := st.Services[fe]
				moved := *s
				moved.Backends = model.SortBackends(append(slices.Clone(s.Backends[1:]),
					model.Backend{L4Addr: model.L4Addr{Addr: netip.AddrFrom4([4]byte{10, 250, 250, 250}), Port: 8080, Proto: model.TCP}}))
				states := [2]*model.State{{Services: maps.Clone(st.Services)}, {Services: st.Services}}
				states[0].Services[fe] = &moved
				if hint {
					// Each is made from the other.
					g0, g1 := model.NewGeneration(), model.NewGeneration()
					states[0].Gen, states[0].BaseGen, states[0].Changed = g0, g1, []model.L4Addr{fe}
					states[1].Gen, states[1].BaseGen, states[1].Changed = g1, g0, []model.L4Addr{fe}
				}
				f := fakedp.New(1<<18, 1<<21, 1<<21)
				r := reconciler.New(f, nil)
				if err := r.Apply(states[1]); err != nil {
					b.Fatal(err)
				}
				f.ResetCounts()
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					if err := r.Apply(states[i%2]); err != nil {
						b.Fatal(err)
					}
					i++
				}
				b.ReportMetric(float64(f.Writes())/float64(i), "writes/op")
				if hint && reconciler.IncrementalApplies(r) != i {
					b.Fatalf("%d of %d Applies looked at the change only", reconciler.IncrementalApplies(r), i)
				}
			})
		}
	}
}

// nopDatapath accepts every batch and holds nothing: what a first
// program costs the reconciler alone, and what its view holds.
type nopDatapath struct{ reconciler.Datapath }

func (nopDatapath) Capacity() (int, int, int)                                { return 1 << 30, 1 << 30, 1 << 30 }
func (nopDatapath) SourceRangeCapacity() int                                 { return 1 << 30 }
func (nopDatapath) UpsertBackends(es []reconciler.BackendEntry) (int, error) { return len(es), nil }
func (nopDatapath) UpsertRevNats(es []reconciler.RevNatEntry) (int, error)   { return len(es), nil }
func (nopDatapath) UpsertSlots(es []reconciler.SlotEntry) (int, error)       { return len(es), nil }
func (nopDatapath) UpsertMasters(es []reconciler.MasterEntry) (int, error)   { return len(es), nil }
func (nopDatapath) UpsertServiceIPs(as []netip.Addr) (int, error)            { return len(as), nil }
func (nopDatapath) ResetServiceStats(reconciler.ServiceID) error             { return nil }

// BenchmarkFromEmptyView is issue 14's first program at N services with
// 2 to 10 backends each, without a datapath: the reconciler's own time,
// and the live heap its view of the maps holds afterwards (view-MiB, the
// reconciler's share of the agent's memory).
func BenchmarkFromEmptyView(b *testing.B) {
	for _, n := range []int{30000, 100000} {
		b.Run(fmt.Sprintf("%dk", n/1000), func(b *testing.B) {
			st := scaleState(n)
			b.ReportAllocs()
			cpu0, runs := testutil.CPUTime(b), 0
			for b.Loop() {
				if err := reconciler.New(nopDatapath{}, nil).Apply(st); err != nil {
					b.Fatal(err)
				}
				runs++
			}
			b.ReportMetric(float64((testutil.CPUTime(b)-cpu0).Microseconds())/1000/float64(runs), "cpu-ms/op")
			b.StopTimer()
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			r := reconciler.New(nopDatapath{}, nil)
			if err := r.Apply(st); err != nil {
				b.Fatal(err)
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			// st too: dead after the Apply, it would be collected
			// between the two readings and counted against the view.
			runtime.KeepAlive(r)
			runtime.KeepAlive(st)
			b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "view-MiB")
		})
	}
}
