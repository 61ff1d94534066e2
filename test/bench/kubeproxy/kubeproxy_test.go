package main

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/test/bench/harness"
)

// TestQuick runs the whole benchmark at 10 Services with 2 changes per
// mode: every mode (the real kube-proxy in iptables and nftables mode, and
// Sluice's agent) synced and programmed every Service, recorded every
// change once in its own network programming histogram, then took changes
// at a steady rate for a few seconds, had its memory sampled from its
// start to its end, and the report files are written and parse. No
// timing is asserted.
func TestQuick(t *testing.T) {
	needsKube(t)
	const n, changes = 10, 2
	cfg := config{Services: []int{n}, Endpoints: 10, Modes: allModes, Rounds: 1, Changes: changes,
		ChangeGap: 1200 * time.Millisecond, SyncTimeout: 3 * time.Minute, ChangeTimeout: time.Minute,
		SteadyRate: 5, SteadyFor: 3 * time.Second, OutDir: t.TempDir(), Stamp: "quick"}
	back, md := harness.RunAndReadBack(t, 10*time.Minute,
		func(ctx context.Context, log *slog.Logger) (*result, error) { return run(ctx, cfg, log) },
		func(r *result) ([]string, error) { return writeReport(cfg.OutDir, cfg.Stamp, r) })
	if len(back.Points) != 1 {
		t.Fatalf("%d points in the report, want 1", len(back.Points))
	}
	pt := back.Points[0]
	for _, e := range pt.Errors {
		t.Errorf("error: %s", e)
	}
	if len(pt.Runs) != len(allModes) {
		t.Fatalf("%d runs, want one per mode (%d)", len(pt.Runs), len(allModes))
	}
	for _, r := range pt.Runs {
		if r.FirstSyncS <= 0 {
			t.Errorf("%s: no first sync", r.Mode)
		}
		if r.Programmed < n {
			t.Errorf("%s: %d services programmed, want %d", r.Mode, r.Programmed, n)
		}
		if len(r.LatencyS) != changes {
			t.Errorf("%s: %d changes seen in its latency histogram, want %d", r.Mode, len(r.LatencyS), changes)
		}
		for i, rec := range r.Recorded {
			if rec != 1 || r.LatencyS[i] <= 0 {
				t.Errorf("%s: change %d recorded %d times, latency %v s", r.Mode, i+1, rec, r.LatencyS[i])
			}
		}
		if r.RSSPeakBytes <= 0 || r.CPUEndS <= 0 {
			t.Errorf("%s: no memory or CPU figures: %+v", r.Mode, r)
		}
		// The first sync was seen by a read the mode answered, and its
		// CPU less the reads until then is less than with them.
		if r.ScrapesSync < 1 || r.ScrapesSync > r.Scrapes || r.CPUNetSyncS > r.CPUSyncS || r.CPUNetSyncS < r.CPUSyncS-float64(r.ScrapesSync)*r.ScrapeCPUS-1e-9 {
			t.Errorf("%s: CPU after sync %.3f s, without its %d scrapes (of %d, %.4f s each) %.3f s", r.Mode, r.CPUSyncS, r.ScrapesSync, r.Scrapes, r.ScrapeCPUS, r.CPUNetSyncS)
		}
		// Sampled from before the first sync to after the steady
		// changes; none above the peak read at the end.
		if len(r.Mem) < 2 || r.Mem[0].T > r.FirstSyncS || r.Steady == nil || r.Mem[len(r.Mem)-1].T < r.Steady.ToS {
			t.Errorf("%s: memory sampled %d times, not from the first sync to the steady changes' end: %+v", r.Mode, len(r.Mem), r.Mem)
		}
		for _, m := range r.Mem {
			if m.RSS <= 0 || m.HWM > r.RSSPeakBytes || m.RSS > r.RSSSampledMaxBytes {
				t.Errorf("%s: sample %+v against VmHWM at the end %d and largest RSS %d", r.Mode, m, r.RSSPeakBytes, r.RSSSampledMaxBytes)
			}
		}
		if w := r.Steady; w == nil || w.Sent != 15 || w.Syncs < 1 || w.Recorded < 1 || w.RSSMax <= 0 || w.HWMAfter < w.HWMBefore {
			t.Errorf("%s: steady changes (5/s for 3 s) %+v: want 15 sent, synced, recorded and sampled", r.Mode, w)
		}
	}
	if len(pt.Ratios) != 2 {
		t.Errorf("%d ratios, want the two kube-proxy modes against Sluice", len(pt.Ratios))
	}
	testutil.ContainsAll(t, "the Markdown report", md, "## 10 Services x 10 endpoints", "| kube-proxy-iptables / sluice |", "| kube-proxy-nftables / sluice |", "| sluice | ", "steady 5/s", "| CPU after sync without scrapes (s) |", "Errors: none.")
}
