package harness

import (
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/sluice-lb/sluice/internal/testutil"
)

// TestTempDirUnmounts: a run's temporary directory is removed with a bpffs
// still mounted under it (a mode the run did not close), and a later
// TempDir removes, mounts and all, a directory left by a run whose process
// is gone, but not one whose process still runs.
func TestTempDirUnmounts(t *testing.T) {
	testutil.Privileged(t)
	const prefix = "sluice-benchtest-"
	log := slog.New(slog.DiscardHandler)
	mountIn := func(dir string) string {
		t.Helper()
		mp := filepath.Join(dir, "mode-1", "bpffs")
		if err := os.MkdirAll(mp, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mount("bpf", mp, "bpf", 0, ""); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = syscall.Unmount(mp, syscall.MNT_DETACH); _ = os.RemoveAll(dir) })
		return mp
	}
	gone := func(what, dir string) {
		t.Helper()
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s %s still there: %v", what, dir, err)
		}
		if ms, err := mountsUnder(dir); err != nil || len(ms) != 0 {
			t.Errorf("%s: mounts left %v (%v)", what, ms, err)
		}
	}

	dir, remove, err := TempDir(prefix, log)
	if err != nil {
		t.Fatal(err)
	}
	mountIn(dir)
	remove()
	gone("a run's directory", dir)

	// A run that was killed: its pid is that of a child that has exited.
	child := exec.Command("true")
	if err := child.Run(); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(os.TempDir(), prefix+strconv.Itoa(child.Process.Pid)+"-1")
	mountIn(stale)
	// One that still runs: this test's parent.
	live := filepath.Join(os.TempDir(), prefix+strconv.Itoa(os.Getppid())+"-1")
	liveMount := mountIn(live)
	_, remove, err = TempDir(prefix, log)
	if err != nil {
		t.Fatal(err)
	}
	defer remove()
	gone("a killed run's directory", stale)
	if ms, err := mountsUnder(live); err != nil || len(ms) != 1 || ms[0] != liveMount {
		t.Errorf("a running process's directory: mounts %v (%v), want %s left", ms, err, liveMount)
	}
}

// TestTempDirKeptWhenUnmountFails: a mount under the directory that does
// not detach leaves the directory in place, the files of the filesystem
// mounted there with it, and the error names the directory. Before, the
// directory was removed all the same, emptying that filesystem.
func TestTempDirKeptWhenUnmountFails(t *testing.T) {
	testutil.Privileged(t)
	dir := t.TempDir()
	mp := filepath.Join(dir, "mode-1", "state")
	if err := os.MkdirAll(mp, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", mp, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(mp, syscall.MNT_DETACH) })
	file := filepath.Join(mp, "kept")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	orig := unmount
	t.Cleanup(func() { unmount = orig })
	// EPERM: reported; EINVAL (a locked mount's answer, passed over as
	// "not mounted"): the mount seen still there after the unmounts.
	for _, errno := range []syscall.Errno{syscall.EPERM, syscall.EINVAL} {
		unmount = func(string, int) error { return errno }
		err := removeTempDir(dir)
		if err == nil || !strings.Contains(err.Error(), dir+" left in place") || (errno == syscall.EPERM && !errors.Is(err, syscall.EPERM)) {
			t.Errorf("removeTempDir with the unmount's %v: %v, want %s left in place", errno, err, dir)
		}
		if _, err := os.Stat(file); err != nil {
			t.Errorf("the file of the filesystem still mounted (the unmount's %v): %v, want it kept", errno, err)
		}
	}
}
