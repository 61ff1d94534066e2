// Package e2e proves ClusterIP load balancing end to end without a cluster:
// the real sluice binary, built by the test, runs in a node namespace with a
// manifest file as its source, and real clients and servers in other
// namespaces exchange real traffic through it.
//
//	client ns --veth--> node ns (sluice: tc on eth0, socket LB on a test
//	                    cgroup, pins under a per-test bpffs dir)
//	                    --veth--> backend1..3 ns (HTTP, TCP echo, UDP echo)
package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/agentproc"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/datapath"
)

// helperEnv makes the test binary act as a client program instead of
// running tests: the socket LB test starts it inside the node namespace and
// the test cgroup.
const helperEnv = "SLUICE_E2E_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(helperMain(os.Args[1:]))
	}
	os.Exit(agentproc.RunTests(m))
}

// helperMain runs a client inside whatever namespace and cgroup it was
// started in, printing "<backend> <peer address>" per exchange:
//
//	tcp ADDR N  N HTTP/1.0 GETs, each on a new connection; the peer is what
//	            the socket reports (getpeername)
//	udp ADDR N  N datagrams, each from a new unconnected socket (sendmsg);
//	            the peer is the source recvfrom reports
//	udp-hold ADDR 1
//	            one datagram on a socket connected to ADDR (connect), then
//	            a wait for that socket to be ended: see helperUDPHold
//
// Socket load balancing must keep the VIP as the peer in all.
func helperMain(args []string) int {
	if len(args) != 3 {
		fmt.Fprintln(os.Stderr, "helper: want tcp|udp|udp-hold ADDR COUNT")
		return 2
	}
	mode, addr := args[0], args[1]
	if mode == "udp-hold" {
		return helperUDPHold(addr)
	}
	var n int
	if _, err := fmt.Sscan(args[2], &n); err != nil {
		fmt.Fprintln(os.Stderr, "helper: COUNT:", err)
		return 2
	}
	for i := 0; i < n; i++ {
		var who, peer string
		var err error
		if mode == "udp" {
			who, peer, err = helperUDP(addr, fmt.Sprintf("q%d", i))
		} else {
			who, peer, err = helperTCP(addr)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "helper: %s %s: %v\n", mode, addr, err)
			return 1
		}
		fmt.Printf("%s %s\n", who, peer)
	}
	return 0
}

func helperTCP(addr string) (who, peer string, err error) {
	c, err := net.DialTimeout(network("tcp", addr), addr, 3*time.Second)
	if err != nil {
		return "", "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := fmt.Fprintf(c, "GET / HTTP/1.0\r\nHost: e2e\r\n\r\n"); err != nil {
		return "", "", err
	}
	body, err := io.ReadAll(c)
	if err != nil {
		return "", "", err
	}
	lines := strings.Split(strings.TrimSpace(string(body)), "\n")
	return strings.TrimSpace(lines[len(lines)-1]), c.RemoteAddr().String(), nil
}

func helperUDP(addr, msg string) (who, peer string, err error) {
	to, err := net.ResolveUDPAddr(network("udp", addr), addr)
	if err != nil {
		return "", "", err
	}
	pc, err := net.ListenUDP(network("udp", addr), nil)
	if err != nil {
		return "", "", err
	}
	defer pc.Close()
	pc.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := pc.WriteTo([]byte(msg), to); err != nil {
		return "", "", err
	}
	buf := make([]byte, 512)
	k, from, err := pc.ReadFrom(buf)
	if err != nil {
		return "", "", err
	}
	who, got, _ := strings.Cut(string(buf[:k]), " ")
	if got != msg {
		return "", "", fmt.Errorf("reply %q to %q", buf[:k], msg)
	}
	return who, from.String(), nil
}

// helperUDPHold connects a UDP socket to addr, exchanges one datagram and
// prints "<backend> <peer address>" (the peer getpeername reports), then
// receives again, which nothing answers: only the socket's end stops that
// receive before its deadline, and it prints "aborted" if it ended with
// ECONNABORTED (the agent destroyed it), else the error.
func helperUDPHold(addr string) int {
	c, err := net.Dial(network("udp", addr), addr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "helper: udp-hold %s: %v\n", addr, err)
		return 1
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Write([]byte("hold")); err != nil {
		fmt.Fprintf(os.Stderr, "helper: udp-hold %s: %v\n", addr, err)
		return 1
	}
	buf := make([]byte, 512)
	k, err := c.Read(buf)
	if err != nil {
		fmt.Fprintf(os.Stderr, "helper: udp-hold %s: %v\n", addr, err)
		return 1
	}
	who, _, _ := strings.Cut(string(buf[:k]), " ")
	fmt.Printf("%s %s\n", who, c.RemoteAddr())
	c.SetDeadline(time.Now().Add(60 * time.Second))
	_, err = c.Read(buf)
	if errors.Is(err, syscall.ECONNABORTED) {
		fmt.Println("aborted")
	} else {
		fmt.Printf("not aborted: %v\n", err)
	}
	return 0
}

// network is "tcp4" or "udp4" for an IPv4 addr, "tcp6" or "udp6" for an
// IPv6 one ("[2001:db8::1]:80").
func network(proto, addr string) string {
	if strings.HasPrefix(addr, "[") {
		return proto + "6"
	}
	return proto + "4"
}

// requirePrivileges is what every test here needs: root, bpffs for the
// agent's pins, and nsenter to start processes in the namespaces.
func requirePrivileges(t *testing.T) {
	t.Helper()
	testutil.Privileged(t)
	testutil.NeedBPFFS(t)
	testutil.NeedCommands(t, "nsenter")
}

// newLB starts a test that runs its own agent: the privileges, the
// binaries, and a topology of a client, a node and backends backends.
func newLB(t *testing.T, backends int) (agentproc.Binaries, *topology.Topology, *topology.LB) {
	t.Helper()
	requirePrivileges(t)
	bins := agentproc.Shared(t)
	topo := topology.NewT(t)
	return bins, topo, topo.BuildLBT(t, backends)
}

const (
	webVIP   = "10.96.0.10:80"   // TCP HTTP, 3 backends on :8080
	dnsVIP   = "10.96.0.11:53"   // UDP, named targetPort "dns" -> :5353
	echoVIP  = "10.96.0.12:9000" // TCP line echo, 3 backends on :9000, later 2
	drainVIP = "10.96.0.13:80"   // TCP HTTP, 3 backends, later none
)

// brokenService is malformed (its clusterIP is no address): the agent must
// report it and apply everything else.
const brokenService = `apiVersion: v1
kind: Service
metadata:
  name: broken
  namespace: default
spec:
  clusterIP: 10.96.0.300
  ports:
  - name: http
    protocol: TCP
    port: 80
    targetPort: 8080
`

type env struct {
	lb       *topology.LB
	agent    *agentproc.Agent
	manifest string
	cgroup   string   // the socket LB cgroup the agent attaches to
	backends []string // backend i's name, as its servers answer
	addrs    []string // backend i's address
}

// write renders the manifest with echo's and drain's endpoints as given.
func (e *env) write(t *testing.T, echo, drain []string) {
	t.Helper()
	all := e.addrs
	svcs := []agentproc.Service{
		{Name: "web", ClusterIP: "10.96.0.10", Endpoints: all, Ports: []agentproc.Port{agentproc.TCP("http", 80, 8080)}},
		{Name: "dns", ClusterIP: "10.96.0.11", Endpoints: all, Ports: []agentproc.Port{agentproc.UDP("dns", 53, 5353).Named()}},
		{Name: "echo", ClusterIP: "10.96.0.12", Endpoints: echo, Ports: []agentproc.Port{agentproc.TCP("echo", 9000, 9000)}},
		{Name: "drain", ClusterIP: "10.96.0.13", Endpoints: drain, Ports: []agentproc.Port{agentproc.TCP("http", 80, 8080)}},
	}
	docs := append([]string{brokenService}, agentproc.Services(svcs...)...)
	if err := agentproc.WriteFile(e.manifest, agentproc.Manifest(docs...)); err != nil {
		t.Fatal(err)
	}
}

// waitServices polls `sluicectl services` until the line of frontend
// satisfies ok.
func (e *env) waitServices(t *testing.T, frontend string, ok func(line string) bool) {
	t.Helper()
	testutil.Eventually(t, "frontend "+frontend+" to reach the wanted state", 15*time.Second, func() error {
		dump, err := e.agent.Services(t.Context())
		if err != nil {
			return err
		}
		for _, l := range strings.Split(dump, "\n") {
			if strings.HasPrefix(l, frontend+"/") && ok(l) {
				return nil
			}
		}
		return fmt.Errorf("last dump:\n%s", dump)
	})
}

func setup(t *testing.T, extraArgs ...string) *env {
	t.Helper()
	bins, topo, lb := newLB(t, 3)
	e := newEnv(t, topo, lb, lb.BackendAddrStrings())
	e.write(t, e.addrs, e.addrs)
	e.startAgent(t, bins, topo, "e2e", extraArgs)
	return e
}

// newEnv serves HTTP on :8080, TCP echo on :9000 and UDP echo on :5353 of
// every backend address of lb and makes the socket LB cgroup, for an
// agent whose Services have addrs as endpoints.
func newEnv(t *testing.T, topo *topology.Topology, lb *topology.LB, addrs []string) *env {
	t.Helper()
	cgMount, err := datapath.CgroupV2Mount()
	if err != nil {
		t.Fatalf("no cgroup v2 mount (`make deps` mounts one): %v", err)
	}
	e := &env{lb: lb, manifest: filepath.Join(t.TempDir(), "services.yaml"), addrs: addrs}
	if e.backends, err = lb.ServeHTTP(8080, "backend-"); err != nil {
		t.Fatal(err)
	}
	if err := lb.ServeEchoes(9000, 5353, e.backends); err != nil {
		t.Fatal(err)
	}
	cg, err := topo.AddCgroup(cgMount, "sluice")
	if err != nil {
		t.Fatal(err)
	}
	e.cgroup = cg.Path
	return e
}

// startAgent starts the agent on e's manifest, device and cgroup, its
// pins in the topology's directory named pins, with extraArgs. It is
// stopped and cleaned up (by StartAgent's cleanup) before the topology
// registered by NewT is torn down.
func (e *env) startAgent(t *testing.T, bins agentproc.Binaries, topo *topology.Topology, pins string, extraArgs []string) {
	t.Helper()
	e.agent = agentproc.StartAgent(t, bins, e.lb.Node, agentproc.AgentConfig{
		Manifests: e.manifest,
		Devices:   []string{e.lb.NodeDev},
		Cgroup:    e.cgroup,
		BPFFS:     filepath.Join(testutil.BPFFS, topo.Prefix()+pins),
		Extra:     extraArgs,
	}, 30*time.Second)
}

// get makes one HTTP request to vip from the client namespace, on a new
// connection, and returns which backend answered.
func (e *env) get(vip string) (string, error) {
	return topology.WhoAnswered(e.lb.Client.HTTPClient(3*time.Second), "http://"+vip+"/")
}

// spread makes n requests to vip from the client, w at a time, and counts
// answers per backend; it fails the test on any error.
func (e *env) spread(t *testing.T, vip string, n int) map[string]int {
	t.Helper()
	var mu sync.Mutex
	counts := map[string]int{}
	var errs []error
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				who, err := e.get(vip)
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					counts[who]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d of %d requests to %s failed; first: %v", len(errs), n, vip, errs[0])
	}
	return counts
}

// dialEcho opens a long-lived connection to the echo service from the
// client.
func (e *env) dialEcho(t *testing.T) *topology.EchoConn {
	t.Helper()
	return e.lb.Client.MustDialEcho(t, echoVIP, 3*time.Second)
}

// echoOnAndBeside opens echo connections from the client to vip until one
// reaches the backend removed and one another backend, and closes the
// rest; 50 tries fail with probability < 2 * (2/3)^50, about 3e-9.
func (e *env) echoOnAndBeside(t *testing.T, vip, removed string) (on, beside *topology.EchoConn) {
	t.Helper()
	for i := 0; i < 50 && (on == nil || beside == nil); i++ {
		c := e.lb.Client.MustDialEcho(t, vip, 3*time.Second)
		switch {
		case c.Backend == removed && on == nil:
			on = c
		case c.Backend != removed && beside == nil:
			beside = c
		default:
			c.Close()
		}
	}
	if on == nil || beside == nil {
		t.Fatalf("50 connections to %s did not reach both %s and another backend", vip, removed)
	}
	return on, beside
}

// udpFromClient sends n datagrams to vip from the client, each on a new
// connected socket (a new flow, a new pick), and counts the answers per
// backend; any datagram without its answer fails the test. A connected
// UDP socket only accepts datagrams from the VIP: an answer proves the
// reply was reverse-translated.
func (e *env) udpFromClient(t *testing.T, vip string, n int) map[string]int {
	t.Helper()
	seen := map[string]int{}
	for i := range n {
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		c, err := e.lb.Client.DialContext(ctx, network("udp", vip), vip)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		msg := fmt.Sprintf("q%d", i)
		if _, err := c.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 512)
		k, err := c.Read(buf)
		c.Close()
		if err != nil {
			t.Fatalf("datagram %d to %s: %v", i, vip, err)
		}
		who, got, _ := strings.Cut(string(buf[:k]), " ")
		if got != msg {
			t.Fatalf("reply %q to %q", buf[:k], msg)
		}
		seen[who]++
	}
	return seen
}

// counters returns `sluicectl counters` as a map.
func (e *env) counters(t *testing.T) map[string]uint64 {
	t.Helper()
	counters, err := e.agent.CounterMap(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return counters
}

// runInCgroup runs the helper client (see helperMain) in the node namespace
// and the agent's cgroup and returns its output lines.
func (e *env) runInCgroup(t *testing.T, mode, vip string, n int) []string {
	t.Helper()
	out, stderr, err := e.cgroupClient(t, mode, vip, n)
	if err != nil {
		t.Fatalf("%s client in the node's cgroup: %v\n%s", mode, err, stderr)
	}
	return strings.Split(strings.TrimSpace(out), "\n")
}

// cgroupSpread runs the helper client in the node's cgroup for n
// exchanges with vip (runInCgroup), checks that every socket reported the
// VIP as its peer, and counts the answers per backend.
func (e *env) cgroupSpread(t *testing.T, mode, vip string, n int) map[string]int {
	t.Helper()
	seen := map[string]int{}
	for _, l := range e.runInCgroup(t, mode, vip, n) {
		who, peer, _ := strings.Cut(l, " ")
		if peer != vip {
			t.Errorf("%s socket reports peer %q, want the VIP %s", mode, peer, vip)
		}
		seen[who]++
	}
	return seen
}

// runInCgroupErr runs the helper client as runInCgroup does, expecting it
// to fail, and returns what it printed of its error.
func (e *env) runInCgroupErr(t *testing.T, mode, vip string, n int) string {
	t.Helper()
	out, stderr, err := e.cgroupClient(t, mode, vip, n)
	if err == nil {
		t.Fatalf("%s client to %s in the node's cgroup succeeded: %s", mode, vip, out)
	}
	return stderr
}

// cgroupClient runs the helper client in the node namespace and the
// agent's cgroup: its output, its standard error, and how it ended.
func (e *env) cgroupClient(t *testing.T, mode, vip string, n int) (out, stderr string, err error) {
	t.Helper()
	cmd, dir := e.cgroupCommand(t, mode, vip, n)
	defer dir.Close()
	var errBuf strings.Builder
	cmd.Stderr = &errBuf
	b, err := cmd.Output()
	return string(b), errBuf.String(), err
}

// cgroupCommand is the helper client's command in the node namespace and
// the agent's cgroup, not started, and the cgroup directory it names (to
// close once started).
func (e *env) cgroupCommand(t *testing.T, mode, vip string, n int) (*exec.Cmd, *os.File) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := e.lb.Node.Command(t.Context(), self, mode, vip, fmt.Sprint(n))
	cmd.Env = append(os.Environ(), helperEnv+"=1")
	dir, err := os.Open(e.cgroup)
	if err != nil {
		t.Fatal(err)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(dir.Fd())}
	return cmd, dir
}

// heldUDP is a helper client in udp-hold mode: a node process whose
// connected UDP socket reached backend who.
type heldUDP struct {
	who  string
	out  *bufio.Scanner
	cmd  *exec.Cmd
	vip  string
	peer string
}

// holdUDP starts udp-hold helpers to vip until one reaches a backend in
// want, and returns it. Each reaches one of three backends at random: 40
// missing two of them have probability (1/3)^40; the others are ended at
// once, the one returned when the test ends.
func (e *env) holdUDP(t *testing.T, vip string, want ...string) *heldUDP {
	t.Helper()
	for range 40 {
		cmd, dir := e.cgroupCommand(t, "udp-hold", vip, 1)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var errBuf strings.Builder
		cmd.Stderr = &errBuf
		err = cmd.Start()
		dir.Close()
		if err != nil {
			t.Fatal(err)
		}
		h := &heldUDP{out: bufio.NewScanner(stdout), cmd: cmd, vip: vip}
		stop := func() { _ = cmd.Process.Kill(); _ = cmd.Wait() } // a test client: its end is wanted
		if !h.out.Scan() {
			stop()
			t.Fatalf("udp-hold helper to %s: no exchange: %s", vip, errBuf.String())
		}
		h.who, h.peer, _ = strings.Cut(h.out.Text(), " ")
		if slices.Contains(want, h.who) {
			t.Cleanup(stop)
			return h
		}
		stop()
	}
	t.Fatalf("40 connected UDP sockets to %s never reached %v", vip, want)
	return nil
}

// ended returns what the helper printed when its socket's wait ended:
// "aborted" if the agent destroyed the socket.
func (h *heldUDP) ended() string {
	if !h.out.Scan() {
		return "no answer: " + fmt.Sprint(h.out.Err())
	}
	return h.out.Text()
}

// readyAndProgrammed checks an agent that started: ready, every one of
// frontends ("VIP/PROTO") in `sluicectl services`, /healthz answering, and
// /metrics counting services frontends and backends backends after a
// successful sync.
func (e *env) readyAndProgrammed(t *testing.T, frontends []string, services, backends int) {
	t.Helper()
	if err := e.agent.Ready(); err != nil {
		t.Fatal(err)
	}
	dump, err := e.agent.Services(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, fe := range frontends {
		if !strings.Contains(dump, fe) {
			t.Errorf("frontend %s not programmed:\n%s", fe, dump)
		}
	}
	if _, err := e.agent.Get(e.agent.HealthAddr, "/healthz"); err != nil {
		t.Errorf("/healthz: %v", err)
	}
	m, err := e.agent.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{fmt.Sprintf("\nsluice_services %d\n", services), fmt.Sprintf("\nsluice_backends %d\n", backends), `sluice_syncs_total{result="success"}`} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %q", strings.TrimSpace(want))
		}
	}
}

// malformedReported checks that the agent reported the malformed object
// name ("namespace/name") and programmed nothing at addr, an address the
// object names.
func (e *env) malformedReported(t *testing.T, name, addr string) {
	t.Helper()
	testutil.EventuallyTrue(t, "the agent to report the malformed Service "+name, 5*time.Second, func() bool {
		return strings.Contains(e.agent.Log.String(), name)
	})
	if dump, _ := e.agent.Services(t.Context()); strings.Contains(dump, addr) {
		t.Errorf("malformed Service programmed:\n%s", dump)
	}
}

// spreadsUniformly makes 600 HTTP requests to vip, a Service over the
// three backends, from the client, each on a new connection, and checks
// that the picks are uniform and that every one was a new per-packet
// translation.
//
// Each count is Binomial(600, 1/3), mean 200, standard deviation
// sqrt(600*1/3*2/3) = 11.5. [130, 270] is mean +- 70, i.e. +- 6 standard
// deviations: a fair picker falls outside with probability about 3 * 2e-9,
// while a picker that skips a backend (0), favours one (e.g. 1/2 -> 300)
// or never picks the last slot fails it.
func (e *env) spreadsUniformly(t *testing.T, vip string) {
	t.Helper()
	const n = 600
	before := e.counters(t)["tc_dnat_new"]
	counts := e.spread(t, vip, n)
	t.Logf("distribution over %d connections to %s: %v", n, vip, counts)
	total := 0
	for _, b := range e.backends {
		total += counts[b]
		if c := counts[b]; c < 130 || c > 270 {
			t.Errorf("%s answered %d of %d connections, want 130..270", b, c, n)
		}
	}
	if total != n {
		t.Errorf("answers from unknown backends: %v", counts)
	}
	// Every connection was a new per-packet translation (either family's
	// counts as tc_dnat_new).
	if got := e.counters(t)["tc_dnat_new"] - before; got < n {
		t.Errorf("sluicectl counters: tc_dnat_new grew by %d, want >= %d", got, n)
	}
}

// allBackendsAnswered fails t unless every backend, and no other, is in
// seen (answers per backend to what: a mode and a VIP).
func (e *env) allBackendsAnswered(t *testing.T, what string, seen map[string]int) {
	t.Helper()
	t.Logf("%s distribution: %v", what, seen)
	total := 0
	for _, b := range e.backends {
		total += seen[b]
		if seen[b] == 0 {
			t.Errorf("%s never answered %s: %v", b, what, seen)
		}
	}
	for who, n := range seen {
		if !slices.Contains(e.backends, who) {
			t.Errorf("%d answers to %s from %q, no backend", n, what, who)
		}
	}
}

// udpReachesAll sends 60 datagrams to vip from the client (udpFromClient),
// each on a new socket: a new flow and a new pick. With 60 flows a
// backend is missed with probability 3 * (2/3)^60 < 1e-10.
func (e *env) udpReachesAll(t *testing.T, vip string) {
	t.Helper()
	e.allBackendsAnswered(t, "UDP "+vip, e.udpFromClient(t, vip, 60))
}

// socketLBFromNodeCgroup checks socket load balancing to web (TCP HTTP)
// and dns (UDP echo), Services of one family over the three backends,
// from the node: a process outside the agent's cgroup gets no
// translation, the node having no route to the service range at all;
// a client process started in the node namespace and the cgroup reaches
// every backend through the VIP, over TCP (connect, getpeername) and UDP
// (sendmsg, recvmsg), and sees the VIP as its peer. Each of 60 exchanges
// picks anew: a backend is missed with probability 3*(2/3)^60 < 1e-10.
func (e *env) socketLBFromNodeCgroup(t *testing.T, web, dns string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	if c, err := e.lb.Node.DialContext(ctx, network("tcp", web), web); err == nil {
		c.Close()
		t.Fatalf("a socket outside the cgroup reached %s", web)
	}
	before := e.counters(t)["sock_xlate"]
	for _, c := range []struct{ mode, vip string }{{"tcp", web}, {"udp", dns}} {
		e.allBackendsAnswered(t, "socket LB "+c.mode+" "+c.vip, e.cgroupSpread(t, c.mode, c.vip, 60))
	}
	// The socket programs counted every exchange they translated (either
	// family's counts as sock_xlate).
	if n := e.counters(t)["sock_xlate"] - before; n < 120 {
		t.Errorf("sluicectl counters: sock_xlate grew by %d, want >= 120", n)
	}
}

// cleanupRemovesEverything stops the agent and runs `sluice cleanup`, and
// checks that this removed everything: the pins (<bpffs>/sluice), and with
// them the kernel's maps pinned as prefix* ("sluice_" for IPv4's maps,
// "sluice6_" for IPv6's) and the programs in those that are program
// arrays (IPv6's tc and XDP programs, which the attached entries
// tail-call); the programs on the cgroup; every one of vips, which no
// longer answers. Then it removes the BPFFS directory, as the agent's own
// cleanup does.
func (e *env) cleanupRemovesEverything(t *testing.T, prefix string, vips ...string) {
	t.Helper()
	dir := filepath.Join(e.agent.BPFFS, "sluice")
	objs := kernelObjects(t, dir, prefix)
	if err := e.agent.Stop(); err != nil {
		t.Fatalf("agent stop: %v", err)
	}
	if err := e.agent.Uninstall(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s still present after sluice cleanup (stat: %v)", dir, err)
	}
	// The kernel frees an object once its last reference goes, after a
	// grace period (RCU's: seconds on a loaded machine).
	start := time.Now()
	testutil.Eventually(t, "the kernel to free what was pinned as "+prefix+"*", 30*time.Second, func() error {
		var left []string
		for _, o := range objs {
			if exec.Command("bpftool", o.kind, "show", "id", fmt.Sprint(o.id)).Run() == nil {
				left = append(left, o.what)
			}
		}
		if len(left) > 0 {
			return fmt.Errorf("still loaded: %v", left)
		}
		return nil
	})
	t.Logf("%d maps and programs freed %v after sluice cleanup", len(objs), time.Since(start).Round(time.Millisecond))
	// Untranslated, a VIP leads nowhere: the node has no route for it.
	for _, vip := range vips {
		if who, err := e.get(vip); err == nil {
			t.Errorf("%s still answered (by %s) after cleanup", vip, who)
		}
	}
	if out, err := exec.Command("bpftool", "cgroup", "show", e.cgroup).CombinedOutput(); err == nil && strings.TrimSpace(string(out)) != "" {
		t.Errorf("programs still attached to %s:\n%s", e.cgroup, out)
	}
	if err := e.agent.Cleanup(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// kernelObject is a map or program the kernel holds: bpftool's kind
// ("map", "prog"), its id, and what it is, for messages.
type kernelObject struct {
	kind, what string
	id         int
}

// kernelObjects returns the maps pinned in dir as prefix*, and the
// programs in those that are program arrays; it fails t if there are
// none.
func kernelObjects(t *testing.T, dir, prefix string) []kernelObject {
	t.Helper()
	pins, err := filepath.Glob(filepath.Join(dir, prefix+"*"))
	if err != nil || len(pins) == 0 {
		t.Fatalf("no maps pinned as %s%s* (%v)", dir+"/", prefix, err)
	}
	var objs []kernelObject
	for _, pin := range pins {
		var m struct {
			ID   int    `json:"id"`
			Type string `json:"type"`
		}
		out, err := exec.Command("bpftool", "-j", "map", "show", "pinned", pin).Output()
		if err == nil {
			err = json.Unmarshal(out, &m)
		}
		if err != nil {
			t.Fatalf("bpftool map show pinned %s: %v", pin, err)
		}
		objs = append(objs, kernelObject{kind: "map", what: filepath.Base(pin), id: m.ID})
		if m.Type != "prog_array" {
			continue
		}
		var entries []struct {
			Formatted struct {
				Value int `json:"value"`
			} `json:"formatted"`
		}
		out, err = exec.Command("bpftool", "-j", "map", "dump", "pinned", pin).Output()
		if err == nil {
			err = json.Unmarshal(out, &entries)
		}
		if err != nil {
			t.Fatalf("bpftool map dump pinned %s: %v: %s", pin, err, out)
		}
		for _, en := range entries {
			id := en.Formatted.Value
			objs = append(objs, kernelObject{kind: "prog", what: fmt.Sprintf("program %d in %s", id, filepath.Base(pin)), id: id})
		}
	}
	return objs
}

// stopUnderTraffic reads the datapath's state, starts HTTP requests to
// vip from the client, one at a time, and stops the agent, which must exit
// cleanly on SIGTERM. It returns the state read and the requests, which go
// on until restartUnchanged (or the test's end) stops them.
func (e *env) stopUnderTraffic(t *testing.T, vip string) (before string, traffic *testutil.Traffic) {
	t.Helper()
	before, err := e.agent.Services(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	traffic = testutil.StartTraffic(1, func() error {
		_, err := e.get(vip)
		return err
	})
	t.Cleanup(traffic.Stop)
	if err := e.agent.Stop(); err != nil {
		t.Fatalf("agent did not exit cleanly on SIGTERM: %v", err)
	}
	return before, traffic
}

// restartUnchanged starts the agent stopUnderTraffic stopped and waits
// until it is ready: the datapath must be as before, and every request
// of traffic, which it stops, must have succeeded.
func (e *env) restartUnchanged(t *testing.T, before string, traffic *testutil.Traffic) {
	t.Helper()
	if err := e.agent.Start(); err != nil {
		t.Fatal(err)
	}
	if err := e.agent.WaitReady(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	traffic.Stop()
	after, err := e.agent.Services(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Errorf("restart changed the datapath:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if n := traffic.Failed(); n > 0 || traffic.OK() == 0 {
		t.Errorf("%d of %d requests failed across stop and restart; first: %v", n, n+traffic.OK(), traffic.FirstErr())
	}
}

func TestClusterIPEndToEnd(t *testing.T) {
	e := setup(t)

	t.Run("ReadyAndProgrammed", func(t *testing.T) {
		e.readyAndProgrammed(t, []string{webVIP + "/TCP", dnsVIP + "/UDP", echoVIP + "/TCP", drainVIP + "/TCP"}, 4, 9)
	})

	t.Run("MalformedObjectReportedRestApplied", func(t *testing.T) {
		// The rest was applied: ReadyAndProgrammed saw all four frontends.
		e.malformedReported(t, "default/broken", "10.96.0.300")
	})

	t.Run("TCPSpreadsUniformly", func(t *testing.T) { e.spreadsUniformly(t, webVIP) })

	t.Run("UDPNamedTargetPort", func(t *testing.T) { e.udpReachesAll(t, dnsVIP) })

	var keep *topology.EchoConn // an established connection that outlives later changes
	t.Run("RemovedBackendKeepsEstablishedConnection", func(t *testing.T) {
		removed := e.backends[2]
		var onRemoved *topology.EchoConn
		onRemoved, keep = e.echoOnAndBeside(t, echoVIP, removed)
		defer onRemoved.Close()

		e.write(t, e.addrs[:2], e.addrs)
		e.waitServices(t, echoVIP, func(l string) bool {
			return !strings.Contains(l, e.addrs[2]) && strings.Count(l, ":9000") == 3 // frontend + 2 backends
		})
		for i := range 60 {
			c := e.dialEcho(t)
			c.Close()
			if c.Backend == removed {
				t.Fatalf("new connection %d reached removed backend %s", i, removed)
			}
		}
		if who, err := onRemoved.Say("still there"); err != nil || who != removed {
			t.Errorf("established connection to %s after its removal: backend %q, err %v", removed, who, err)
		}
	})

	t.Run("EmptiedServiceRefusesFast", func(t *testing.T) {
		if _, err := e.get(drainVIP); err != nil {
			t.Fatalf("drain service before emptying: %v", err)
		}
		e.write(t, e.addrs[:2], nil)
		e.waitServices(t, drainVIP, func(l string) bool { return strings.Contains(l, "(none") })
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		start := time.Now()
		c, err := e.lb.Client.DialContext(ctx, "tcp4", drainVIP)
		took := time.Since(start)
		if err == nil {
			c.Close()
			t.Fatalf("connected to %s, which has no endpoints", drainVIP)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("connect to emptied service: %v, want connection refused or reset", err)
		}
		// The errno tells a refusal from a black hole (which would end in
		// the context deadline); how long it took is only logged, since
		// the machines are shared and noisy.
		t.Logf("connect to the emptied service failed after %v: %v", took, err)
		if t.Failed() {
			counters, _ := e.agent.Counters(t.Context())
			t.Logf("datapath counters:\n%s", counters)
		}
	})

	t.Run("SocketLBFromNodeCgroup", func(t *testing.T) { e.socketLBFromNodeCgroup(t, webVIP, dnsVIP) })

	t.Run("SurvivesAgentStopAndRestart", func(t *testing.T) {
		if keep == nil {
			t.Skip("no established connection from the earlier subtest")
		}
		before, traffic := e.stopUnderTraffic(t, webVIP)
		// Requests go on succeeding while no agent runs.
		down := traffic.OK()
		testutil.Eventually(t, "20 requests to succeed while the agent is stopped", 10*time.Second, func() error {
			if n := traffic.OK() - down; n < 20 {
				return fmt.Errorf("only %d requests succeeded (%d failed)", n, traffic.Failed())
			}
			return nil
		})
		if who, err := keep.Say("agent down"); err != nil || who != keep.Backend {
			t.Errorf("established connection while the agent is down: %q %v", who, err)
		}
		if _, err := os.Stat(filepath.Join(e.agent.BPFFS, "sluice", "sluice_services_v2")); err != nil {
			t.Errorf("pins gone after SIGTERM: %v", err)
		}

		e.restartUnchanged(t, before, traffic)
		if who, err := keep.Say("agent back"); err != nil || who != keep.Backend {
			t.Errorf("established connection after restart: %q %v", who, err)
		}
		keep.Close()
	})

	t.Run("CleanupRemovesEverything", func(t *testing.T) { e.cleanupRemovesEverything(t, "sluice_", webVIP) })
}

// TestReadyzFollowsDesiredState: /readyz is 200 once everything of the
// newest desired state that fits the maps is programmed. A frontend that
// does not fit (one more than --max-services) is reported, in /readyz
// (named on the metrics address) and /metrics, not waited for: the others are programmed and the agent is
// ready. Once the file is fixed the report goes away.
func TestReadyzFollowsDesiredState(t *testing.T) {
	bins, topo, lb := newLB(t, 1)
	manifest := filepath.Join(t.TempDir(), "services.yaml")
	write := func(n int) {
		var docs []string
		for i := 1; i <= n; i++ {
			docs = append(docs, agentproc.Service{
				Name: fmt.Sprintf("svc%d", i), ClusterIP: fmt.Sprintf("10.96.1.%d", i),
				Endpoints: []string{lb.BackendAddrs[0].String()},
				Ports:     []agentproc.Port{agentproc.TCP("http", 80, 8080)},
			}.YAML())
		}
		if err := agentproc.WriteFile(manifest, agentproc.Manifest(docs...)); err != nil {
			t.Fatal(err)
		}
	}
	write(2)
	agent := agentproc.StartAgent(t, bins, lb.Node, agentproc.AgentConfig{
		Manifests: manifest,
		BPFFS:     filepath.Join(testutil.BPFFS, topo.Prefix()+"readyz"),
		Extra:     []string{"--max-services", "3"},
	}, 30*time.Second)

	write(4) // one more frontend than sluice_rev_nat holds
	const unprogrammed = `sluice_service_unprogrammed_frontends{reason="capacity",service="default/svc4:http"} 1`
	testutil.Eventually(t, "the frontend that does not fit to be reported", 10*time.Second, func() error {
		m, err := agent.Metrics()
		if err != nil {
			return err
		}
		if !strings.Contains(m, unprogrammed) || !strings.Contains(m, "\nsluice_services 3\n") {
			return errors.New("/metrics lacks svc4's failure or 3 programmed frontends")
		}
		return nil
	})
	// It stays ready: the three that fit are programmed, and retrying the
	// fourth cannot help until something changes.
	time.Sleep(time.Second)
	// The metrics address names it (?verbose); the health address, on
	// every address of a node, only counts it.
	body, err := agent.Get(agent.MetricsAddr, "/readyz?verbose")
	if err != nil {
		t.Fatalf("/readyz?verbose with one frontend that does not fit: %v", err)
	}
	if !strings.Contains(body, "default/svc4:http") || !strings.Contains(body, "capacity") {
		t.Errorf("/readyz?verbose does not report svc4:\n%s", body)
	}
	if body, err := agent.Get(agent.HealthAddr, "/readyz"); err != nil || strings.Contains(body, "svc4") || !strings.Contains(body, "not programmed: 1 frontends of 1 Services") {
		t.Errorf("health address /readyz: %q, %v; want 1 frontend of 1 Service counted, not named", body, err)
	}

	write(3)
	eventuallyReadyWithoutReports(t, agent, "the report to go once the manifest is fixed")
	m, err := agent.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(m, "\nsluice_services 3\n") || strings.Contains(m, "sluice_service_unprogrammed_frontends{") {
		t.Errorf("/metrics does not report 3 programmed frontends and no failure")
	}
}

// eventuallyReadyWithoutReports waits until /readyz answers exactly
// "ok\n": ready, and no frontend reported as not programmed.
func eventuallyReadyWithoutReports(t *testing.T, agent *agentproc.Agent, what string) {
	t.Helper()
	testutil.Eventually(t, what, 15*time.Second, func() error {
		body, err := agent.Get(agent.HealthAddr, "/readyz")
		if err != nil {
			return err
		}
		if body != "ok\n" {
			return fmt.Errorf("/readyz: %q", body)
		}
		return nil
	})
}

// TestOversizedServiceDoesNotBlockOthers: a Service with more endpoints
// than the service map has room for (--max-service-entries) is not
// programmed; the good Services beside it are, and answer; the agent is
// ready and names the oversized one in /readyz, in /metrics and in one log
// line. Shrunk to fit, it is programmed too. One of each family, big and
// big6 (IPv6 only, in the IPv6 map of the same size), good and good6:
// neither oversized Service blocks a Service of either family, and each
// family's Services are counted against their own family's map.
func TestOversizedServiceDoesNotBlockOthers(t *testing.T) {
	bins, topo, lb := newLB(t, 2)
	v6 := lb.AddIPv6T(t)
	backends, err := lb.ServeHTTP(8080, "backend-")
	if err != nil {
		t.Fatal(err)
	}
	var addrs6 []string
	for _, a := range v6.BackendAddrs {
		addrs6 = append(addrs6, a.String())
	}
	manifest := filepath.Join(t.TempDir(), "services.yaml")
	http := []agentproc.Port{agentproc.TCP("http", 80, 8080)}
	write := func(bigEndpoints int) {
		eps, eps6 := slices.Clone(lb.BackendAddrStrings()), slices.Clone(addrs6)
		for i := len(eps); i < bigEndpoints; i++ {
			// They answer nothing; never chosen while big is unprogrammed.
			eps = append(eps, fmt.Sprintf("10.244.9.%d", i+1))
			eps6 = append(eps6, fmt.Sprintf("2001:db8:244:9::%d", i+1))
		}
		docs := agentproc.Services(
			agentproc.Service{Name: "big", ClusterIP: "10.96.2.1", Endpoints: eps, Ports: http},
			agentproc.Service{Name: "good", ClusterIP: "10.96.2.2", Endpoints: lb.BackendAddrStrings(), Ports: http},
			agentproc.Service{Name: "big6", ClusterIP: "2001:db8:96::201", Endpoints: eps6, Ports: http},
			agentproc.Service{Name: "good6", ClusterIP: "2001:db8:96::202", Endpoints: addrs6, Ports: http},
		)
		if err := agentproc.WriteFile(manifest, agentproc.Manifest(docs...)); err != nil {
			t.Fatal(err)
		}
	}
	// 16 service entries in each family's map: good takes 3 (master
	// and 2 slots), big would take 41; the same in the IPv6 map. Shrunk,
	// big and good take 9 of their map's 16, and big6 and good6 9 of
	// theirs: they fit only counted per family (18 together).
	write(40)
	agent := agentproc.StartAgent(t, bins, lb.Node, agentproc.AgentConfig{
		Manifests: manifest,
		Devices:   []string{lb.NodeDev},
		BPFFS:     filepath.Join(testutil.BPFFS, topo.Prefix()+"oversized"),
		Extra:     []string{"--max-service-entries", "16"},
	}, 30*time.Second)

	for _, good := range []string{"10.96.2.2:80", "[2001:db8:96::202]:80"} {
		who, err := topology.WhoAnswered(lb.Client.HTTPClient(3*time.Second), "http://"+good+"/")
		if err != nil || !slices.Contains(backends, who) {
			t.Fatalf("the good Service at %s: answer %q, %v; want one of %v", good, who, err, backends)
		}
	}
	body, err := agent.Get(agent.MetricsAddr, "/readyz?verbose")
	if err != nil {
		t.Fatalf("/readyz?verbose: %v", err)
	}
	m, err := agent.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	dump, _ := agent.Services(t.Context())
	time.Sleep(time.Second) // resyncs and retries, if any, would log again
	logged := agent.Log.String()
	// (How many are in use depends on whether good was programmed first.)
	for _, big := range []struct {
		name, frontend string
		full           []string
	}{
		{"default/big:http", "10.96.2.1:80", []string{"41 new IPv4 service entries: ", " in use of 16 (--max-service-entries)"}},
		{"default/big6:http", "[2001:db8:96::201]:80", []string{"41 new IPv6 service entries: ", " in use of 16 (--max-service-entries)"}},
	} {
		if !strings.HasPrefix(body, "ok\n") || !strings.Contains(body, big.name) || !strings.Contains(body, "capacity") {
			t.Errorf("/readyz body does not report %s for capacity:\n%s", big.name, body)
		}
		for _, full := range big.full {
			if !strings.Contains(body, full) {
				t.Errorf("/readyz body does not say %q:\n%s", full, body)
			}
		}
		if want := fmt.Sprintf(`sluice_service_unprogrammed_frontends{reason="capacity",service=%q} 1`, big.name); !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
		if strings.Contains(dump, big.frontend) {
			t.Errorf("the oversized Service %s is programmed:\n%s", big.name, dump)
		}
		n := 0
		for _, l := range strings.Split(logged, "\n") {
			if strings.Contains(l, "service not programmed") && strings.Contains(l, big.name+" ") {
				n++
			}
		}
		if n != 1 {
			t.Errorf("the oversized Service %s was logged %d times, want once", big.name, n)
		}
	}
	if n := strings.Count(logged, "service not programmed"); n != 2 {
		t.Errorf("%d Services logged as not programmed, want the 2 oversized ones", n)
	}

	write(5) // 6 entries: they fit now
	eventuallyReadyWithoutReports(t, agent, "the shrunk Services to be programmed")
	dump, _ = agent.Services(t.Context())
	for _, fe := range []string{"10.96.2.1:80", "[2001:db8:96::201]:80"} {
		if !strings.Contains(dump, fe) {
			t.Errorf("the shrunk Service at %s is not programmed:\n%s", fe, dump)
		}
	}
}
