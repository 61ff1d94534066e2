package testutil

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// BPFFS is where bpffs is mounted: the agent's default pin root, which
// `make deps` mounts.
const BPFFS = "/sys/fs/bpf"

// bpffsMagic is BPF_FS_MAGIC, statfs's f_type of a bpffs.
const bpffsMagic = 0xcafe4a11

// NeedBPFFS fails tb unless a bpffs is mounted at BPFFS, and returns BPFFS.
func NeedBPFFS(tb testing.TB) string {
	tb.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(BPFFS, &st); err != nil || st.Type != bpffsMagic {
		tb.Fatalf("no bpffs mounted at %s (`make deps` mounts it; statfs: %v)", BPFFS, err)
	}
	return BPFFS
}

// pinDirPrefix starts the name of every directory PinDir makes, followed
// by the test process's pid (see StaleRuns).
const pinDirPrefix = "sluice-test-"

// PinDir returns a fresh directory on bpffs for the test's pins, removed
// with everything under it when the test ends. Pins need root: a test that
// asks for them is a privileged test (see Privileged).
//
// A run killed before its cleanups leaves its directories behind, and with
// them every map pinned there stays in the kernel; the next PinDir removes
// those of runs whose process is gone.
func PinDir(tb testing.TB) string {
	tb.Helper()
	Privileged(tb)
	root := NeedBPFFS(tb)
	for _, name := range StaleRuns(root, pinDirPrefix) {
		if err := os.RemoveAll(filepath.Join(root, name)); err != nil {
			tb.Logf("remove a killed run's pin dir: %v", err)
		}
	}
	var b [6]byte
	rand.Read(b[:])
	dir := filepath.Join(root, fmt.Sprintf("%s%d-%s", pinDirPrefix, os.Getpid(), hex.EncodeToString(b[:])))
	if err := os.Mkdir(dir, 0o700); err != nil {
		tb.Fatalf("create pin dir: %v", err)
	}
	tb.Cleanup(func() {
		// A pin left behind keeps its map in the kernel after the test.
		if err := os.RemoveAll(dir); err != nil {
			tb.Errorf("remove pin dir: %v", err)
		}
	})
	return dir
}
