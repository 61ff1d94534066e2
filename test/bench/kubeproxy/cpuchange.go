package main

import (
	"context"
	"fmt"
	"math"
	"time"
)

// cpuWindows is one pair of equally long windows in the life of a synced
// mode (BENCH_CPU_CHANGES): one in which K single EndpointSlice changes
// were sent, one every gap, and one with none (what the mode does on its
// own meanwhile: informer resyncs, periodic syncs, the collector). No
// /metrics read falls inside either window. Their difference over K is
// the mode's CPU for one change.
type cpuWindows struct {
	Changes int     `json:"changes"`
	WindowS float64 `json:"window_s"`
	// ChangesFirst says which window came first (it alternates by round).
	ChangesFirst bool    `json:"changes_first"`
	ChangeCPUS   float64 `json:"change_cpu_s"`
	IdleCPUS     float64 `json:"idle_cpu_s"`
	// ChangeSyncs and IdleSyncs are the syncs the mode counted in each
	// (kubeproxy_sync_proxy_rules_duration_seconds_count): K more in the
	// first shows every change synced alone.
	ChangeSyncs int `json:"change_syncs"`
	IdleSyncs   int `json:"idle_syncs"`
	// Recorded is how many programming latencies the mode recorded in the
	// change window (K expected), LatencyMeanS their mean.
	Recorded     int     `json:"recorded"`
	LatencyMeanS float64 `json:"latency_mean_s"`
}

// perChangeMs is the mode's CPU for one change: the change window's CPU
// less the idle window's, over the changes, in milliseconds.
func (w cpuWindows) perChangeMs() float64 {
	if w.Changes == 0 {
		return math.NaN()
	}
	return (w.ChangeCPUS - w.IdleCPUS) / float64(w.Changes) * 1000
}

// idleMsPerS is what the mode spends on its own, milliseconds of CPU a
// second of the idle window.
func (w cpuWindows) idleMsPerS() float64 {
	if w.WindowS == 0 {
		return math.NaN()
	}
	return w.IdleCPUS / w.WindowS * 1000
}

// syncCounts reads the mode's count of syncs and its programming
// latencies' count and sum (one /metrics read, outside the windows).
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

// measureCPUPerChange measures one pair of windows of k changes, gap
// apart (the change window lasts k gaps from its first change), the
// change window first if changesFirst.
func measureCPUPerChange(ctx context.Context, c *cluster, p *proxy, n, k int, gap time.Duration, changesFirst bool) (cpuWindows, error) {
	w := cpuWindows{Changes: k, WindowS: (time.Duration(k) * gap).Seconds(), ChangesFirst: changesFirst}
	sleepUntil := func(t time.Time) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Until(t)):
			return nil
		}
	}
	window := func(changes bool) (cpu float64, syncs int, err error) {
		s0, _, _, err := syncCounts(p)
		if err != nil {
			return 0, 0, err
		}
		before, err := readProc(p.pid)
		if err != nil {
			return 0, 0, err
		}
		start := time.Now()
		for i := range k {
			if err := sleepUntil(start.Add(time.Duration(i) * gap)); err != nil {
				return 0, 0, err
			}
			if changes {
				if _, err := c.change(ctx, n); err != nil {
					return 0, 0, err
				}
			}
		}
		if err := sleepUntil(start.Add(time.Duration(k) * gap)); err != nil {
			return 0, 0, err
		}
		after, err := readProc(p.pid)
		if err != nil {
			return 0, 0, err
		}
		s1, _, _, err := syncCounts(p)
		if err != nil {
			return 0, 0, err
		}
		return after.cpuAll - before.cpuAll, int(math.Round(s1 - s0)), nil
	}
	_, cnt0, sum0, err := syncCounts(p)
	if err != nil {
		return w, err
	}
	for _, changes := range []bool{changesFirst, !changesFirst} {
		cpu, syncs, err := window(changes)
		if err != nil {
			return w, fmt.Errorf("%s window: %w", map[bool]string{true: "change", false: "idle"}[changes], err)
		}
		if changes {
			w.ChangeCPUS, w.ChangeSyncs = cpu, syncs
		} else {
			w.IdleCPUS, w.IdleSyncs = cpu, syncs
		}
	}
	_, cnt1, sum1, err := syncCounts(p)
	if err != nil {
		return w, err
	}
	if w.Recorded = int(math.Round(cnt1 - cnt0)); w.Recorded > 0 {
		w.LatencyMeanS = (sum1 - sum0) / (cnt1 - cnt0)
	}
	return w, nil
}
