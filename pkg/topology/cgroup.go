package topology

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// Cgroup is a cgroup v2 directory made for one run, so that cgroup-attached
// programs (socket load balancing) apply only to processes put in it.
type Cgroup struct {
	Path string
	dir  *os.File
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
	cg := &Cgroup{Path: p, dir: dir}
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
		// Only processes this run started can be in the cgroup.
		procs, _ := os.ReadFile(filepath.Join(c.Path, "cgroup.procs"))
		for _, f := range bytes.Fields(procs) {
			if pid, err := strconv.Atoi(string(f)); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
}
