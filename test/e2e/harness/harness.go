// Package harness runs the real sluice binary inside a topology built by
// pkg/topology: it builds the binaries, writes manifests of Services and
// EndpointSlices, starts and stops the agent in the node namespace, and
// reads the datapath back with sluicectl. The end-to-end tests and the demo
// share it.
package harness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/pkg/topology"
)

// Binaries are the built sluice and sluicectl.
type Binaries struct {
	Sluice, Sluicectl string
}

// Build compiles cmd/sluice and cmd/sluicectl of this module into dir.
func Build(ctx context.Context, dir string) (Binaries, error) {
	root, err := moduleRoot(ctx)
	if err != nil {
		return Binaries{}, err
	}
	b := Binaries{Sluice: filepath.Join(dir, "sluice"), Sluicectl: filepath.Join(dir, "sluicectl")}
	for _, x := range []struct{ pkg, out string }{{"./cmd/sluice", b.Sluice}, {"./cmd/sluicectl", b.Sluicectl}} {
		cmd := exec.CommandContext(ctx, "go", "build", "-o", x.out, x.pkg)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOTOOLCHAIN=local")
		if out, err := cmd.CombinedOutput(); err != nil {
			return Binaries{}, fmt.Errorf("go build %s: %w\n%s", x.pkg, err, out)
		}
	}
	return b, nil
}

func moduleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("not inside the sluice module")
	}
	return filepath.Dir(mod), nil
}

var shared struct {
	once sync.Once
	dir  string
	bins Binaries
	err  error
}

// Shared builds the binaries once per test process, into a directory that
// RemoveShared deletes (call it from TestMain after m.Run).
func Shared(t testing.TB) Binaries {
	t.Helper()
	shared.once.Do(func() {
		if shared.dir, shared.err = os.MkdirTemp("", "sluice-bin-"); shared.err == nil {
			shared.bins, shared.err = Build(context.Background(), shared.dir)
		}
	})
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.bins
}

// RemoveShared deletes what Shared built.
func RemoveShared() {
	if shared.dir != "" {
		os.RemoveAll(shared.dir)
	}
}

// WriteFile replaces path atomically (write a temporary file, rename), so a
// watcher never reads half a manifest.
func WriteFile(path, content string) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".manifest-*")
	if err != nil {
		return err
	}
	if _, err := tmp.WriteString(content); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// Agent is a sluice agent running in a namespace.
type Agent struct {
	Bin   Binaries
	NS    *topology.NS
	BPFFS string
	Args  []string // the agent's full argument list
	// HealthAddr and MetricsAddr are where /readyz and /metrics are
	// served inside NS.
	HealthAddr, MetricsAddr string

	Log  *Buffer
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
	a := &Agent{Bin: bin, NS: ns, BPFFS: cfg.BPFFS, HealthAddr: "127.0.0.1:10256", MetricsAddr: "127.0.0.1:10249", Log: &Buffer{}}
	a.Args = []string{
		"--manifests", cfg.Manifests,
		"--bpffs", cfg.BPFFS,
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
		if err := a.Stop(); err != nil {
			t.Errorf("stop agent in %s: %v", ns.Name, err)
		}
		if err := a.Cleanup(context.Background()); err != nil {
			t.Errorf("cleanup agent in %s: %v", ns.Name, err)
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
	fmt.Fprintf(a.Log, "=== start %s %s\n", a.Bin.Sluice, strings.Join(a.Args, " "))
	p, err := a.NS.Start(a.Log, nil, a.Bin.Sluice, a.Args...)
	if err != nil {
		return err
	}
	a.proc = p
	return nil
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
	body.ReadFrom(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s: %s", path, resp.Status, strings.TrimSpace(body.String()))
	}
	return body.String(), nil
}

// WaitReady polls /readyz until it answers 200, the agent exits, or timeout.
func (a *Agent) WaitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := a.Ready()
		if err == nil {
			return nil
		}
		if a.proc != nil {
			select {
			case <-a.proc.Exited():
				return fmt.Errorf("agent exited (%v) before ready", a.proc.Err())
			default:
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("agent not ready after %v: %w", timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Services returns `sluicectl services` as run in the agent's namespace.
func (a *Agent) Services(ctx context.Context) (string, error) {
	return a.ctl(ctx, "services")
}

// Counters returns `sluicectl counters`.
func (a *Agent) Counters(ctx context.Context) (string, error) {
	return a.ctl(ctx, "counters")
}

func (a *Agent) ctl(ctx context.Context, what string) (string, error) {
	var stderr bytes.Buffer
	cmd := a.NS.Command(ctx, a.Bin.Sluicectl, "--bpffs", a.BPFFS, what)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("sluicectl %s: %w: %s", what, err, stderr.String())
	}
	return string(out), nil
}

// Cleanup runs `sluice cleanup` in the agent's namespace (the clsact
// filters it removes are per namespace) and then removes the BPFFS
// directory itself.
func (a *Agent) Cleanup(ctx context.Context) error {
	out, err := a.NS.Command(ctx, a.Bin.Sluice, "cleanup", "--bpffs", a.BPFFS).CombinedOutput()
	if err != nil {
		return fmt.Errorf("sluice cleanup: %w: %s", err, out)
	}
	if err := os.RemoveAll(a.BPFFS); err != nil {
		return fmt.Errorf("remove %s: %w", a.BPFFS, err)
	}
	return nil
}

// Buffer is a bytes.Buffer safe for concurrent writes and reads.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
