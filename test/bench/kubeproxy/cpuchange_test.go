package main

import (
	"math"
	"testing"
)

// TestCPUPerChange: a change's CPU is the change window's less the idle
// window's, over the changes, in milliseconds; the idle rate is per second
// of a window.
func TestCPUPerChange(t *testing.T) {
	w := cpuWindows{Changes: 200, WindowS: 240, ChangeCPUS: 3.5, IdleCPUS: 2.3}
	if got, want := w.perChangeMs(), 6.0; math.Abs(got-want) > 1e-9 {
		t.Errorf("perChangeMs = %v, want %v", got, want)
	}
	if got, want := w.idleMsPerS(), 2300.0/240; math.Abs(got-want) > 1e-9 {
		t.Errorf("idleMsPerS = %v, want %v", got, want)
	}
	// Less CPU with the changes than without (noise): negative, not clamped.
	w = cpuWindows{Changes: 4, WindowS: 4, ChangeCPUS: 0.10, IdleCPUS: 0.12}
	if got, want := w.perChangeMs(), -5.0; math.Abs(got-want) > 1e-9 {
		t.Errorf("perChangeMs = %v, want %v", got, want)
	}
	if got := (cpuWindows{}).perChangeMs(); !math.IsNaN(got) {
		t.Errorf("no changes: perChangeMs = %v, want NaN", got)
	}
}
