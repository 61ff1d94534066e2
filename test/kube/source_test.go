package kube

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// One apiserver, the shapes of Service that matter: several ports with named
// targetPorts, several slices, not-ready and terminating endpoints, a
// selectorless Service with hand-made slices, another proxy's Service and an
// ExternalName Service; per family, over one proxy.
func TestServicesAndEndpointSlices(t *testing.T) {
	c, dp, _ := startSyncedProxy(t)
	forFamilies(t, func(t *testing.T, f family) {
		ns := f.namespace(t, c, "shapes")
		web := f.service(t, c, ns, "web", nil, svcPort("http", 80, "http"), svcPort("metrics", 9100, "metrics"))
		// The two slices list the ports in their own numbering: a named
		// targetPort may resolve to different numbers on different pods.
		createSlice(t, c, f.slice(ns, "web", "web-a", slicePorts{"http": 8080, "metrics": 9090},
			ready(f.addr(1, 1)), ready(f.addr(1, 2)), notReady(f.addr(1, 9))))
		createSlice(t, c, f.slice(ns, "web", "web-b", slicePorts{"http": 8081, "metrics": 9091},
			ready(f.addr(1, 3)), terminating(f.addr(1, 8))))

		manual := f.service(t, c, ns, "manual", func(s *corev1.Service) { s.Spec.Selector = nil },
			svcPort("", 53, "53"))
		createSlice(t, c, f.slice(ns, "manual", "manual-1", slicePorts{"": 5353}, ready(f.addr(2, 1))))

		other := f.service(t, c, ns, "other", func(s *corev1.Service) {
			s.Labels = map[string]string{translate.LabelServiceProxyName: "someone-else"}
		}, svcPort("http", 80, "http"))
		createSlice(t, c, f.slice(ns, "other", "other-1", slicePorts{"http": 8080}, ready(f.addr(3, 1))))
		f.service(t, c, ns, "dns-alias", func(s *corev1.Service) {
			s.Spec = corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "example.com"}
		})

		wantProgrammed(t, dp, map[string][]string{
			fe(web, 80):    {be(f.addr(1, 1), 8080), be(f.addr(1, 2), 8080), be(f.addr(1, 3), 8081)},
			fe(web, 9100):  {be(f.addr(1, 1), 9090), be(f.addr(1, 2), 9090), be(f.addr(1, 3), 9091)},
			fe(manual, 53): {be(f.addr(2, 1), 5353)},
		}, fe(other, 80))

		// Every ready endpoint goes: the serving, terminating one takes over
		// (kube-proxy's fallback), so in-flight rollouts drain gracefully.
		updateSlice(t, c, ns, "web-a", notReady(f.addr(1, 1)), notReady(f.addr(1, 2)))
		updateSlice(t, c, ns, "web-b", terminating(f.addr(1, 8)))
		wantProgrammed(t, dp, map[string][]string{
			fe(web, 80):   {be(f.addr(1, 8), 8081)},
			fe(web, 9100): {be(f.addr(1, 8), 9091)},
		})

		// No endpoint at all: the frontend stays, with no backend, so
		// connections are refused rather than leaking elsewhere.
		if err := c.DiscoveryV1().EndpointSlices(ns).Delete(context.Background(), "web-b", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		wantProgrammed(t, dp, map[string][]string{fe(web, 80): {}, fe(web, 9100): {}})

		// Another proxy's Service becomes ours when its label goes.
		other, err := c.CoreV1().Services(ns).Get(context.Background(), "other", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		other.Labels = nil
		if _, err := c.CoreV1().Services(ns).Update(context.Background(), other, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		wantProgrammed(t, dp, map[string][]string{fe(other, 80): {be(f.addr(3, 1), 8080)}})

		// Deleting a Service removes its frontends.
		if err := c.CoreV1().Services(ns).Delete(context.Background(), "web", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		wantProgrammed(t, dp, map[string][]string{fe(manual, 53): {be(f.addr(2, 1), 5353)}}, fe(web, 80), fe(web, 9100))
	})
	checkFake(t, dp)
}

// A rollout's burst of slice updates is folded into a few syncs, and the
// reconciler writes only the net difference; per family, over one proxy.
func TestBurstOfUpdatesIsFolded(t *testing.T) {
	env := startEnv(t)
	c := env.Client
	dp := newFake()
	const minSync = 2 * time.Second
	p := startProxy(t, env.AgentConfig, dp, proxyOpts{minSync: minSync})
	forFamilies(t, func(t *testing.T, f family) {
		ns := f.namespace(t, c, "burst")
		web := f.service(t, c, ns, "web", nil, svcPort("http", 80, "http"))
		createSlice(t, c, f.slice(ns, "web", "web-a", slicePorts{"http": 8080}, ready(f.addr(1, 1))))
		wantProgrammed(t, dp, map[string][]string{fe(web, 80): {be(f.addr(1, 1), 8080)}})

		// Let minSync pass so the burst starts with a fresh budget.
		time.Sleep(minSync)
		applies, writes := p.applies.Load(), dp.Writes()
		start := time.Now()
		// 30 updates: endpoints added one at a time, then the first 10 removed.
		var eps []ep
		for i := 1; i <= 30; i++ {
			eps = append(eps, ready(f.addr(1, i)))
			updateSlice(t, c, ns, "web-a", eps...)
		}
		updateSlice(t, c, ns, "web-a", eps[10:]...)
		burst := time.Since(start)
		want := []string{}
		for i := 11; i <= 30; i++ {
			want = append(want, be(f.addr(1, i), 8080))
		}
		wantProgrammed(t, dp, map[string][]string{fe(web, 80): want})
		time.Sleep(minSync + 500*time.Millisecond) // any sync still due has run
		n := p.applies.Load() - applies
		// One sync at the start of the burst, then at most one per minSync.
		if limit := 1 + int64(burst/minSync) + 1; n > limit {
			t.Errorf("31 updates in %v took %d syncs, want <= %d", burst.Round(time.Millisecond), n, limit)
		}
		t.Logf("31 updates in %v: %d syncs, %d map writes", burst.Round(time.Millisecond), n, dp.Writes()-writes)
	})
	checkFake(t, dp)
}

// The metrics a sync records, scraped as Prometheus would; per family,
// over one proxy, each family's Service deleted before the next comes.
func TestMetricsAfterSync(t *testing.T) {
	env := startEnv(t)
	c := env.Client
	dp := newFake()
	p := startProxy(t, env.AgentConfig, dp, proxyOpts{})
	forFamilies(t, func(t *testing.T, f family) {
		ns := f.namespace(t, c, "metrics")
		web := f.service(t, c, ns, "web", nil, svcPort("http", 80, "http"))
		createSlice(t, c, f.slice(ns, "web", "web-a", slicePorts{"http": 8080}, ready(f.addr(1, 1)), ready(f.addr(1, 2))))
		wantProgrammed(t, dp, map[string][]string{fe(web, 80): {be(f.addr(1, 1), 8080), be(f.addr(1, 2), 8080)}})
		wantMetrics(t, p, []string{
			"sluice_services 2", // web and the apiserver's default/kubernetes
			"sluice_backends 2", // (which has no endpoints: kubeenv runs no endpoint reconciler)
			`sluice_map_fill_ratio{map="rev_nat"} 0.002`,
			`sluice_syncs_total{result="success"}`,
			"sluice_network_programming_duration_seconds_count",
			`rest_client_requests_total{code="200"`, // client-go's, as kube-proxy exports them
			`rest_client_request_duration_seconds_count{host=`,
		}, // kube-proxy's latency, in the family of the slice whose change it measures
			`kubeproxy_network_programming_duration_seconds_count{ip_family="`+f.name+`"}`,
			// and its change counts and last change queued
			"kubeproxy_sync_proxy_rules_service_changes_total",
			"kubeproxy_sync_proxy_rules_endpoint_changes_total",
			`kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="`+f.name+`"}`)

		// Deleted, web leaves the counts: the next family starts from
		// default/kubernetes alone.
		if err := c.CoreV1().Services(ns).Delete(context.Background(), "web", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		wantMetrics(t, p, []string{"sluice_services 1", "sluice_backends 0"})
	})
}

// wantMetrics waits until p's metrics have a line starting with each of
// lines, and each of the counted series above 0.
func wantMetrics(t *testing.T, p *proxy, lines []string, counted ...string) {
	t.Helper()
	eventually(t, "metrics", 10*time.Second, func() error {
		body := testutil.Scrape(t, p.metrics.Handler())
		for _, line := range lines {
			if !hasPrefixLine(body, line) {
				return fmt.Errorf("no %q in\n%s", line, body)
			}
		}
		samples, err := testutil.Samples(strings.NewReader(body), nil)
		if err != nil {
			return err
		}
		for _, series := range counted {
			if samples[series] <= 0 {
				return fmt.Errorf("%s = %v, want above 0, in\n%s", series, samples[series], body)
			}
		}
		return nil
	})
}

// The source reads the slices of a real API server from their protobuf
// straight into its cache (pkg/source/kube, restslices.go), the events
// after the first list too (a slice added, updated, deleted); a slice the
// fast path declines (FQDN addresses) comes through the standard decoder
// without stopping the watch; the streamed list's end (a bookmark, which
// the fast path declines) is read, or the caches would never sync.
func TestSlicesDecodedOnTheFastPath(t *testing.T) {
	c, dp, p := startSyncedProxy(t)
	fast, standard := p.src.SliceDecodes()
	t.Logf("at the first sync: %d slices decoded fast, %d standard", fast, standard)
	if standard == 0 {
		t.Errorf("no slice decoded on the standard path at the first sync: the streamed list's closing bookmark is one")
	}
	// moreDecodes waits until the source decoded more slices fast and on
	// the standard path than before, and returns the counts.
	moreDecodes := func(what string, fast0, standard0 int64, wantFast, wantStandard bool) (int64, int64) {
		t.Helper()
		var f, s int64
		eventually(t, what, 30*time.Second, func() error {
			f, s = p.src.SliceDecodes()
			if (f > fast0) != wantFast || (wantStandard && s == standard0) {
				return fmt.Errorf("decoded %d fast (from %d), %d standard (from %d)", f, fast0, s, standard0)
			}
			return nil
		})
		return f, s
	}
	forFamilies(t, func(t *testing.T, f family) {
		ns := f.namespace(t, c, "fastpath")
		web := f.service(t, c, ns, "web", nil, svcPort("http", 80, "http"))
		createSlice(t, c, f.slice(ns, "web", "web-a", slicePorts{"http": 8080}, ready(f.addr(1, 1)), ready(f.addr(1, 2))))
		wantProgrammed(t, dp, map[string][]string{fe(web, 80): {be(f.addr(1, 1), 8080), be(f.addr(1, 2), 8080)}})
		fast, standard = moreDecodes("the added slice decoded fast", fast, standard, true, false)

		fqdn := makeSlice(ns, "web", "web-fqdn", slicePorts{"http": 8080}, ready("db.example.com"))
		fqdn.AddressType = discoveryv1.AddressTypeFQDN
		createSlice(t, c, fqdn)
		fast, standard = moreDecodes("the FQDN slice decoded on the standard path", fast, standard, false, true)

		updateSlice(t, c, ns, "web-a", ready(f.addr(1, 2)), notReady(f.addr(1, 3)))
		wantProgrammed(t, dp, map[string][]string{fe(web, 80): {be(f.addr(1, 2), 8080)}})
		fast, standard = moreDecodes("the updated slice decoded fast", fast, standard, true, false)

		if err := c.DiscoveryV1().EndpointSlices(ns).Delete(context.Background(), "web-a", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		wantProgrammed(t, dp, map[string][]string{fe(web, 80): {}})
		fast, standard = moreDecodes("the deleted slice decoded fast", fast, standard, true, false)
	})
	checkFake(t, dp)
}
