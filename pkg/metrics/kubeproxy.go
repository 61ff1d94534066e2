package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-lb/sluice/pkg/model"
)

// kube-proxy's metrics, under kube-proxy's names, types, labels and
// buckets (kubernetes pkg/proxy/metrics/metrics.go; the ip_family label
// since v1.33), so that a dashboard or alert written for kube-proxy reads
// Sluice unchanged:
//
//	kubeproxy_sync_proxy_rules_duration_seconds{ip_family}      histogram, every sync
//	kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family} gauge, last successful sync
//	kubeproxy_network_programming_duration_seconds{ip_family}   histogram, per trigger time
//	kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family,traffic_policy}
//	    gauge (despite its name, as in kube-proxy): Service ports with a
//	    Local traffic policy whose endpoints are all on other nodes
//
// They are recorded by the same calls as Sluice's own sync and programming
// histograms (ObserveSync, ObserveProgrammed, SetProgrammed): one
// measurement, two names.
//
// ip_family: a dual-stack kube-proxy runs one proxier per family, each
// with its own series. Sluice serves both families in one sync, so a sync
// is recorded under both; a Service port without local endpoints counts in
// the family of its frontend; a programming latency in the family of the
// EndpointSlice whose change it measures (model.Trigger), as the proxier
// of that family, which alone receives the slice, records it.

// ipFamilies are the ip_family label's values, by family index (familyOf).
var ipFamilies = [2]string{"IPv4", "IPv6"}

// familyOf is the index in ipFamilies of svc's frontend's family.
func familyOf(svc *model.Service) int {
	return familyIndex(is6(svc.Frontend))
}

// familyIndex is the index in ipFamilies of IPv6 (v6) or IPv4.
func familyIndex(v6 bool) int {
	if v6 {
		return 1
	}
	return 0
}

type kubeProxyMetrics struct {
	syncDuration  *prometheus.HistogramVec
	lastSync      *prometheus.GaugeVec
	programming   *prometheus.HistogramVec
	noLocalEndpts *prometheus.GaugeVec
}

// kubeProxyProgrammingBuckets are kube-proxy's buckets of
// network_programming_duration_seconds: 0, 0.25s, 0.5s, every second to
// 59s, every 5s to 115s, every 30s to 5min.
func kubeProxyProgrammingBuckets() []float64 {
	b := []float64{0}
	b = append(b, prometheus.LinearBuckets(0.25, 0.25, 2)...)
	b = append(b, prometheus.LinearBuckets(1, 1, 59)...)
	b = append(b, prometheus.LinearBuckets(60, 5, 12)...)
	return append(b, prometheus.LinearBuckets(120, 30, 7)...)
}

func newKubeProxyMetrics(reg prometheus.Registerer) kubeProxyMetrics {
	const subsystem = "kubeproxy"
	k := kubeProxyMetrics{
		syncDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Subsystem: subsystem,
			Name:      "sync_proxy_rules_duration_seconds",
			Help:      "SyncProxyRules latency in seconds (Sluice: one sync of the desired state to the BPF maps, as sluice_sync_duration_seconds)",
			Buckets:   prometheus.ExponentialBuckets(0.001, 2, 15),
		}, []string{"ip_family"}),
		lastSync: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Subsystem: subsystem,
			Name:      "sync_proxy_rules_last_timestamp_seconds",
			Help:      "The last time proxy rules were successfully synced",
		}, []string{"ip_family"}),
		programming: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Subsystem: subsystem,
			Name:      "network_programming_duration_seconds",
			Help:      "In Cluster Network Programming Latency in seconds (as sluice_network_programming_duration_seconds)",
			Buckets:   kubeProxyProgrammingBuckets(),
		}, []string{"ip_family"}),
		noLocalEndpts: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Subsystem: subsystem,
			Name:      "sync_proxy_rules_no_local_endpoints_total",
			Help:      "Number of services with a Local traffic policy and no endpoints",
		}, []string{"ip_family", "traffic_policy"}),
	}
	reg.MustRegister(k.syncDuration, k.lastSync, k.programming, k.noLocalEndpts)
	// Every series exists from the start, as after kube-proxy's first
	// sync: a query for them finds a value (0 or empty) instead of
	// nothing before the first change.
	for _, f := range ipFamilies {
		k.syncDuration.WithLabelValues(f)
		k.programming.WithLabelValues(f)
		k.lastSync.WithLabelValues(f)
		k.noLocalEndpts.WithLabelValues(f, "internal")
		k.noLocalEndpts.WithLabelValues(f, "external")
	}
	return k
}

// observeSync records a sync that ended at now, took d and failed with
// err (nil: succeeded).
func (k kubeProxyMetrics) observeSync(now time.Time, d time.Duration, err error) {
	for _, f := range ipFamilies {
		k.syncDuration.WithLabelValues(f).Observe(d.Seconds())
		if err == nil {
			k.lastSync.WithLabelValues(f).Set(float64(now.UnixNano()) / 1e9)
		}
	}
}

// Which kube-proxy no_local_endpoints count a frontend is in
// (noLocalKind).
const (
	noLocalInternal = 0
	noLocalExternal = 1
)

// noLocalKind says which of kube-proxy's counts of Service ports whose
// traffic policy is Local and that have endpoints, but none on this node,
// svc's frontend is in: internal for internalTrafficPolicy (its ClusterIP
// frontends drop), external for externalTrafficPolicy (its external
// frontends drop external clients); -1 for neither. Each Service port
// counts once, however many frontends it has (Metrics.noLocal).
func noLocalKind(svc *model.Service) int {
	switch {
	case len(svc.Backends) > 0 || !svc.DropWhenEmpty:
		return -1
	case svc.Kind == model.ClusterIP:
		// Dropping with no backends: internalTrafficPolicy Local and
		// endpoints only elsewhere (translate).
		return noLocalInternal
	case svc.ExternalLocal && svc.TwoScopes:
		// Dropping for external clients; a LoadBalancer IP that drops
		// for everyone (no source admitted) has no two scopes.
		return noLocalExternal
	}
	return -1
}

// setNoLocalEndpoints sets the no_local_endpoints gauges, as kube-proxy
// does at every sync, to the number of Service ports of each family and
// kind: n[family][noLocalInternal or noLocalExternal].
func (k kubeProxyMetrics) setNoLocalEndpoints(n [2][2]int) {
	for f, name := range ipFamilies {
		k.noLocalEndpts.WithLabelValues(name, "internal").Set(float64(n[f][noLocalInternal]))
		k.noLocalEndpts.WithLabelValues(name, "external").Set(float64(n[f][noLocalExternal]))
	}
}
