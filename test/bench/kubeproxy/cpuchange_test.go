package main

import (
	"math"
	"testing"

	"github.com/sluice-lb/sluice/internal/testutil"
)

// TestCPUPerChange: a change's CPU is, per pair of blocks, the change
// block's CPU less the idle block's, over the changes a block, in
// milliseconds (negative when the idle block cost more: not clamped); the
// idle rate is per second of a block; the median the report takes leaves
// an outlier pair out.
func TestCPUPerChange(t *testing.T) {
	w := cpuBlocks{Changes: 60, PerPair: 20, BlockS: 24,
		ChangeCPUS: []float64{0.10, 0.35, 0.05}, IdleCPUS: []float64{0.04, 2.80, 0.07}}
	near := func(got, want []float64) bool {
		if len(got) != len(want) {
			return false
		}
		for i := range got {
			if math.Abs(got[i]-want[i]) > 1e-9 {
				return false
			}
		}
		return true
	}
	if got, want := w.perChangeMs(), []float64{3, -122.5, -1}; !near(got, want) {
		t.Errorf("perChangeMs = %v, want %v", got, want)
	}
	if got, want := w.idleMsPerS(), []float64{40.0 / 24, 2800.0 / 24, 70.0 / 24}; !near(got, want) {
		t.Errorf("idleMsPerS = %v, want %v", got, want)
	}
	if got := testutil.Median(w.perChangeMs()); math.Abs(got-(-1)) > 1e-9 {
		t.Errorf("median = %v, want -1 (the outlier pair left out)", got)
	}
	if got := testutil.Median([]float64{4, 1, 3, 2}); got != 2.5 {
		t.Errorf("median of 4 = %v, want 2.5", got)
	}
	// A pair missing its idle block (the run stopped) is not counted.
	w.IdleCPUS = w.IdleCPUS[:2]
	if got := len(w.perChangeMs()); got != 2 {
		t.Errorf("%d pairs, want 2", got)
	}
}
