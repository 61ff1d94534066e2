package testutil

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// deadPid cannot be a running process: it is above the kernel's
// PID_MAX_LIMIT (2^22).
const deadPid = 4194305

func TestStaleRuns(t *testing.T) {
	dir := t.TempDir()
	names := map[string]bool{ // name -> listed as stale
		fmt.Sprintf("run-%d-a", deadPid):         true,
		fmt.Sprintf("run-%d-b-c", deadPid):       true,
		fmt.Sprintf("run-%d-x", os.Getpid()):     false, // this process
		fmt.Sprintf("run-%d-x", os.Getppid()):    false, // a live process
		fmt.Sprintf("other-%d-a", deadPid):       false, // another prefix
		fmt.Sprintf("run-%d", deadPid):           false, // no "-" after the pid
		"run-x1-a":                               false,
		"run--1-a":                               false,
		fmt.Sprintf("run-%d0000000000-a", 1<<31): false, // out of range
	}
	for name := range names {
		if err := os.Mkdir(filepath.Join(dir, name), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	got := StaleRuns(dir, "run-")
	slices.Sort(got)
	var want []string
	for name, stale := range names {
		if stale {
			want = append(want, name)
		}
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("StaleRuns = %v, want %v", got, want)
	}
	if got := StaleRuns(filepath.Join(dir, "nosuch"), "run-"); got != nil {
		t.Errorf("StaleRuns of a missing dir = %v, want none", got)
	}
}

// TestPinDirRemovesKilledRuns: a directory a killed run left on bpffs (with
// a subdirectory, as the agent's pins make) goes at the next PinDir; this
// run's own and names of another form stay.
func TestPinDirRemovesKilledRuns(t *testing.T) {
	root := NeedBPFFS(t)
	Privileged(t)
	dead := filepath.Join(root, fmt.Sprintf("%s%d-0123456789ab", pinDirPrefix, deadPid))
	odd := filepath.Join(root, pinDirPrefix+"0123456789ab") // the names before pids
	for _, d := range []string{filepath.Join(dead, "sluice"), odd} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, d := range []string{dead, odd} {
			if err := os.RemoveAll(d); err != nil {
				t.Error(err)
			}
		}
	})
	first := PinDir(t)
	second := PinDir(t)
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Errorf("a killed run's %s not removed (stat: %v)", dead, err)
	}
	for _, d := range []string{first, second, odd} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s removed: %v", d, err)
		}
	}
	if want := fmt.Sprintf("%s%d-", pinDirPrefix, os.Getpid()); !strings.HasPrefix(filepath.Base(first), want) {
		t.Errorf("PinDir = %s, want a name starting %s", first, want)
	}
}
