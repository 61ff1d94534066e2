package kube

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
	"github.com/sluice-lb/sluice/pkg/reconciler/fakedp"
	"github.com/sluice-lb/sluice/pkg/source/translate"
)

var changeProfile = flag.String("changeprofile", "", "BenchmarkOneSliceChange/30k: write the allocations profile to this file after its timed changes, and to FILE.base before them (go tool pprof -diff_base FILE.base FILE: theirs alone)")

// BenchmarkOneSliceChange is what one EndpointSlice change costs the
// agent's Kubernetes path at N ClusterIP Services x 10 endpoints (issue
// 14's 30k, and 10k beside it: a change must not cost more with N): the
// slice arrives on the informer's watch as protobuf, as from an API
// server, with what an API server's objects carry (asServed); it is
// decoded, slimmed into the cache, handed to the tracker, synced and
// translated, and the state is applied by the reconciler (to a datapath
// that holds nothing: the map writes are pkg/datapath's) and reported
// programmed. One endpoint's address goes back and forth, timed once the
// first BackendIDQuarantine+64 changes are made (warm-B/change). B/op is the
// garbage a change leaves (nearly all of it: the state a change makes
// shares the rest), which sets how often the agent collects (test/bench/
// performance.md, fortieth pass); cpu-us/op the process's CPU time.
func BenchmarkOneSliceChange(b *testing.B) {
	for _, n := range benchSizes() {
		b.Run(fmt.Sprintf("%dk", n/1000), func(b *testing.B) { benchOneSliceChange(b, n) })
	}
}

func benchOneSliceChange(b *testing.B, n int) {
	svcs, eps := benchObjects(n, true)
	// The changed slice's two versions, as the API server would send
	// them: the first endpoint moved, and back.
	var versions [2][]byte
	for v := range versions {
		es := eps[n/2].DeepCopy()
		es.ResourceVersion = fmt.Sprint(900000 + v)
		if v == 0 {
			es.Endpoints[0].Addresses[0] = "10.250.250.250"
		}
		var err error
		if versions[v], err = es.Marshal(); err != nil {
			b.Fatal(err)
		}
	}
	updates := make(chan []byte)
	client := fake.NewClientset()
	streamFirstList(b, client, "services", marshalEach(b, svcs), nil, func() protoObject { return &corev1.Service{} })
	streamFirstList(b, client, "endpointslices", marshalEach(b, eps), updates, func() protoObject { return &discoveryv1.EndpointSlice{} })
	streamFirstList(b, client, "nodes", nil, nil, func() protoObject { return &corev1.Node{} })
	// The ServiceCIDRs the source follows (servicecidrs.go): none.
	streamFirstList(b, client, "servicecidrs", nil, nil, func() protoObject { return &networkingv1.ServiceCIDR{} })

	src, err := New(Config{Client: streamingClient{client}, Options: translate.Options{Node: translate.Node{Name: node}},
		SyncPeriod: time.Hour, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	states := make(chan *model.State, 16)
	ctx, cancel := context.WithCancel(b.Context())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, func(st *model.State) { states <- st }) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			b.Error(err)
		}
	}()
	rec := reconciler.New(fakedp.Nop{}, nil)
	if err := rec.Restore(); err != nil {
		b.Fatal(err)
	}
	st := <-states
	if st.Services.Len() != n {
		b.Fatalf("first state: %d frontends, want %d", st.Services.Len(), n)
	}
	if err := rec.Apply(st); err != nil {
		b.Fatal(err)
	}
	src.Programmed(st)
	moved := model.L4Addr{Addr: netip.MustParseAddr("10.250.250.250"), Port: 8080, Proto: model.TCP}
	fe := model.L4Addr{Addr: netip.MustParseAddr(fmt.Sprintf("10.%d.%d.%d", 96+(n/2)>>16, ((n/2)>>8)&0xff, (n/2)&0xff)), Port: 80, Proto: model.TCP}

	i := 0
	change := func() {
		updates <- versions[i%2]
		next := <-states
		if next == st || next.BaseGen == 0 || len(next.Changed) != 1 || next.Changed[0] != fe {
			b.Fatalf("change %d: state %p after %p, changed %v: want the one frontend %s", i, next, st, next.Changed, fe)
		}
		if err := rec.Apply(next); err != nil {
			b.Fatal(err)
		}
		src.Programmed(next)
		st = next
		bs := st.Services.Get(fe).Backends
		if has := slices.ContainsFunc(bs, func(be model.Backend) bool { return be.L4Addr == moved }); has != (i%2 == 0) {
			b.Fatalf("change %d: moved endpoint present %v", i, has)
		}
		i++
	}
	// The first changes after the first sync, untimed: each gives the
	// endpoint that comes back a new backend id until the freed ones
	// leave quarantine, so the ids climb past the ones the first sync
	// used (warm-B/change: what those changes allocated, each).
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	const warm = reconciler.BackendIDQuarantine + 64
	for range warm {
		change()
	}
	runtime.ReadMemStats(&after)

	writeAllocs := func(suffix string) {
		if *changeProfile == "" || n != 30000 {
			return
		}
		runtime.GC() // the profile is as of the last collection
		out, err := os.Create(*changeProfile + suffix)
		if err == nil {
			err = pprof.Lookup("allocs").WriteTo(out, 0)
			err = errors.Join(err, out.Close())
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	writeAllocs(".base")
	// Timed from a collection: 3,000 changes then make 45 MB, short of
	// the next one, which at this heap (about 140 MB live: the fake
	// server's bytes and the first sync's objects too) would be 0.2
	// CPU-second, 70 us a change, in some runs and not others.
	runtime.GC()

	b.ReportAllocs()
	cpu0, i0 := testutil.CPUTime(b), i
	for b.Loop() {
		change()
	}
	b.StopTimer()
	writeAllocs("")
	b.ReportMetric(float64((testutil.CPUTime(b)-cpu0).Microseconds())/float64(i-i0), "cpu-us/op")
	// After the loop: its start drops the metrics reported before.
	b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/warm, "warm-B/change")
}

// benchSizes are BenchmarkOneSliceChange's N: 10,000 and 30,000, and
// 100,000 unless -short.
func benchSizes() []int { return testutil.ScaleSizes(2, 10000, 30000, 100000) }
