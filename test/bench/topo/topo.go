// Package topo builds the benchmark's network: for each mode a triple of
// network namespaces, client -> node -> backend, joined by veth pairs, with
// addresses only inside them (see package rules for the plan). Each mode gets
// its own triple so its ruleset, conntrack table and agent never meet another
// mode's, and modes can be measured in turn without reprogramming.
//
// Namespaces are named sb<pid>-<mode>-{c,n,b}; Cleanup (or, after a crash,
// CleanupStale on the next run) deletes them, and everything in them (rules,
// routes, tc programs) goes with them.
package topo

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Addresses inside every triple.
const (
	ClientAddr     = "10.64.1.2" // first client source address; more follow
	NodeClientAddr = "10.64.1.1"
	NodeBackAddr   = "10.64.2.1"
	BackendAddr    = "10.64.2.2"
	NodeClientDev  = "nc" // the node's client-facing veth
	NodeBackDev    = "nb"
	ClientDev      = "c0"
	BackendDev     = "b0"
	ClientSources  = 8 // client source addresses 10.64.1.2 .. 10.64.1.9
)

// ClientSourceAddrs are the client namespace's source addresses.
func ClientSourceAddrs() []string {
	var out []string
	for i := 0; i < ClientSources; i++ {
		out = append(out, fmt.Sprintf("10.64.1.%d", 2+i))
	}
	return out
}

// Triple is one mode's client, node and backend namespaces.
type Triple struct {
	Mode                  string
	Client, Node, Backend string
}

// Prefix is the namespace-name prefix of this process.
func Prefix() string { return fmt.Sprintf("sb%d-", os.Getpid()) }

// Run runs a command and returns its combined output in the error.
func Run(ctx context.Context, name string, args ...string) error {
	_, err := Output(ctx, name, args...)
	return err
}

// Output runs a command and returns its stdout.
func Output(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.Bytes(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.Bytes(), nil
}

// NS runs a command inside a namespace.
func NS(ctx context.Context, ns string, args ...string) error {
	return Run(ctx, "ip", append([]string{"netns", "exec", ns}, args...)...)
}

// Sysctl writes a sysctl inside a namespace (key with dots).
func Sysctl(ns, key, val string) error {
	p := "/proc/sys/" + strings.ReplaceAll(key, ".", "/")
	return InNetns(ns, func() error {
		// /proc/sys/net follows the writing thread's network namespace.
		return os.WriteFile(p, []byte(val), 0o644)
	})
}

// InNetns runs f on an OS thread switched into namespace ns. Sockets f
// creates belong to ns and stay usable from any goroutine afterwards. The
// thread is discarded afterwards rather than switched back.
func InNetns(ns string, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		fd, err := unix.Open(filepath.Join("/run/netns", ns), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- fmt.Errorf("open netns %s: %w", ns, err)
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns %s: %w", ns, err)
			return
		}
		errc <- f()
	}()
	return <-errc
}

// New creates the triple for a mode.
func New(ctx context.Context, mode string) (*Triple, error) {
	p := Prefix() + mode
	t := &Triple{Mode: mode, Client: p + "-c", Node: p + "-n", Backend: p + "-b"}
	if err := t.setup(ctx); err != nil {
		t.Cleanup()
		return nil, fmt.Errorf("topology %s: %w", mode, err)
	}
	return t, nil
}

func (t *Triple) setup(ctx context.Context) error {
	for _, ns := range []string{t.Client, t.Node, t.Backend} {
		if err := Run(ctx, "ip", "netns", "add", ns); err != nil {
			return err
		}
	}
	steps := [][]string{
		{"-n", t.Node, "link", "add", NodeClientDev, "type", "veth", "peer", "name", ClientDev, "netns", t.Client},
		{"-n", t.Node, "link", "add", NodeBackDev, "type", "veth", "peer", "name", BackendDev, "netns", t.Backend},
		{"-n", t.Node, "addr", "add", NodeClientAddr + "/24", "dev", NodeClientDev},
		{"-n", t.Node, "addr", "add", NodeBackAddr + "/24", "dev", NodeBackDev},
		{"-n", t.Node, "link", "set", "lo", "up"},
		{"-n", t.Node, "link", "set", NodeClientDev, "up"},
		{"-n", t.Node, "link", "set", NodeBackDev, "up"},
		{"-n", t.Node, "route", "add", "10.80.0.0/12", "via", BackendAddr},
		// Node-local clients need a route to the service CIDR before their
		// OUTPUT DNAT runs (a real node has a default route). Only locally
		// generated traffic (iif lo) gets it: forwarded traffic to a VIP no
		// rule matches still fails at once with "net unreachable", which
		// keeps the programming-time probes sharp.
		{"-n", t.Node, "route", "add", "10.32.0.0/16", "via", BackendAddr, "table", "100"},
		{"-n", t.Node, "rule", "add", "iif", "lo", "lookup", "100", "pref", "100"},
		{"-n", t.Client, "link", "set", "lo", "up"},
		{"-n", t.Client, "link", "set", ClientDev, "up"},
		{"-n", t.Client, "route", "add", "default", "via", NodeClientAddr},
		{"-n", t.Backend, "addr", "add", BackendAddr + "/24", "dev", BackendDev},
		{"-n", t.Backend, "link", "set", "lo", "up"},
		{"-n", t.Backend, "link", "set", BackendDev, "up"},
		{"-n", t.Backend, "route", "add", "default", "via", NodeBackAddr},
		// Every backend address is local to the backend namespace, so one
		// listener on 0.0.0.0 answers for all of them.
		{"-n", t.Backend, "route", "add", "local", "10.80.0.0/12", "dev", "lo"},
	}
	var addrs [][]string
	for _, a := range ClientSourceAddrs() {
		addrs = append(addrs, []string{"-n", t.Client, "addr", "add", a + "/24", "dev", ClientDev})
	}
	steps = append(steps[:2], append(addrs, steps[2:]...)...)
	for _, s := range steps {
		if err := Run(ctx, "ip", s...); err != nil {
			return err
		}
	}
	sysctls := []struct{ ns, k, v string }{
		{t.Node, "net.ipv4.ip_forward", "1"},
		{t.Node, "net.ipv4.ip_local_port_range", "1024 65535"},
		{t.Node, "net.ipv4.tcp_tw_reuse", "1"},
		{t.Client, "net.ipv4.ip_local_port_range", "1024 65535"},
		{t.Client, "net.ipv4.tcp_tw_reuse", "1"},
		{t.Backend, "net.core.somaxconn", "4096"},
		{t.Backend, "net.ipv4.tcp_max_syn_backlog", "4096"},
	}
	for _, s := range sysctls {
		if err := Sysctl(s.ns, s.k, s.v); err != nil {
			return fmt.Errorf("sysctl %s in %s: %w", s.k, s.ns, err)
		}
	}
	return nil
}

// ConntrackSysctls sizes the node's conntrack for connection churn. They
// exist only once conntrack is in use in the namespace, so call it after the
// rules are loaded; missing keys are skipped and reported.
func (t *Triple) ConntrackSysctls() []string {
	var set []string
	for _, kv := range [][2]string{
		{"net.netfilter.nf_conntrack_tcp_timeout_time_wait", "10"},
		{"net.netfilter.nf_conntrack_tcp_timeout_close_wait", "10"},
		{"net.netfilter.nf_conntrack_tcp_timeout_fin_wait", "10"},
	} {
		if err := Sysctl(t.Node, kv[0], kv[1]); err == nil {
			set = append(set, kv[0]+"="+kv[1])
		}
	}
	return set
}

// Cleanup kills what still runs in the triple's namespaces and deletes them.
func (t *Triple) Cleanup() {
	for _, ns := range []string{t.Client, t.Node, t.Backend} {
		if ns != "" {
			deleteNS(ns)
		}
	}
}

// deleteNS kills the processes in ns (children are not tied to the
// benchmark's life: Go's Pdeathsig follows the forking thread, not the
// process) and deletes it.
func deleteNS(ns string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if out, err := Output(ctx, "ip", "netns", "pids", ns); err == nil {
		for _, f := range strings.Fields(string(out)) {
			if pid, err := strconv.Atoi(f); err == nil && pid != os.Getpid() {
				_ = unix.Kill(pid, unix.SIGKILL)
			}
		}
	}
	_ = Run(ctx, "ip", "netns", "del", ns)
}

// CleanupStale deletes namespaces left by benchmark processes that are gone.
func CleanupStale() {
	ents, err := os.ReadDir("/run/netns")
	if err != nil {
		return
	}
	for _, e := range ents {
		name := e.Name()
		if !strings.HasPrefix(name, "sb") {
			continue
		}
		pidStr, _, ok := strings.Cut(name[2:], "-")
		pid, err := strconv.Atoi(pidStr)
		if !ok || err != nil || pid == os.Getpid() {
			continue
		}
		if unix.Kill(pid, 0) == nil {
			continue // still running
		}
		deleteNS(name)
	}
}
