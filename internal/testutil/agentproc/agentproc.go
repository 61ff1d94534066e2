// Package agentproc runs the real sluice binary as a process inside a
// namespace of package topology: it builds the binaries (once per test
// process), writes manifests of Services and EndpointSlices atomically,
// starts the agent, waits for its readiness, reads the datapath back with
// sluicectl, and tears it down, asserting that it exits cleanly on
// SIGTERM and that `sluice cleanup` removes what it installed. The
// end-to-end, north-south and Kubernetes tests, the demo and the
// benchmarks all run the agent through it.
package agentproc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
)

// Agent is a sluice agent running in a namespace.
type Agent struct {
	Bin   Binaries
	NS    *topology.NS
	BPFFS string
	Args  []string // the agent's full argument list
	// HealthAddr and MetricsAddr are where /readyz and /metrics are
	// served inside NS.
	HealthAddr, MetricsAddr string
	// NamesFile is where the agent writes its frontends' Service names
	// (sluice --names-file), which sluicectl reads.
	NamesFile string

	// Env, if set, is added to the agent's environment (NAME=value
	// each, e.g. GODEBUG=gctrace=1): the agent is started through env(1),
	// which execs it, so Pid stays the agent's.
	Env []string

	Log  *testutil.Buffer
	proc *topology.Process
}

// AgentConfig says how to run the agent.
type AgentConfig struct {
	Manifests string
	Devices   []string
	Cgroup    string // socket load balancing cgroup; empty: --socket-lb=false
	BPFFS     string // the agent pins under BPFFS/sluice
	Extra     []string
}

// NewAgent prepares (does not start) an agent in ns. Per-run directories
// next to cfg.BPFFS left by killed runs are removed first.
func NewAgent(bin Binaries, ns *topology.NS, cfg AgentConfig) *Agent {
	_ = topology.SweepStale(filepath.Dir(cfg.BPFFS))
	a := &Agent{Bin: bin, NS: ns, BPFFS: cfg.BPFFS, HealthAddr: "127.0.0.1:10256", MetricsAddr: "127.0.0.1:10249", Log: &testutil.Buffer{},
		// Named after the run's pins and the directory holding them
		// (the benchmarks pin under <own temporary directory>/bpffs, one
		// per agent), not the host's /run/sluice; removed by Uninstall
		// (so by Cleanup and Teardown too).
		NamesFile: filepath.Join(os.TempDir(), filepath.Base(filepath.Dir(cfg.BPFFS))+"-"+filepath.Base(cfg.BPFFS)+"-names.json")}
	a.Args = []string{
		"--manifests", cfg.Manifests,
		"--bpffs", cfg.BPFFS,
		"--names-file", a.NamesFile,
		"--health-addr", a.HealthAddr,
		"--metrics-addr", a.MetricsAddr,
		"--node-name", "node",
		"--log-level", "debug",
	}
	if len(cfg.Devices) > 0 {
		a.Args = append(a.Args, "--devices", strings.Join(cfg.Devices, ","))
	}
	if cfg.Cgroup != "" {
		a.Args = append(a.Args, "--cgroup", cfg.Cgroup)
	} else {
		a.Args = append(a.Args, "--socket-lb=false")
	}
	a.Args = append(a.Args, cfg.Extra...)
	return a
}

// StartAgent prepares, starts and waits (up to ready) for an agent in ns,
// and registers its teardown with t: on failure the agent's counters and
// log are dumped; then it is stopped (it must exit cleanly on SIGTERM) and
// `sluice cleanup` removes what it installed. Cleanups run last-registered
// first, so a caller's own cleanups registered afterwards run while the
// agent is still up.
func StartAgent(t testing.TB, bin Binaries, ns *topology.NS, cfg AgentConfig, ready time.Duration) *Agent {
	t.Helper()
	a := NewAgent(bin, ns, cfg)
	t.Cleanup(func() {
		if t.Failed() {
			counters, err := a.Counters(context.Background())
			t.Logf("agent in %s: counters (%v):\n%s\nlog:\n%s", ns.Name, err, counters, a.Log.String())
		}
		if err := a.Teardown(context.Background()); err != nil {
			t.Error(err)
		}
	})
	if err := a.Start(); err != nil {
		t.Fatalf("start agent in %s: %v", ns.Name, err)
	}
	if err := a.WaitReady(ready); err != nil {
		t.Fatalf("agent in %s: %v\n%s", ns.Name, err, a.Log.String())
	}
	return a
}

// Start starts the agent. Its output accumulates in Log.
func (a *Agent) Start() error {
	if a.proc != nil {
		select {
		case <-a.proc.Exited():
		default:
			return errors.New("agent already running")
		}
	}
	if _, err := fmt.Fprintf(a.Log, "=== start %s%s %s\n", envPrefix(a.Env), a.Bin.Sluice, strings.Join(a.Args, " ")); err != nil {
		return fmt.Errorf("agent log: %w", err)
	}
	name, args := a.Bin.Sluice, a.Args
	if len(a.Env) > 0 {
		name, args = "env", append(append(slices.Clone(a.Env), a.Bin.Sluice), a.Args...)
	}
	p, err := a.NS.Start(a.Log, nil, name, args...)
	if err != nil {
		return err
	}
	a.proc = p
	return nil
}

// envPrefix is env as the start line shows it: "A=1 B=2 ", or empty.
func envPrefix(env []string) string {
	if len(env) == 0 {
		return ""
	}
	return strings.Join(env, " ") + " "
}

// Pid is the agent's process id (nsenter execs the agent: the pid is the
// agent's own), or 0 before Start.
func (a *Agent) Pid() int {
	if a.proc == nil {
		return 0
	}
	return a.proc.Cmd.Process.Pid
}

// Exited returns how the agent ended, or nil while it runs (or before
// Start).
func (a *Agent) Exited() error {
	if a.proc == nil {
		return nil
	}
	select {
	case <-a.proc.Exited():
		if err := a.proc.Err(); err != nil {
			return fmt.Errorf("agent exited: %w", err)
		}
		return errors.New("agent exited")
	default:
		return nil
	}
}

// Stop sends SIGTERM and waits for the agent to exit; it returns an error
// unless the agent exited with status 0.
func (a *Agent) Stop() error {
	if a.proc == nil {
		return nil
	}
	return a.proc.Stop(10 * time.Second)
}

// Ready returns nil if /readyz answers 200, else what it answered.
func (a *Agent) Ready() error {
	_, err := a.Get(a.HealthAddr, "/readyz")
	return err
}

// Metrics returns the agent's Prometheus exposition.
func (a *Agent) Metrics() (string, error) {
	return a.Get(a.MetricsAddr, "/metrics")
}

// Get fetches path from addr inside the agent's namespace; anything but
// 200 is an error.
func (a *Agent) Get(addr, path string) (string, error) {
	c := a.NS.HTTPClient(2 * time.Second)
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var body bytes.Buffer
	if _, err := body.ReadFrom(resp.Body); err != nil {
		return "", fmt.Errorf("%s: read body: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s: %s", path, resp.Status, strings.TrimSpace(body.String()))
	}
	return body.String(), nil
}

// WaitReady polls /readyz until it answers 200, the agent exits, or
// timeout.
func (a *Agent) WaitReady(timeout time.Duration) error {
	var exited error
	err := testutil.Poll(timeout, func() error {
		if exited = a.Exited(); exited != nil {
			return nil // no use waiting any longer
		}
		return a.Ready()
	})
	if exited != nil {
		return fmt.Errorf("%w before ready", exited)
	}
	if err != nil {
		return fmt.Errorf("agent not ready after %v: %w", timeout, err)
	}
	return nil
}

// Services returns `sluicectl services` as run in the agent's namespace.
func (a *Agent) Services(ctx context.Context) (string, error) {
	return a.ctl(ctx, "services")
}

// Counters returns `sluicectl counters`.
func (a *Agent) Counters(ctx context.Context) (string, error) {
	return a.ctl(ctx, "counters")
}

// Counter returns one datapath counter from `sluicectl counters`; an
// error if there is no counter of that name.
func (a *Agent) Counter(ctx context.Context, name string) (uint64, error) {
	all, err := a.CounterMap(ctx)
	if err != nil {
		return 0, err
	}
	n, ok := all[name]
	if !ok {
		return 0, fmt.Errorf("no counter %s in sluicectl counters", name)
	}
	return n, nil
}

// CounterMap returns every datapath counter from `sluicectl counters`.
func (a *Agent) CounterMap(ctx context.Context) (map[string]uint64, error) {
	out, err := a.Counters(ctx)
	if err != nil {
		return nil, err
	}
	counters := map[string]uint64{}
	for _, l := range strings.Split(out, "\n") {
		var name string
		var n uint64
		if _, err := fmt.Sscan(l, &name, &n); err == nil {
			counters[name] = n
		}
	}
	return counters, nil
}

func (a *Agent) ctl(ctx context.Context, what string) (string, error) {
	var stderr bytes.Buffer
	cmd := a.NS.Command(ctx, a.Bin.Sluicectl, "--bpffs", a.BPFFS, "--names-file", a.NamesFile, what)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("sluicectl %s: %w: %s", what, err, stderr.String())
	}
	return string(out), nil
}

// Teardown stops the agent, which must exit cleanly (status 0) on
// SIGTERM, and then removes what it installed (Cleanup); it returns the
// errors of both.
func (a *Agent) Teardown(ctx context.Context) error {
	var errs []error
	if err := a.Stop(); err != nil {
		errs = append(errs, fmt.Errorf("stop agent in %s: %w", a.NS.Name, err))
	}
	if err := a.Cleanup(ctx); err != nil {
		errs = append(errs, fmt.Errorf("cleanup agent in %s: %w", a.NS.Name, err))
	}
	return errors.Join(errs...)
}

// Uninstall runs `sluice cleanup` in the agent's namespace (the clsact
// filters it removes are per namespace) and removes the names file: the
// datapath is gone, the BPFFS directory stays (a benchmark that mounted a
// bpffs there starts the agent again on it, which writes the names file
// anew). The benchmarks uninstall and never call Cleanup: before, their
// names files stayed in the temporary directory.
func (a *Agent) Uninstall(ctx context.Context) error {
	out, err := a.NS.Command(ctx, a.Bin.Sluice, "cleanup", "--bpffs", a.BPFFS).CombinedOutput()
	if err != nil {
		return fmt.Errorf("sluice cleanup: %w: %s", err, out)
	}
	if err := os.Remove(a.NamesFile); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", a.NamesFile, err)
	}
	return nil
}

// Cleanup uninstalls the agent (Uninstall) and then removes the BPFFS
// directory itself.
func (a *Agent) Cleanup(ctx context.Context) error {
	if err := a.Uninstall(ctx); err != nil {
		return err
	}
	if err := os.RemoveAll(a.BPFFS); err != nil {
		return fmt.Errorf("remove %s: %w", a.BPFFS, err)
	}
	return nil
}
