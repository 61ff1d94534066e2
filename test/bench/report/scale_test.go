package report

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/test/bench/harness"
)

func TestScaleTables(t *testing.T) {
	var res harness.Results
	if err := json.Unmarshal([]byte(`{"points":[{"services":100000,"endpoints":10,
		"conn":[{"layer":"packet","target":"random","mode":"sluice","rounds":[{"errors":0},{"errors":3,"first_error":"connect: refused"}]}],
		"prog":[{"mode":"sluice","initial_s":[70,80,90],"initial_from_start_s":[50,60,55],"update_s":[2,3,4],"update_from_write_s":[0.5,0.25,1]}],
		"mem":[{"mode":"sluice","agent_rss_bytes":1048576,"agent_peak_rss_bytes":2097152}],
		"mem_end":[{"mode":"sluice","agent_rss_bytes":3145728,"agent_peak_rss_bytes":4194304,"kernel_bytes":5242880}]}]}`), &res); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	loadRunErrors(&b, &res)
	agentMemTable(&b, &res)
	fromStartTable(&b, &res)
	testutil.ContainsAll(t, "the tables", b.String(),
		"2 client runs, 1 with errors",
		"| 100000 | packet | random | sluice | 0 3 | connect: refused |",
		"| 100000 | sluice | 1.0 | 3.0 | 4.0 | 5.0 |",
		"| 100000 | sluice | 80.000 | 55.000 (50.000-60.000) n=3 | 3000.0 | 500.0 (250.0-1000.0) n=3 |",
	)
}
