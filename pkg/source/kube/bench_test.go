package kube

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// BenchmarkFirstState is issue 14's Kubernetes source at 30,000 ClusterIP
// Services of 10 endpoints each, served by a fake API server: from Run
// until the first desired state is handed over (informers listed, caches
// synced, every Service translated). live-MiB is the heap the source
// holds afterwards (its informer caches, the change tracker and the
// state), without the fake server's own copies: the source's share of
// the agent's memory. alloc-MiB/op is what the first state allocated,
// cpu-ms/op the CPU time the process spent on it (testutil.CPUTime: the
// collector's work counts, the fake server's decoding too).
//
// peak-MiB is the most heap the process held above what it held before
// Run (testutil.HeapPeak: garbage not yet collected included), the
// start's peak, which the agent's peak RSS follows; peak-live-MiB the most
// a collection found live.
//
// minimal: the objects carry only what the translation needs, and the
// fake server hands out copies sharing its strings. decoded: the objects
// carry what an API server's do (uid, resourceVersion, labels, selector,
// the trigger-time annotation, Pod references, endpoints' node names,
// zones and conditions), and every list is decoded from protobuf as the
// agent's client decodes it, so every string is the source's own: what a
// real cluster costs. streamed: the same objects, served as an API server
// of 1.34 and later serves an informer's first list, and as the agent's
// client (client-go's WatchListClient, on by default since 1.35) asks for
// it: a watch that sends every object as its own event, each decoded
// alone, then a bookmark (KEP-3157's streaming list), where decoded is an
// API server without it: one list decoded whole.
func BenchmarkFirstState(b *testing.B) {
	const n = 30000
	for _, mode := range []string{"minimal", "decoded", "streamed"} {
		decoded := mode != "minimal"
		b.Run(mode, func(b *testing.B) {
			var svcs corev1.ServiceList
			var eps discoveryv1.EndpointSliceList
			svcs.Items, eps.Items = benchObjects(n, decoded)
			client := firstStateClient(b, &svcs, &eps, mode)
			var live, peak, peakLive, alloc float64
			var cpu time.Duration
			runs := 0
			for b.Loop() {
				b.StopTimer()
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
				t0 := testutil.CPUTime(b)
				stopPeak := testutil.HeapPeak()
				go func() {
					done <- src.Run(ctx, func(st *model.State) {
						select {
						case got <- st:
						default:
						}
					})
				}()
				st := <-got
				cpu += testutil.CPUTime(b) - t0
				b.StopTimer()
				top, topLive := stopPeak()
				peak += float64(top-min(before.HeapAlloc, top)) / (1 << 20)
				peakLive += float64(topLive-min(before.HeapAlloc, topLive)) / (1 << 20)
				if st.Services.Len() != n {
					b.Fatalf("first state: %d frontends, want %d", st.Services.Len(), n)
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
			b.ReportMetric(peak/float64(runs), "peak-MiB")
			b.ReportMetric(peakLive/float64(runs), "peak-live-MiB")
			b.ReportMetric(alloc/float64(runs), "alloc-MiB/op")
			b.ReportMetric(float64(cpu.Microseconds())/1000/float64(runs), "cpu-ms/op")
		})
	}
}

// benchObjects returns n ClusterIP Services, Service i at
// 10.(96+i>>16).(i>>8).(i):80, each with a slice of 10 endpoints; served:
// with what an API server's objects carry (asServed).
func benchObjects(n int, served bool) ([]corev1.Service, []discoveryv1.EndpointSlice) {
	svcs := make([]corev1.Service, n)
	eps := make([]discoveryv1.EndpointSlice, n)
	for i := range n {
		name := fmt.Sprintf("svc-%d", i)
		svc := service(name, fmt.Sprintf("10.%d.%d.%d", 96+i>>16, (i>>8)&0xff, i&0xff), 80)
		ips := make([]string, 10)
		for j := range ips {
			k := i*10 + j
			ips[j] = fmt.Sprintf("10.%d.%d.%d", 128+k>>16, (k>>8)&0xff, k&0xff)
		}
		es := slice(name, name+"-1", 8080, ips...)
		if served {
			asServed(svc, es, i)
		}
		svcs[i], eps[i] = *svc, *es
	}
	return svcs, eps
}

// firstStateClient serves svcs and eps: the fake's own objects
// (minimal), each list decoded afresh from protobuf as the agent's client
// decodes an API server's answer (decoded), or every object decoded alone
// from a watch that streams the first list (streamed).
func firstStateClient(b *testing.B, svcs *corev1.ServiceList, eps *discoveryv1.EndpointSliceList, mode string) kubernetes.Interface {
	switch mode {
	case "minimal":
		objs := make([]k8sruntime.Object, 0, len(svcs.Items)+len(eps.Items))
		for i := range svcs.Items {
			objs = append(objs, &svcs.Items[i])
		}
		for i := range eps.Items {
			objs = append(objs, &eps.Items[i])
		}
		return fake.NewClientset(objs...)
	case "streamed":
		client := fake.NewClientset()
		streamFirstList(b, client, "services", marshalEach(b, svcs.Items), nil, func() protoObject { return &corev1.Service{} })
		streamFirstList(b, client, "endpointslices", marshalEach(b, eps.Items), nil, func() protoObject { return &discoveryv1.EndpointSlice{} })
		streamFirstList(b, client, "nodes", nil, nil, func() protoObject { return &corev1.Node{} })
		// The ServiceCIDRs the source follows (servicecidrs.go): none.
		streamFirstList(b, client, "servicecidrs", nil, nil, func() protoObject { return &networkingv1.ServiceCIDR{} })
		return streamingClient{client}
	}
	var raw [2][]byte
	for i, l := range []interface{ Marshal() ([]byte, error) }{svcs, eps} {
		var err error
		if raw[i], err = l.Marshal(); err != nil {
			b.Fatal(err)
		}
	}
	svcBytes, epsBytes := raw[0], raw[1]
	client := fake.NewClientset()
	client.PrependReactor("list", "services", func(k8stesting.Action) (bool, k8sruntime.Object, error) {
		l := &corev1.ServiceList{}
		return true, l, l.Unmarshal(svcBytes)
	})
	client.PrependReactor("list", "endpointslices", func(k8stesting.Action) (bool, k8sruntime.Object, error) {
		l := &discoveryv1.EndpointSliceList{}
		return true, l, l.Unmarshal(epsBytes)
	})
	return client
}

// streamingClient is the fake clientset, telling the informers' reflectors
// that it serves streaming lists (streamFirstList), which the fake itself
// says it does not.
type streamingClient struct{ *fake.Clientset }

func (streamingClient) IsWatchListSemanticsUnSupported() bool { return false }

type protoObject interface {
	k8sruntime.Object
	metav1.Object
	Unmarshal([]byte) error
}

func marshalEach[T any, P interface {
	*T
	Marshal() ([]byte, error)
}](b *testing.B, items []T) [][]byte {
	out := make([][]byte, len(items))
	for i := range items {
		var err error
		if out[i], err = P(&items[i]).Marshal(); err != nil {
			b.Fatal(err)
		}
	}
	return out
}

// streamFirstList serves watches of resource as an API server serves a
// watch that asks for the initial events (sendInitialEvents, KEP-3157):
// every object, decoded from its own bytes only when the watcher takes the
// one before, then a bookmark that ends them; then each object read from
// updates (nil: none), decoded, as a modification. A watch that does not
// ask for the initial events sends nothing.
func streamFirstList(b *testing.B, client *fake.Clientset, resource string, items [][]byte, updates <-chan []byte, newObj func() protoObject) {
	client.PrependWatchReactor(resource, func(a k8stesting.Action) (bool, watch.Interface, error) {
		w := &streamWatch{ch: make(chan watch.Event), stop: make(chan struct{})}
		initial := a.(k8stesting.WatchActionImpl).ListOptions.SendInitialEvents
		go func() {
			defer close(w.ch)
			for i := 0; initial != nil && *initial && i <= len(items); i++ {
				o := newObj()
				ev := watch.Event{Type: watch.Added, Object: o}
				if i < len(items) {
					if err := o.Unmarshal(items[i]); err != nil {
						b.Error(err)
						return
					}
				} else {
					ev.Type = watch.Bookmark
					o.SetResourceVersion("999999")
					o.SetAnnotations(map[string]string{metav1.InitialEventsAnnotationKey: "true"})
				}
				select {
				case w.ch <- ev:
				case <-w.stop:
					return
				}
			}
			for initial != nil && *initial {
				var raw []byte
				select {
				case raw = <-updates:
				case <-w.stop:
					return
				}
				o := newObj()
				if err := o.Unmarshal(raw); err != nil {
					b.Error(err)
					return
				}
				select {
				case w.ch <- watch.Event{Type: watch.Modified, Object: o}:
				case <-w.stop:
					return
				}
			}
			<-w.stop
		}()
		return true, w, nil
	})
}

type streamWatch struct {
	ch   chan watch.Event
	stop chan struct{}
	once sync.Once
}

func (w *streamWatch) ResultChan() <-chan watch.Event { return w.ch }
func (w *streamWatch) Stop()                          { w.once.Do(func() { close(w.stop) }) }

// asServed gives the i-th Service and its slice what an API server's
// objects carry besides what the tests set: the metadata, the Service's
// selector and defaulted fields, the slice's controller labels and
// annotation, and each endpoint's Pod, node (one of 100), zone (one of 3)
// and conditions.
func asServed(svc *corev1.Service, es *discoveryv1.EndpointSlice, i int) {
	created := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, i, 0, time.UTC))
	app := map[string]string{"app.kubernetes.io/name": svc.Name}
	svc.UID = types.UID(fmt.Sprintf("5e1c0000-0000-4000-8000-%012d", 2*i))
	svc.ResourceVersion = fmt.Sprint(1000 + 2*i)
	svc.Generation = 1
	svc.CreationTimestamp = created
	svc.Labels = app
	svc.Spec.Selector = app
	svc.Spec.SessionAffinity = corev1.ServiceAffinityNone
	svc.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol}
	svc.Spec.IPFamilyPolicy = new(corev1.IPFamilyPolicySingleStack)
	svc.Spec.InternalTrafficPolicy = new(corev1.ServiceInternalTrafficPolicyCluster)
	es.GenerateName = svc.Name + "-"
	es.UID = types.UID(fmt.Sprintf("5e1c0000-0000-4000-8000-%012d", 2*i+1))
	es.ResourceVersion = fmt.Sprint(1001 + 2*i)
	es.Generation = 1
	es.CreationTimestamp = created
	es.Labels[discoveryv1.LabelManagedBy] = "endpointslice-controller.k8s.io"
	es.Labels["app.kubernetes.io/name"] = svc.Name
	es.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: created.UTC().Format(time.RFC3339)}
	es.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: svc.Name, UID: svc.UID,
		Controller: new(true), BlockOwnerDeletion: new(true)}}
	for j := range es.Endpoints {
		e := &es.Endpoints[j]
		e.Conditions = discoveryv1.EndpointConditions{Ready: new(true), Serving: new(true), Terminating: new(false)}
		e.NodeName = new(fmt.Sprintf("node-%d", (i*10+j)%100))
		e.Zone = new(fmt.Sprintf("zone-%c", 'a'+(i*10+j)%3))
		e.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: svc.Namespace, Name: fmt.Sprintf("%s-%d", svc.Name, j),
			UID: types.UID(fmt.Sprintf("90d00000-0000-4000-8000-%012d", i*10+j))}
	}
}
