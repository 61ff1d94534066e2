package harness

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// memcg is a child memory cgroup (v1 or v2) of the benchmark's own, in which
// a mode's programming commands run so the kernel memory their rules take is
// charged to it: x_tables blobs and nf_tables objects are allocated with
// __GFP_ACCOUNT, so memory.kmem.usage_in_bytes (v1) or memory.stat's
// "kernel" (v2) after the command exits is the ruleset's kernel memory.
type memcg struct {
	dir string
	v2  bool
}

func newMemcg(name string) (*memcg, error) {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var v1path, v2path string
	found2 := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == "memory" {
				v1path = parts[2]
			}
		}
		if parts[0] == "0" && parts[1] == "" {
			v2path, found2 = parts[2], true
		}
	}
	if v1path != "" {
		base := filepath.Join("/sys/fs/cgroup/memory", v1path)
		if _, err := os.Stat(filepath.Join(base, "memory.kmem.usage_in_bytes")); err == nil {
			d := filepath.Join(base, name)
			if err := os.Mkdir(d, 0o755); err != nil {
				return nil, fmt.Errorf("memcg: %w", err)
			}
			return &memcg{dir: d}, nil
		}
	}
	if found2 {
		base := filepath.Join("/sys/fs/cgroup", v2path)
		if _, err := os.Stat(filepath.Join(base, "memory.current")); err == nil {
			d := filepath.Join(base, name)
			if err := os.Mkdir(d, 0o755); err != nil {
				return nil, fmt.Errorf("memcg: %w", err)
			}
			return &memcg{dir: d, v2: true}, nil
		}
	}
	return nil, fmt.Errorf("no memory cgroup with kernel-memory accounting")
}

// wrap returns argv that joins the cgroup, then execs args.
func (m *memcg) wrap(args []string) []string {
	if m == nil {
		return args
	}
	return append([]string{"sh", "-c", `echo $$ > "$0/cgroup.procs" && exec "$@"`, m.dir}, args...)
}

// kernelBytes is the kernel memory charged to the cgroup.
func (m *memcg) kernelBytes() (int64, error) {
	if m == nil {
		return 0, fmt.Errorf("no memcg")
	}
	if !m.v2 {
		b, err := os.ReadFile(filepath.Join(m.dir, "memory.kmem.usage_in_bytes"))
		if err != nil {
			return 0, err
		}
		return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	}
	b, err := os.ReadFile(filepath.Join(m.dir, "memory.stat"))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "kernel "); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("memory.stat has no kernel line")
}

// remove deletes the cgroup (its charges move to the parent).
func (m *memcg) remove() {
	if m != nil {
		_ = os.Remove(m.dir)
	}
}
