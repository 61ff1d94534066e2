package datapath

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/vishvananda/netns"
)

// newTestNetns creates a network namespace named uniquely for this run,
// deleted when the test ends (even if it fails).
func newTestNetns(t testing.TB) netns.NsHandle {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatalf("get current netns: %v", err)
	}
	defer orig.Close()
	name := "sluice-test-" + randomSuffix()
	ns, err := netns.NewNamed(name) // also moves this thread into it
	if err != nil {
		t.Fatalf("create netns %s: %v", name, err)
	}
	if err := netns.Set(orig); err != nil {
		// This thread stays in the new namespace; let it die with
		// the goroutine rather than unlock it.
		runtime.LockOSThread()
		t.Fatalf("return to original netns: %v", err)
	}
	t.Cleanup(func() {
		ns.Close()
		if err := netns.DeleteNamed(name); err != nil {
			t.Errorf("delete netns %s: %v", name, err)
		}
	})
	return ns
}

// enterNetns locks the calling goroutine to its thread and moves the
// thread into ns until the test ends. Sockets and netlink requests made
// from this goroutine then happen inside ns. Subtests run on goroutines of
// their own and must call it again.
func enterNetns(t testing.TB, ns netns.NsHandle) {
	t.Helper()
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("get current netns: %v", err)
	}
	if err := netns.Set(ns); err != nil {
		orig.Close()
		runtime.UnlockOSThread()
		t.Fatalf("enter netns: %v", err)
	}
	t.Cleanup(func() {
		defer orig.Close()
		if err := netns.Set(orig); err != nil {
			t.Errorf("leave netns: %v", err) // the thread dies with its goroutine
			return
		}
		runtime.UnlockOSThread()
	})
}

// newTestCgroup creates a cgroup under the cgroup2 mount, removed when the
// test ends.
func newTestCgroup(t *testing.T) string {
	t.Helper()
	root, err := CgroupV2Mount()
	if err != nil {
		t.Fatalf("CgroupV2Mount: %v", err)
	}
	cg := filepath.Join(root, "sluice-test-"+randomSuffix())
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatalf("create cgroup: %v", err)
	}
	t.Cleanup(func() {
		if err := os.Remove(cg); err != nil {
			t.Errorf("remove cgroup %s: %v", cg, err)
		}
	})
	return cg
}

// enterCgroup moves this test process into cg until the test ends, so
// that the sockets it creates meanwhile belong to cg.
func enterCgroup(t *testing.T, cg string) {
	t.Helper()
	root, err := CgroupV2Mount()
	if err != nil {
		t.Fatal(err)
	}
	orig, err := ownCgroup()
	if err != nil {
		t.Fatal(err)
	}
	pid := []byte(strconv.Itoa(os.Getpid()))
	if err := os.WriteFile(filepath.Join(cg, "cgroup.procs"), pid, 0); err != nil {
		t.Fatalf("move into cgroup %s: %v", cg, err)
	}
	t.Cleanup(func() {
		if err := os.WriteFile(filepath.Join(root, orig, "cgroup.procs"), pid, 0); err != nil {
			t.Errorf("move back to cgroup %s: %v", orig, err)
		}
	})
}

// ownCgroup returns this process's cgroup2 path ("0::/path" in
// /proc/self/cgroup).
func ownCgroup() (string, error) {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if p, ok := strings.CutPrefix(sc.Text(), "0::"); ok {
			return p, nil
		}
	}
	return "", fmt.Errorf("no cgroup2 entry in /proc/self/cgroup")
}
