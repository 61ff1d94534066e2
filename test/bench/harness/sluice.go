package harness

import (
	"context"
	"errors"

	"github.com/sluice-lb/sluice/test/bench/topo"
)

// newSluiceMode starts nothing yet: the agent (cmd/sluice) has not landed.
func newSluiceMode(r *runner, tri *topo.Triple, dir, cgName string) (mode, error) {
	return nil, errors.New("sluice agent not available yet (cmd/sluice)")
}

// testRun measures the tc program per packet through BPF_PROG_TEST_RUN.
func (r *runner) testRun(ctx context.Context, svcs any) *TestRunStat {
	return nil
}
