package topology

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Cgroup is a cgroup v2 directory made for one run, so that cgroup-attached
// programs (socket load balancing) apply only to processes put in it.
type Cgroup struct {
	Path  string
	mount string
	dir   *os.File
}

// AddCgroup creates "<mount>/<prefix><name>" under a cgroup v2 mount. On
// close, processes still in it are killed and the directory is removed.
func (t *Topology) AddCgroup(mount, name string) (*Cgroup, error) {
	_ = SweepStale(mount) // cgroups of killed runs (empty: their processes died with them)
	p := filepath.Join(mount, t.prefix+name)
	if err := os.Mkdir(p, 0o755); err != nil {
		return nil, fmt.Errorf("create cgroup: %w", err)
	}
	dir, err := os.Open(p)
	if err != nil {
		_ = os.Remove(p)
		return nil, fmt.Errorf("open cgroup: %w", err)
	}
	cg := &Cgroup{Path: p, mount: mount, dir: dir}
	t.Defer(cg.remove)
	return cg, nil
}

// Put makes cmd start inside the cgroup (clone3 with CLONE_INTO_CGROUP), so
// not even its first instruction runs outside it. Call before cmd.Start.
func (c *Cgroup) Put(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.UseCgroupFD = true
	cmd.SysProcAttr.CgroupFD = int(c.dir.Fd())
}

// Join moves this whole process (every thread) into the cgroup until t
// ends, when it moves back to the cgroup it was in, so that the sockets the
// test creates meanwhile belong to the cgroup.
func (c *Cgroup) Join(t testing.TB) {
	t.Helper()
	orig, err := ownCgroup()
	if err != nil {
		t.Fatal(err)
	}
	pid := []byte(strconv.Itoa(os.Getpid()))
	if err := os.WriteFile(filepath.Join(c.Path, "cgroup.procs"), pid, 0); err != nil {
		t.Fatalf("move into cgroup %s: %v", c.Path, err)
	}
	t.Cleanup(func() {
		if err := os.WriteFile(filepath.Join(c.mount, orig, "cgroup.procs"), pid, 0); err != nil {
			t.Errorf("move back to cgroup %s: %v", orig, err)
		}
	})
}

// ownCgroup returns this process's cgroup v2 path ("0::/path" in
// /proc/self/cgroup).
func ownCgroup() (string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(l, "0::"); ok {
			return p, nil
		}
	}
	return "", errors.New("no cgroup v2 entry in /proc/self/cgroup")
}

func (c *Cgroup) remove() error {
	defer c.dir.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := os.Remove(c.Path)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("remove cgroup %s: %w", c.Path, err)
		}
		// Only processes this run started can be in the cgroup; this
		// process itself only if a Join failed to move it back.
		procs, _ := os.ReadFile(filepath.Join(c.Path, "cgroup.procs"))
		for _, f := range bytes.Fields(procs) {
			if pid, err := strconv.Atoi(string(f)); err == nil && pid != os.Getpid() {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
}
