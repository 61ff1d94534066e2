package main

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/sluice-lb/sluice/test/bench/harness"
)

// cpuBlocks is the CPU a synced mode spent in alternating blocks of time
// (BENCH_CPU_CHANGES): a change block, in which B single EndpointSlice
// changes were sent one every gap, then an idle block as long with none,
// and again, for K changes in all. No /metrics read falls inside a block.
// A change's CPU is a pair's difference over B.
//
// Blocks, not one window of each: a mode syncs everything at least every
// sync period (30 s) unless a change made it sync sooner, so a long
// window of changes has none of those periodic syncs and a long idle
// window all of them, and their difference comes out negative (seen:
// -11 ms a change at 30,000 Services). An idle block of a gap times B
// (24 s) after a change block ends before the next periodic sync is due,
// so both blocks hold the same background (informer and agent resyncs,
// collections) but for the changes. And one pair that holds a rare cost
// (Sluice's reconciler re-reads its maps every 5 minutes: about 2.5
// CPU-seconds at 30,000 x 10) shows as an outlier the median leaves out.
type cpuBlocks struct {
	Changes int     `json:"changes"`  // K
	PerPair int     `json:"per_pair"` // B
	BlockS  float64 `json:"block_s"`
	// ChangeCPUS and IdleCPUS are each pair's blocks' CPU, in seconds
	// (every thread's time on CPU, /proc/<pid>/task/*/schedstat).
	ChangeCPUS []float64 `json:"change_cpu_s"`
	IdleCPUS   []float64 `json:"idle_cpu_s"`
	// ChangeSyncs and IdleSyncs are the syncs the mode counted in all
	// change and all idle blocks (kubeproxy_sync_proxy_rules_duration_seconds_count):
	// K in the first shows every change synced alone.
	ChangeSyncs int `json:"change_syncs"`
	IdleSyncs   int `json:"idle_syncs"`
	// Recorded is how many programming latencies the mode recorded (K
	// expected), LatencyMeanS their mean.
	Recorded     int     `json:"recorded"`
	LatencyMeanS float64 `json:"latency_mean_s"`
}

// perChangeMs is each pair's CPU for one change: its change block's CPU
// less its idle block's, over B, in milliseconds.
func (w cpuBlocks) perChangeMs() []float64 {
	var v []float64
	for i := range min(len(w.ChangeCPUS), len(w.IdleCPUS)) {
		v = append(v, (w.ChangeCPUS[i]-w.IdleCPUS[i])/float64(w.PerPair)*1000)
	}
	return v
}

// idleMsPerS is each idle block's CPU in milliseconds a second.
func (w cpuBlocks) idleMsPerS() []float64 {
	var v []float64
	for _, c := range w.IdleCPUS {
		v = append(v, c/w.BlockS*1000)
	}
	return v
}

// syncCounts reads the mode's count of syncs and its programming
// latencies' count and sum (one /metrics read, outside the blocks).
func syncCounts(p *proxy) (syncs, latCount, latSum float64, err error) {
	body, err := p.metrics()
	if err != nil {
		return 0, 0, 0, err
	}
	syncs, _ = sample(body, metricSyncSeconds+"_count", ipv4Label)
	latCount, _ = sample(body, metricProgramming+"_count", "")
	latSum, _ = sample(body, metricProgramming+"_sum", "")
	return syncs, latCount, latSum, nil
}

// threadsCPU is the time every thread of pid has spent on a CPU, in
// seconds (harness.ThreadsRunNs: schedstat's nanoseconds, where
// /proc/<pid>/stat counts 10 ms ticks and a change costs a few
// milliseconds).
func threadsCPU(pid int) (float64, error) {
	ns, err := harness.ThreadsRunNs(pid)
	return float64(ns) / 1e9, err
}

// measureCPUPerChange measures k changes in blocks of b, gap apart, each
// change block followed by an idle block as long.
func measureCPUPerChange(ctx context.Context, c *cluster, p *proxy, n, k, b int, gap time.Duration) (cpuBlocks, error) {
	b = max(1, min(b, k))
	w := cpuBlocks{Changes: k, PerPair: b, BlockS: (time.Duration(b) * gap).Seconds()}
	sleepUntil := func(t time.Time) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Until(t)):
			return nil
		}
	}
	block := func(changes bool) (float64, error) {
		before, err := threadsCPU(p.pid)
		if err != nil {
			return 0, err
		}
		start := time.Now()
		for i := range b {
			if err := sleepUntil(start.Add(time.Duration(i) * gap)); err != nil {
				return 0, err
			}
			if changes {
				if err := c.change(ctx, n); err != nil {
					return 0, err
				}
			}
		}
		if err := sleepUntil(start.Add(time.Duration(b) * gap)); err != nil {
			return 0, err
		}
		after, err := threadsCPU(p.pid)
		return after - before, err
	}
	_, cnt0, sum0, err := syncCounts(p)
	if err != nil {
		return w, err
	}
	var changeSyncs, idleSyncs float64
	for range k / b {
		cs, _, _, err := syncCounts(p)
		if err != nil {
			return w, err
		}
		cpu, err := block(true)
		if err != nil {
			return w, fmt.Errorf("change block: %w", err)
		}
		w.ChangeCPUS = append(w.ChangeCPUS, cpu)
		mid, _, _, err := syncCounts(p)
		if err != nil {
			return w, err
		}
		if cpu, err = block(false); err != nil {
			return w, fmt.Errorf("idle block: %w", err)
		}
		w.IdleCPUS = append(w.IdleCPUS, cpu)
		end, _, _, err := syncCounts(p)
		if err != nil {
			return w, err
		}
		changeSyncs += mid - cs
		idleSyncs += end - mid
	}
	_, cnt1, sum1, err := syncCounts(p)
	if err != nil {
		return w, err
	}
	w.ChangeSyncs, w.IdleSyncs = int(math.Round(changeSyncs)), int(math.Round(idleSyncs))
	if w.Recorded = int(math.Round(cnt1 - cnt0)); w.Recorded > 0 {
		w.LatencyMeanS = (sum1 - sum0) / (cnt1 - cnt0)
	}
	return w, nil
}
