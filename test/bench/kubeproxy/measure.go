package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil"
)

// The metrics both kinds of proxy export under kube-proxy's names.
const (
	metricLastSync    = "kubeproxy_sync_proxy_rules_last_timestamp_seconds"
	metricSyncSeconds = "kubeproxy_sync_proxy_rules_duration_seconds"
	metricProgramming = "kubeproxy_network_programming_duration_seconds"
	ipv4Label         = `ip_family="IPv4"`
)

// pollEvery is how often a mode's metrics are read while waiting. The
// figures do not depend on it (they come from the mode's own timestamps
// and histogram sums), but the mode's CPU does: a scrape of Sluice's
// /metrics walks its BPF maps to report how full they are (tens of
// milliseconds of CPU at 10,000 Services), so the scrapes are counted and
// their cost measured (scrapeCost), and CPU is also reported without them.
const pollEvery = 500 * time.Millisecond

// costScrapes is how many scrapes measure a scrape's CPU cost.
const costScrapes = 10

// modeRun is one mode's figures in one round at one N.
type modeRun struct {
	Mode  string `json:"mode"`
	Round int    `json:"round"`
	// FirstSyncS is from the process's start to the end of its first
	// successful sync (its own kubeproxy_sync_proxy_rules_last_timestamp_seconds).
	FirstSyncS float64 `json:"first_sync_s"`
	// FirstSyncWorkS is the first sync's own duration
	// (kubeproxy_sync_proxy_rules_duration_seconds), when it was the only
	// sync when seen (the poll came before a second one).
	FirstSyncWorkS float64 `json:"first_sync_work_s,omitempty"`
	// StartupS and CachesS split a Sluice agent's first sync by its log:
	// from the process's start until its Kubernetes source began waiting
	// for the informers, and that wait (their lists); see startPhases.
	StartupS float64 `json:"startup_s,omitempty"`
	CachesS  float64 `json:"caches_s,omitempty"`
	// Programmed is how many Services the mode's own state held after the
	// first sync (Service ports with endpoints).
	Programmed int `json:"programmed"`
	// SyncsAtCheck is how many syncs the mode had ended when Programmed
	// was read.
	SyncsAtCheck int `json:"syncs_at_check"`
	// LatencyS is each change's network programming latency as the mode
	// recorded it; ObservedS the time from the patch until the benchmark
	// saw it recorded (an upper bound, for cross-checking).
	LatencyS  []float64 `json:"latency_s"`
	ObservedS []float64 `json:"observed_s"`
	// Recorded is how many latencies the mode recorded per change (1
	// expected).
	Recorded []int `json:"recorded"`
	// Memory and CPU of the process: after the first sync and at the end
	// (after the changes); CPU with the children it waited for
	// (iptables-restore, nft) and its own.
	RSSSyncBytes int64   `json:"rss_after_sync_bytes"`
	HWMSyncBytes int64   `json:"rss_peak_after_sync_bytes"`
	RSSEndBytes  int64   `json:"rss_end_bytes"`
	RSSPeakBytes int64   `json:"rss_peak_bytes"`
	CPUSyncS     float64 `json:"cpu_after_sync_s"`
	CPUEndS      float64 `json:"cpu_end_s"`
	CPUOwnEndS   float64 `json:"cpu_own_end_s"`
	// Scrapes is how many times the benchmark read the mode's /metrics
	// until the end, ScrapeCPUS what one read cost the mode, and
	// CPUNetEndS is CPUEndS less Scrapes reads.
	Scrapes    int     `json:"scrapes"`
	ScrapeCPUS float64 `json:"scrape_cpu_s"`
	CPUNetEndS float64 `json:"cpu_net_end_s"`
	// ScrapesSync is how many reads of its /metrics the mode answered
	// until CPUSyncS was read, and CPUNetSyncS is CPUSyncS less
	// ScrapesSync reads (each at ScrapeCPUS).
	ScrapesSync int     `json:"scrapes_at_sync"`
	CPUNetSyncS float64 `json:"cpu_net_after_sync_s"`
	// CPUBlocks are the CPU blocks (BENCH_CPU_CHANGES), if any.
	CPUBlocks *cpuBlocks `json:"cpu_blocks,omitempty"`
	// Steady is the window of changes at a steady rate
	// (BENCH_STEADY_RATE), if any.
	Steady *steadyRun `json:"steady,omitempty"`
	// Mem is VmRSS and VmHWM every memEvery from the start to the end;
	// RSSSampledMaxBytes the largest VmRSS in it, at RSSSampledMaxS.
	Mem                []memSample `json:"mem_samples,omitempty"`
	RSSSampledMaxBytes int64       `json:"rss_sampled_max_bytes,omitempty"`
	RSSSampledMaxS     float64     `json:"rss_sampled_max_s,omitempty"`
	Errors             []string    `json:"errors,omitempty"`
}

// measure runs mode once at n Services: first sync, changes, memory and
// CPU; what fails is recorded in the run's errors (stopping it too: r is
// a named result, so the deferred close still adds to it), and the run
// goes on where it can.
func measure(ctx context.Context, cfg config, c *cluster, bins binaries, mode string, n, round int) (r modeRun) {
	r = modeRun{Mode: mode, Round: round}
	fail := func(format string, args ...any) { r.Errors = append(r.Errors, fmt.Sprintf(format, args...)) }
	p, started, err := startProxy(c, mode, bins)
	if err != nil {
		fail("start: %v", err)
		return r
	}
	defer func() {
		if err := p.close(context.Background(), c); err != nil {
			fail("stop: %v", err)
		}
		if len(r.Errors) > 0 {
			r.Errors = append(r.Errors, "log tail: "+testutil.LastLines(p.log.String(), 15))
		}
		if cfg.LogDir != "" {
			name := filepath.Join(cfg.LogDir, fmt.Sprintf("%d-%s-r%d.log", n, mode, round))
			if err := os.WriteFile(name, []byte(p.log.String()), 0o644); err != nil {
				fail("keep the log: %v", err)
			}
		}
	}()
	stopMem, memStopped := sampleMemory(p.pid, started, memEvery), false
	collectMem := func() {
		if memStopped {
			return
		}
		memStopped = true
		r.Mem = stopMem()
		if rss, at, ok := rssMax(r.Mem, 0, math.Inf(1)); ok {
			r.RSSSampledMaxBytes, r.RSSSampledMaxS = rss, at
		}
		if w := r.Steady; w != nil {
			// The window and the sync after it (steadyChanges waits 2 s).
			w.RSSMax, _, _ = rssMax(r.Mem, w.FromS, w.ToS+2+memEvery.Seconds())
		}
	}
	defer collectMem() // before the close above: the process is still there

	// First sync.
	var last float64
	var body string
	err = waitFor(ctx, cfg.SyncTimeout, p, func() (bool, error) {
		var err error
		if body, err = p.metrics(); err != nil {
			return false, nil // not serving yet
		}
		last, _ = sample(body, metricLastSync, ipv4Label)
		return last > 0, nil
	})
	if err != nil {
		fail("first sync: %v", err)
		return r
	}
	r.FirstSyncS = last - float64(started.UnixNano())/1e9
	if cnt, _ := sample(body, metricSyncSeconds+"_count", ipv4Label); cnt == 1 {
		r.FirstSyncWorkS, _ = sample(body, metricSyncSeconds+"_sum", ipv4Label)
	}
	if mode == modeSluice || mode == modeSluiceBase {
		var ok bool
		if r.StartupS, r.CachesS, ok = startPhases(p.log.String(), started); !ok {
			fail("first sync: no \"waiting for caches to sync\" and \"caches synced\" lines in the agent's log")
		}
	}
	st, err := readProc(p.pid)
	if err != nil {
		fail("after the first sync: %v", err)
	}
	r.RSSSyncBytes, r.HWMSyncBytes, r.CPUSyncS = st.rss, st.hwm, st.cpuAll
	r.ScrapesSync = p.served
	// The count is polled: Sluice sets its sync timestamp a moment before
	// its count of programmed Services (sluice_services). SyncsAtCheck
	// says how many syncs had ended by then: 1 shows the first sync
	// programmed them all.
	err = waitFor(ctx, cfg.ChangeTimeout, p, func() (bool, error) {
		var err error
		if r.Programmed, err = p.programmed(ctx); err != nil {
			return false, err
		}
		body, err := p.metrics()
		if err != nil {
			return false, err
		}
		cnt, _ := sample(body, metricSyncSeconds+"_count", ipv4Label)
		r.SyncsAtCheck = int(cnt)
		if r.Programmed >= n {
			return true, nil
		}
		return false, mapsFull(body)
	})
	if err != nil {
		fail("first sync: %d of %d services programmed: %v", r.Programmed, n, err)
	}

	// Single changes, one at a time.
	for k := range cfg.Changes {
		lat, obs, rec, err := change(ctx, cfg, c, p, n)
		if err != nil {
			fail("change %d: %v", k+1, err)
			break
		}
		r.LatencyS = append(r.LatencyS, lat)
		r.ObservedS = append(r.ObservedS, obs)
		r.Recorded = append(r.Recorded, rec)
		if rec != 1 {
			fail("change %d: recorded %d times", k+1, rec)
		}
	}

	if cfg.CPUChanges > 0 && len(r.Errors) == 0 {
		w, err := measureCPUPerChange(ctx, c, p, n, cfg.CPUChanges, cfg.CPUBlock, cfg.CPUGap)
		if err != nil {
			fail("CPU blocks: %v", err)
		} else {
			r.CPUBlocks = &w
			if want := w.PerPair * len(w.ChangeCPUS); w.Recorded != want {
				fail("CPU blocks: %d changes, %d latencies recorded", want, w.Recorded)
			}
		}
	}

	if cfg.SteadyRate > 0 && cfg.SteadyFor > 0 && len(r.Errors) == 0 {
		w, err := steadyChanges(ctx, c, p, n, cfg.SteadyRate, cfg.SteadyFor, started)
		if err != nil {
			fail("steady changes: %v", err)
		}
		r.Steady = &w
	}

	collectMem()
	if st, err = readProc(p.pid); err != nil {
		fail("at the end: %v", err)
	}
	r.RSSEndBytes, r.RSSPeakBytes, r.CPUEndS, r.CPUOwnEndS = st.rss, st.hwm, st.cpuAll, st.cpuOwn
	r.Scrapes = p.scrapes
	if r.ScrapeCPUS, err = scrapeCost(p); err != nil {
		fail("scrape cost: %v", err)
	}
	r.CPUNetEndS = max(0, r.CPUEndS-float64(r.Scrapes)*r.ScrapeCPUS)
	r.CPUNetSyncS = max(0, r.CPUSyncS-float64(r.ScrapesSync)*r.ScrapeCPUS)
	return r
}

// scrapeCost is the CPU time one read of the mode's /metrics costs it.
func scrapeCost(p *proxy) (float64, error) {
	before, err := readProc(p.pid)
	if err != nil {
		return 0, err
	}
	for range costScrapes {
		if _, err := p.metrics(); err != nil {
			return 0, err
		}
	}
	after, err := readProc(p.pid)
	if err != nil {
		return 0, err
	}
	return (after.cpuAll - before.cpuAll) / costScrapes, nil
}

// change waits until the mode's last sync ended at least cfg.ChangeGap
// ago, patches one EndpointSlice and waits until the mode records its
// programming latency; it returns the latency the mode recorded (the mean
// if it recorded more than one), the time until the benchmark saw it, and
// how many the mode recorded.
func change(ctx context.Context, cfg config, c *cluster, p *proxy, n int) (lat, observed float64, recorded int, err error) {
	var sum0, cnt0 float64
	err = waitFor(ctx, cfg.ChangeTimeout, p, func() (bool, error) {
		body, err := p.metrics()
		if err != nil {
			return false, err
		}
		last, _ := sample(body, metricLastSync, ipv4Label)
		sum0, _ = sample(body, metricProgramming+"_sum", "")
		cnt0, _ = sample(body, metricProgramming+"_count", "")
		return time.Since(time.Unix(0, int64(last*1e9))) >= cfg.ChangeGap, nil
	})
	if err != nil {
		return 0, 0, 0, fmt.Errorf("waiting for a quiet moment: %w", err)
	}
	start := time.Now()
	if err := c.change(ctx, n); err != nil {
		return 0, 0, 0, err
	}
	var sum, cnt float64
	err = waitFor(ctx, cfg.ChangeTimeout, p, func() (bool, error) {
		body, err := p.metrics()
		if err != nil {
			return false, err
		}
		sum, _ = sample(body, metricProgramming+"_sum", "")
		cnt, _ = sample(body, metricProgramming+"_count", "")
		return cnt > cnt0, nil
	})
	observed = time.Since(start).Seconds()
	if err != nil {
		return 0, 0, 0, fmt.Errorf("waiting for %s to count the change: %w", metricProgramming, err)
	}
	recorded = int(math.Round(cnt - cnt0))
	return (sum - sum0) / (cnt - cnt0), observed, recorded, nil
}

// errTimeout is a wait that ran into its bound.
var errTimeout = errors.New("timeout")

// errHopeless, from a wait's done function, ends the wait at once: what it
// waits for cannot come (an agent whose maps are full programs no more
// Services however long it is given).
var errHopeless = errors.New("will not come")

// waitFor polls done until it says so, the process exits, ctx ends or
// timeout passes. An error from done ends the wait only if it persists
// until the timeout (the last one is returned).
func waitFor(ctx context.Context, timeout time.Duration, p *proxy, done func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		ok, err := done()
		if ok {
			return nil
		}
		if errors.Is(err, errHopeless) {
			return err
		}
		last = err
		if err := p.exited(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			if last != nil {
				return fmt.Errorf("%w > %v (last: %v)", errTimeout, timeout, last)
			}
			return fmt.Errorf("%w > %v", errTimeout, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pollEvery):
		}
	}
}

// mapsFull returns an errHopeless error if a Sluice agent's metrics say
// its maps are full (frontends not programmed for capacity: it programs
// no more until something changes), else nil.
func mapsFull(body string) error {
	if full, _ := sample(body, "sluice_service_unprogrammed_frontends", `reason="capacity"`); full > 0 {
		return fmt.Errorf("%w: the agent's maps are full, %d frontends not programmed for capacity (sluice_service_unprogrammed_frontends): raise its --max-* flags", errHopeless, int(full))
	}
	return nil
}

// sample sums the values of the series of metric name whose labels
// contain label (every series for ""), in a Prometheus text exposition;
// ok is false if there is none.
func sample(body, name, label string) (v float64, ok bool) {
	for _, l := range strings.Split(body, "\n") {
		rest, found := strings.CutPrefix(l, name)
		if !found || rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		labels := ""
		if rest[0] == '{' {
			end := strings.IndexByte(rest, '}')
			if end < 0 {
				continue
			}
			labels, rest = rest[1:end], rest[end+1:]
		}
		if label != "" && !strings.Contains(labels, label) {
			continue
		}
		f, err := strconv.ParseFloat(strings.Fields(rest)[0], 64)
		if err != nil {
			continue
		}
		v, ok = v+f, true
	}
	return v, ok
}

// procStat is a process's memory and CPU time.
type procStat struct {
	rss, hwm       int64   // VmRSS, VmHWM
	cpuOwn, cpuAll float64 // utime+stime; plus cutime+cstime
}

func readProc(pid int) (procStat, error) {
	var st procStat
	vm, err := testutil.ReadProcStatusKB(pid, "VmRSS", "VmHWM")
	if err != nil {
		return st, err
	}
	st.rss, st.hwm = vm["VmRSS"]*1024, vm["VmHWM"]*1024
	t, err := testutil.ReadProcTicks(pid)
	if err != nil {
		return st, err
	}
	st.cpuOwn = (t.UTime + t.STime) / testutil.ClockTicks
	st.cpuAll = (t.UTime + t.STime + t.CUTime + t.CSTime) / testutil.ClockTicks
	return st, nil
}
