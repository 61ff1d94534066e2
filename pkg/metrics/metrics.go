// Package metrics holds Sluice's Prometheus metrics: how long a sync takes,
// how long a change in the API takes to reach the maps (the same measure as
// kube-proxy's network_programming_duration_seconds), how much is programmed
// and how full the fixed-size BPF maps are. The agent and the sources record
// into one Metrics; Handler serves it.
//
// Fill ratios are computed at scrape time from the last programmed state and
// the datapath's capacities, so a scrape never touches the BPF maps; the
// rev_nat and services maps' add the retired masters of removed TCP
// frontends (the reconciler's count), which no Service names but which
// hold their entries until the TCP established timeout.
//
// Services the reconciler could not program are exported one series per
// Service port and reason (sluice_service_unprogrammed_frontends): only
// failing ones, so the number of series is bounded by the failures, not by
// the number of Services.
//
// kube-proxy's own metrics (kubeproxy.go) are served beside Sluice's,
// recorded by the same calls, so that the dashboards and alerts operators
// have for kube-proxy keep working. The datapath's counters, map fill and
// program costs (datapath.go) are read from the kernel at scrape time.
package metrics

import (
	"net/http"
	"sync"
	"time"

	"github.com/sluice-lb/sluice/pkg/reconciler"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluice-lb/sluice/pkg/model"
)

const namespace = "sluice"

// Capacity reports the maximum number of services (reverse-NAT entries),
// backends and service map entries (masters plus slots); it has the shape of
// reconciler.Datapath's Capacity method.
type Capacity func() (services, backends, serviceEntries int)

// BackendCounter reports how many entries the backend maps hold, of both
// families, and how many of them are IPv6's
// (reconciler.Reconciler.BackendCounts).
type BackendCounter func() (backends, backends6 int)

// RetiredCounter reports how many removed TCP frontends' masters are kept
// retired for their established flows, of both families, and how many of
// them are IPv6's (reconciler.Reconciler.RetiredCounts).
type RetiredCounter func() (retired, retired6 int)

// Metrics is the set of metrics one agent exports. The zero value is not
// usable; call New.
type Metrics struct {
	Registry *prometheus.Registry

	// SyncDuration is how long one sync (desired state to map writes) took.
	SyncDuration prometheus.Histogram
	// NetworkProgrammingDuration is the time from the last change of an
	// object (an EndpointSlice's endpoints.kubernetes.io/last-change-trigger-time
	// annotation) to the map write that made it effective.
	NetworkProgrammingDuration prometheus.Histogram
	// SyncErrors counts syncs that failed (and will be retried).
	SyncErrors prometheus.Counter
	// Syncs counts syncs by result.
	Syncs *prometheus.CounterVec
	// SocketTerminations counts the connected UDP sockets ended because
	// the backend they were translated to left its Service, by method
	// (bpf, netlink) and result (destroyed, failed).
	SocketTerminations *prometheus.CounterVec
	// SocketsSpared counts the sockets that had talked to such a backend
	// and were left alone, by reason: unconnected (they select a backend
	// again by themselves), still_backend (their own Service still has
	// it).
	SocketsSpared *prometheus.CounterVec
	// StaleUDPConntrackDeleted counts the netfilter conntrack entries of
	// UDP to a frontend that someone else (kube-proxy) DNATed, deleted at
	// the start (datapath.EndStaleUDP).
	StaleUDPConntrackDeleted prometheus.Counter
	// ConntrackGCRuns counts conntrack garbage collections by result,
	// ConntrackGCDeleted the expired entries they deleted.
	ConntrackGCRuns    *prometheus.CounterVec
	ConntrackGCDeleted prometheus.Counter
	// ConntrackHalfOpen is how many flows not answered yet the
	// established conntrack table held at the last collection, both
	// families, by source: found (the collection's pass over the table)
	// and counted (the programs' count of them, which bounds their
	// share of the table, bpf/lib/conntrack.h): a difference that lasts
	// is a drift of the count.
	ConntrackHalfOpen *prometheus.GaugeVec
	// ConntrackHalfOpenResyncs counts the corrections of that count
	// the collections made, a difference from what they found that
	// lasted two of them (datapath.ConntrackStats.HalfOpenResynced).
	ConntrackHalfOpenResyncs prometheus.Counter

	// countMu guards what SetProgrammed counts from: the last state it
	// counted, its counts, and how many of its frontends name each
	// backend, so that a state made from it (model.State.BaseGen) is
	// counted by its changes only, not by a walk of 30,000 Services.
	// With a backendCounter (the agent's reconciler, which knows its
	// backend map already), the backends are not counted here at all:
	// backendRefs would be a second map of every backend address.
	countMu        sync.Mutex
	last           *model.State
	lastCounts     Counts
	backendCounter BackendCounter
	backendRefs    map[model.L4Addr]int
	backends6      int // IPv6 addresses in backendRefs
	// noLocal counts, per Service port with a Local traffic policy and
	// no local endpoints, its frontends that drop for that reason, by
	// family (familyOf) and kind: [family][noLocalInternal] and
	// [family][noLocalExternal] (noLocalKind).
	noLocal [2][2]map[model.ServicePortName]int

	mu       sync.Mutex
	counts   Counts
	capacity Capacity
	// retiredCounter is SetRetiredCounter's.
	retiredCounter RetiredCounter
	// driftCounter is SetDriftCounter's (drift.go).
	driftCounter DriftCounter
	// unprogrammed counts the frontends that failed in the last apply,
	// by Service port and reason.
	unprogrammed map[unprogrammedKey]int

	// fullSync is SetFullSync's (kubeproxy.go).
	fullSync func() bool

	kubeProxy kubeProxyMetrics
}

type unprogrammedKey struct{ service, reason string }

// Counts is what a programmed state holds, in the units of the BPF maps.
// Backends and ServiceEntries are of both address families; each family
// has its own maps (sluice6_backends, sluice6_services) of the same size,
// so Backends6 and ServiceEntries6 say how many of them are IPv6's.
type Counts struct {
	Services       int // frontends: one reverse-NAT entry each
	Backends       int // distinct backend addresses
	ServiceEntries int // service map entries: one master plus one slot per backend

	Backends6, ServiceEntries6 int
}

// CountState counts what programming s takes.
func CountState(s *model.State) Counts {
	var c Counts
	backends := map[model.L4Addr]struct{}{}
	for _, svc := range s.Services.All() {
		c.Services++
		c.ServiceEntries += 1 + len(svc.Backends)
		if familyOf(svc) == 1 {
			c.ServiceEntries6 += 1 + len(svc.Backends)
		}
		for _, b := range svc.Backends {
			backends[b.L4Addr] = struct{}{}
		}
	}
	c.Backends = len(backends)
	for a := range backends {
		if is6(a) {
			c.Backends6++
		}
	}
	return c
}

// is6 reports whether a is in the IPv6 maps.
func is6(a model.L4Addr) bool { return !a.Addr.Unmap().Is4() }

// counter and counterVec make New's counters, named in the sluice_
// namespace.
func counter(name, help string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help})
}

func counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help}, labels)
}

// New returns Metrics registered in a new registry, together with the Go
// runtime and process collectors.
func New() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		SyncDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace,
			Name:      "sync_duration_seconds",
			Help:      "Time one sync of the desired state to the BPF maps took.",
			Buckets:   prometheus.ExponentialBuckets(0.0001, 2, 18), // 100µs .. ~13s
		}),
		NetworkProgrammingDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace,
			Name:      "network_programming_duration_seconds",
			Help:      "Time from an EndpointSlice's last change (its last-change-trigger-time annotation) to the map write that applied it.",
			Buckets: append(prometheus.ExponentialBuckets(0.001, 2, 15), // 1ms .. ~16s
				30, 60, 120, 300),
		}),
		SyncErrors: counter("sync_errors_total",
			"Syncs that failed and were retried."),
		Syncs: counterVec("syncs_total",
			"Syncs by result.",
			"result"),
		SocketTerminations: counterVec("socket_terminations_total",
			"Connected UDP sockets ended, by method and result: those whose backend left the Service they were translated for, and, once at the agent's start, those still connected to a UDP Service frontend (translated by another proxy, kube-proxy).",
			"method", "result"),
		SocketsSpared: counterVec("sockets_spared_total",
			"Sockets that had talked to a removed backend and were left open: unconnected ones, and ones whose Service still has the backend.",
			"reason"),
		StaleUDPConntrackDeleted: counter("stale_udp_conntrack_deleted_total",
			"Netfilter conntrack entries of UDP to a Service frontend that another proxy (kube-proxy) had DNATed, deleted at the agent's start."),
		ConntrackGCRuns: counterVec("conntrack_gc_runs_total",
			"Garbage collections of the per-packet conntrack table, by result.",
			"result"),
		ConntrackGCDeleted: counter("conntrack_gc_deleted_entries_total",
			"Expired per-packet conntrack entries the garbage collection deleted."),
		ConntrackHalfOpen: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "conntrack_half_open_flows",
			Help: "Flows not answered yet (TCP: not assured yet, their client's ACK after the reply not seen) in the established per-packet conntrack table (its half-open share, both families; a source-NATed flow by its port reservation) at the last garbage collection: found by its pass, or counted by the programs, whose count bounds the share."},
			[]string{"source"}),
		ConntrackHalfOpenResyncs: counter("conntrack_half_open_resyncs_total",
			"Corrections of the programs' count of half-open flows (either family) by the garbage collection: a difference from the flows its pass found that lasted two collections."),
	}
	m.ConntrackGCRuns.WithLabelValues("success")
	m.ConntrackGCRuns.WithLabelValues("error")
	m.kubeProxy = newKubeProxyMetrics(m.Registry)
	registerRESTClient(m.Registry)
	m.Registry.MustRegister(
		m.SyncDuration,
		m.NetworkProgrammingDuration,
		m.SyncErrors,
		m.Syncs,
		m.SocketTerminations,
		m.SocketsSpared,
		m.StaleUDPConntrackDeleted,
		m.ConntrackGCRuns,
		m.ConntrackGCDeleted,
		m.ConntrackHalfOpen,
		m.ConntrackHalfOpenResyncs,
		stateCollector{m},
		driftCollector{m},
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}

// ObserveSync records one sync that took d and ended with err.
func (m *Metrics) ObserveSync(d time.Duration, err error) {
	m.SyncDuration.Observe(d.Seconds())
	m.mu.Lock()
	full := m.fullSync
	m.mu.Unlock()
	m.kubeProxy.observeSync(time.Now(), d, err, full)
	if err != nil {
		m.SyncErrors.Inc()
		m.Syncs.WithLabelValues("error").Inc()
		return
	}
	m.Syncs.WithLabelValues("success").Inc()
}

// DeclareSocketTermination makes the socket termination counters of method
// show (at 0) before anything happened, so that a rate over them is
// defined from the agent's start.
func (m *Metrics) DeclareSocketTermination(method string) {
	for _, r := range []string{"destroyed", "failed"} {
		m.SocketTerminations.WithLabelValues(method, r)
	}
	for _, r := range []string{"unconnected", "still_backend"} {
		m.SocketsSpared.WithLabelValues(r)
	}
}

// ObserveSocketTermination records what one flush of removed backends did
// to their sockets.
func (m *Metrics) ObserveSocketTermination(method string, destroyed, failed, sparedUnconnected, sparedStillBackend int) {
	m.SocketTerminations.WithLabelValues(method, "destroyed").Add(float64(destroyed))
	m.SocketTerminations.WithLabelValues(method, "failed").Add(float64(failed))
	m.SocketsSpared.WithLabelValues("unconnected").Add(float64(sparedUnconnected))
	m.SocketsSpared.WithLabelValues("still_backend").Add(float64(sparedStillBackend))
}

// ObserveStaleUDP records what the start's pass over the UDP state
// another proxy left did (datapath.EndStaleUDP): the conntrack entries it
// deleted, and the sockets connected to a frontend it ended (destroyed)
// or failed to, counted as socket terminations of method.
func (m *Metrics) ObserveStaleUDP(conntrackDeleted int, method string, destroyed, failed int) {
	m.StaleUDPConntrackDeleted.Add(float64(conntrackDeleted))
	if destroyed+failed > 0 {
		m.SocketTerminations.WithLabelValues(method, "destroyed").Add(float64(destroyed))
		m.SocketTerminations.WithLabelValues(method, "failed").Add(float64(failed))
	}
}

// ObserveConntrackGC records one garbage collection of the conntrack
// table that deleted entries, or failed with err.
func (m *Metrics) ObserveConntrackGC(deleted int, err error) {
	if err != nil {
		m.ConntrackGCRuns.WithLabelValues("error").Inc()
		return
	}
	m.ConntrackGCRuns.WithLabelValues("success").Inc()
	m.ConntrackGCDeleted.Add(float64(deleted))
}

// SetConntrackHalfOpen records the half-open flows a garbage collection
// found in the established conntrack table and the programs' count of
// them (ConntrackHalfOpen), and the corrections of the count it made
// (ConntrackHalfOpenResyncs).
func (m *Metrics) SetConntrackHalfOpen(found, counted, resyncs int) {
	m.ConntrackHalfOpen.WithLabelValues("found").Set(float64(found))
	m.ConntrackHalfOpen.WithLabelValues("counted").Set(float64(counted))
	m.ConntrackHalfOpenResyncs.Add(float64(resyncs))
}

// ObserveProgrammed records, for each trigger, the latency from its time
// to now: the moment its change reached the maps; kube-proxy's series
// under the trigger's family. The Kubernetes source calls it when the
// agent reports a state programmed.
func (m *Metrics) ObserveProgrammed(now time.Time, triggers []model.Trigger) {
	for _, t := range triggers {
		if t.At.IsZero() || t.At.After(now) {
			continue // a skewed clock must not record a negative latency
		}
		d := now.Sub(t.At).Seconds()
		m.NetworkProgrammingDuration.Observe(d)
		m.kubeProxy.programming.WithLabelValues(ipFamilies[familyIndex(t.IPv6)]).Observe(d)
	}
}

// SetProgrammed records the state that is now in the maps. The agent calls
// it after every successful apply, with the very state it applied. A state
// made from the one before (model.State.BaseGen) costs what changed:
// the counts, the backends' references and the Service ports without
// local endpoints are updated by its Changed frontends only.
func (m *Metrics) SetProgrammed(s *model.State) {
	m.countMu.Lock()
	var c Counts
	if m.last != nil && s.BaseGen != 0 && s.BaseGen == m.last.Gen {
		c = m.lastCounts
		for _, a := range s.Changed {
			if old := m.last.Services.Get(a); old != nil {
				m.count(&c, old, -1)
			}
			if svc := s.Services.Get(a); svc != nil {
				m.count(&c, svc, 1)
			}
		}
	} else {
		if m.backendCounter == nil {
			m.backendRefs = make(map[model.L4Addr]int, len(m.backendRefs))
		}
		m.backends6 = 0
		m.noLocal = [2][2]map[model.ServicePortName]int{{{}, {}}, {{}, {}}}
		for _, svc := range s.Services.All() {
			m.count(&c, svc, 1)
		}
	}
	if m.backendCounter != nil {
		c.Backends, c.Backends6 = m.backendCounter()
	} else {
		c.Backends, c.Backends6 = len(m.backendRefs), m.backends6
	}
	m.last, m.lastCounts = s, c
	var noLocal [2][2]int
	for f := range m.noLocal {
		for k := range m.noLocal[f] {
			noLocal[f][k] = len(m.noLocal[f][k])
		}
	}
	m.countMu.Unlock()
	m.kubeProxy.setNoLocalEndpoints(noLocal)
	m.mu.Lock()
	m.counts = c
	m.mu.Unlock()
}

// count adds (d = 1) or removes (d = -1) svc's frontend to or from c, the
// backends' references and the Service ports without local endpoints.
func (m *Metrics) count(c *Counts, svc *model.Service, d int) {
	c.Services += d
	c.ServiceEntries += d * (1 + len(svc.Backends))
	if familyOf(svc) == 1 {
		c.ServiceEntries6 += d * (1 + len(svc.Backends))
	}
	if m.backendRefs != nil { // else backendCounter counts them
		for _, b := range svc.Backends {
			old := m.backendRefs[b.L4Addr]
			n := old + d
			if n <= 0 {
				delete(m.backendRefs, b.L4Addr)
			} else {
				m.backendRefs[b.L4Addr] = n
			}
			if is6(b.L4Addr) && (old > 0) != (n > 0) {
				m.backends6 += d
			}
		}
	}
	if k := noLocalKind(svc); k >= 0 {
		n := m.noLocal[familyOf(svc)][k]
		if n[svc.Name] += d; n[svc.Name] <= 0 {
			delete(n, svc.Name)
		}
	}
}

// SetBackendCounter makes the backend counts (sluice_backends, the
// backend maps' fill ratios) those c reports after each programmed state,
// instead of the distinct backend addresses of the state, which
// SetProgrammed would keep a map of. The agent sets its reconciler's:
// what the maps hold, which is what the fill ratios are about.
func (m *Metrics) SetBackendCounter(c BackendCounter) {
	m.countMu.Lock()
	defer m.countMu.Unlock()
	m.backendCounter = c
	m.last, m.backendRefs, m.backends6 = nil, nil, 0 // the next state is counted afresh
}

// SetFailures records the frontends the last apply could not program
// (agent.FailureObserver); an empty list clears them.
func (m *Metrics) SetFailures(failures []*reconciler.FrontendError) {
	u := make(map[unprogrammedKey]int, len(failures))
	for _, f := range failures {
		name := f.Service.String()
		if f.Service == (model.ServicePortName{}) {
			name = "" // a frontend restored from the maps that nobody wants
		}
		u[unprogrammedKey{name, f.Reason()}]++
	}
	m.mu.Lock()
	m.unprogrammed = u
	m.mu.Unlock()
}

// SetCapacity sets where fill ratios get the maps' sizes from. Until it is
// set, no fill ratio is exported.
func (m *Metrics) SetCapacity(c Capacity) {
	m.mu.Lock()
	m.capacity = c
	m.mu.Unlock()
}

// SetRetiredCounter makes sluice_retired_frontends what c reports at
// scrape time, and adds what the retired masters hold to the fill ratios
// of the rev_nat and services maps (a service id and a master each),
// which the programmed state does not count: they are no Service's.
// Until it is set, neither is exported or counted.
func (m *Metrics) SetRetiredCounter(c RetiredCounter) {
	m.mu.Lock()
	m.retiredCounter = c
	m.mu.Unlock()
}

// Handler serves the registry in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry})
}

var (
	servicesDesc = prometheus.NewDesc(namespace+"_services",
		"Service frontends programmed.", nil, nil)
	backendsDesc = prometheus.NewDesc(namespace+"_backends",
		"Distinct backends programmed.", nil, nil)
	fillDesc = prometheus.NewDesc(namespace+"_map_fill_ratio",
		"Fraction of a BPF map's capacity in use.", []string{"map"}, nil)
	retiredDesc = prometheus.NewDesc(namespace+"_retired_frontends",
		"Removed TCP and UDP frontends whose masters are kept retired for their established flows (until the TCP established timeout or the UDP timeout); each holds a service id and a service map entry.", nil, nil)
	unprogrammedDesc = prometheus.NewDesc(namespace+"_service_unprogrammed_frontends",
		"Frontends of a Service port the last sync could not program, by reason: capacity or invalid (permanent: retried when the desired state changes) or write (retried with backoff). Only failing Service ports have a series.",
		[]string{"service", "reason"}, nil)
)

// stateCollector exports the programmed counts and fill ratios at scrape
// time.
type stateCollector struct{ m *Metrics }

func (c stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- servicesDesc
	ch <- backendsDesc
	ch <- fillDesc
	ch <- retiredDesc
	ch <- unprogrammedDesc
}

func (c stateCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.mu.Lock()
	counts, capacity, unprogrammed, retiredCounter := c.m.counts, c.m.capacity, c.m.unprogrammed, c.m.retiredCounter
	c.m.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(servicesDesc, prometheus.GaugeValue, float64(counts.Services))
	ch <- prometheus.MustNewConstMetric(backendsDesc, prometheus.GaugeValue, float64(counts.Backends))
	// The retired masters, read now: the programmed state does not name
	// them, but they hold entries of the rev_nat and services maps.
	var retired, retired6 int
	if retiredCounter != nil {
		retired, retired6 = retiredCounter()
		ch <- prometheus.MustNewConstMetric(retiredDesc, prometheus.GaugeValue, float64(retired))
	}
	for k, n := range unprogrammed {
		ch <- prometheus.MustNewConstMetric(unprogrammedDesc, prometheus.GaugeValue, float64(n), k.service, k.reason)
	}
	if capacity == nil {
		return
	}
	// Each family's maps are that large; rev_nat counts the frontends of
	// both, as the reconciler does (service ids are one space). A retired
	// master takes a service id and one service entry of its family.
	services, backends, entries := capacity()
	for _, f := range []struct {
		name      string
		used, max int
	}{
		{"rev_nat", counts.Services + retired, services},
		{"backends", counts.Backends - counts.Backends6, backends},
		{"backends6", counts.Backends6, backends},
		{"services", counts.ServiceEntries - counts.ServiceEntries6 + retired - retired6, entries},
		{"services6", counts.ServiceEntries6 + retired6, entries},
	} {
		if f.max <= 0 {
			continue
		}
		ch <- prometheus.MustNewConstMetric(fillDesc, prometheus.GaugeValue,
			float64(f.used)/float64(f.max), f.name)
	}
}
