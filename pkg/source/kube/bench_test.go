package kube

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// BenchmarkFirstState is issue 14's Kubernetes source at 30,000 ClusterIP
// Services of 10 endpoints each, served by a fake API server: from Run
// until the first desired state is handed over (informers listed, caches
// synced, every Service translated). live-MiB is the heap the source
// holds afterwards (its informer caches, the change tracker and the
// state), without the fake server's own copies: the source's share of
// the agent's memory. alloc-MiB/op is what the first state allocated.
func BenchmarkFirstState(b *testing.B) {
	const n = 30000
	objs := make([]k8sruntime.Object, 0, 2*n)
	for i := range n {
		name := fmt.Sprintf("svc-%d", i)
		objs = append(objs, service(name, fmt.Sprintf("10.%d.%d.%d", 96+i>>16, (i>>8)&0xff, i&0xff), 80))
		ips := make([]string, 10)
		for j := range ips {
			k := i*10 + j
			ips[j] = fmt.Sprintf("10.%d.%d.%d", 128+k>>16, (k>>8)&0xff, k&0xff)
		}
		objs = append(objs, slice(name, name+"-1", 8080, ips...))
	}
	var live, alloc float64
	runs := 0
	for b.Loop() {
		b.StopTimer()
		client := fake.NewClientset(objs...)
		src, err := New(Config{Client: client, Options: translate.Options{Node: translate.Node{Name: node}}, SyncPeriod: time.Hour})
		if err != nil {
			b.Fatal(err)
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		ctx, cancel := context.WithCancel(b.Context())
		got := make(chan *model.State, 1)
		done := make(chan error, 1)
		b.StartTimer()
		go func() {
			done <- src.Run(ctx, func(st *model.State) {
				select {
				case got <- st:
				default:
				}
			})
		}()
		st := <-got
		b.StopTimer()
		if len(st.Services) != n {
			b.Fatalf("first state: %d frontends, want %d", len(st.Services), n)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		live += float64(after.HeapAlloc-min(before.HeapAlloc, after.HeapAlloc)) / (1 << 20)
		alloc += float64(after.TotalAlloc-before.TotalAlloc) / (1 << 20)
		runs++
		runtime.KeepAlive(src)
		runtime.KeepAlive(st)
		cancel()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(live/float64(runs), "live-MiB")
	b.ReportMetric(alloc/float64(runs), "alloc-MiB/op")
}
