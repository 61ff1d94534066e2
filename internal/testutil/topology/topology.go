// Package topology builds throwaway network topologies out of named network
// namespaces and veth pairs, for Sluice's datapath tests, end-to-end tests,
// demo and benchmarks: the one namespace library of the module.
//
// Every namespace gets a name unique to the process and the topology
// ("sl-<pid>-<n>-client"), so concurrent runs never collide, and everything
// created is registered for cleanup in reverse order. Addresses live only
// inside the namespaces: no namespace is given a link or a route to the host.
//
// Namespaces are entered the Go way: the goroutine is locked to its OS thread,
// the thread joins the namespace (setns), and a socket created there stays in
// that namespace for its whole life, whichever thread later uses it. Child
// processes are started with nsenter, which, unlike `ip netns exec`, does not
// remount /sys and so leaves bpffs at /sys/fs/bpf visible. A test that
// wants a whole goroutine inside a namespace (netlink calls, raw sockets,
// BPF_PROG_TEST_RUN with a device's ifindex) calls NS.Enter instead.
package topology

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/sluice-lb/sluice/internal/testutil"
)

// netnsDir is where named namespaces are bind-mounted, as with `ip netns`.
const netnsDir = "/run/netns"

// namePrefix starts the name of every namespace this package creates.
const namePrefix = "sl-"

var topologies atomic.Uint32

// Topology owns a set of namespaces and everything created in them.
type Topology struct {
	prefix string

	mu       sync.Mutex
	cleanups []func() error
	closed   bool
}

// New returns an empty topology. The caller must Close it; tests should use
// NewT, which arranges that.
func New() (*Topology, error) {
	sweepStale()
	n := topologies.Add(1)
	return &Topology{prefix: fmt.Sprintf("%s%d-%d-", namePrefix, os.Getpid(), n)}, nil
}

// NewT returns an empty topology closed by t.Cleanup, so it is torn down even
// when the test fails or calls t.Fatal.
func NewT(t testing.TB) *Topology {
	t.Helper()
	topo, err := New()
	if err != nil {
		t.Fatalf("topology: %v", err)
	}
	t.Cleanup(func() {
		if err := topo.Close(); err != nil {
			t.Errorf("topology cleanup: %v", err)
		}
	})
	return topo
}

// NewNS returns a namespace of its own for a test: a topology of one
// namespace, closed by t.Cleanup.
func NewNS(t testing.TB, name string) *NS {
	t.Helper()
	return NewT(t).AddNST(t, name)
}

// AddNST is AddNS for a test: it fails tb if the namespace cannot be made.
func (t *Topology) AddNST(tb testing.TB, name string) *NS {
	tb.Helper()
	return orFail(t.AddNS(name))(tb)
}

// orFail is what the test forms of the constructors (AddNST, BuildLBT,
// AddIPv6T) return: v, once it has failed tb if err is not nil. Called as
// orFail(constructor(...))(tb).
func orFail[V any](v V, err error) func(testing.TB) V {
	return func(tb testing.TB) V {
		tb.Helper()
		if err != nil {
			tb.Fatalf("topology: %v", err)
		}
		return v
	}
}

// Prefix is the string every namespace name of this topology starts with.
func (t *Topology) Prefix() string { return t.prefix }

// Defer registers fn to run when the topology is closed, before everything
// registered earlier. Use it for processes and files that live in the
// topology's namespaces.
func (t *Topology) Defer(fn func() error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cleanups = append(t.cleanups, fn)
}

// Close runs every registered cleanup in reverse order and returns their
// errors joined. It is safe to call more than once.
func (t *Topology) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	cleanups := t.cleanups
	t.cleanups = nil
	t.mu.Unlock()

	var errs []error
	for i := len(cleanups) - 1; i >= 0; i-- {
		if err := cleanups[i](); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// AddNS creates a named network namespace "<prefix><name>" with its loopback
// up.
func (t *Topology) AddNS(name string) (*NS, error) {
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return nil, errors.New("topology is closed")
	}
	ns, err := createNS(t, t.prefix+name)
	if err != nil {
		return nil, err
	}
	t.Defer(ns.destroy)
	return ns, nil
}

// Veth creates a veth pair with one end named aDev in a and the other named
// bDev in b, and sets both up. The pair is created inside a, so names only
// have to be unique within each namespace, and it disappears with either
// namespace.
func (t *Topology) Veth(a *NS, aDev string, b *NS, bDev string) error {
	la := netlink.NewLinkAttrs()
	la.Name = aDev
	veth := &netlink.Veth{LinkAttrs: la, PeerName: bDev, PeerNamespace: netlink.NsFd(int(b.handle))}
	if err := a.nl.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth %s/%s <-> %s/%s: %w", a.Name, aDev, b.Name, bDev, err)
	}
	if err := a.LinkUp(aDev); err != nil {
		return err
	}
	return b.LinkUp(bDev)
}

// sweepStale deletes namespaces left behind by runs of this package whose
// process no longer exists (killed before they could clean up), and kills
// what still runs in them: children that were not tied to the run's life
// (Pdeathsig follows the thread that forked, not the process).
func sweepStale() {
	for _, name := range testutil.StaleRuns(netnsDir, namePrefix) {
		path := filepath.Join(netnsDir, name)
		for _, pid := range pidsIn(path) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		_ = unmountAndRemove(path)
	}
}

// pidsIn lists the processes whose network namespace is the one bound at
// path, as `ip netns pids` does: by the namespace's inode.
func pidsIn(path string) []int {
	var ns syscall.Stat_t
	if err := syscall.Stat(path, &ns); err != nil {
		return nil
	}
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		var st syscall.Stat_t
		if syscall.Stat(filepath.Join("/proc", e.Name(), "ns", "net"), &st) == nil && st.Dev == ns.Dev && st.Ino == ns.Ino {
			pids = append(pids, pid)
		}
	}
	return pids
}

// SweepStale removes the entries of dir (recursively) named by runs of this
// package whose process no longer exists: per-run bpffs directories or
// cgroups left behind by a run that was killed.
func SweepStale(dir string) error {
	var errs []error
	for _, name := range testutil.StaleRuns(dir, namePrefix) {
		if err := os.RemoveAll(filepath.Join(dir, name)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
