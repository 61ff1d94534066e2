package metrics

import (
	"fmt"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-lb/sluice/pkg/datapath"
)

// The datapath's own numbers, read from the kernel at scrape time by a
// collector (as tubular exports its per-CPU counters), never by a polling
// goroutine: a scrape costs what it reads, and nothing runs between
// scrapes.
//
//	sluice_datapath_<path>_total{reason}  the per-CPU outcome counters of
//	    sluice_metrics, summed over CPUs, one family per path (sock, tc,
//	    xdp): reason METRIC_TC_DNAT_NEW is sluice_datapath_tc_total{reason="dnat_new"}.
//	    The reasons come from enum metric_reason in the BPF object's BTF
//	    (datapath.CounterNames), so a reason added in C is exported with
//	    no change here.
//	sluice_bpf_map_entries{map}, sluice_bpf_map_capacity{map}  how full
//	    each hash map is, the conntrack tables among them (counted);
//	    sluice_bpf_map_memory_bytes{map} the memory each holds (the
//	    kernel's memlock estimate).
//	sluice_bpf_program_runs_total{program},
//	sluice_bpf_program_run_seconds_total{program}  run_cnt and
//	    run_time_ns of each program, counted by the kernel while the agent
//	    holds BPF statistics enabled (datapath.EnableStats).

// DatapathStats is what the datapath collector reads; *datapath.Datapath
// has it.
type DatapathStats interface {
	Counters() (map[string]uint64, error)
	MapFill() ([]datapath.MapFill, error)
	ProgramStats() ([]datapath.ProgramStats, error)
}

// SetDatapath exports d's counters, map fill and program statistics,
// read at every scrape. Call it once.
func (m *Metrics) SetDatapath(d DatapathStats) {
	m.Registry.MustRegister(newDatapathCollector(d))
}

var (
	mapEntriesDesc = prometheus.NewDesc(namespace+"_bpf_map_entries",
		"Entries in a BPF hash map, counted at scrape time.", []string{"map"}, nil)
	mapCapacityDesc = prometheus.NewDesc(namespace+"_bpf_map_capacity",
		"Maximum entries of a BPF hash map (max_entries).", []string{"map"}, nil)
	mapBytesDesc = prometheus.NewDesc(namespace+"_bpf_map_memory_bytes",
		"Memory a BPF hash map or trie holds, as the kernel estimates it (memlock): all of max_entries for a preallocated map, the entries there now for the others (the service maps).",
		[]string{"map"}, nil)
	programRunsDesc = prometheus.NewDesc(namespace+"_bpf_program_runs_total",
		"Times a Sluice BPF program ran since the agent loaded it (the kernel's run_cnt; counted while the agent runs, which enables BPF statistics).",
		[]string{"program"}, nil)
	programSecondsDesc = prometheus.NewDesc(namespace+"_bpf_program_run_seconds_total",
		"Time a Sluice BPF program ran since the agent loaded it, summed over CPUs (the kernel's run_time_ns).",
		[]string{"program"}, nil)
)

// counterPath splits a counter reason into the datapath path it belongs
// to and the reason within it: tc_dnat_new is path tc, reason dnat_new.
func counterPath(name string) (path, reason string) {
	path, reason, ok := strings.Cut(name, "_")
	if !ok {
		return "other", name
	}
	return path, reason
}

type datapathCollector struct {
	d DatapathStats
	// counters are the descriptions of the counter families, by path.
	counters map[string]*prometheus.Desc

	// mu serialises scrapes: two at once would walk the maps twice for
	// the same answer.
	mu sync.Mutex
}

func newDatapathCollector(d DatapathStats) *datapathCollector {
	c := &datapathCollector{d: d, counters: map[string]*prometheus.Desc{}}
	for _, name := range datapath.CounterNames() {
		path, _ := counterPath(name)
		if c.counters[path] == nil {
			c.counters[path] = prometheus.NewDesc(fmt.Sprintf("%s_datapath_%s_total", namespace, path),
				fmt.Sprintf("Packets and socket operations of the %s datapath, by outcome (enum metric_reason in bpf/lib/structs.h), summed over CPUs.", path),
				[]string{"reason"}, nil)
		}
	}
	return c
}

func (c *datapathCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.counters {
		ch <- d
	}
	ch <- mapEntriesDesc
	ch <- mapCapacityDesc
	ch <- mapBytesDesc
	ch <- programRunsDesc
	ch <- programSecondsDesc
}

func (c *datapathCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if counts, err := c.d.Counters(); err != nil {
		for _, d := range c.counters {
			ch <- prometheus.NewInvalidMetric(d, fmt.Errorf("read datapath counters: %w", err))
		}
	} else {
		for name, n := range counts {
			path, reason := counterPath(name)
			if d := c.counters[path]; d != nil {
				ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(n), reason)
			}
		}
	}
	if fill, err := c.d.MapFill(); err != nil {
		ch <- prometheus.NewInvalidMetric(mapEntriesDesc, fmt.Errorf("count map entries: %w", err))
	} else {
		for _, f := range fill {
			ch <- prometheus.MustNewConstMetric(mapEntriesDesc, prometheus.GaugeValue, float64(f.Entries), f.Name)
			ch <- prometheus.MustNewConstMetric(mapCapacityDesc, prometheus.GaugeValue, float64(f.Capacity), f.Name)
			if f.Bytes > 0 {
				ch <- prometheus.MustNewConstMetric(mapBytesDesc, prometheus.GaugeValue, float64(f.Bytes), f.Name)
			}
		}
	}
	if progs, err := c.d.ProgramStats(); err != nil {
		ch <- prometheus.NewInvalidMetric(programRunsDesc, fmt.Errorf("read program statistics: %w", err))
	} else {
		for _, p := range progs {
			ch <- prometheus.MustNewConstMetric(programRunsDesc, prometheus.CounterValue, float64(p.Runs), p.Name)
			ch <- prometheus.MustNewConstMetric(programSecondsDesc, prometheus.CounterValue, p.RunTime.Seconds(), p.Name)
		}
	}
}
