package harness

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/test/bench/load"
)

func TestPercentile(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 100; i++ {
		d = append(d, time.Duration(i))
	}
	if p := load.Percentile(d, 0.5); p != 50 {
		t.Errorf("p50 = %d", p)
	}
	if p := load.Percentile(d, 0.99); p != 99 {
		t.Errorf("p99 = %d", p)
	}
	if p := load.Percentile(d[:1], 0.99); p != 1 {
		t.Errorf("p99 of one = %d", p)
	}
}

func TestConfigFromEnv(t *testing.T) {
	t.Setenv("BENCH_SERVICES", "100, 1_000")
	t.Setenv("BENCH_MODES", "direct,nftables,sluice")
	t.Setenv("BENCH_PROG_TIMEOUT", "5s")
	perf := filepath.Join(t.TempDir(), "perf")
	t.Setenv("BENCH_PERF", perf)
	c, err := ConfigFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Services) != 2 || c.Services[1] != 1000 || len(c.Modes) != 2 || c.Modes[0] != ModeNft || c.ProgTimeout != 5*time.Second {
		t.Errorf("config %+v", c)
	}
	// The profiles' directory exists before the first client run.
	if st, err := os.Stat(perf); c.PerfDir != perf || err != nil || !st.IsDir() {
		t.Errorf("BENCH_PERF=%s: PerfDir %q, %v", perf, c.PerfDir, err)
	}
	t.Setenv("BENCH_MODES", "ipvs")
	if _, err := ConfigFromEnv(); err == nil {
		t.Error("unknown mode accepted")
	}
}

// TestConfigSluiceBase: BENCH_SLUICE_BASE adds mode sluice-base to the
// default modes, BENCH_MODES may name it, and neither goes without the
// other; without the variable the modes are as before.
func TestConfigSluiceBase(t *testing.T) {
	for _, tc := range []struct {
		base, modes string
		want        []string // nil: an error
	}{
		{"", "", AllModes},
		{"/x/sluice", "", append(slices.Clone(AllModes), ModeSluiceBase)},
		{"/x/sluice", "sluice-base,sluice", []string{ModeSluiceBase, ModeSluice}},
		{"/x/sluice", "sluice", nil},
		{"", "sluice,sluice-base", nil},
	} {
		t.Setenv("BENCH_SLUICE_BASE", tc.base)
		t.Setenv("BENCH_MODES", tc.modes)
		c, err := ConfigFromEnv()
		if tc.want == nil {
			if err == nil {
				t.Errorf("BENCH_SLUICE_BASE=%q BENCH_MODES=%q accepted: %v", tc.base, tc.modes, c.Modes)
			}
			continue
		}
		if err != nil || !slices.Equal(c.Modes, tc.want) || c.SluiceBase != tc.base {
			t.Errorf("BENCH_SLUICE_BASE=%q BENCH_MODES=%q: modes %v, base %q, %v; want %v", tc.base, tc.modes, c.Modes, c.SluiceBase, err, tc.want)
		}
	}
	if !slices.Equal(AllModes, []string{ModeIptNft, ModeIptLeg, ModeNft, ModeSluice}) {
		t.Errorf("AllModes changed: %v", AllModes)
	}
}

// TestCPURatios: the CPU ratio is the floor's CPU per connection over the
// mode's, round by round, rounds without a figure left out.
func TestCPURatios(t *testing.T) {
	floor := &ConnStat{CPURounds: []*CPUCost{
		{ClientUs: 50, ServerUs: 40, SoftirqdUs: 10, TotalUs: 100},
		{ClientUs: 50, ServerUs: 30, TotalUs: 80},
		{ClientUs: 40, ServerUs: 40, TotalUs: 80},
	}}
	mode := &ConnStat{CPURounds: []*CPUCost{
		{ClientUs: 60, ServerUs: 40, SoftirqdUs: 25, TotalUs: 125},
		nil, // a run that made no connection
		{ClientUs: 50, ServerUs: 50, TotalUs: 100},
	}}
	mode.cpuRatios(floor)
	if mode.RatioCPU != (Stat{Median: 0.8, Min: 0.8, Max: 0.8}) {
		t.Errorf("ratio %+v, want 0.8 in both rounds", mode.RatioCPU)
	}
	if r := mode.RatioCPUNoSoftirqd; math.Abs(r.Median-0.85) > 1e-9 || r.Min != 0.8 || r.Max != 0.9 {
		t.Errorf("ratio without ksoftirqd %+v, want 0.9 and 0.8", mode.RatioCPUNoSoftirqd)
	}
	if mode.CPUUs != (Stat{Median: 112.5, Min: 100, Max: 125}) {
		t.Errorf("CPU per connection %+v", mode.CPUUs)
	}
	// A process's run time is read from its threads.
	if procRunNs(os.Getpid()) == 0 {
		t.Error("this process's run time reads 0")
	}
	if len(softirqdPids()) == 0 {
		t.Error("no ksoftirqd found")
	}
}
