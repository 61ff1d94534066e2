package metrics

import (
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-lb/sluice/pkg/datapath"
	"github.com/sluice-lb/sluice/pkg/model"
)

// Per-Service counters (--service-metrics), read from the datapath's
// sluice_svc_stats at scrape time, like the node-wide counters
// (datapath.go):
//
//	sluice_service_new_flows_total{namespace,service,port,protocol}
//	sluice_service_packets_total{...}, sluice_service_bytes_total{...}
//	sluice_service_drops_total{...,reason}
//
// One series per Service port and protocol: the frontends of one Service
// port (its ClusterIP, NodePort, external IPs, both scopes of each) are
// added together, since an operator asks about the Service, and a series
// per frontend would multiply the cardinality that already makes this
// opt-in (30,000 Services are 30,000 series per family). port is the
// Service port's name, as in kube-proxy's ServicePortName (empty for an
// unnamed single port). The names come from the last programmed state
// (SetProgrammed), the same that the names file is written from: a
// frontend the agent does not want (restored from the maps, about to be
// removed) has no Service and is left out.
//
// A drop reason's series appears at its first drop: refusals are rare,
// and a series per Service port and reason, zero for nearly all, would
// more than double a scrape at 30,000 Services (BenchmarkServiceScrape30k).
//
// These are counters of the kernel's, which the agent never resets: a
// Service port whose frontends all went away drops out, and one whose
// frontend got a new id starts from zero again, which Prometheus' rate
// takes as a counter reset.

// ServiceStats is what the service collector reads; *datapath.Maps has
// it.
type ServiceStats interface {
	ServiceStats() ([]datapath.ServiceStats, error)
}

// SetServiceStats exports the per-Service counters of s, read at every
// scrape, named after the Services of the last programmed state. Call it
// once, and only with --service-metrics: without it the series would all
// be zero.
func (m *Metrics) SetServiceStats(s ServiceStats) {
	m.Registry.MustRegister(&serviceCollector{m: m, s: s, reasons: datapath.ServiceDropReasons()})
}

var (
	serviceLabels       = []string{"namespace", "service", "port", "protocol"}
	serviceNewFlowsDesc = prometheus.NewDesc(namespace+"_service_new_flows_total",
		"New flows to a Service port: first packets translated by tc or XDP, connect() and sendmsg() calls translated by the socket path; summed over its frontends and CPUs.",
		serviceLabels, nil)
	servicePacketsDesc = prometheus.NewDesc(namespace+"_service_packets_total",
		"Packets to a Service port translated to a backend by tc or XDP (not those of socket-balanced connections, which never carry the Service's address).",
		serviceLabels, nil)
	serviceBytesDesc = prometheus.NewDesc(namespace+"_service_bytes_total",
		"Bytes (IPv4 total length) of the packets sluice_service_packets_total counts.",
		serviceLabels, nil)
	serviceDropsDesc = prometheus.NewDesc(namespace+"_service_drops_total",
		"Packets and connects to a Service port refused, by reason (enum svc_drop_reason in bpf/lib/structs.h); no_endpoints are rejects (ICMP port unreachable, ECONNREFUSED).",
		append(append([]string(nil), serviceLabels...), "reason"), nil)
)

type serviceCollector struct {
	m       *Metrics
	s       ServiceStats
	reasons []string

	// mu serialises scrapes: two at once would read the maps twice for
	// the same answer.
	mu sync.Mutex
}

func (c *serviceCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- serviceNewFlowsDesc
	ch <- servicePacketsDesc
	ch <- serviceBytesDesc
	ch <- serviceDropsDesc
}

// servicePort is one series' labels.
type servicePort struct {
	name  model.ServicePortName
	proto model.Protocol
}

// serviceSums are one Service port's counters.
type serviceSums struct {
	newFlows, packets, bytes uint64
	drops                    []uint64 // by c.reasons
}

func (c *serviceCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	stats, err := c.s.ServiceStats()
	if err != nil {
		err = fmt.Errorf("read per-Service counters: %w", err)
		for _, d := range []*prometheus.Desc{serviceNewFlowsDesc, servicePacketsDesc, serviceBytesDesc, serviceDropsDesc} {
			ch <- prometheus.NewInvalidMetric(d, err)
		}
		return
	}
	c.m.countMu.Lock()
	st := c.m.last // a programmed state is never changed afterwards
	c.m.countMu.Unlock()
	if st == nil {
		return
	}
	sums := make(map[servicePort]*serviceSums, len(stats))
	for _, s := range stats {
		svc := st.Services.Get(s.Frontend)
		if svc == nil {
			continue
		}
		k := servicePort{svc.Name, s.Frontend.Proto}
		sum := sums[k]
		if sum == nil {
			sum = &serviceSums{drops: make([]uint64, len(c.reasons))}
			sums[k] = sum
		}
		sum.newFlows += s.NewFlows
		sum.packets += s.Packets
		sum.bytes += s.Bytes
		for i := range min(len(sum.drops), len(s.Drops)) {
			sum.drops[i] += s.Drops[i]
		}
	}
	for k, sum := range sums {
		labels := []string{k.name.Namespace, k.name.Name, k.name.Port, k.proto.String()}
		ch <- prometheus.MustNewConstMetric(serviceNewFlowsDesc, prometheus.CounterValue, float64(sum.newFlows), labels...)
		ch <- prometheus.MustNewConstMetric(servicePacketsDesc, prometheus.CounterValue, float64(sum.packets), labels...)
		ch <- prometheus.MustNewConstMetric(serviceBytesDesc, prometheus.CounterValue, float64(sum.bytes), labels...)
		for i, r := range c.reasons {
			if sum.drops[i] == 0 {
				continue
			}
			ch <- prometheus.MustNewConstMetric(serviceDropsDesc, prometheus.CounterValue, float64(sum.drops[i]), append(labels, r)...)
		}
	}
}
