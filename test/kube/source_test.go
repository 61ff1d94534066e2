package kube

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// One apiserver, the shapes of Service that matter: several ports with named
// targetPorts, several slices, not-ready and terminating endpoints, a
// selectorless Service with hand-made slices, another proxy's Service and an
// ExternalName Service.
func TestServicesAndEndpointSlices(t *testing.T) {
	env := startEnv(t)
	c := env.Client
	dp := newFake()
	p := startProxy(t, env.AgentConfig, dp, proxyOpts{minSync: 100 * time.Millisecond})
	eventually(t, "first sync", 30*time.Second, func() error {
		if !p.src.Synced() {
			return fmt.Errorf("not synced")
		}
		return nil
	})

	web := createService(t, c, "default", "web", nil, svcPort("http", 80, "http"), svcPort("metrics", 9100, "metrics"))
	// The two slices list the ports in their own numbering: a named
	// targetPort may resolve to different numbers on different pods.
	createSlice(t, c, makeSlice("default", "web", "web-a", slicePorts{"http": 8080, "metrics": 9090},
		ready("10.0.1.1"), ready("10.0.1.2"), notReady("10.0.1.9")))
	createSlice(t, c, makeSlice("default", "web", "web-b", slicePorts{"http": 8081, "metrics": 9091},
		ready("10.0.1.3"), terminating("10.0.1.8")))

	manual := createService(t, c, "default", "manual", func(s *corev1.Service) { s.Spec.Selector = nil },
		svcPort("", 53, "53"))
	createSlice(t, c, makeSlice("default", "manual", "manual-1", slicePorts{"": 5353}, ready("10.0.2.1")))

	other := createService(t, c, "default", "other", func(s *corev1.Service) {
		s.Labels = map[string]string{translate.LabelServiceProxyName: "someone-else"}
	}, svcPort("http", 80, "http"))
	createSlice(t, c, makeSlice("default", "other", "other-1", slicePorts{"http": 8080}, ready("10.0.3.1")))
	createService(t, c, "default", "dns-alias", func(s *corev1.Service) {
		s.Spec = corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "example.com"}
	})

	wantProgrammed(t, dp, map[string][]string{
		fe(web, 80):    {be("10.0.1.1", 8080), be("10.0.1.2", 8080), be("10.0.1.3", 8081)},
		fe(web, 9100):  {be("10.0.1.1", 9090), be("10.0.1.2", 9090), be("10.0.1.3", 9091)},
		fe(manual, 53): {be("10.0.2.1", 5353)},
	}, fe(other, 80))

	// Every ready endpoint goes: the serving, terminating one takes over
	// (kube-proxy's fallback), so in-flight rollouts drain gracefully.
	updateSlice(t, c, "default", "web-a", notReady("10.0.1.1"), notReady("10.0.1.2"))
	updateSlice(t, c, "default", "web-b", terminating("10.0.1.8"))
	wantProgrammed(t, dp, map[string][]string{
		fe(web, 80):   {be("10.0.1.8", 8081)},
		fe(web, 9100): {be("10.0.1.8", 9091)},
	})

	// No endpoint at all: the frontend stays, with no backend, so
	// connections are refused rather than leaking elsewhere.
	if err := c.DiscoveryV1().EndpointSlices("default").Delete(context.Background(), "web-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	wantProgrammed(t, dp, map[string][]string{fe(web, 80): {}, fe(web, 9100): {}})

	// Another proxy's Service becomes ours when its label goes.
	other, err := c.CoreV1().Services("default").Get(context.Background(), "other", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	other.Labels = nil
	if _, err := c.CoreV1().Services("default").Update(context.Background(), other, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wantProgrammed(t, dp, map[string][]string{fe(other, 80): {be("10.0.3.1", 8080)}})

	// Deleting a Service removes its frontends.
	if err := c.CoreV1().Services("default").Delete(context.Background(), "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	wantProgrammed(t, dp, map[string][]string{fe(manual, 53): {be("10.0.2.1", 5353)}}, fe(web, 80), fe(web, 9100))
	checkFake(t, dp)
}

// A rollout's burst of slice updates is folded into a few syncs, and the
// reconciler writes only the net difference.
func TestBurstOfUpdatesIsFolded(t *testing.T) {
	env := startEnv(t)
	c := env.Client
	dp := newFake()
	const minSync = 2 * time.Second
	p := startProxy(t, env.AgentConfig, dp, proxyOpts{minSync: minSync})
	web := createService(t, c, "default", "web", nil, svcPort("http", 80, "http"))
	createSlice(t, c, makeSlice("default", "web", "web-a", slicePorts{"http": 8080}, ready("10.0.1.1")))
	wantProgrammed(t, dp, map[string][]string{fe(web, 80): {be("10.0.1.1", 8080)}})

	// Let minSync pass so the burst starts with a fresh budget.
	time.Sleep(minSync)
	applies, writes := p.applies.Load(), dp.Writes()
	start := time.Now()
	// 30 updates: endpoints added one at a time, then the first 10 removed.
	var eps []ep
	for i := 1; i <= 30; i++ {
		eps = append(eps, ready(fmt.Sprintf("10.0.1.%d", i)))
		updateSlice(t, c, "default", "web-a", eps...)
	}
	updateSlice(t, c, "default", "web-a", eps[10:]...)
	burst := time.Since(start)
	want := []string{}
	for i := 11; i <= 30; i++ {
		want = append(want, be(fmt.Sprintf("10.0.1.%d", i), 8080))
	}
	wantProgrammed(t, dp, map[string][]string{fe(web, 80): want})
	time.Sleep(minSync + 500*time.Millisecond) // any sync still due has run
	n := p.applies.Load() - applies
	// One sync at the start of the burst, then at most one per minSync.
	if limit := 1 + int64(burst/minSync) + 1; n > limit {
		t.Errorf("31 updates in %v took %d syncs, want <= %d", burst.Round(time.Millisecond), n, limit)
	}
	t.Logf("31 updates in %v: %d syncs, %d map writes", burst.Round(time.Millisecond), n, dp.Writes()-writes)
	checkFake(t, dp)
}

// The metrics a sync records, scraped as Prometheus would.
func TestMetricsAfterSync(t *testing.T) {
	env := startEnv(t)
	c := env.Client
	dp := newFake()
	p := startProxy(t, env.AgentConfig, dp, proxyOpts{})
	web := createService(t, c, "default", "web", nil, svcPort("http", 80, "http"))
	createSlice(t, c, makeSlice("default", "web", "web-a", slicePorts{"http": 8080}, ready("10.0.1.1"), ready("10.0.1.2")))
	wantProgrammed(t, dp, map[string][]string{fe(web, 80): {be("10.0.1.1", 8080), be("10.0.1.2", 8080)}})
	eventually(t, "metrics", 10*time.Second, func() error {
		body := testutil.Scrape(t, p.metrics.Handler())
		for _, line := range []string{
			"sluice_services 2", // web and the apiserver's default/kubernetes
			"sluice_backends 2", // (which has no endpoints: kubeenv runs no endpoint reconciler)
			`sluice_map_fill_ratio{map="rev_nat"} 0.002`,
			`sluice_syncs_total{result="success"}`,
			"sluice_network_programming_duration_seconds_count",
		} {
			if !hasPrefixLine(body, line) {
				return fmt.Errorf("no %q in\n%s", line, body)
			}
		}
		return nil
	})
}
