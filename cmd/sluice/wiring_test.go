package main

// Tests of runAgent's and run's wiring that the functions they call do not
// show: the servers' failures reach the source (kube-proxy's events), and
// the start's waits for the Node share one budget.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/agent"
	"github.com/sluice-lb/sluice/pkg/datapath"
	"github.com/sluice-lb/sluice/pkg/metrics"
	"github.com/sluice-lb/sluice/pkg/model"
)

// runningSource is a source that hands the agent one state (if any) and
// runs until the agent stops it, recording the failures it is told as the
// Kubernetes source records them (bindFailureReporter,
// serverFailureReporter); its record of a server failure is refused, as
// an API server may refuse it.
type runningSource struct {
	state *model.State

	mu         sync.Mutex
	health     []bool
	errs       []error
	bindFailed chan string // "namespace/name port: err" of each health check port not bound
}

func newRunningSource(st *model.State) *runningSource {
	return &runningSource{state: st, bindFailed: make(chan string, 16)}
}

func (s *runningSource) Run(ctx context.Context, apply func(*model.State)) error {
	if s.state != nil {
		apply(s.state)
	}
	<-ctx.Done()
	return nil
}

func (s *runningSource) ReportServerFailure(_ context.Context, health bool, err error) error {
	s.mu.Lock()
	s.health, s.errs = append(s.health, health), append(s.errs, err)
	s.mu.Unlock()
	return errRefused
}

func (s *runningSource) HealthCheckFailed(svc model.ServicePortName, port uint16, err error) {
	s.bindFailed <- fmt.Sprintf("%s/%s %d: %v", svc.Namespace, svc.Name, port, err)
}

func (s *runningSource) told() ([]bool, []error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]bool(nil), s.health...), append([]error(nil), s.errs...)
}

var (
	_ serverFailureReporter = (*runningSource)(nil)
	_ bindFailureReporter   = (*runningSource)(nil)
)

// agentRun is runAgent running in the test, on a datapath pinned in a
// directory of its own (no device, no socket load balancing).
type agentRun struct {
	log    *testutil.Buffer
	cancel context.CancelFunc
	done   chan error
}

func startRunAgent(t *testing.T, src agent.Source, ns northSouthConfig, srv listenAddrs) *agentRun {
	t.Helper()
	testutil.Privileged(t)
	bpffs := testutil.PinDir(t)
	t.Cleanup(func() {
		if err := datapath.Cleanup(bpffs); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	ns.gcEvery = time.Hour
	r := &agentRun{log: &testutil.Buffer{}, done: make(chan error, 1)}
	log := slog.New(slog.NewTextHandler(r.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() {
		r.done <- runAgent(ctx, agent.Config{}, datapath.Config{BPFFS: bpffs, DisableSocketLB: true, DeferDryRun: true},
			0, ns, src, metrics.New(), nil, srv, log)
	}()
	// runAgent returns before the cleanups above (registered first, run
	// last) remove its pins.
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-r.done:
			_ = err // the test's to check (wait), if it expected one
		case <-time.After(time.Minute):
			t.Errorf("runAgent did not return within a minute of its context's end\n%s", r.log)
		}
	})
	return r
}

// wait returns runAgent's error once it returns on its own (a minute at
// most: the bound of a hang, not a measure, which fails the test with
// every goroutine's stack).
func (r *agentRun) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-r.done:
		r.done <- err // for the cleanup
		return err
	case <-time.After(time.Minute):
		buf := make([]byte, 1<<20)
		n := runtime.Stack(buf, true)
		t.Fatalf("runAgent still running a minute after its server failed\n%s\n%s", r.log, buf[:n])
		return nil
	}
}

// breakListener makes the listening socket of this process on 127.0.0.1
// port fail, as a socket the kernel takes away from a running server: a
// shutdown(2) of a listening TCP socket wakes its accept with EINVAL,
// which net/http's Serve does not retry.
func breakListener(t *testing.T, port int) {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		link, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err != nil || !strings.HasPrefix(link, "socket:") {
			continue
		}
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		sa, err := syscall.Getsockname(fd)
		in, ok := sa.(*syscall.SockaddrInet4)
		if err != nil || !ok || in.Port != port || in.Addr != [4]byte{127, 0, 0, 1} {
			continue
		}
		if acc, err := syscall.GetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_ACCEPTCONN); err != nil || acc != 1 {
			continue
		}
		if err := syscall.Shutdown(fd, syscall.SHUT_RDWR); err != nil {
			t.Fatalf("shutdown of the listener on 127.0.0.1:%d: %v", port, err)
		}
		return
	}
	t.Fatalf("no listening socket on 127.0.0.1:%d in this process", port)
}

// TestRunningServerFailureReported: the health or the metrics server
// failing after it started (its listener broken under it) ends the agent
// with that server's error, stops the other server, and is told to the
// source, once, as the failure of that server (the Kubernetes source's
// FailedToStartProxierHealthcheck or FailedToStartMetricServer on the
// Node, as kube-proxy records its servers' errors); the source refusing
// the record is logged, and the agent's exit is the server's error all
// the same.
func TestRunningServerFailureReported(t *testing.T) {
	for _, failing := range []string{"health", "metrics"} {
		t.Run(failing, func(t *testing.T) {
			ports := testutil.FreePorts(t, 2)
			addr := map[string]string{"health": fmt.Sprintf("127.0.0.1:%d", ports[0]), "metrics": fmt.Sprintf("127.0.0.1:%d", ports[1])}
			port := map[string]int{"health": ports[0], "metrics": ports[1]}
			other := map[string]string{"health": "metrics", "metrics": "health"}[failing]
			src := newRunningSource(nil)
			r := startRunAgent(t, src, northSouthConfig{}, listenAddrs{health: addr["health"], metrics: addr["metrics"]})
			// Both servers answer: the failure comes after the start.
			for _, name := range []string{"health", "metrics"} {
				path := map[string]string{"health": "/livez", "metrics": "/metrics"}[name]
				testutil.Eventually(t, name+" server answering", time.Minute, func() error {
					resp, err := http.Get("http://" + addr[name] + path)
					if err != nil {
						return err
					}
					resp.Body.Close()
					return nil
				})
			}
			breakListener(t, port[failing])
			err := r.wait(t)
			if err == nil || !strings.HasPrefix(err.Error(), failing+" server: accept ") || !errors.Is(err, syscall.EINVAL) {
				t.Fatalf("runAgent returned %v, want the %s server's accept error\n%s", err, failing, r.log)
			}
			health, errs := src.told()
			if len(errs) != 1 || health[0] != (failing == "health") || errs[0].Error() != err.Error() {
				t.Errorf("source told %v (health %v), want the agent's error %q once (health %v)", errs, health, err, failing == "health")
			}
			if log := r.log.String(); !strings.Contains(log, `msg="server failure not recorded as an event"`) || !strings.Contains(log, "err="+errRefused.Error()) {
				t.Errorf("the source's refusal is not logged:\n%s", log)
			}
			// The agent stopped the other server on its way out.
			if c, err := net.Dial("tcp", addr[other]); err == nil {
				c.Close()
				t.Errorf("the %s server still accepts after the agent returned", other)
			}
		})
	}
}

// TestHealthCheckPortBindFailureReported: a healthCheckNodePort that
// cannot be bound (taken) is told to the source, naming the Service, the
// port and the error (the Kubernetes source's
// FailedToStartServiceHealthcheck on the Service), and the agent goes on.
func TestHealthCheckPortBindFailureReported(t *testing.T) {
	held := heldPort(t)
	port := uint16(held.Addr().(*net.TCPAddr).Port)
	src := newRunningSource(localLBState(port))
	r := startRunAgent(t, src, northSouthConfig{hc: true, hcHosts: []string{"127.0.0.1"}}, listenAddrs{})
	// The ports' sync logs what it could not bind after it has told the
	// source (health.NodePortServer.SetProgrammed).
	testutil.Eventually(t, "the health check ports synced with the programmed state", time.Minute, func() error {
		select {
		case err := <-r.done:
			r.done <- err
			t.Fatalf("runAgent returned %v before the health check ports synced\n%s", err, r.log)
		default:
		}
		if !strings.Contains(r.log.String(), `msg="health check ports"`) {
			return errors.New("no \"health check ports\" error logged yet")
		}
		return nil
	})
	select {
	case got := <-src.bindFailed:
		if want := fmt.Sprintf("default/web %d: ", port); !strings.HasPrefix(got, want) || !strings.Contains(got, "address already in use") {
			t.Errorf("source told %q, want %q... address already in use", got, want)
		}
	default:
		t.Errorf("the port not bound was logged but not told to the source\n%s", r.log)
	}
	select {
	case err := <-r.done:
		r.done <- err
		t.Errorf("runAgent returned %v: a health check port not bound must not end the agent", err)
	default:
	}
}

// fakeNodeAPI is an HTTP server standing in for the API server's Node
// reads (GET /api/v1/nodes/NAME), answering each read with answer(n, r),
// n counting reads from 1; a nil Node leaves the read unanswered until
// the client gives it up.
func fakeNodeAPI(t *testing.T, answer func(n int, r *http.Request) *corev1.Node) string {
	t.Helper()
	var mu sync.Mutex
	reads := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || !strings.HasPrefix(r.URL.Path, "/api/v1/nodes/") {
			t.Errorf("unexpected API request %s %s", r.Method, r.URL)
			http.Error(w, "not here", http.StatusNotFound)
			return
		}
		mu.Lock()
		reads++
		n := reads
		mu.Unlock()
		node := answer(n, r)
		if node == nil {
			<-r.Context().Done()
			return
		}
		node.TypeMeta = metav1.TypeMeta{Kind: "Node", APIVersion: "v1"}
		w.Header().Set("Content-Type", "application/json")
		if err := json.NewEncoder(w).Encode(node); err != nil {
			t.Errorf("encode the Node: %v", err)
		}
	}))
	t.Cleanup(srv.Close)
	return writeKubeconfig(t, srv.URL)
}

// writeKubeconfig writes a kubeconfig for the API server at url.
func writeKubeconfig(t *testing.T, url string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`, url)
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// setNodeWaits sets the start's budget (nodeAPIWait) and the addresses'
// own bound (nodeIPsWait) for the test.
func setNodeWaits(t *testing.T, budget, ips time.Duration) {
	savedAPI, savedIPs := nodeAPIWait, nodeIPsWait
	nodeAPIWait, nodeIPsWait = budget, ips
	t.Cleanup(func() { nodeAPIWait, nodeIPsWait = savedAPI, savedIPs })
}

// runUntilWaited runs the agent with the Kubernetes source on kubeconfig,
// as node "node-a" with extra flags, on a --bpffs that is not a bpffs: a
// start that gets past the waits for the Node fails at the node's
// prerequisites, before it loads or pins anything. It returns the exit
// code and the log.
func runUntilWaited(t *testing.T, kubeconfig string, extra ...string) (int, string) {
	t.Helper()
	args := append([]string{"--kubeconfig", kubeconfig, "--node-name", "node-a", "--bpffs", t.TempDir(),
		"--socket-lb=false", "--health-addr", "", "--metrics-addr", "", "--names-file", ""}, extra...)
	var code int
	log := captureStderr(t, func() { code = run(args) })
	return code, log
}

// TestStartWaitsShareBudget: the start's waits for the Node share one
// budget (nodeAPIWait, an hour here): the wait for the Node's addresses
// gets what the NodeCIDR mode's wait for podCIDRs left of it, not a
// budget of its own, nor its own 30 seconds (nodeIPsWait, an hour here).
// The fake API answers every read at once: the NodeCIDR wait's with
// podCIDRs and no address, moving the budget's clock (nodeWaitClock) on
// by all of the budget or half of it as it answers, and the later reads
// with the address 192.0.2.10. With none left the agent gives the
// addresses' wait up before it reads and goes on without node addresses
// (kube-proxy's "timed out waiting"); with half left it takes 192.0.2.10.
// Either way it fails next at the prerequisites (a --bpffs that is not
// one). Only the clock moves: no outcome rests on time passing.
func TestStartWaitsShareBudget(t *testing.T) {
	const budget = time.Hour
	setNodeWaits(t, budget, time.Hour)
	var moved atomic.Int64 // how far the budget's clock is moved on
	saved := nodeWaitClock
	nodeWaitClock = func() time.Time { return time.Now().Add(time.Duration(moved.Load())) }
	t.Cleanup(func() { nodeWaitClock = saved })
	for _, c := range []struct {
		name     string
		took     time.Duration // the NodeCIDR wait's, by the budget's clock
		want     string        // in the log
		addrRead bool          // the addresses' wait read the Node
	}{
		{"none left", budget, `msg="timed out waiting for the Node to be assigned addresses: no node IPs from it"`, false},
		{"half left", budget / 2, `msg="node addresses from the Node object" node=node-a addresses=[192.0.2.10]`, true},
	} {
		moved.Store(0)
		var addrReads atomic.Int32
		kubeconfig := fakeNodeAPI(t, func(n int, r *http.Request) *corev1.Node {
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}
			node.Spec.PodCIDRs = []string{"10.244.1.0/24"}
			if n == 1 { // the NodeCIDR wait's
				moved.Store(int64(c.took))
				return node
			}
			addrReads.Add(1)
			node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.10"}}
			return node
		})
		code, log := runUntilWaited(t, kubeconfig, "--detect-local-mode", "NodeCIDR")
		if code != 1 || !strings.Contains(log, `msg="pods told by the Node's podCIDRs (--detect-local-mode NodeCIDR)"`) ||
			!strings.Contains(log, c.want) || strings.Contains(log, "192.0.2.10") != c.addrRead ||
			!strings.Contains(log, `msg="node prerequisite not met"`) {
			t.Errorf("%s: exit %d, want 1 at the prerequisites after podCIDRs were found and `%s`:\n%s", c.name, code, c.want, log)
		}
		if got := addrReads.Load() > 0; got != c.addrRead {
			t.Errorf("%s: the addresses' wait read the Node: %v, want %v", c.name, got, c.addrRead)
		}
	}
}

// TestStartWaitsBoundedByBudget: an API server that never answers (a TCP
// listener that accepts and says nothing) ends the start with exit 1 once
// the budget is spent, whichever wait was on: the Node's addresses (an
// error naming the API and the budget) or the NodeCIDR mode's podCIDRs
// (kube-proxy's timeout, naming the budget), and neither the addresses'
// own 30 seconds (an hour here) nor anything else keeps it waiting.
func TestStartWaitsBoundedByBudget(t *testing.T) {
	const budget = time.Second
	setNodeWaits(t, budget, time.Hour)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn // held open, never answered
		done  = make(chan struct{})
	)
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	defer func() {
		l.Close()
		<-done
		for _, c := range conns {
			c.Close()
		}
	}()
	kubeconfig := writeKubeconfig(t, "http://"+l.Addr().String())
	for _, c := range []struct {
		name  string
		extra []string
		want  string
	}{
		{"node addresses", nil, `reading node \"node-a\": the API did not answer for `},
		{"NodeCIDR", []string{"--detect-local-mode", "NodeCIDR"},
			`timeout waiting for PodCIDR allocation on node \"node-a\" (waited 1s for --detect-local-mode NodeCIDR): last read: `},
	} {
		code, log := runUntilWaited(t, kubeconfig, c.extra...)
		if code != 1 || !strings.Contains(log, c.want) || strings.Contains(log, "node prerequisite not met") {
			t.Errorf("%s: exit %d, want 1 with `%s`, before the prerequisites:\n%s", c.name, code, c.want, log)
		}
	}
}

// TestNoDeviceHoldsNodeIPWarned: with no --devices and a node IP that no
// interface holds, the default devices are none: no tc program is
// attached, and NodePorts added once the address comes are served to the
// node's and pods' own connections only. The agent says so at start,
// naming the node IP and --devices, and so does the NodePort addresses'
// warning; a node IP an interface holds (one of
// this host's global addresses, if it has one) takes its device, without
// the warning. The start then fails at the missing --manifests, before it
// loads or pins anything.
func TestNoDeviceHoldsNodeIPWarned(t *testing.T) {
	const warned = `msg="no device holds a node address: no tc program attached`
	type run1 struct {
		nodeIP string
		want   string // in the log
		warn   bool
	}
	cases := []run1{{"203.0.113.77", `node_ips=[203.0.113.77]`, true}}
	if as, err := net.InterfaceAddrs(); err == nil {
		for _, a := range as {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && ipn.IP.IsGlobalUnicast() {
				cases = append(cases, run1{ipn.IP.String(), `msg="devices holding the node addresses"`, false})
				break
			}
		}
	}
	for _, c := range cases {
		// A subtest each: runToMissingManifests stops the one whose
		// start did not stop at the missing file, not the others.
		t.Run(c.nodeIP, func(t *testing.T) {
			log := runToMissingManifests(t, "--node-ip", c.nodeIP, "--socket-lb=false")
			if strings.Contains(log, warned) != c.warn || !strings.Contains(log, c.want) ||
				c.warn && !strings.Contains(log, "own connections only, unless a --devices pattern matches") {
				t.Errorf("--node-ip %s: warned %v (want %v) with %s:\n%s",
					c.nodeIP, strings.Contains(log, warned), c.warn, c.want, log)
			}
		})
	}
}
