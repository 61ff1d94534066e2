package harness

import (
	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/test/bench/load"
)

// Results is everything one benchmark run measured; it is written as
// results/<date>.json and rendered as <date>.md and PNG plots.
type Results struct {
	Span
	Config   Config   `json:"config"`
	Machine  Machine  `json:"machine"`
	Settings []string `json:"settings"` // sysctls and similar that the run set
	Notes    []string `json:"notes"`
	Points   []Point  `json:"points"`
}

// Machine describes where the run happened.
type Machine struct {
	Kernel   string            `json:"kernel"`
	CPU      string            `json:"cpu"`
	CPUs     int               `json:"cpus"`
	MemBytes int64             `json:"mem_bytes"`
	Go       string            `json:"go"`
	Tools    map[string]string `json:"tools"`
	Load     string            `json:"loadavg_at_start"`
}

// Point is everything measured at one service count.
type Point struct {
	Services  int               `json:"services"`
	Endpoints int               `json:"endpoints"`
	Skipped   string            `json:"skipped,omitempty"`
	Modes     []string          `json:"modes"`
	Failed    map[string]string `json:"failed,omitempty"` // mode -> why it was dropped at this N
	Conn      []ConnStat        `json:"conn"`
	Prog      []ProgStat        `json:"prog"`
	Mem       []MemStat         `json:"mem"`
	TestRun   *TestRunStat      `json:"bpf_test_run,omitempty"`
	// ConntrackPeak is the largest nf_conntrack_count seen in a mode's
	// node namespace after a client run (against nf_conntrack_max).
	ConntrackPeak map[string]int `json:"conntrack_peak,omitempty"`
	// Verified says, per mode, whether every one of the N services answered
	// a connection after the initial programming (untimed).
	Verified map[string]string `json:"verified,omitempty"`
	// MemEnd is the memory again at the end of the point, after the load
	// runs and the endpoint changes (Mem is right after the initial load).
	MemEnd []MemStat `json:"mem_end,omitempty"`
}

// ConnStat is one mode's connection figures for a layer and a target set.
type ConnStat struct {
	Layer  string              `json:"layer"`  // "packet" (client in its own netns) or "socket" (client on the node)
	Target string              `json:"target"` // "random" or "last"
	Mode   string              `json:"mode"`
	Rounds []load.ClientResult `json:"rounds"`
	// Medians over rounds, with min..max spread.
	ConnsPerS Stat `json:"conns_per_s"`
	P50us     Stat `json:"p50_us"`
	P99us     Stat `json:"p99_us"`
	// Medians over rounds of the per-round ratio to the floor (direct).
	RatioConnsPerS float64 `json:"ratio_conns_per_s,omitempty"`
	RatioSpread    Stat    `json:"ratio_spread,omitempty"` // RatioConnsPerS with the min..max of the per-round ratios
	RatioP99       float64 `json:"ratio_p99,omitempty"`
	Errors         int     `json:"errors"`
	// Sluice's programs in these runs (BENCH_BPF_STATS): per round, and
	// the median per program over rounds.
	ProgRounds [][]ProgCost `json:"prog_rounds,omitempty"`
	Prog       []ProgCost   `json:"prog,omitempty"`
	// CPU per connection (cpucost.go), per round (nil where the run made
	// no connection), the median over rounds of client + server +
	// ksoftirqd, and the per-round ratio of the floor's to this mode's, so
	// that it reads as RatioConnsPerS does: 1 is the floor's cost, 0.9 a
	// mode that needs 1/0.9 of it. RatioCPUNoSoftirqd leaves ksoftirqd out.
	CPURounds          []*CPUCost `json:"cpu_rounds,omitempty"`
	CPUUs              Stat       `json:"cpu_us,omitempty"`
	RatioCPU           Stat       `json:"ratio_cpu,omitempty"`
	RatioCPUNoSoftirqd Stat       `json:"ratio_cpu_no_ksoftirqd,omitempty"`
}

// cpuRatios fills the CPU figures from CPURounds against the floor's runs
// of the same rounds.
func (st *ConnStat) cpuRatios(floor *ConnStat) {
	var tot, rt, rn []float64
	for i, c := range st.CPURounds {
		if c == nil {
			continue
		}
		tot = append(tot, c.TotalUs)
		if i >= len(floor.CPURounds) || floor.CPURounds[i] == nil {
			continue
		}
		f := floor.CPURounds[i]
		rt = append(rt, f.TotalUs/c.TotalUs)
		if own := c.ClientUs + c.ServerUs; own > 0 {
			rn = append(rn, (f.ClientUs+f.ServerUs)/own)
		}
	}
	st.CPUUs, st.RatioCPU, st.RatioCPUNoSoftirqd = testutil.SpreadOf(tot), testutil.SpreadOf(rt), testutil.SpreadOf(rn)
}

// Stat is a median over rounds with the range it came from.
type Stat = testutil.Spread

// ProgStat is one mode's programming times.
type ProgStat struct {
	Mode string `json:"mode"`
	// Initial: from an empty datapath to all sampled services answering.
	InitialS      []float64 `json:"initial_s"`
	Initial       Stat      `json:"initial"`
	InitialResult string    `json:"initial_result"` // "ok", "timeout > X s", or an error
	// LoadedAfterS is when a load that ran past the bound finished, so
	// that connections could still be measured (0: it did not, or no need).
	LoadedAfterS float64 `json:"loaded_after_s,omitempty"`
	// Update: one endpoint changed in the source until a client reaches it.
	UpdateS      []float64 `json:"update_s"`
	Update       Stat      `json:"update"`
	UpdateResult string    `json:"update_result"`
	// Sluice only, from the agent's log: the manifest source's share
	// (debounce, parse, translate; from the file write) and the
	// reconciler's Apply, per step.
	InitialSourceS []float64 `json:"initial_source_s,omitempty"`
	InitialApplyS  []float64 `json:"initial_apply_s,omitempty"`
	UpdateSourceS  []float64 `json:"update_source_s,omitempty"`
	UpdateApplyS   []float64 `json:"update_apply_s,omitempty"`
	// InitialFromStartS is InitialS less the time to write the sluice
	// mode's manifest: from the agent's start to all sampled services
	// answering (the source's initial share is from the same start).
	InitialFromStartS []float64 `json:"initial_from_start_s,omitempty"`
	// UpdateFromWriteS is UpdateS from the manifest's rename into place,
	// without the time the benchmark took to render and write it.
	UpdateFromWriteS []float64 `json:"update_from_write_s,omitempty"`
}

// MemStat is one mode's memory at N.
type MemStat struct {
	Mode string `json:"mode"`
	memStat
}

// TestRunStat is the tc ingress program's cost per packet through
// BPF_PROG_TEST_RUN (see harness.testRun for what is timed).
type TestRunStat struct {
	Calls         int     `json:"calls"`   // single runs per figure
	ApplyS        float64 `json:"apply_s"` // reconciler Apply of all N services into empty maps
	NewFlowNs     Stat    `json:"new_flow_ns"`
	EstablishedNs Stat    `json:"established_ns"`
	Result        string  `json:"result"`
}
