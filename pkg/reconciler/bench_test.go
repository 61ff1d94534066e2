package reconciler_test

import (
	"flag"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
	"github.com/sluice-lb/sluice/pkg/reconciler/fakedp"
	"github.com/sluice-lb/sluice/pkg/source/tracker"
	"github.com/sluice-lb/sluice/pkg/source/translate"
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
		s := st.Services.Get(vip(42))
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
// 2+i%9), the shape of the sources' scale benchmarks.
func scaleState(n int) *model.State {
	return sizedState(n, func(i int) int { return 2 + i%9 })
}

// sizedState is n services, service i with backends(i) backends.
// Backend j of service i is 10.(16*(i>>16)+j+1).(i>>8).(i):8080/TCP.
func sizedState(n int, backends func(i int) int) *model.State {
	var sb model.ServicesBuilder
	for i := range n {
		bs := make([]model.Backend, 0, backends(i))
		for j := range backends(i) {
			bs = append(bs, model.Backend{L4Addr: model.L4Addr{
				Addr: netip.AddrFrom4([4]byte{10, byte(16*(i>>16) + j + 1), byte(i >> 8), byte(i)}), Port: 8080, Proto: model.TCP}})
		}
		fe := scaleVIP(i)
		sb.Set(fe, svc(fe, fmt.Sprintf("svc-%d", i), bs...))
	}
	return &model.State{Services: sb.Services()}
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
	for _, n := range testutil.ScaleSizes(1, 30000, 100000) {
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
				s := st.Services.Get(fe)
				moved := *s
				moved.Backends = model.SortBackends(append(slices.Clone(s.Backends[1:]),
					model.Backend{L4Addr: model.L4Addr{Addr: netip.AddrFrom4([4]byte{10, 250, 250, 250}), Port: 8080, Proto: model.TCP}}))
				states := [2]*model.State{{Services: st.Services}, {Services: st.Services}}
				states[0].Services.Set(fe, &moved)
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

// BenchmarkFromEmptyView is issue 14's first program at N services with
// 2 to 10 backends each (30kx10: 10 each, the load run's shape), without
// a datapath: the reconciler's own time in the agent's first apply (a
// Restore of the empty maps, then the Apply), and the live heap its view
// of the maps holds afterwards (view-MiB, the reconciler's share of the
// agent's memory); peak-MiB and peak-live-MiB are the heap's most during
// the first program (testutil.HeapPeak), less what it held before (the
// state). The map writes themselves are BenchmarkMapsFromEmpty's
// (pkg/datapath, privileged).
func BenchmarkFromEmptyView(b *testing.B) {
	for _, bc := range []struct {
		name  string
		state func() *model.State
	}{
		{"30k", func() *model.State { return scaleState(30000) }},
		// The load run's shape (test/bench: 300,000 backends).
		{"30kx10", func() *model.State { return sizedState(30000, func(int) int { return 10 }) }},
		{"100k", func() *model.State { return scaleState(100000) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			st := bc.state()
			b.ReportAllocs()
			cpu0, runs := testutil.CPUTime(b), 0
			for b.Loop() {
				r := reconciler.New(fakedp.Nop{}, nil)
				if err := r.Restore(); err != nil {
					b.Fatal(err)
				}
				if err := r.Apply(st); err != nil {
					b.Fatal(err)
				}
				runs++
			}
			b.ReportMetric(float64((testutil.CPUTime(b)-cpu0).Microseconds())/1000/float64(runs), "cpu-ms/op")
			b.StopTimer()
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			r := reconciler.New(fakedp.Nop{}, nil)
			if err := r.Restore(); err != nil {
				b.Fatal(err)
			}
			stopPeak := testutil.HeapPeak()
			if err := r.Apply(st); err != nil {
				b.Fatal(err)
			}
			peak, peakLive := stopPeak()
			runtime.GC()
			runtime.ReadMemStats(&after)
			// st too: dead after the Apply, it would be collected
			// between the two readings and counted against the view.
			runtime.KeepAlive(r)
			runtime.KeepAlive(st)
			b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "view-MiB")
			b.ReportMetric(float64(peak-min(peak, before.HeapAlloc))/(1<<20), "peak-MiB")
			b.ReportMetric(float64(peakLive-min(peakLive, before.HeapAlloc))/(1<<20), "peak-live-MiB")
		})
	}
}

var heapProfile = flag.String("heapprofile", "", "BenchmarkDesiredState: write a heap profile of the live tracker, state and view to this file")

// BenchmarkDesiredState is issue 14's desired state and view at 30,000
// ClusterIP Services x 8 endpoints, as the Kubernetes source makes them:
// its change tracker fed with each Service and its slice as the source's
// caches hold it (translate.Slice, the endpoints with their node names),
// synced, and the state programmed on the fake datapath. state-MiB is the
// live heap the tracker and its state hold after the first Sync (without
// the objects fed: the caches' share), view-MiB what the reconciler
// holds once it programmed that state (without the fake's maps).
// one-change is one endpoint of one Service changed, synced and applied:
// the agent's work per change, but for the informers'.
// -heapprofile writes the heap profile of the tracker, state and view,
// while they are live.
func BenchmarkDesiredState(b *testing.B) {
	const n, k = 30000, 8
	opts := translate.Options{Node: translate.Node{Name: "node-0"}}
	nodes := make([]string, 100)
	for i := range nodes {
		nodes[i] = fmt.Sprintf("node-%d", i)
	}
	svcs := make([]*corev1.Service, n)
	eps := make([]*translate.Slice, n)
	for i := range n {
		name := fmt.Sprintf("svc-%d", i)
		svcs[i] = &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, ResourceVersion: "1"},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: scaleVIP(i).Addr.String(),
				ClusterIPs: []string{scaleVIP(i).Addr.String()},
				Ports:      []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)}}},
		}
		es := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: name + "-1", ResourceVersion: "1", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: new("http"), Port: new(int32(8080)), Protocol: new(corev1.ProtocolTCP)}},
		}
		for j := range k {
			x := i*k + j
			es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
				Addresses:  []string{fmt.Sprintf("10.%d.%d.%d", 128+x>>16, (x>>8)&0xff, x&0xff)},
				Conditions: discoveryv1.EndpointConditions{Ready: new(true)},
				NodeName:   &nodes[x%len(nodes)],
			})
		}
		eps[i] = translate.SliceOf(es)
	}
	key := func(i int) (types.NamespacedName, types.NamespacedName) {
		return types.NamespacedName{Namespace: "default", Name: svcs[i].Name}, types.NamespacedName{Namespace: "default", Name: eps[i].Name}
	}
	first := func() (*tracker.Tracker, *model.State) {
		tr := tracker.New(opts)
		for i := range n {
			sk, ek := key(i)
			tr.SetService(sk, svcs[i])
			tr.SetCompactSlice(ek, eps[i], "")
		}
		st := tr.Sync().State
		if st.Services.Len() != n {
			b.Fatalf("%d frontends, want %d", st.Services.Len(), n)
		}
		return tr, st
	}
	liveMiB := func() float64 {
		var m runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m)
		return float64(m.HeapAlloc) / (1 << 20)
	}
	b.Run("initial", func(b *testing.B) {
		var state, view float64
		runs := 0
		for b.Loop() {
			b.StopTimer()
			f := fakedp.New(1<<16, 1<<20, 1<<20)
			before := liveMiB()
			b.StartTimer()
			tr, st := first()
			b.StopTimer()
			mid := liveMiB()
			b.StartTimer()
			r := reconciler.New(f, nil)
			mustApply(b, r, st)
			b.StopTimer()
			withView := liveMiB()
			if *heapProfile != "" && runs == 0 {
				out, err := os.Create(*heapProfile)
				if err != nil {
					b.Fatal(err)
				}
				if err := pprof.Lookup("heap").WriteTo(out, 0); err != nil {
					b.Fatal(err)
				}
				out.Close()
			}
			runtime.KeepAlive(r) // its last use: the reading below goes without it
			state += mid - before
			view += withView - liveMiB()
			runs++
			runtime.KeepAlive(tr)
			runtime.KeepAlive(st)
			runtime.KeepAlive(f)
			b.StartTimer()
		}
		b.ReportMetric(state/float64(runs), "state-MiB")
		b.ReportMetric(view/float64(runs), "view-MiB")
	})
	b.Run("one-change", func(b *testing.B) {
		tr, st := first()
		r := reconciler.New(fakedp.New(1<<16, 1<<20, 1<<20), nil)
		mustApply(b, r, st)
		i := n / 2
		orig := eps[i]
		changed := *orig
		changed.ResourceVersion = "2"
		endpoints := make([]translate.SliceEndpoint, orig.Endpoints.Len())
		for j := range endpoints {
			endpoints[j] = orig.Endpoints.At(j)
		}
		endpoints[0].Addr = netip.MustParseAddr("10.250.250.250")
		changed.Endpoints = translate.MakeSliceEndpoints(endpoints)
		_, ek := key(i)
		b.ReportAllocs()
		cpu0, runs := testutil.CPUTime(b), 0
		for b.Loop() {
			es := orig
			if runs%2 == 0 {
				es = &changed
			}
			tr.SetCompactSlice(ek, es, "")
			res := tr.Sync()
			if res.Changed != 1 {
				b.Fatal(res.Changed)
			}
			mustApply(b, r, res.State)
			runs++
		}
		b.ReportMetric(float64((testutil.CPUTime(b)-cpu0).Microseconds())/1000/float64(runs), "cpu-ms/op")
	})
}
