package tracker

import (
	"fmt"
	"runtime"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// BenchmarkTracker feeds 30,000 Services with one 10-endpoint slice each
// and syncs ("initial"), then changes one slice and syncs again
// ("one-slice-change"; "one-slice-change-100k" at 100,000; cpu-us/op is
// the process's CPU time): the tracker's share of what a source pays.
// pkg/source/kube's BenchmarkFirstState adds the informers.
func BenchmarkTracker(b *testing.B) {
	const n = 30000
	svcs, eps := trackerObjects(n)
	feed := func() *Tracker { return fed(svcs, eps) }
	// live-MiB: what the tracker and its state hold after the first
	// sync, without the objects fed (the informer caches' share).
	b.Run("initial", func(b *testing.B) {
		b.ReportAllocs()
		var live float64
		runs := 0
		for b.Loop() {
			b.StopTimer()
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			b.StartTimer()
			tr := feed()
			r := tr.Sync()
			if r.State.Services.Len() != n {
				b.Fatal(r.State.Services.Len())
			}
			b.StopTimer()
			runtime.GC()
			runtime.ReadMemStats(&after)
			live += float64(after.HeapAlloc-min(before.HeapAlloc, after.HeapAlloc)) / (1 << 20)
			runs++
			runtime.KeepAlive(tr)
			runtime.KeepAlive(r)
			b.StartTimer()
		}
		b.ReportMetric(live/float64(runs), "live-MiB")
	})
	b.Run("one-slice-change", func(b *testing.B) { benchOneSliceChange(b, svcs, eps) })
	// The same at 100,000 (issue 14: a change must not cost more with N).
	b.Run("one-slice-change-100k", func(b *testing.B) {
		svcs, eps := trackerObjects(100000)
		benchOneSliceChange(b, svcs, eps)
	})
}

// trackerObjects returns n Services with one 10-endpoint slice each.
func trackerObjects(n int) ([]*corev1.Service, []*discoveryv1.EndpointSlice) {
	svcs := make([]*corev1.Service, n)
	eps := make([]*discoveryv1.EndpointSlice, n)
	for i := range n {
		name := fmt.Sprintf("svc-%d", i)
		svcs[i] = service(name, fmt.Sprintf("10.%d.%d.%d", 96+i>>16, (i>>8)&0xff, i&0xff), 80)
		ips := make([]string, 10)
		for j := range ips {
			ips[j] = fmt.Sprintf("10.%d.%d.%d", 1+i>>8&0x7f, i&0xff, j+1)
		}
		eps[i] = slice(name, name+"-1", 8080, ips...)
	}
	return svcs, eps
}

// fed returns a tracker fed with svcs and eps, not synced.
func fed(svcs []*corev1.Service, eps []*discoveryv1.EndpointSlice) *Tracker {
	tr := New(translate.Options{})
	for i := range svcs {
		tr.SetService(nameOf(svcs[i]), svcs[i])
		tr.SetSlice(nameOf(eps[i]), eps[i])
	}
	return tr
}

// benchOneSliceChange syncs svcs and eps, then times one slice's change
// and the sync that follows, back and forth.
func benchOneSliceChange(b *testing.B, svcs []*corev1.Service, eps []*discoveryv1.EndpointSlice) {
	n := len(svcs)
	tr := fed(svcs, eps)
	tr.Sync()
	changed := eps[n/2].DeepCopy()
	changed.Endpoints[0].Addresses[0] = "10.99.99.99"
	b.ReportAllocs()
	cpu0, i := testutil.CPUTime(b), 0
	for b.Loop() {
		es := eps[n/2]
		if i%2 == 0 {
			es = changed
		}
		i++
		tr.SetSlice(nameOf(es), es)
		if r := tr.Sync(); r.Changed != 1 {
			b.Fatal(r.Changed)
		}
	}
	b.ReportMetric(float64((testutil.CPUTime(b)-cpu0).Microseconds())/float64(i), "cpu-us/op")
}
