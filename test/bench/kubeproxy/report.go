package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/test/bench/harness"
	"github.com/sluice-lb/sluice/test/bench/load"
)

// result is everything a run measured; it is written as
// kubeproxy-<date>.json and rendered as kubeproxy-<date>.md.
type result struct {
	harness.Span
	Config   config            `json:"config"`
	Machine  harness.Machine   `json:"machine"`
	Versions map[string]string `json:"versions"`
	Notes    []string          `json:"notes"`
	Points   []*point          `json:"points"`
}

// point is everything measured at one N.
type point struct {
	Services  int       `json:"services"`
	Endpoints int       `json:"endpoints"`
	CreateS   float64   `json:"create_s"` // creating the Services not there yet
	Skipped   string    `json:"skipped,omitempty"`
	Runs      []modeRun `json:"runs"`
	Summary   []summary `json:"summary"`
	Ratios    []ratio   `json:"ratios"`
	Errors    []string  `json:"errors,omitempty"`
}

// summary is one mode's figures at one N over the rounds: medians of the
// rounds' values with their min-max spread; the latency's over every change
// of every round.
type summary struct {
	Mode       string          `json:"mode"`
	Rounds     int             `json:"rounds"`
	FirstSyncS testutil.Spread `json:"first_sync_s"`
	LatencyS   testutil.Spread `json:"latency_s"` // every change of every round
	LatencyP90 float64         `json:"latency_p90_s"`
	Changes    int             `json:"changes"`
	RSSEndMiB  testutil.Spread `json:"rss_end_mib"`
	RSSPeakMiB testutil.Spread `json:"rss_peak_mib"`
	CPUSyncS   testutil.Spread `json:"cpu_after_sync_s"`
	// CPUNetSyncS is CPUSyncS less the scrapes until then.
	CPUNetSyncS testutil.Spread `json:"cpu_net_after_sync_s"`
	CPUEndS     testutil.Spread `json:"cpu_end_s"`
	CPUNetEndS  testutil.Spread `json:"cpu_net_end_s"`
	ScrapeMs    testutil.Spread `json:"scrape_cpu_ms"`
	// The memory at the first sync; the CPU windows' figures.
	RSSSyncMiB  testutil.Spread `json:"rss_after_sync_mib"`
	HWMSyncMiB  testutil.Spread `json:"rss_peak_after_sync_mib"`
	CPUChangeMs testutil.Spread `json:"cpu_per_change_ms,omitzero"`
	IdleMsPerS  testutil.Spread `json:"idle_cpu_ms_per_s,omitzero"`
	// The largest VmRSS of the samples every memEvery; in the steady
	// window, and VmHWM at its end.
	RSSSampledMaxMiB testutil.Spread `json:"rss_sampled_max_mib,omitzero"`
	SteadyRSSMaxMiB  testutil.Spread `json:"steady_rss_max_mib,omitzero"`
	SteadyHWMMiB     testutil.Spread `json:"steady_hwm_after_mib,omitzero"`
	Errors           int             `json:"errors"`
}

// ratio is mode / base of the same round, median over rounds with the
// spread: first sync, the round's median latency, peak RSS, CPU at the
// end.
type ratio struct {
	Mode      string          `json:"mode"`
	Base      string          `json:"base"`
	FirstSync testutil.Spread `json:"first_sync"`
	Latency   testutil.Spread `json:"latency_median"`
	RSSPeak   testutil.Spread `json:"rss_peak"`
	CPUEnd    testutil.Spread `json:"cpu_end"`
	CPUNetEnd testutil.Spread `json:"cpu_net_end"`
	// CPUNetSync is of the CPU to the first sync, the scrapes until then
	// subtracted.
	CPUNetSync testutil.Spread `json:"cpu_net_after_sync"`
}

func newResult(cfg config) *result {
	return &result{Span: harness.StartSpan(), Config: cfg, Machine: harness.DescribeMachine(), Versions: map[string]string{},
		Notes: []string{
			"first sync: from the process's start to the end of its first successful sync, its own kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"}; both wait for their Service and EndpointSlice informers before it",
			"latency: the mode's own kubeproxy_network_programming_duration_seconds (delta of _sum over delta of _count) for one EndpointSlice patch with a fresh last-change-trigger-time, one change at a time, each sent at least the change gap after the mode's last sync ended",
			"every mode at its defaults (min sync period 1 s, sync period 30 s), kube-proxy with --conntrack-max-per-core=0 and conntrack timeouts left alone (a network namespace cannot set them)",
			"CPU: utime+stime+cutime+cstime of /proc/<pid>/stat (with the iptables-restore and nft children kube-proxy waited for); RSS: VmRSS, peak VmHWM",
			"the benchmark reads each mode's /metrics every 500 ms while it waits; a read of Sluice's walks its BPF maps (map fill), so 'without scrapes' subtracts the reads times the CPU one read cost, measured at the end over 10 reads; 'CPU after sync without scrapes' subtracts the reads the mode answered until the CPU after its first sync was read (those before it listened cost it nothing) times the same cost",
			"CPU per change (BENCH_CPU_CHANGES=K): after the latency changes, blocks of BENCH_CPU_BLOCK changes BENCH_CPU_GAP apart, each followed by a block as long without any, no /metrics read inside either; per pair (CPU with - CPU without) / BENCH_CPU_BLOCK, from every thread's schedstat; the median over every pair of every round with its range (a pair holding a rare cost, such as Sluice's re-read of its maps every 5 minutes, is the outlier)",
			"the kube-apiserver and etcd run on the same 2 cores: their work while a proxy lists and watches is not counted in the proxy's CPU but slows its first sync alike for every mode",
		}}
}

// add summarises the runs of pt.
func (pt *point) finish(modes []string) {
	for _, m := range modes {
		var runs []modeRun
		for _, r := range pt.Runs {
			if r.Mode == m {
				runs = append(runs, r)
			}
		}
		s := summary{Mode: m, Rounds: len(runs)}
		var first, lat, rssEnd, rssPeak, cpuSync, cpuNetSync, cpuEnd, cpuNet, scrape, rssSync, hwmSync, perChange, idle []float64
		var sampledMax, steadyMax, steadyHWM []float64
		for _, r := range runs {
			s.Errors += len(r.Errors)
			for _, e := range r.Errors {
				pt.Errors = append(pt.Errors, fmt.Sprintf("%s round %d: %s", m, r.Round, e))
			}
			if r.FirstSyncS > 0 {
				first = append(first, r.FirstSyncS)
				rssEnd = append(rssEnd, float64(r.RSSEndBytes)/(1<<20))
				rssPeak = append(rssPeak, float64(r.RSSPeakBytes)/(1<<20))
				cpuSync = append(cpuSync, r.CPUSyncS)
				cpuNetSync = append(cpuNetSync, r.CPUNetSyncS)
				cpuEnd = append(cpuEnd, r.CPUEndS)
				cpuNet = append(cpuNet, r.CPUNetEndS)
				scrape = append(scrape, r.ScrapeCPUS*1000)
				rssSync = append(rssSync, float64(r.RSSSyncBytes)/(1<<20))
				hwmSync = append(hwmSync, float64(r.HWMSyncBytes)/(1<<20))
			}
			if w := r.CPUBlocks; w != nil {
				perChange = append(perChange, w.perChangeMs()...)
				idle = append(idle, w.idleMsPerS()...)
			}
			if r.RSSSampledMaxBytes > 0 {
				sampledMax = append(sampledMax, float64(r.RSSSampledMaxBytes)/(1<<20))
			}
			if w := r.Steady; w != nil && w.HWMAfter > 0 {
				steadyMax = append(steadyMax, float64(w.RSSMax)/(1<<20))
				steadyHWM = append(steadyHWM, float64(w.HWMAfter)/(1<<20))
			}
			lat = append(lat, r.LatencyS...)
		}
		s.RSSSampledMaxMiB, s.SteadyRSSMaxMiB, s.SteadyHWMMiB = testutil.SpreadOf(sampledMax), testutil.SpreadOf(steadyMax), testutil.SpreadOf(steadyHWM)
		s.FirstSyncS, s.LatencyS, s.Changes = testutil.SpreadOf(first), testutil.SpreadOf(lat), len(lat)
		s.LatencyP90 = load.Percentile(slices.Sorted(slices.Values(lat)), 0.9)
		s.RSSEndMiB, s.RSSPeakMiB = testutil.SpreadOf(rssEnd), testutil.SpreadOf(rssPeak)
		s.CPUSyncS, s.CPUEndS = testutil.SpreadOf(cpuSync), testutil.SpreadOf(cpuEnd)
		s.CPUNetSyncS = testutil.SpreadOf(cpuNetSync)
		s.CPUNetEndS, s.ScrapeMs = testutil.SpreadOf(cpuNet), testutil.SpreadOf(scrape)
		s.RSSSyncMiB, s.HWMSyncMiB = testutil.SpreadOf(rssSync), testutil.SpreadOf(hwmSync)
		s.CPUChangeMs, s.IdleMsPerS = testutil.SpreadOf(perChange), testutil.SpreadOf(idle)
		pt.Summary = append(pt.Summary, s)
	}
	if !slices.Contains(modes, modeSluice) {
		return
	}
	for _, m := range modes {
		if m == modeSluice {
			continue
		}
		var first, lat, rss, cpu, cpuNet, cpuNetSync []float64
		for _, r := range pt.Runs {
			if r.Mode != m {
				continue
			}
			i := slices.IndexFunc(pt.Runs, func(b modeRun) bool { return b.Mode == modeSluice && b.Round == r.Round })
			if i < 0 {
				continue
			}
			b := pt.Runs[i]
			first = appendRatio(first, r.FirstSyncS, b.FirstSyncS)
			lat = appendRatio(lat, testutil.Median(r.LatencyS), testutil.Median(b.LatencyS))
			rss = appendRatio(rss, float64(r.RSSPeakBytes), float64(b.RSSPeakBytes))
			cpu = appendRatio(cpu, r.CPUEndS, b.CPUEndS)
			cpuNet = appendRatio(cpuNet, r.CPUNetEndS, b.CPUNetEndS)
			cpuNetSync = appendRatio(cpuNetSync, r.CPUNetSyncS, b.CPUNetSyncS)
		}
		pt.Ratios = append(pt.Ratios, ratio{Mode: m, Base: modeSluice, FirstSync: testutil.SpreadOf(first),
			Latency: testutil.SpreadOf(lat), RSSPeak: testutil.SpreadOf(rss), CPUEnd: testutil.SpreadOf(cpu),
			CPUNetEnd: testutil.SpreadOf(cpuNet), CPUNetSync: testutil.SpreadOf(cpuNetSync)})
	}
}

// appendRatio appends a/b when both were measured.
func appendRatio(v []float64, a, b float64) []float64 {
	if a > 0 && b > 0 {
		v = append(v, a/b)
	}
	return v
}

// writeReport writes kubeproxy-<stamp>.json and .md, and the plots, into
// dir and returns their paths.
func writeReport(dir, stamp string, r *result) ([]string, error) {
	files, err := harness.WriteRecord(dir, "kubeproxy-"+stamp, r, []byte(markdown(stamp, r)))
	if err != nil {
		return files, err
	}
	pngs, err := plots(dir, stamp, r)
	return append(files, pngs...), err
}

func markdown(stamp string, r *result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# The real kube-proxy beside Sluice, against a real kube-apiserver (%s)\n\n", stamp)
	fmt.Fprintf(&b, "`go run ./test/bench/kubeproxy`: %d round(s) per N, modes interleaved in every round (%s; reversed in even rounds), %d single EndpointSlice changes per mode and round, %d endpoints per Service. Medians over rounds with [min-max]; ratios are medians of per-round ratios to Sluice in the same round.\n\n",
		r.Config.Rounds, strings.Join(r.Config.Modes, ", "), r.Config.Changes, r.Config.Endpoints)
	m := r.Machine
	fmt.Fprintf(&b, "Machine: %d x %s, %.1f GiB, kernel %s, %s, load at start %s.\n", m.CPUs, m.CPU, float64(m.MemBytes)/(1<<30), m.Kernel, m.Go, m.Load)
	var vs []string
	for k, v := range r.Versions {
		vs = append(vs, k+" "+v)
	}
	slices.Sort(vs)
	fmt.Fprintf(&b, "Versions: %s.\n\n", strings.Join(vs, "; "))
	for _, pt := range r.Points {
		fmt.Fprintf(&b, "## %d Services x %d endpoints\n\n", pt.Services, pt.Endpoints)
		if pt.Skipped != "" {
			fmt.Fprintf(&b, "Skipped: %s\n\n", pt.Skipped)
			continue
		}
		fmt.Fprintf(&b, "Services created in %.1f s (%s).\n\n", pt.CreateS, r.Config.Populate)
		b.WriteString("| mode | first sync (s) | latency median (s) | latency p90 (s) | changes | RSS peak (MiB) | RSS end (MiB) | CPU after sync (s) | CPU after sync without scrapes (s) | CPU end (s) | CPU end without scrapes (s) | one scrape (ms CPU) | errors |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, s := range pt.Summary {
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %d | %s | %s | %s | %s | %s | %s | %s | %d |\n", s.Mode, spread(s.FirstSyncS, "%.2f"),
				spread(s.LatencyS, "%.3f"), spread(testutil.Spread{Median: s.LatencyP90, Min: s.LatencyP90, Max: s.LatencyP90}, "%.3f"), s.Changes, spread(s.RSSPeakMiB, "%.0f"), spread(s.RSSEndMiB, "%.0f"),
				spread(s.CPUSyncS, "%.2f"), spread(s.CPUNetSyncS, "%.2f"), spread(s.CPUEndS, "%.2f"), spread(s.CPUNetEndS, "%.2f"), spread(s.ScrapeMs, "%.0f"), s.Errors)
		}
		b.WriteString("\n| mode | RSS at first sync (MiB) | RSS peak at first sync (MiB) | CPU per change, every pair of blocks (ms) | CPU idle, every idle block (ms/s) |\n|---|---|---|---|---|\n")
		for _, s := range pt.Summary {
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", s.Mode, spread(s.RSSSyncMiB, "%.1f"), spread(s.HWMSyncMiB, "%.1f"),
				spread(s.CPUChangeMs, "%.2f"), spread(s.IdleMsPerS, "%.2f"))
		}
		b.WriteString("\n| mode | RSS sampled, largest (MiB) | steady changes: RSS largest (MiB) | steady changes: VmHWM after (MiB) |\n|---|---|---|---|\n")
		for _, s := range pt.Summary {
			fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", s.Mode, spread(s.RSSSampledMaxMiB, "%.1f"), spread(s.SteadyRSSMaxMiB, "%.1f"), spread(s.SteadyHWMMiB, "%.1f"))
		}
		b.WriteString("\nPer run, VmRSS sampled every 2 s, the largest of each minute from the start (MiB), and the steady window:\n\n")
		for _, r := range pt.Runs {
			fmt.Fprintf(&b, "- %s round %d: %s", r.Mode, r.Round, strings.Join(perMinute(r.Mem), ", "))
			if w := r.Steady; w != nil {
				fmt.Fprintf(&b, "; steady %.0f/s from %.0f s to %.0f s: %d sent, %d syncs, %d latencies recorded (mean %.3f s), VmHWM %.1f -> %.1f MiB",
					w.Rate, w.FromS, w.ToS, w.Sent, w.Syncs, w.Recorded, w.LatencyMeanS, float64(w.HWMBefore)/(1<<20), float64(w.HWMAfter)/(1<<20))
			}
			b.WriteString("\n")
		}
		if len(pt.Ratios) > 0 {
			b.WriteString("\n| ratio | first sync | latency median | RSS peak | CPU end | CPU end without scrapes | CPU after sync without scrapes |\n|---|---|---|---|---|---|---|\n")
			for _, q := range pt.Ratios {
				fmt.Fprintf(&b, "| %s / %s | %s | %s | %s | %s | %s | %s |\n", q.Mode, q.Base, spread(q.FirstSync, "%.1fx"),
					spread(q.Latency, "%.1fx"), spread(q.RSSPeak, "%.1fx"), spread(q.CPUEnd, "%.1fx"), spread(q.CPUNetEnd, "%.1fx"), spread(q.CPUNetSync, "%.1fx"))
			}
		}
		b.WriteString("\n")
		if len(pt.Errors) > 0 {
			b.WriteString("Errors:\n\n")
			for _, e := range pt.Errors {
				fmt.Fprintf(&b, "- %s\n", strings.ReplaceAll(e, "\n", "\n  "))
			}
			b.WriteString("\n")
		} else {
			b.WriteString("Errors: none.\n\n")
		}
	}
	b.WriteString("## How\n\n")
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "- %s\n", n)
	}
	return b.String()
}

// perMinute is the largest VmRSS of the samples in each minute from the
// process's start, in MiB ("-" for a minute without a sample).
func perMinute(s []memSample) []string {
	var top []int64
	for _, x := range s {
		m := int(x.T / 60)
		for len(top) <= m {
			top = append(top, -1)
		}
		top[m] = max(top[m], x.RSS)
	}
	out := make([]string, len(top))
	for i, v := range top {
		out[i] = "-"
		if v >= 0 {
			out[i] = fmt.Sprintf("%.0f", float64(v)/(1<<20))
		}
	}
	return out
}

// spread formats a median with its range; "-" for none.
func spread(s testutil.Spread, f string) string {
	if s == (testutil.Spread{}) {
		return "-"
	}
	if s.Min == s.Max {
		return fmt.Sprintf(f, s.Median)
	}
	return fmt.Sprintf(f+" ["+f+"-"+f+"]", s.Median, s.Min, s.Max)
}
