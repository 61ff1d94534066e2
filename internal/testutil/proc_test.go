package testutil

import (
	"os"
	"testing"
)

// The benchmarks' readings of a process, on this test's own process: CPU
// it has spent shows in its ticks, and its memory in kB with a peak at
// least its current size.
func TestReadProc(t *testing.T) {
	pid := os.Getpid()
	for start := CPUTime(t); CPUTime(t)-start < 3e7; { // 30 ms of CPU, a few ticks
	}
	ticks, err := ReadProcTicks(pid)
	if err != nil {
		t.Fatal(err)
	}
	if ticks.UTime+ticks.STime <= 0 || ticks.CUTime < 0 || ticks.CSTime < 0 {
		t.Errorf("ticks %+v after 30 ms of CPU", ticks)
	}
	vm, err := ReadProcStatusKB(pid, "VmRSS", "VmHWM", "NoSuchField")
	if err != nil {
		t.Fatal(err)
	}
	if vm["VmRSS"] <= 0 || vm["VmHWM"] < vm["VmRSS"] || len(vm) != 2 {
		t.Errorf("status %v: want 0 < VmRSS <= VmHWM and no NoSuchField", vm)
	}
	if _, err := ReadProcTicks(-1); err == nil {
		t.Error("ReadProcTicks(-1): no error")
	}
}

func TestLastLines(t *testing.T) {
	for _, c := range []struct {
		in   string
		n    int
		want string
	}{
		{"a\nb\nc\n", 2, "b\nc"},
		{"a\nb\nc", 5, "a\nb\nc"},
		{"", 3, ""},
	} {
		if got := LastLines(c.in, c.n); got != c.want {
			t.Errorf("LastLines(%q, %d) = %q, want %q", c.in, c.n, got, c.want)
		}
	}
}
