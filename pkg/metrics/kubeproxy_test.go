package metrics

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// kube-proxy's metric names are served with kube-proxy's types, labels and
// buckets, recorded by the same calls as Sluice's own.
func TestKubeProxyMetrics(t *testing.T) {
	m := New()
	body := func() string {
		var b strings.Builder
		for k := range scrape(t, m) {
			b.WriteString(k + "\n")
		}
		return b.String()
	}
	// Exported before the first sync, as kube-proxy's are after its first.
	// Both families' series, as a dual-stack kube-proxy's two proxiers.
	checkZeroBeforeSync(t, m,
		`kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="FAM"}`,
		`kubeproxy_network_programming_duration_seconds_count{ip_family="FAM"}`,
		`kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="FAM"}`,
		`kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="FAM",traffic_policy="internal"}`,
		`kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="FAM",traffic_policy="external"}`,
	)

	before := time.Now()
	m.ObserveSync(3*time.Millisecond, nil)
	m.ObserveSync(5*time.Millisecond, errors.New("map full"))
	now := time.Now()
	m.ObserveProgrammed(now, []model.Trigger{{At: now.Add(-1500 * time.Millisecond)}, {At: now.Add(-70 * time.Second)}, {At: now.Add(-3 * time.Second), IPv6: true}})

	got := scrape(t, m)
	for s, want := range map[string]float64{
		`kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"}`:              2, // failed syncs too
		`kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv6"}`:              2, // one sync serves both families
		`kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="0.004"}`:  1,
		`kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="16.384"}`: 2,
		`kubeproxy_network_programming_duration_seconds_count{ip_family="IPv4"}`:           2,
		`kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="2"}`:   1,
		`kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="70"}`:  2,
		`kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="65"}`:  1,
		// A change of an IPv6 EndpointSlice, in the IPv6 series only.
		`kubeproxy_network_programming_duration_seconds_count{ip_family="IPv6"}`:         1,
		`kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv6",le="2"}`: 0,
		`kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv6",le="3"}`: 1,
		// Sluice's own are recorded by the same calls, over both families.
		`sluice_sync_duration_seconds_count`:                2,
		`sluice_network_programming_duration_seconds_count`: 3,
	} {
		if got[s] != want {
			t.Errorf("%s = %v, want %v", s, got[s], want)
		}
	}
	// kube-proxy's bucket boundaries: 15 exponential from 1ms, and
	// 0, 0.25, 0.5, 1..59, 60..115 by 5, 120..300 by 30.
	if n := strings.Count(body(), `kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4"`); n != 16 {
		t.Errorf("%d sync duration buckets, want 15 and +Inf", n)
	}
	if n := strings.Count(body(), `kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4"`); n != 1+2+59+12+7+1 {
		t.Errorf("%d network programming buckets, want kube-proxy's 81 and +Inf", n)
	}
	// The last successful sync, not the failed one after it.
	for _, fam := range []string{"IPv4", "IPv6"} {
		ts := got[`kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="`+fam+`"}`]
		if ts < float64(before.Unix()) || ts > float64(now.Unix()+1) {
			t.Errorf("%s: last sync timestamp %v, want between %d and %d", fam, ts, before.Unix(), now.Unix())
		}
	}
}

// The Service ports kube-proxy counts in no_local_endpoints_total are
// counted from what the translation makes of real Services: a Local policy
// with endpoints only on other nodes, once per Service port however many
// frontends it has; not a Service without endpoints, not one with a local
// endpoint, not a Cluster policy.
func TestNoLocalEndpoints(t *testing.T) {
	node := translate.Node{Name: "node-a", IPs: []netip.Addr{netip.MustParseAddr("192.168.0.2")},
		Addresses: []netip.Addr{netip.MustParseAddr("192.168.0.2"), netip.MustParseAddr("192.168.1.2")}}
	local, cluster := corev1.ServiceInternalTrafficPolicyLocal, corev1.ServiceInternalTrafficPolicyCluster
	nodePort := int32(30080)
	svc := func(name, ip string, itp corev1.ServiceInternalTrafficPolicy, etpLocal bool) *corev1.Service {
		s := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: ip, ClusterIPs: []string{ip},
				InternalTrafficPolicy: &itp,
				Ports:                 []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}}},
		}
		if etpLocal {
			s.Spec.Type = corev1.ServiceTypeNodePort
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			s.Spec.Ports[0].NodePort = nodePort
			nodePort++
		}
		return s
	}
	slice := func(svc string, nodes ...string) *discoveryv1.EndpointSlice {
		es := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: svc + "-1", Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptrTo("http"), Protocol: ptrTo(corev1.ProtocolTCP), Port: ptrTo[int32](8080)}},
		}
		for i, n := range nodes {
			es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{"10.1.0." + string(rune('1'+i))},
				Conditions: discoveryv1.EndpointConditions{Ready: ptrTo(true)}, NodeName: ptrTo(n)})
		}
		return es
	}
	st := model.NewState()
	for _, c := range []struct {
		svc *corev1.Service
		eps *discoveryv1.EndpointSlice
	}{
		{svc("itp-elsewhere", "10.96.0.1", local, false), slice("itp-elsewhere", "node-b")}, // internal
		{svc("itp-here", "10.96.0.2", local, false), slice("itp-here", "node-b", "node-a")},
		{svc("itp-none", "10.96.0.3", local, false), slice("itp-none")}, // no endpoints: rejected, not counted
		{svc("cluster", "10.96.0.4", cluster, false), slice("cluster", "node-b")},
		{svc("etp-elsewhere", "10.96.0.5", cluster, true), slice("etp-elsewhere", "node-b")}, // external, two NodePort frontends
		{svc("both-elsewhere", "10.96.0.6", local, true), slice("both-elsewhere", "node-c")}, // internal and external
		{svc("etp-here", "10.96.0.7", cluster, true), slice("etp-here", "node-a")},
	} {
		tr, err := translate.ServiceToModel(c.svc, []*discoveryv1.EndpointSlice{c.eps}, translate.Options{Node: node})
		if err != nil || tr.Skipped != "" {
			t.Fatalf("%s: %v %q", c.svc.Name, err, tr.Skipped)
		}
		for _, s := range tr.Services {
			st.Services.Set(s.Frontend, s)
		}
	}
	// An IPv6 ClusterIP frontend dropping for want of a local endpoint
	// (internalTrafficPolicy Local, as translate makes it) counts in the
	// IPv6 family only, its IPv4 twin of the same Service port in IPv4.
	for _, vip := range []string{"2001:db8:96::8", "10.96.0.8"} {
		fe := model.L4Addr{Addr: netip.MustParseAddr(vip), Port: 80, Proto: model.TCP}
		st.Services.Set(fe, &model.Service{Name: model.ServicePortName{Namespace: "default", Name: "dual-itp-elsewhere", Port: "http"},
			Kind: model.ClusterIP, Frontend: fe, DropWhenEmpty: true})
	}
	m := New()
	m.SetProgrammed(st)
	want := `
# HELP kubeproxy_sync_proxy_rules_no_local_endpoints_total Number of services with a Local traffic policy and no endpoints
# TYPE kubeproxy_sync_proxy_rules_no_local_endpoints_total gauge
kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="external"} 2
kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="internal"} 3
kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv6",traffic_policy="external"} 0
kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv6",traffic_policy="internal"} 1
`
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want), "kubeproxy_sync_proxy_rules_no_local_endpoints_total"); err != nil {
		t.Error(err)
	}
	// A later sync recounts: with nothing left, both are 0.
	m.SetProgrammed(model.NewState())
	for _, n := range []string{"} 1", "} 2", "} 3"} {
		want = strings.ReplaceAll(want, n, "} 0")
	}
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want), "kubeproxy_sync_proxy_rules_no_local_endpoints_total"); err != nil {
		t.Error(err)
	}
}

// checkZeroBeforeSync reports each series that m, before any sync, does
// not export as 0, for both families (FAM in its name stands for the
// family).
func checkZeroBeforeSync(t *testing.T, m *Metrics, series ...string) {
	t.Helper()
	start := scrape(t, m)
	for _, fam := range []string{"IPv4", "IPv6"} {
		for _, s := range series {
			s = strings.Replace(s, "FAM", fam, 1)
			if v, ok := start[s]; !ok || v != 0 {
				t.Errorf("before any sync: %s = %v (exported: %v), want 0", s, v, ok)
			}
		}
	}
}

func ptrTo[T any](v T) *T { return &v }

// The rest of kube-proxy's metrics that Sluice has a meaning for: full and
// partial syncs (as the reconciler says), the changes read and pending, the
// last change queued, the probes by code; and client-go's requests, as
// kube-proxy registers them.
func TestKubeProxyChangeAndProbeMetrics(t *testing.T) {
	m := New()
	checkZeroBeforeSync(t, m,
		`kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="FAM"}`,
		`kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family="FAM"}`,
		`kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="FAM"}`,
	)
	full := true
	m.SetFullSync(func() bool { return full })
	m.ObserveSync(3*time.Millisecond, nil) // the first: full
	full = false
	m.ObserveSync(time.Millisecond, nil)
	m.ObserveSync(2*time.Millisecond, errors.New("map full"))
	for range 3 {
		m.ObserveChange(true, false) // a Service event that changed nothing
	}
	m.ObserveChange(true, true)
	m.ObserveChange(false, true)
	m.ObserveChange(false, true)
	queued := time.Unix(1_790_000_000, 500_000_000)
	m.ObserveQueued(queued)
	for _, c := range []struct {
		probe string
		code  int
	}{{"healthz", 200}, {"healthz", 200}, {"healthz", 503}, {"livez", 200}} {
		m.ObserveProbe(c.probe, c.code)
	}

	// A request through client-go, as the Kubernetes source makes them.
	host, err := requestVersion()
	if err != nil {
		t.Fatal(err)
	}

	got := scrape(t, m)
	for s, want := range map[string]float64{
		`kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv4"}`:    1,
		`kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv6"}`:    1,
		`kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family="IPv4"}`: 2, // a failed one too, as kube-proxy's deferred record
		`kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"}`:         3,
		`kubeproxy_sync_proxy_rules_service_changes_total`:                            4,
		`kubeproxy_sync_proxy_rules_service_changes_pending`:                          1,
		`kubeproxy_sync_proxy_rules_endpoint_changes_total`:                           2,
		`kubeproxy_sync_proxy_rules_endpoint_changes_pending`:                         2,
		`kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv4"}`:  1_790_000_000.5,
		`kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv6"}`:  1_790_000_000.5,
		`kubeproxy_proxy_healthz_total{code="200"}`:                                   2,
		`kubeproxy_proxy_healthz_total{code="503"}`:                                   1,
		`kubeproxy_proxy_livez_total{code="200"}`:                                     1,
		`rest_client_requests_total{code="200",host="` + host + `",method="GET"}`:     1,
		`rest_client_request_duration_seconds_count{host="` + host + `",verb="GET"}`:  1,
	} {
		if v, ok := got[s]; !ok || v != want {
			t.Errorf("%s = %v (exported: %v), want %v", s, v, ok, want)
		}
	}
	m.ObserveTaken()
	got = scrape(t, m)
	for _, s := range []string{`kubeproxy_sync_proxy_rules_service_changes_pending`, `kubeproxy_sync_proxy_rules_endpoint_changes_pending`} {
		if got[s] != 0 {
			t.Errorf("after a sync took the changes: %s = %v, want 0", s, got[s])
		}
	}
	if got[`kubeproxy_sync_proxy_rules_service_changes_total`] != 4 {
		t.Errorf("a sync reset the change total")
	}
}
