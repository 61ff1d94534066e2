package metrics

// The reconciler's periodic re-reads of the maps (--map-refresh-interval)
// find entries changed or deleted behind the agent's back (bpftool, another
// program) and repair them; the reconciler counts them (Reconciler.Drift)
// and they are read from it at scrape time, as the backend counts are, so
// that an operator can alert on drift.

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// DriftCounter reports the re-reads of the maps and the entries they found
// drifted (reconciler.Reconciler.Drift).
type DriftCounter func() reconciler.DriftStats

var (
	driftEntriesDesc = prometheus.NewDesc(namespace+"_map_drift_entries_total",
		"Map entries a re-read of the BPF maps found changed, deleted or added behind the agent's back and had repaired, by map (masters and slots are the services maps').",
		[]string{"map"}, nil)
	rereadsDesc = prometheus.NewDesc(namespace+"_map_rereads_total",
		"Re-reads of the BPF maps (--map-refresh-interval) by result: no_drift, repaired (entry by entry) or rebuilt (the reconciler's view rebuilt from a dump of the maps).",
		[]string{"result"}, nil)
)

// SetDriftCounter makes sluice_map_drift_entries_total and
// sluice_map_rereads_total what c reports at scrape time. Until it is set
// they are not exported.
func (m *Metrics) SetDriftCounter(c DriftCounter) {
	m.mu.Lock()
	m.driftCounter = c
	m.mu.Unlock()
}

// driftCollector exports the drift counters at scrape time.
type driftCollector struct{ m *Metrics }

func (c driftCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- driftEntriesDesc
	ch <- rereadsDesc
}

func (c driftCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.mu.Lock()
	counter := c.m.driftCounter
	c.m.mu.Unlock()
	if counter == nil {
		return
	}
	d := counter()
	for k, n := range d.Entries {
		ch <- prometheus.MustNewConstMetric(driftEntriesDesc, prometheus.CounterValue, float64(n), reconciler.DriftMaps[k])
	}
	for _, r := range []struct {
		result string
		n      uint64
	}{{"no_drift", d.NoDrift}, {"repaired", d.Repaired}, {"rebuilt", d.Rebuilt}} {
		ch <- prometheus.MustNewConstMetric(rereadsDesc, prometheus.CounterValue, float64(r.n), r.result)
	}
}
