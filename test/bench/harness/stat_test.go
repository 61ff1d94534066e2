package harness

import (
	"os"
	"path/filepath"
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
