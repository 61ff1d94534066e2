package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/test/bench/report"
)

// kubePlots are the charts of a run, one per figure of the report's
// summary table: each mode's median over N with its min-max spread, on a
// log scale (kube-proxy and Sluice differ by orders of magnitude).
var kubePlots = []struct {
	suffix, title, ylabel string
	get                   func(summary) testutil.Spread
}{
	{"first-sync", "first full sync, from the process's start", "seconds (log)",
		func(s summary) testutil.Spread { return s.FirstSyncS }},
	{"latency", "network programming latency of one EndpointSlice change", "seconds (log)",
		func(s summary) testutil.Spread { return s.LatencyS }},
	{"rss", "memory: peak RSS (VmHWM) at the end", "MiB (log)",
		func(s summary) testutil.Spread { return s.RSSPeakMiB }},
	{"cpu", "CPU to the end, the benchmark's scrapes subtracted", "CPU seconds (log)",
		func(s summary) testutil.Spread { return s.CPUNetEndS }},
}

// plots draws kubeproxy-<stamp>-<figure>.png into dir from r's summaries
// and returns their paths. A mode that has no figure at some N (it did
// not sync there) has no point there.
func plots(dir, stamp string, r *result) ([]string, error) {
	var files []string
	for _, f := range kubePlots {
		var lines []report.Line
		at := map[string]int{}
		for _, pt := range r.Points {
			for _, s := range pt.Summary {
				v := f.get(s)
				if v.Median <= 0 {
					continue
				}
				i, ok := at[s.Mode]
				if !ok {
					i = len(lines)
					at[s.Mode] = i
					lines = append(lines, report.Line{Name: s.Mode, Color: report.ModeColor(s.Mode)})
				}
				l := &lines[i]
				l.Xs, l.Ys, l.Lo, l.Hi = append(l.Xs, float64(pt.Services)), append(l.Ys, v.Median), append(l.Lo, v.Min), append(l.Hi, v.Max)
			}
		}
		p := filepath.Join(dir, "kubeproxy-"+stamp+"-"+f.suffix+".png")
		if err := report.Chart(p, f.title, f.ylabel, true, lines); err != nil {
			return files, err
		}
		files = append(files, p)
	}
	return files, nil
}

// plotRecorded draws the plots of recorded runs (`kubeproxy plot
// <kubeproxy-<date>.json>...`) beside their JSON: for runs made before the
// benchmark drew them.
func plotRecorded(paths []string) ([]string, error) {
	var files []string
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return files, err
		}
		var r result
		if err := json.Unmarshal(b, &r); err != nil {
			return files, fmt.Errorf("%s: %w", p, err)
		}
		if r.Config.Stamp == "" {
			return files, fmt.Errorf("%s: no stamp in its config: not a kubeproxy benchmark's record", p)
		}
		fs, err := plots(filepath.Dir(p), r.Config.Stamp, &r)
		files = append(files, fs...)
		if err != nil {
			return files, err
		}
	}
	return files, nil
}
