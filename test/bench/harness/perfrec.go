package harness

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// perfRecord is a system-wide `perf record -a -g` around one client run
// (BENCH_PERF): what the whole machine did while the run's connections
// were made, to be divided by them (see test/bench/performance.md's
// "twenty-third pass"). Its file is <dir>/<N>-<layer>-<target>-<mode>-r<round>.data,
// and beside it a .txt with the run's connections and duration.
type perfRecord struct {
	cmd  *exec.Cmd
	base string
	t0   time.Time
}

// perfStartWait is how long perf gets to open its events before the
// client starts.
const perfStartWait = 500 * time.Millisecond

// startPerf starts perf for one client run; nil without BENCH_PERF, or
// (noted in the report) when perf does not start.
func (r *runner) startPerf(ctx context.Context, services int, layer, target, mode string, round int) *perfRecord {
	if r.cfg.PerfDir == "" {
		return nil
	}
	base := filepath.Join(r.cfg.PerfDir, fmt.Sprintf("%d-%s-%s-%s-r%d", services, layer, target, mode, round))
	cmd := exec.CommandContext(ctx, "perf", "record", "-a", "-g", "-F", "1999", "-q", "-o", base+".data")
	if err := cmd.Start(); err != nil {
		r.note("BENCH_PERF: " + err.Error())
		return nil
	}
	time.Sleep(perfStartWait)
	return &perfRecord{cmd: cmd, base: base, t0: time.Now()}
}

// stop ends the recording (perf writes its file on SIGINT) and writes
// the run's connections beside it.
func (p *perfRecord) stop(conns int) {
	if p == nil {
		return
	}
	el := time.Since(p.t0)
	_ = p.cmd.Process.Signal(syscall.SIGINT)
	_ = p.cmd.Wait()
	_ = os.WriteFile(p.base+".txt", fmt.Appendf(nil, "conns %d\nseconds %.3f\n", conns, el.Seconds()), 0o644)
}
