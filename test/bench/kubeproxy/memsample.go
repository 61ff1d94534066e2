package main

import (
	"context"
	"fmt"
	"math"
	"time"
)

// memEvery is how often a mode's VmRSS and VmHWM are sampled through its
// whole run. The first sync's and the end's figures alone miss what
// happens between: Sluice's reconciler re-reads its maps every 5
// minutes, and a peak there shows at the end only as a VmHWM with no
// time to it.
const memEvery = 2 * time.Second

// memSample is a process's memory at one moment of its run.
type memSample struct {
	// T is the time since the process's start, in seconds.
	T   float64 `json:"t_s"`
	RSS int64   `json:"rss"`
	HWM int64   `json:"hwm"`
}

// sampleMemory reads pid's VmRSS and VmHWM every period from now on,
// until the function it returns is called or the process is gone, and
// that function returns the samples (T from started).
func sampleMemory(pid int, started time.Time, every time.Duration) (stop func() []memSample) {
	done := make(chan struct{})
	out := make(chan []memSample, 1)
	// The first sample is taken before sampleMemory returns, not when
	// the goroutine is first scheduled: a process that ends right after
	// the call still has its sample (TestSampleMemory's kill raced it).
	var s []memSample
	sample := func() bool {
		st, err := readProc(pid)
		if err != nil {
			return false // gone: nothing more to read
		}
		s = append(s, memSample{T: time.Since(started).Seconds(), RSS: st.rss, HWM: st.hwm})
		return true
	}
	first := sample()
	go func() {
		if !first {
			out <- s
			return
		}
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-t.C:
			case <-done:
				out <- s
				return
			}
			if !sample() {
				out <- s
				return
			}
		}
	}()
	return func() []memSample {
		close(done)
		return <-out
	}
}

// rssMax is the largest VmRSS sampled with T in [from, to), and its T;
// ok is false if none was.
func rssMax(s []memSample, from, to float64) (rss int64, at float64, ok bool) {
	for _, x := range s {
		if x.T >= from && x.T < to && (!ok || x.RSS > rss) {
			rss, at, ok = x.RSS, x.T, true
		}
	}
	return rss, at, ok
}

// steadyRun is a window of changes sent at a steady rate
// (BENCH_STEADY_RATE for BENCH_STEADY_DURATION), after the other changes:
// the memory a mode holds while changes keep coming, which single
// changes with a quiet moment before each do not show.
type steadyRun struct {
	Rate float64 `json:"rate_per_s"`
	// Sent is how many changes were sent, FromS and ToS when the window
	// began and ended (since the process's start).
	Sent  int     `json:"sent"`
	FromS float64 `json:"from_s"`
	ToS   float64 `json:"to_s"`
	// Syncs and Recorded are the syncs and the programming latencies the
	// mode counted in the window (Syncs well under Sent: the min sync
	// period folds changes together), LatencyMeanS the latencies' mean.
	Syncs        int     `json:"syncs"`
	Recorded     int     `json:"recorded"`
	LatencyMeanS float64 `json:"latency_mean_s"`
	// HWMBefore and HWMAfter are VmHWM at the window's start and end;
	// RSSMax the largest VmRSS sampled in it.
	HWMBefore int64 `json:"hwm_before"`
	HWMAfter  int64 `json:"hwm_after"`
	RSSMax    int64 `json:"rss_max"`
}

// steadyChanges sends single EndpointSlice changes at rate a second for d,
// one after another (a change that takes longer than 1/rate delays the
// next: Sent says how many went).
func steadyChanges(ctx context.Context, c *cluster, p *proxy, n int, rate float64, d time.Duration, started time.Time) (steadyRun, error) {
	w := steadyRun{Rate: rate}
	syncs0, cnt0, sum0, err := syncCounts(p)
	if err != nil {
		return w, err
	}
	st, err := readProc(p.pid)
	if err != nil {
		return w, err
	}
	w.HWMBefore = st.hwm
	start := time.Now()
	w.FromS = start.Sub(started).Seconds()
	gap := time.Duration(float64(time.Second) / rate)
	for k := 0; ; k++ {
		next := start.Add(time.Duration(k) * gap)
		if !next.Before(start.Add(d)) {
			break
		}
		select {
		case <-ctx.Done():
			return w, ctx.Err()
		case <-time.After(time.Until(next)):
		}
		if err := c.change(ctx, n); err != nil {
			return w, fmt.Errorf("steady change %d: %w", k+1, err)
		}
		w.Sent++
	}
	w.ToS = time.Since(started).Seconds()
	// The last changes' sync: a min sync period and a little.
	select {
	case <-ctx.Done():
		return w, ctx.Err()
	case <-time.After(2 * time.Second):
	}
	syncs1, cnt1, sum1, err := syncCounts(p)
	if err != nil {
		return w, err
	}
	if st, err = readProc(p.pid); err != nil {
		return w, err
	}
	w.HWMAfter = st.hwm
	w.Syncs = int(math.Round(syncs1 - syncs0))
	if w.Recorded = int(math.Round(cnt1 - cnt0)); w.Recorded > 0 {
		w.LatencyMeanS = (sum1 - sum0) / (cnt1 - cnt0)
	}
	return w, nil
}
