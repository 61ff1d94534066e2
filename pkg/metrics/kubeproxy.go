package metrics

import (
	"strconv"
	"sync/atomic"
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
//	kubeproxy_sync_full_proxy_rules_duration_seconds{ip_family}    histogram, syncs that compared every frontend
//	kubeproxy_sync_partial_proxy_rules_duration_seconds{ip_family} histogram, syncs that looked at the changed ones only
//	kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family}
//	    gauge, the last change that asked for a sync: much later than
//	    last_timestamp, the proxy is hung
//	kubeproxy_sync_proxy_rules_service_changes_total, _endpoint_changes_total
//	    counters, every Service and EndpointSlice event read
//	kubeproxy_sync_proxy_rules_service_changes_pending, _endpoint_changes_pending
//	    gauges, the events that changed something since the last sync took
//	    the changes
//	kubeproxy_proxy_healthz_total{code}, kubeproxy_proxy_livez_total{code}
//	    counters, /healthz and /livez answers by status code
//
// The sync and programming ones are recorded by the same calls as Sluice's
// own sync and programming histograms (ObserveSync, ObserveProgrammed,
// SetProgrammed): one measurement, two names. The changes are told by the
// Kubernetes source (ObserveChange, ObserveQueued, ObserveTaken), the
// probes by pkg/health (ObserveProbe). A full sync is kube-proxy's
// (nftables, iptables) that rewrites every rule; Sluice's is an apply whose
// reconciler compared every desired frontend with the maps, not only the
// changed ones: the first, one after a failure or a re-read of the maps
// that rebuilt its view, one of a state not made from the last applied
// (SetFullSync says which it was).
//
// Left out, as kube-proxy's mode-specific ones with no meaning here: the
// iptables and nftables rule counts and restore or sync failures (a
// failed sync is sluice_sync_errors_total), the nfacct packet counters
// (sluice_datapath_*_total count the datapath's outcomes), and the
// conntrack reconciler's (Sluice's conntrack is its own table,
// sluice_conntrack_gc_*).
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
	syncFull      *prometheus.HistogramVec
	syncPartial   *prometheus.HistogramVec
	lastSync      *prometheus.GaugeVec
	lastQueued    *prometheus.GaugeVec
	programming   *prometheus.HistogramVec
	noLocalEndpts *prometheus.GaugeVec
	healthz       *prometheus.CounterVec
	livez         *prometheus.CounterVec
	changes       *changeCounts

	// queuedGauges are lastQueued's two series, looked up once: the
	// source stamps every changed event.
	queuedGauges [2]prometheus.Gauge
}

// changeCounts are the Service and EndpointSlice changes, counted with
// atomics (read at scrape time): a first list of 30,000 Services and as many
// slices counts 60,000 events.
type changeCounts struct {
	services, servicesPending, endpoints, endpointsPending atomic.Int64
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
	// kube-proxy's buckets of its three sync duration histograms.
	syncBuckets := prometheus.ExponentialBuckets(0.001, 2, 15)
	k := kubeProxyMetrics{
		syncDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Subsystem: subsystem,
			Name:      "sync_proxy_rules_duration_seconds",
			Help:      "SyncProxyRules latency in seconds (Sluice: one sync of the desired state to the BPF maps, as sluice_sync_duration_seconds)",
			Buckets:   syncBuckets,
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
		syncFull: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Subsystem: subsystem,
			Name:      "sync_full_proxy_rules_duration_seconds",
			Help:      "SyncProxyRules latency in seconds for full resyncs (Sluice: syncs whose reconciler compared every frontend with the maps)",
			Buckets:   syncBuckets,
		}, []string{"ip_family"}),
		syncPartial: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Subsystem: subsystem,
			Name:      "sync_partial_proxy_rules_duration_seconds",
			Help:      "SyncProxyRules latency in seconds for partial resyncs (Sluice: syncs that looked at the changed frontends only)",
			Buckets:   syncBuckets,
		}, []string{"ip_family"}),
		lastQueued: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Subsystem: subsystem,
			Name:      "sync_proxy_rules_last_queued_timestamp_seconds",
			Help:      "The last time a sync of proxy rules was queued",
		}, []string{"ip_family"}),
		healthz: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: subsystem,
			Name:      "proxy_healthz_total",
			Help:      "Cumulative proxy healthz HTTP status",
		}, []string{"code"}),
		livez: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: subsystem,
			Name:      "proxy_livez_total",
			Help:      "Cumulative proxy livez HTTP status",
		}, []string{"code"}),
		changes: &changeCounts{},
	}
	c := k.changes
	reg.MustRegister(k.syncDuration, k.syncFull, k.syncPartial, k.lastSync, k.lastQueued, k.programming, k.noLocalEndpts, k.healthz, k.livez,
		prometheus.NewCounterFunc(prometheus.CounterOpts{Subsystem: subsystem, Name: "sync_proxy_rules_service_changes_total",
			Help: "Cumulative proxy rules Service changes"}, func() float64 { return float64(c.services.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Subsystem: subsystem, Name: "sync_proxy_rules_service_changes_pending",
			Help: "Pending proxy rules Service changes"}, func() float64 { return float64(c.servicesPending.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Subsystem: subsystem, Name: "sync_proxy_rules_endpoint_changes_total",
			Help: "Cumulative proxy rules Endpoint changes"}, func() float64 { return float64(c.endpoints.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Subsystem: subsystem, Name: "sync_proxy_rules_endpoint_changes_pending",
			Help: "Pending proxy rules Endpoint changes"}, func() float64 { return float64(c.endpointsPending.Load()) }),
	)
	// Every series exists from the start, as after kube-proxy's first
	// sync: a query for them finds a value (0 or empty) instead of
	// nothing before the first change.
	for i, f := range ipFamilies {
		k.syncDuration.WithLabelValues(f)
		k.syncFull.WithLabelValues(f)
		k.syncPartial.WithLabelValues(f)
		k.programming.WithLabelValues(f)
		k.lastSync.WithLabelValues(f)
		k.queuedGauges[i] = k.lastQueued.WithLabelValues(f)
		k.noLocalEndpts.WithLabelValues(f, "internal")
		k.noLocalEndpts.WithLabelValues(f, "external")
	}
	return k
}

// observeSync records a sync that ended at now, took d and failed with
// err (nil: succeeded); full says whether it was a full one (nil: not
// known, neither full nor partial is recorded).
func (k kubeProxyMetrics) observeSync(now time.Time, d time.Duration, err error, full func() bool) {
	kind := k.syncPartial
	if full == nil {
		kind = nil
	} else if full() {
		kind = k.syncFull
	}
	for _, f := range ipFamilies {
		k.syncDuration.WithLabelValues(f).Observe(d.Seconds())
		if kind != nil {
			kind.WithLabelValues(f).Observe(d.Seconds())
		}
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

// ObserveChange counts a Service (service) or EndpointSlice event read
// from the API; queued says it changed what is to be programmed, and is
// pending until a sync takes it (ObserveTaken). kube-proxy's change
// trackers count the same (sync_proxy_rules_*_changes_total and _pending;
// its Service count is of Services with a net change, this one of the
// events that changed one).
func (m *Metrics) ObserveChange(service, queued bool) {
	c := m.kubeProxy.changes
	total, pending := &c.endpoints, &c.endpointsPending
	if service {
		total, pending = &c.services, &c.servicesPending
	}
	total.Add(1)
	if queued {
		pending.Add(1)
	}
}

// ObserveTaken records that a sync took every pending change.
func (m *Metrics) ObserveTaken() {
	m.kubeProxy.changes.servicesPending.Store(0)
	m.kubeProxy.changes.endpointsPending.Store(0)
}

// ObserveQueued records that a change asked for a sync at now
// (kube-proxy's Sync(), its last_queued_timestamp), under both families:
// one Sluice sync serves both.
func (m *Metrics) ObserveQueued(now time.Time) {
	v := float64(now.UnixNano()) / 1e9
	for _, g := range m.kubeProxy.queuedGauges {
		g.Set(v)
	}
}

// ObserveProbe counts an answer to /healthz (probe "healthz") or /livez
// ("livez") by status code (pkg/health.ProbeCounter).
func (m *Metrics) ObserveProbe(probe string, code int) {
	vec := m.kubeProxy.livez
	if probe == "healthz" {
		vec = m.kubeProxy.healthz
	}
	vec.WithLabelValues(strconv.Itoa(code)).Inc()
}

// SetFullSync sets what says whether the apply a sync measured was a full
// one, comparing every desired frontend with the maps
// (reconciler.Reconciler.LastApplyFull), for the full and partial sync
// histograms; it is asked right after the apply, from the goroutine that
// ran it. Until it is set, neither is recorded.
func (m *Metrics) SetFullSync(full func() bool) {
	m.mu.Lock()
	m.fullSync = full
	m.mu.Unlock()
}
