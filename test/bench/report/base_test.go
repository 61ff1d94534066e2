package report

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/test/bench/harness"
)

// TestBaseTable: a run with mode sluice-base shows it in every table to the
// floor, and holds it against sluice round by round: the ratios below are
// worked by hand from the figures in the JSON.
func TestBaseTable(t *testing.T) {
	var res harness.Results
	// Round 1 of sluice-base failed in the socket layer: that round has no
	// ratio there.
	if err := json.Unmarshal([]byte(`{"points":[{"services":100,"endpoints":10,"modes":["direct","sluice","sluice-base"],
		"conn":[
		{"layer":"packet","target":"random","mode":"direct","rounds":[{"conns":10,"conns_per_s":1000,"p50_us":100,"p99_us":200},{"conns":10,"conns_per_s":1000,"p50_us":100,"p99_us":200}],
		 "cpu_rounds":[{"total_us":10},{"total_us":10}],"cpu_us":{"median":10,"min":10,"max":10},"ratio_cpu":{"median":1,"min":1,"max":1}},
		{"layer":"packet","target":"random","mode":"sluice","rounds":[{"conns":10,"conns_per_s":800,"p50_us":110,"p99_us":300},{"conns":10,"conns_per_s":1000,"p50_us":100,"p99_us":250}],
		 "cpu_rounds":[{"total_us":20},{"total_us":25}],"cpu_us":{"median":22.5,"min":20,"max":25},"ratio_cpu":{"median":0.45,"min":0.4,"max":0.5},"ratio_conns_per_s":0.9,"ratio_p99":1.4},
		{"layer":"packet","target":"random","mode":"sluice-base","rounds":[{"conns":10,"conns_per_s":400,"p50_us":220,"p99_us":600},{"conns":10,"conns_per_s":1100,"p50_us":100,"p99_us":250}],
		 "cpu_rounds":[{"total_us":30},{"total_us":25}],"cpu_us":{"median":27.5,"min":25,"max":30},"ratio_cpu":{"median":0.37,"min":0.33,"max":0.4},"ratio_conns_per_s":0.75,"ratio_p99":2.1},
		{"layer":"socket","target":"last","mode":"sluice","rounds":[{"conns":10,"conns_per_s":500},{"conns":10,"conns_per_s":500}]},
		{"layer":"socket","target":"last","mode":"sluice-base","rounds":[{"conns":10,"conns_per_s":1000},{"conns":0,"errors":1}]}],
		"prog":[{"mode":"sluice","initial_s":[1,2],"update_s":[0.1,0.2,0.4]},{"mode":"sluice-base","initial_s":[3,2],"update_s":[0.1,0.1,0.1]}],
		"mem":[{"mode":"sluice","kernel_bytes":1000,"agent_rss_bytes":2000},{"mode":"sluice-base","kernel_bytes":1500,"agent_rss_bytes":1000}],
		"mem_end":[{"mode":"sluice","agent_peak_rss_bytes":4000},{"mode":"sluice-base","agent_peak_rss_bytes":5000}]}]}`), &res); err != nil {
		t.Fatal(err)
	}
	md := string(Markdown(&res, "t"))
	testutil.ContainsAll(t, "the report", md,
		// In the tables to the floor, as any mode.
		"| 100 | sluice-base | 0.75 / 2.10 | - | - | - |",
		"| 100 | sluice-base | 0 (0-0) | 0.75 | 0 | 0 (0-0) | 2.10 | 0 |", // medians the harness fills, left out here
		"| 100 | packet | random | sluice-base |",
		// Against sluice, round by round: conns/s 400/800 and 1100/1000.
		"## sluice-base against sluice (BENCH_SLUICE_BASE)",
		"| 100 | conns/s | 0.80 [0.50-1.10] n=2 | - | - | 2.00 [2.00-2.00] n=1 |",
		"| 100 | p50 us | 1.50 [1.00-2.00] n=2 | - | - | - |",
		"| 100 | p99 us | 1.50 [1.00-2.00] n=2 | - | - | - |",
		"| 100 | CPU us/conn | 1.25 [1.00-1.50] n=2 | - | - | - |",
		"| 100 | initial programming | 2.00 [1.00-3.00] n=2 |",
		"| 100 | endpoint update | 0.50 [0.25-1.00] n=3 |",
		"| 100 | BPF map memory | 1.50 [1.50-1.50] n=1 |",
		"| 100 | agent RSS after the initial load | 0.50 [0.50-0.50] n=1 |",
		"| 100 | agent peak RSS at the end | 1.25 [1.25-1.25] n=1 |",
	)
	// Without sluice-base, no such section.
	res.Points[0].Conn = res.Points[0].Conn[:2]
	res.Points[0].Prog, res.Points[0].Mem, res.Points[0].MemEnd = res.Points[0].Prog[:1], res.Points[0].Mem[:1], res.Points[0].MemEnd[:1]
	if md := string(Markdown(&res, "t")); strings.Contains(md, "sluice-base against sluice") {
		t.Errorf("a section for sluice-base without it:\n%s", md)
	}
}
