package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/agent"
	"github.com/sluice-lb/sluice/pkg/metrics"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/source/internal/sourcetest"
	"github.com/sluice-lb/sluice/pkg/source/translate"
)

const node = "node-a"

var (
	service = sourcetest.Service
	slice   = sourcetest.Slice
)

// recorder records every state it is handed: as Run's apply, or as the
// agent's reconciler (agent.Reconciler), failing the first fail applies.
type recorder struct {
	mu     sync.Mutex
	states []*model.State
	fail   int // fail this many applies first
}

func (r *recorder) apply(st *model.State) { _ = r.Apply(st) }

func (r *recorder) Apply(st *model.State) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail > 0 {
		r.fail--
		return errors.New("injected")
	}
	r.states = append(r.states, st)
	return nil
}

func (r *recorder) Restore() error { return nil }
func (r *recorder) InSync() bool   { return true }

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.states)
}

func (r *recorder) last() *model.State {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.states) == 0 {
		return nil
	}
	return r.states[len(r.states)-1]
}

// backendsOf returns the backends of frontend vip:port as "ip:port" strings.
func backendsOf(st *model.State, vip string, port uint16) ([]string, bool) {
	if st == nil {
		return nil, false
	}
	svc, ok := st.Services.Lookup(model.L4Addr{Addr: netip.MustParseAddr(vip), Port: port, Proto: model.TCP})
	if !ok {
		return nil, false
	}
	out := []string{}
	for _, b := range svc.Backends {
		out = append(out, netip.AddrPortFrom(b.Addr, b.Port).String())
	}
	return out, true
}

func newSource(t *testing.T, cfg Config) *Source {
	t.Helper()
	cfg.Options = translate.Options{Node: translate.Node{Name: node}}
	if cfg.SyncPeriod == 0 {
		cfg.SyncPeriod = time.Hour
	}
	src, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// run runs a source handing its states to rec until the test ends.
func run(t *testing.T, cfg Config, rec *recorder) *Source {
	t.Helper()
	src := newSource(t, cfg)
	testutil.RunUntilCleanup(t, "Run", func(ctx context.Context) error { return src.Run(ctx, rec.apply) })
	return src
}

// The agent tells the source when a state is programmed.
var _ agent.ProgrammedSource = (*Source)(nil)

// runAgent runs a source under an agent, as cmd/sluice does, with rec as
// its reconciler and m its Observer, until the test ends.
func runAgent(t *testing.T, cfg Config, rec *recorder, m *metrics.Metrics) *Source {
	t.Helper()
	cfg.ObserveProgrammed = m.ObserveProgrammed
	src := newSource(t, cfg)
	startAgent(t, src, rec, m)
	return src
}

// startAgent runs src (made with m.ObserveProgrammed) under an agent, as
// runAgent does, until the test ends.
func startAgent(t *testing.T, src *Source, rec *recorder, m *metrics.Metrics) {
	t.Helper()
	a := agent.New(agent.Config{Observers: []agent.Observer{m}}, testutil.NoPrograms{}, rec, slog.New(slog.DiscardHandler))
	testutil.RunUntilCleanup(t, "agent Run", func(ctx context.Context) error { return a.Run(ctx, src) })
}

// createSlice creates es, stamped with a trigger time just after now:
// after the start of a source made before (its tracker drops the trigger
// times at or before its start, as kube-proxy's).
func createSlice(t *testing.T, client *fake.Clientset, es *discoveryv1.EndpointSlice) {
	t.Helper()
	trigger := time.Now().Add(time.Millisecond)
	es.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: trigger.Format(time.RFC3339Nano)}
	if _, err := client.DiscoveryV1().EndpointSlices(es.Namespace).Create(context.Background(), es, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestNothingProgrammedBeforeCachesSync(t *testing.T) {
	client := fake.NewClientset(service("web", "10.96.0.10", 80), slice("web", "web-1", 8080, "10.0.0.1"))
	release := make(chan struct{})
	// The EndpointSlice list hangs until released: the Service cache syncs,
	// the slice cache does not.
	client.PrependReactor("list", "endpointslices", func(k8stesting.Action) (bool, runtime.Object, error) {
		<-release
		return false, nil, nil
	})
	rec := &recorder{}
	src := run(t, Config{Client: client}, rec)
	time.Sleep(300 * time.Millisecond)
	if n := rec.count(); n != 0 || src.Synced() {
		close(release)
		t.Fatalf("synced %d times (Synced=%v) before the EndpointSlice cache synced", n, src.Synced())
	}
	close(release)
	waitFor(t, "first sync", 5*time.Second, func() bool { return rec.count() == 1 })
	if got, _ := backendsOf(rec.last(), "10.96.0.10", 80); fmt.Sprint(got) != "[10.0.0.1:8080]" {
		t.Errorf("first sync backends = %v, want [10.0.0.1:8080]: it must hold the full initial list", got)
	}
	if !src.Synced() {
		t.Error("Synced() = false after the first sync")
	}
}

func TestBurstFoldedIntoNetChange(t *testing.T) {
	client := fake.NewClientset()
	rec := &recorder{}
	const minSync = 500 * time.Millisecond
	run(t, Config{Client: client, MinSyncPeriod: minSync}, rec)
	waitFor(t, "initial (empty) sync", 5*time.Second, func() bool { return rec.count() == 1 })

	ctx := context.Background()
	start := time.Now()
	// A service that comes and goes within the burst costs nothing.
	if _, err := client.CoreV1().Services("default").Create(ctx, service("flash", "10.96.0.99", 80), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Services("default").Create(ctx, service("web", "10.96.0.10", 80), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	es := slice("web", "web-1", 8080, "10.0.0.1")
	if _, err := client.DiscoveryV1().EndpointSlices("default").Create(ctx, es, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := 2; i <= 20; i++ {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.0.0.%d", i)},
			Conditions: discoveryv1.EndpointConditions{Ready: new(true)}})
		es.ResourceVersion = fmt.Sprint(i)
		if _, err := client.DiscoveryV1().EndpointSlices("default").Update(ctx, es, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := client.CoreV1().Services("default").Delete(ctx, "flash", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if time.Since(start) > minSync/2 {
		t.Skip("the burst took too long to be inside one min sync period on this machine")
	}
	waitFor(t, "20 backends", 5*time.Second, func() bool {
		got, _ := backendsOf(rec.last(), "10.96.0.10", 80)
		return len(got) == 20
	})
	time.Sleep(2 * minSync)
	// The first event ran a sync at once (the last was long ago); the rest
	// of the burst folded into at most one more.
	if n := rec.count() - 1; n > 2 {
		t.Errorf("a burst of 23 changes took %d syncs, want <= 2", n)
	}
	if _, ok := backendsOf(rec.last(), "10.96.0.99", 80); ok {
		t.Error("the service deleted within the burst is programmed")
	}
}

func TestSyncErrorRetriedAndMetrics(t *testing.T) {
	client := fake.NewClientset(service("web", "10.96.0.10", 80))
	m := metrics.New()
	rec := &recorder{fail: 1}
	src := newSource(t, Config{Client: client, ObserveProgrammed: m.ObserveProgrammed})
	createSlice(t, client, slice("web", "web-1", 8080, "10.0.0.1")) // changed after the start
	time.Sleep(600 * time.Millisecond)                              // and waits before the agent runs
	startAgent(t, src, rec, m)
	waitFor(t, "a sync after the failed one", 5*time.Second, func() bool { return rec.count() == 1 })
	// The agent records the sync (SetProgrammed, ObserveSync, Programmed)
	// after the datapath's apply returns: wait for its last record.
	waitFor(t, "the programmed sync's latency observed", 5*time.Second, func() bool {
		return !containsLine(testutil.Scrape(t, m.Handler()), "sluice_network_programming_duration_seconds_count 0")
	})
	if got := promtest.ToFloat64(m.SyncErrors); got != 1 {
		t.Errorf("sync errors = %v, want 1", got)
	}
	if !src.Synced() {
		t.Error("not Synced after a successful retry")
	}
	// The trigger time of the change survived the failed sync: its latency
	// is counted once, when it was really programmed, and is >= 600ms.
	if n := promtest.CollectAndCount(m.NetworkProgrammingDuration); n != 1 {
		t.Fatalf("programming latency series = %d", n)
	}
	body := testutil.Scrape(t, m.Handler())
	if !containsLine(body, "sluice_network_programming_duration_seconds_count 1") {
		t.Errorf("want one programming latency sample:\n%s", body)
	}
	if !containsLine(body, `sluice_network_programming_duration_seconds_bucket{le="0.512"} 0`) {
		t.Errorf("programming latency below the 600ms the change waited:\n%s", body)
	}
	if !containsLine(body, "sluice_services 1") || !containsLine(body, "sluice_backends 1") {
		t.Errorf("programmed counts missing:\n%s", body)
	}
}

// kube-proxy's change metrics through the source: every Service and
// EndpointSlice event counted, those not synced yet pending until a sync
// takes them, and the last change queued stamped (its hung-proxy signal,
// against kubeproxy_sync_proxy_rules_last_timestamp_seconds).
func TestChangeMetrics(t *testing.T) {
	client := fake.NewClientset(service("web", "10.96.0.10", 80), slice("web", "web-1", 8080, "10.0.0.1"))
	m := metrics.New()
	rec := &recorder{}
	started := time.Now()
	// The second sync waits an hour: what comes after the first stays
	// pending.
	src := runAgent(t, Config{Client: client, Changes: m, MinSyncPeriod: time.Hour}, rec, m)
	waitFor(t, "first sync", 5*time.Second, func() bool { return rec.count() == 1 && src.Synced() })
	ts := func(s map[string]float64, fam string) time.Time {
		v := s[`kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="`+fam+`"}`]
		return time.Unix(0, int64(v*1e9))
	}
	got := scrapeSamples(t, m)
	for name, want := range map[string]float64{
		"kubeproxy_sync_proxy_rules_service_changes_total":    1,
		"kubeproxy_sync_proxy_rules_endpoint_changes_total":   1,
		"kubeproxy_sync_proxy_rules_service_changes_pending":  0, // taken by the first sync
		"kubeproxy_sync_proxy_rules_endpoint_changes_pending": 0,
	} {
		if v, ok := got[name]; !ok || v != want {
			t.Errorf("after the first sync: %s = %v (exported: %v), want %v", name, v, ok, want)
		}
	}
	// Stamped as the caches started syncing, as kube-proxy's SyncLoop.
	if q := ts(got, "IPv4"); q.Before(started.Add(-time.Millisecond)) {
		t.Errorf("last queued %v before the source started (%v)", q, started)
	}

	before := time.Now()
	ctx := context.Background()
	if _, err := client.CoreV1().Services("default").Create(ctx, service("api", "10.96.0.11", 80), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.DiscoveryV1().EndpointSlices("default").Create(ctx, slice("api", "api-1", 8080, "10.0.0.2"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the two changes pending", 5*time.Second, func() bool {
		got = scrapeSamples(t, m)
		return got["kubeproxy_sync_proxy_rules_service_changes_pending"] == 1 && got["kubeproxy_sync_proxy_rules_endpoint_changes_pending"] == 1
	})
	for _, fam := range []string{"IPv4", "IPv6"} {
		if q := ts(got, fam); q.Before(before.Add(-time.Millisecond)) {
			t.Errorf("%s: last queued %v, want the changes' (after %v)", fam, q, before)
		}
	}
	if got["kubeproxy_sync_proxy_rules_service_changes_total"] != 2 || got["kubeproxy_sync_proxy_rules_endpoint_changes_total"] != 2 {
		t.Errorf("change totals %v and %v, want 2 and 2", got["kubeproxy_sync_proxy_rules_service_changes_total"], got["kubeproxy_sync_proxy_rules_endpoint_changes_total"])
	}
}

// A slice of addressType FQDN is no change in kube-proxy's metrics: its
// endpoint change trackers drop one before counting it.
func TestChangeMetricsSkipFQDNSlices(t *testing.T) {
	client := fake.NewClientset(service("web", "10.96.0.10", 80))
	m := metrics.New()
	rec := &recorder{}
	src := runAgent(t, Config{Client: client, Changes: m, MinSyncPeriod: time.Hour}, rec, m)
	waitFor(t, "first sync", 5*time.Second, func() bool { return rec.count() == 1 && src.Synced() })
	ctx := context.Background()
	fqdn := slice("web", "web-fqdn", 8080, "10.0.0.1")
	fqdn.AddressType = discoveryv1.AddressTypeFQDN
	fqdn.Endpoints[0].Addresses = []string{"backend.example"}
	if _, err := client.DiscoveryV1().EndpointSlices("default").Create(ctx, fqdn, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// An IPv4 slice after it: once that one is counted, the informer
	// handed the FQDN one over before it.
	if _, err := client.DiscoveryV1().EndpointSlices("default").Create(ctx, slice("web", "web-1", 8080, "10.0.0.2"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var got map[string]float64
	waitFor(t, "the IPv4 slice counted", 5*time.Second, func() bool {
		got = scrapeSamples(t, m)
		return got["kubeproxy_sync_proxy_rules_endpoint_changes_total"] >= 1
	})
	// The FQDN slice's event asks for a sync (it changed the tracker's
	// state), which the runner's burst may start at once, despite
	// MinSyncPeriod, and which then takes the IPv4 slice's change if that
	// came first: pending is 1, or 0 after such a sync, never 2. total
	// is never reset: 1 is the IPv4 slice's alone (the FQDN slice's event
	// came before it and was not counted in either: both are counted
	// together, ObserveChange).
	if total, pending := got["kubeproxy_sync_proxy_rules_endpoint_changes_total"], got["kubeproxy_sync_proxy_rules_endpoint_changes_pending"]; total != 1 || pending > 1 {
		t.Errorf("endpoint changes total %v pending %v, want 1 and at most 1 (the IPv4 slice's, not the FQDN one's)", total, pending)
	}
}

func TestNodeObjectIsWatched(t *testing.T) {
	zone := func(z string) map[string]string { return map[string]string{corev1.LabelTopologyZone: z} }
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Labels: zone("zone-a")}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "other", Labels: zone("zone-b")}})
	rec := &recorder{}
	src := run(t, Config{Client: client}, rec)
	waitFor(t, "first sync", 5*time.Second, func() bool { return rec.count() == 1 })
	// The node translations are for has this Node object's labels.
	if got := src.tracker.Node(); got.Name != node || got.Labels[corev1.LabelTopologyZone] != "zone-a" {
		t.Fatalf("tracked node = %+v, want %s in zone-a", got, node)
	}
}

// A deleted Node keeps its zone for the topology hints, as kube-proxy's node
// topology handler ignores deletes: the node's pods are still served, and
// PreferClose must not turn off under them.
func TestNodeDeleteKeepsZone(t *testing.T) {
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Labels: map[string]string{corev1.LabelTopologyZone: "zone-a"}}})
	h := &healthRecorder{}
	rec := &recorder{}
	src := run(t, Config{Client: client, Health: h}, rec)
	waitFor(t, "first sync", 5*time.Second, func() bool { return rec.count() == 1 })
	if err := client.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the delete seen", 5*time.Second, func() bool { ok, _, told := h.node(); return !ok && told > 1 })
	if got := src.tracker.Node(); got.Labels[corev1.LabelTopologyZone] != "zone-a" {
		t.Fatalf("tracked node after its Node's delete = %+v, want still in zone-a", got)
	}
}

// In the agent, apply only queues the state; the agent applies it later and
// reports it programmed through Programmed. The latency is taken then, not
// at hand-over; of the slice changed after the source started alone (as
// kube-proxy: the one last changed a second before it did is no latency
// of this agent's).
func TestProgrammingLatencyTakenWhenAgentReportsProgrammed(t *testing.T) {
	old := slice("old", "old-1", 8080, "10.0.0.2")
	old.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: time.Now().Add(-time.Second).Format(time.RFC3339Nano)}
	client := fake.NewClientset(service("web", "10.96.0.10", 80), service("old", "10.96.0.11", 80), old)
	m := metrics.New()
	src := newSource(t, Config{Client: client, ObserveProgrammed: m.ObserveProgrammed})
	createSlice(t, client, slice("web", "web-1", 8080, "10.0.0.1"))
	handed := make(chan *model.State, 10)
	testutil.RunUntilCleanup(t, "Run after cancel", func(ctx context.Context) error {
		return src.Run(ctx, func(st *model.State) { handed <- st })
	})

	var st *model.State
	select {
	case st = <-handed:
	case <-time.After(5 * time.Second):
		t.Fatal("no state handed over")
	}
	if n := histogramCount(t, m); n != 0 {
		t.Fatalf("latency recorded at hand-over (%d samples), before programming", n)
	}
	if b, _ := backendsOf(st, "10.96.0.10", 80); len(b) != 1 {
		t.Fatal("the slice created after the start is not in the first state")
	}
	time.Sleep(600 * time.Millisecond) // the agent is slow to apply
	src.Programmed(st)
	if n := histogramCount(t, m); n != 1 {
		t.Fatalf("latency samples = %d after the state was programmed, want 1 (of the slice changed after the start)", n)
	}
	if !containsLine(testutil.Scrape(t, m.Handler()), `sluice_network_programming_duration_seconds_bucket{le="0.512"} 0`) {
		t.Error("latency does not include the time until programming (>= 600ms)")
	}
	src.Programmed(st) // a resync of the same state records nothing more
	if n := histogramCount(t, m); n != 1 {
		t.Fatalf("latency samples = %d after a re-apply, want 1", n)
	}
}

// An agent's start measures no latency for the slices it finds: each
// carries the time of its last change, made before the agent started, which
// it did not wait for (kube-proxy's "Endpoints create before tracker
// started"). Before, every restart recorded one sample per slice, as old
// as its slice's last change.
func TestProgrammingLatencyNoneForSlicesBeforeStart(t *testing.T) {
	es := slice("web", "web-1", 8080, "10.0.0.1")
	es.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: time.Now().Add(-time.Second).Format(time.RFC3339Nano)}
	client := fake.NewClientset(service("web", "10.96.0.10", 80), es)
	m := metrics.New()
	rec := &recorder{}
	var observed atomic.Int32 // states reported programmed, after their latency is taken
	src := newSource(t, Config{Client: client, ObserveProgrammed: func(now time.Time, triggers []model.Trigger) {
		m.ObserveProgrammed(now, triggers)
		observed.Add(1)
	}})
	startAgent(t, src, rec, m)
	waitFor(t, "the first state programmed", 5*time.Second, func() bool { return observed.Load() == 1 })
	if b, _ := backendsOf(rec.last(), "10.96.0.10", 80); len(b) != 1 {
		t.Fatalf("backends %v, want the slice's", b)
	}
	body := testutil.Scrape(t, m.Handler())
	if n := histogramCount(t, m); n != 0 {
		t.Errorf("latency samples = %d for a slice changed before the start, want 0:\n%s", n, body)
	}
	if containsLine(body, `kubeproxy_network_programming_duration_seconds_count{ip_family="IPv4"} 1`) {
		t.Errorf("kube-proxy's latency has a sample for a slice changed before the start:\n%s", body)
	}
}

// TestCachesHoldSlimObjects: the informers' caches keep what a
// translation reads and what the events read (cachedService): no
// managedFields, no last-applied-configuration, no annotations at all
// (no translation reads them), and the Service still translates.
func TestCachesHoldSlimObjects(t *testing.T) {
	svc := service("web", "10.96.0.10", 80)
	svc.UID, svc.Generation = "uid-web", 3
	svc.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply,
		FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(`{"f:spec":{"f:ports":{}}}`)}}
	svc.Annotations = map[string]string{
		corev1.LastAppliedConfigAnnotation: `{"apiVersion":"v1","kind":"Service"}`,
		corev1.AnnotationTopologyMode:      "Auto",
	}
	sl := slice("web", "web-1", 8080, "10.0.0.1")
	sl.ManagedFields = svc.ManagedFields
	client := fake.NewClientset(svc, sl)
	rec := &recorder{}
	src := run(t, Config{Client: client}, rec)
	waitFor(t, "first sync", 5*time.Second, func() bool { return rec.count() >= 1 })
	if got, _ := backendsOf(rec.last(), "10.96.0.10", 80); fmt.Sprint(got) != "[10.0.0.1:8080]" {
		t.Errorf("backends = %v, want [10.0.0.1:8080]", got)
	}
	obj, ok, err := src.services.GetByKey("default/web")
	if err != nil || !ok {
		t.Fatalf("cached Service: %v, %v", ok, err)
	}
	cached, isCached := obj.(*cachedService)
	if !isCached {
		t.Fatalf("the cache holds a %T, want *cachedService", obj)
	}
	if len(cached.GetManagedFields()) != 0 || cached.GetAnnotations() != nil {
		t.Errorf("cached Service keeps managedFields %v or annotations %v", cached.GetManagedFields(), cached.GetAnnotations())
	}
	if cached.GetUID() != "uid-web" || cached.GetGeneration() != 3 || cached.Ports[0].Port != 80 ||
		cached.ClusterIPs[0] != netip.MustParseAddr("10.96.0.10") {
		t.Errorf("cached Service lost what the events or a translation read: %+v", cached)
	}
	// The API still has them: the transform changed the cache's copy only.
	stored, err := client.CoreV1().Services("default").Get(t.Context(), "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(stored.ManagedFields) == 0 {
		t.Error("the fake API lost the Service's managedFields")
	}
}

// slim caches of a slice what a translation reads of its endpoints (the
// cache's form has no place for their Pod references and deprecated
// topology), and drops from the Node what no translation reads.
func TestSlimEndpointsAndNode(t *testing.T) {
	sl := slice("web", "web-1", 8080, "10.0.0.1")
	sl.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: "web", UID: "u1"}}
	ep := &sl.Endpoints[0]
	ep.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: "web-0", UID: "u2"}
	ep.DeprecatedTopology = map[string]string{corev1.LabelHostname: node}
	ep.NodeName, ep.Zone = new(node), new("zone-a")
	ep.Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "zone-a"}}}
	o, err := newSlimmer().slim(sl)
	if err != nil {
		t.Fatal(err)
	}
	c, ok := o.(*cachedSlice)
	if !ok {
		t.Fatalf("slim made a %T of a slice, want *cachedSlice", o)
	}
	if c.GetOwnerReferences() != nil {
		t.Errorf("cached slice keeps owner %v", c.GetOwnerReferences())
	}
	if e := c.Endpoints.At(0); *e.NodeName != node || e.Hints == nil || e.Addr != netip.MustParseAddr("10.0.0.1") || !e.Ready ||
		c.Service != "web" || c.GetName() != "web-1" || c.GetNamespace() != "default" {
		t.Errorf("cached slice lost what a translation reads: %+v", c)
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Labels: map[string]string{corev1.LabelTopologyZone: "zone-a"}},
		Status: corev1.NodeStatus{Images: []corev1.ContainerImage{{Names: []string{"registry.example/app:v1"}, SizeBytes: 1 << 20}},
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.10"}}}}
	if _, err := newSlimmer().slim(n); err != nil {
		t.Fatal(err)
	}
	if n.Status.Images != nil || len(n.Status.Addresses) != 1 || n.Labels[corev1.LabelTopologyZone] != "zone-a" {
		t.Errorf("slimmed Node: images %v, addresses %v, labels %v", n.Status.Images, n.Status.Addresses, n.Labels)
	}
}

// The tracker is given room for the first lists once: as many as the
// informers' stores hold, the other's count standing in for a store not
// filled yet.
func TestFirstListsReserveTheTracker(t *testing.T) {
	const n = 40
	objs := make([]runtime.Object, 0, 2*n)
	for i := range n {
		name := fmt.Sprintf("svc-%d", i)
		objs = append(objs, service(name, fmt.Sprintf("10.96.1.%d", i), 80), slice(name, name+"-1", 8080, fmt.Sprintf("10.0.1.%d", i)))
	}
	src := newSource(t, Config{Client: fake.NewClientset(objs...)})
	var mu sync.Mutex
	var calls [][2]int
	reserve := src.reserveTracker
	src.reserveTracker = func(services, slices int) {
		mu.Lock()
		calls = append(calls, [2]int{services, slices})
		mu.Unlock()
		reserve(services, slices)
	}
	rec := &recorder{}
	testutil.RunUntilCleanup(t, "Run", func(ctx context.Context) error { return src.Run(ctx, rec.apply) })
	waitFor(t, "first sync", 5*time.Second, func() bool { return rec.count() == 1 })
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != 1 || calls[0] != [2]int{n, n} {
		t.Fatalf("tracker reserved %v, want once for %d Services and %d slices", calls, n, n)
	}
	if got := rec.last().Services.Len(); got != n {
		t.Fatalf("first state: %d frontends, want %d", got, n)
	}
}
