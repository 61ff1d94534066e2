// Package lifecycle proves, with the real agent and real traffic, that a
// node's datapath can change under load without a connection lost: an
// upgrade from the previous release's binary to this one, a resize of the
// conntrack table of a running node, and a change of configuration whose
// attachments follow it (issue 11: "Upgrade and resize without
// disruption", "Attachments follow the configuration").
//
//	client ns --veth--> node ns (sluice: tc on eth0, socket LB on a test
//	                    cgroup, pins under a per-test bpffs dir)
//	                    --veth--> backend1..3 ns (HTTP :8080, UDP and TCP echo)
//
// The load is per-packet (tc): new HTTP connections and new UDP flows
// from the client namespace, one after the other in a few workers, plus
// long-lived TCP connections opened before the change and during it, and
// used after it.
// The agent is stopped and a new one started while the load runs.
package lifecycle

import (
	"archive/tar"
	"bytes"
	"context"
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
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/agentproc"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/datapath"
)

func TestMain(m *testing.M) {
	code := agentproc.RunTests(m)
	builtAgents.Lock()
	for _, b := range builtAgents.by {
		if b.dir != "" {
			_ = os.RemoveAll(b.dir) // a temporary directory; the exit code stands
		}
	}
	builtAgents.Unlock()
	os.Exit(code)
}

// previousRelease is the last landed release, whose agent the upgrade
// starts from. Its BPF objects are committed with it, so its tree builds
// the agent it shipped.
const previousRelease = "6dde642"

// servicesV1Commit is the last commit whose agent kept the backend slots
// in the services maps (sluice_services_v1) before they moved to the
// slots arrays (issue 14, forty-third pass): the upgrade from it converts
// those maps under load.
const servicesV1Commit = "7f1b7c4"

// builtAgent is an agent built from a commit's tree, once per test
// process.
type builtAgent struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

var builtAgents = struct {
	sync.Mutex
	by map[string]*builtAgent
}{by: map[string]*builtAgent{}}

// previousAgent builds the previous release's agent from its tree (git
// archive of the commit, go build ./cmd/sluice), once per test process,
// with GOFLAGS=-mod=readonly (its modules are a subset of this tree's, in
// the module cache after make deps; the Go module proxy is asked only for
// what the cache lacks): about 12 s with a warm build cache.
// SLUICE_PREVIOUS_AGENT names a binary built already. A clone without the
// commit (a shallow one) cannot run the upgrade test: it fails, naming the
// fix (a full clone, or SLUICE_PREVIOUS_AGENT).
func previousAgent(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("SLUICE_PREVIOUS_AGENT"); bin != "" {
		return bin
	}
	return agentAt(t, previousRelease, "SLUICE_PREVIOUS_AGENT")
}

// agentAt builds the agent of commit as previousAgent does (env names the
// variable that gives a binary built already, for the error).
func agentAt(t *testing.T, commit, env string) string {
	t.Helper()
	builtAgents.Lock()
	ba := builtAgents.by[commit]
	if ba == nil {
		ba = &builtAgent{}
		builtAgents.by[commit] = ba
	}
	builtAgents.Unlock()
	ba.once.Do(func() {
		ctx := context.Background()
		root, err := testutil.ModuleRoot(ctx)
		if err != nil {
			ba.err = err
			return
		}
		if ba.dir, ba.err = os.MkdirTemp("", "sluice-"+commit+"-"); ba.err != nil {
			return
		}
		src := filepath.Join(ba.dir, "src")
		archive, err := exec.CommandContext(ctx, "git", "-C", root, "archive", "--format=tar", commit).Output()
		if err != nil {
			ba.err = fmt.Errorf("git archive %s: %w (a shallow clone lacks it: clone the whole history, or set %s to its agent binary)", commit, err, env)
			return
		}
		if ba.err = untar(archive, src); ba.err != nil {
			return
		}
		ba.bin = filepath.Join(ba.dir, "sluice")
		if err := agentproc.GoBuild(ctx, src, "./cmd/sluice", ba.bin, "GOFLAGS=-mod=readonly"); err != nil {
			ba.err = fmt.Errorf("build the agent of %s: %w", commit, err)
		}
	})
	if ba.err != nil {
		t.Fatal(ba.err)
	}
	return ba.bin
}

func untar(b []byte, dir string) error {
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)&0o777)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := os.Symlink(h.Linkname, p); err != nil {
				return err
			}
		}
	}
}

// The Services' ClusterIPs: HTTP (web :80, backends' :8080), UDP echo
// (dns :53, backends' :5353) and TCP line echo (echo :9000, backends'
// :9000); over IPv6, their twins in topology.ServiceRange6.
var vips = map[bool]struct{ web, dns, echo string }{
	false: {"10.96.0.10", "10.96.0.11", "10.96.0.12"},
	true:  {"2001:db8:96::10", "2001:db8:96::11", "2001:db8:96::12"},
}

type env struct {
	lb       *topology.LB
	manifest string
	cgroup   string
	bpffs    string
	topo     *topology.Topology
	v6       bool     // the Services and the load are IPv6 (setupFamily)
	addrs    []string // the backends' addresses in the test's family
}

// The Services' addresses, in the family of the test.
func (e *env) webVIP() string  { return net.JoinHostPort(vips[e.v6].web, "80") }
func (e *env) dnsVIP() string  { return net.JoinHostPort(vips[e.v6].dns, "53") }
func (e *env) echoVIP() string { return net.JoinHostPort(vips[e.v6].echo, "9000") }

func setup(t *testing.T) *env { return setupFamily(t, false) }

// setupFamily builds the node, its backends and the Services, IPv6 ones
// over the LB's IPv6 plane (2001:db8::/32, inside the test's namespaces)
// if v6.
func setupFamily(t *testing.T, v6 bool) *env {
	t.Helper()
	testutil.Privileged(t)
	testutil.NeedBPFFS(t)
	testutil.NeedCommands(t, "nsenter")
	cgMount, err := datapath.CgroupV2Mount()
	if err != nil {
		t.Fatalf("no cgroup v2 mount: %v", err)
	}
	topo := topology.NewT(t)
	lb := topo.BuildLBT(t, 3)
	e := &env{lb: lb, manifest: filepath.Join(t.TempDir(), "services.yaml"), topo: topo,
		bpffs: filepath.Join(testutil.BPFFS, topo.Prefix()+"lifecycle"), v6: v6}
	addrs := lb.BackendAddrStrings()
	if v6 {
		addrs = lb.AddIPv6T(t).BackendAddrStrings()
	}
	names, err := lb.ServeHTTP(8080, "backend-")
	if err != nil {
		t.Fatal(err)
	}
	if err := lb.ServeEchoes(9000, 5353, names); err != nil {
		t.Fatal(err)
	}
	cg, err := topo.AddCgroup(cgMount, "sluice")
	if err != nil {
		t.Fatal(err)
	}
	e.cgroup = cg.Path
	e.addrs = addrs
	e.writeServices(t)
	return e
}

// writeServices writes the manifest: web, dns and echo, on the backends'
// addresses of the test's family, and extra.
func (e *env) writeServices(t *testing.T, extra ...agentproc.Service) {
	t.Helper()
	docs := agentproc.Services(append([]agentproc.Service{
		{Name: "web", ClusterIP: vips[e.v6].web, Endpoints: e.addrs, Ports: []agentproc.Port{agentproc.TCP("http", 80, 8080)}},
		{Name: "dns", ClusterIP: vips[e.v6].dns, Endpoints: e.addrs, Ports: []agentproc.Port{agentproc.UDP("dns", 53, 5353)}},
		{Name: "echo", ClusterIP: vips[e.v6].echo, Endpoints: e.addrs, Ports: []agentproc.Port{agentproc.TCP("echo", 9000, 9000)}},
	}, extra...)...)
	if err := agentproc.WriteFile(e.manifest, agentproc.Manifest(docs...)); err != nil {
		t.Fatal(err)
	}
}

// agent prepares an agent of bin on the node, attached to eth0 and the
// test cgroup, with extra flags; its teardown (with this build's cleanup)
// is registered with t.
func (e *env) agent(t *testing.T, bin agentproc.Binaries, devices []string, extra ...string) *agentproc.Agent {
	t.Helper()
	a := agentproc.NewAgent(bin, e.lb.Node, agentproc.AgentConfig{
		Manifests: e.manifest, Devices: devices, Cgroup: e.cgroup, BPFFS: e.bpffs, Extra: extra,
	})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent log:\n%s", a.Log.String())
		}
		a.Bin = agentproc.Shared(t) // this build's cleanup removes either release's pins
		if err := a.Teardown(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return a
}

// load is the traffic kept up across a change.
type load struct {
	http, udp, opener *testutil.Traffic
	long              []*topology.EchoConn

	mu       sync.Mutex
	failures []string // when each request failed, and why
	start    time.Time
	// opened are the long-lived connections opened while the load ran
	// (opener): some by the old agent's programs after the new agent
	// copied the tables, used again once the new programs run.
	opened []*topology.EchoConn
}

// record notes a failed request, with when it failed since the load began.
func (l *load) record(what string, started time.Time, err error) error {
	if err != nil {
		l.mu.Lock()
		l.failures = append(l.failures, fmt.Sprintf("%s started at +%v (%s), failed at +%v: %v",
			what, started.Sub(l.start).Round(time.Millisecond), started.UTC().Format("15:04:05.000"),
			time.Since(l.start).Round(time.Millisecond), err))
		l.mu.Unlock()
	}
	return err
}

// startLoad starts 3 workers of HTTP requests (a new connection each) and
// one of UDP exchanges (a new socket, a new flow, each) from the client
// through the node, each pausing pause between two, opens 6 long-lived TCP
// connections, and starts a worker that opens another one every 100 ms
// (stop uses them all again). (Every flow holds conntrack entries for a
// while after it is done, 10 s for TCP and 60 s for UDP: a pause keeps
// their number within the sizes a test resizes to.)
func (e *env) startLoad(t *testing.T, pause time.Duration) *load {
	t.Helper()
	l := &load{start: time.Now()}
	for range 6 {
		l.long = append(l.long, e.dialEcho(t))
	}
	client := e.lb.Client.HTTPClient(3 * time.Second)
	l.http = testutil.StartTraffic(3, func() error {
		time.Sleep(pause)
		start := time.Now()
		_, err := topology.WhoAnswered(client, "http://"+e.webVIP()+"/")
		return l.record("HTTP", start, err)
	})
	l.udp = testutil.StartTraffic(1, func() error {
		time.Sleep(pause)
		start := time.Now()
		return l.record("UDP", start, e.udpExchange())
	})
	l.opener = testutil.StartTraffic(1, func() error {
		time.Sleep(100 * time.Millisecond)
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		c, err := e.lb.Client.DialEcho(ctx, e.echoVIP())
		if err == nil {
			l.mu.Lock()
			l.opened = append(l.opened, c)
			l.mu.Unlock()
		}
		return l.record("long-lived TCP", start, err)
	})
	return l
}

// udpExchange sends a datagram to the dns Service from a new socket and waits for
// the echo: one datagram, never resent (a lost one is a failure), waited
// for 10 s (a loaded machine, during an upgrade or a resize, may hold a
// reply for seconds; a lost one never comes).
func (e *env) udpExchange() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	network := "udp4"
	if e.v6 {
		network = "udp6"
	}
	c, err := e.lb.Client.DialContext(ctx, network, e.dnsVIP())
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte("ping")); err != nil {
		return err
	}
	buf := make([]byte, 256)
	n, err := c.Read(buf)
	if err != nil {
		return fmt.Errorf("UDP reply: %w", err)
	}
	if !strings.HasSuffix(string(buf[:n]), " ping") {
		return fmt.Errorf("UDP reply %q", buf[:n])
	}
	return nil
}

// stop stops the load and fails t if anything failed: a request, a UDP
// exchange, or a long-lived connection (which must still reach its own
// backend).
func (l *load) stop(t *testing.T, what string) {
	t.Helper()
	l.http.Stop()
	l.udp.Stop()
	l.opener.Stop()
	long := append(l.long, l.opened...)
	for i, c := range long {
		if who, err := c.Say(fmt.Sprintf("after %s", what)); err != nil || who != c.Backend {
			t.Errorf("long-lived connection %d of %d (to %s) after %s: %q, %v", i, len(long), c.Backend, what, who, err)
		}
		c.Close()
	}
	ok := l.http.OK() + l.udp.OK() + l.opener.OK()
	failed := l.http.Failed() + l.udp.Failed() + l.opener.Failed()
	t.Logf("%s under load: %d HTTP connections and %d UDP flows succeeded, %d and %d failed; %d long-lived connections kept (%d opened under load, %d failed to open)",
		what, l.http.OK(), l.udp.OK(), l.http.Failed(), l.udp.Failed(), len(long), len(l.opened), l.opener.Failed())
	if failed > 0 {
		first := l.http.FirstErr()
		if first == nil {
			first = l.udp.FirstErr()
		}
		if first == nil {
			first = l.opener.FirstErr()
		}
		l.mu.Lock()
		t.Errorf("%s: %d of %d connections failed; first: %v\n%s", what, failed, ok+failed, first, strings.Join(l.failures, "\n"))
		l.mu.Unlock()
	}
	if l.http.OK() == 0 || l.udp.OK() == 0 {
		t.Errorf("%s: no load (%d HTTP, %d UDP)", what, l.http.OK(), l.udp.OK())
	}
}

// dialEcho opens a long-lived connection to the echo service from the
// client.
func (e *env) dialEcho(t *testing.T) *topology.EchoConn {
	t.Helper()
	return e.lb.Client.MustDialEcho(t, e.echoVIP(), 3*time.Second)
}

// replace stops a (SIGTERM: it must exit cleanly) and starts it again with
// bin and args, while the load goes on, and waits for it to be ready.
func replace(t *testing.T, l *load, a *agentproc.Agent, bin agentproc.Binaries, args []string) {
	t.Helper()
	time.Sleep(2 * time.Second) // load on the old agent
	stop := time.Since(l.start)
	if err := a.Stop(); err != nil {
		t.Fatalf("agent did not exit cleanly: %v", err)
	}
	a.Bin, a.Args = bin, args
	start := time.Since(l.start)
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	if err := a.WaitReady(60 * time.Second); err != nil {
		t.Fatalf("%v\n%s", err, a.Log.String())
	}
	t.Logf("old agent stopped at +%v, new one started at +%v, ready at +%v", stop.Round(time.Millisecond),
		start.Round(time.Millisecond), time.Since(l.start).Round(time.Millisecond))
	time.Sleep(2 * time.Second) // load on the new agent
}

// withFlag returns args with --name=value in place of any --name there.
func withFlag(args []string, name, value string) []string {
	return append(withoutFlag(args, name), "--"+name+"="+value)
}

// withoutServiceColumn splits a `sluicectl services` table into the fields
// of each line, without the SERVICE column.
func withoutServiceColumn(table string) [][]string {
	var out [][]string
	col := -1
	for _, line := range strings.Split(strings.TrimSpace(table), "\n") {
		f := strings.Fields(line)
		if col < 0 {
			col = slices.Index(f, "SERVICE")
		}
		if col >= 0 && col < len(f) {
			f = slices.Delete(f, col, col+1)
		}
		out = append(out, f)
	}
	return out
}

// withoutFlag returns args without the flag name (--name value, or
// --name=value).
func withoutFlag(args []string, name string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		if args[i] == "--"+name {
			i++
			continue
		}
		if strings.HasPrefix(args[i], "--"+name+"=") {
			continue
		}
		out = append(out, args[i])
	}
	return out
}

// pinnedSize returns the size of the map pinned as name by the agent.
func (e *env) pinnedSize(t *testing.T, name string) uint32 {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(e.bpffs, "sluice", name), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	return m.MaxEntries()
}

// TestUpgradeFromPreviousRelease: the previous release's agent runs the
// node under load; it is stopped and this build's agent started on its
// pins. Its maps are renamed to this release's versioned names, its
// conntrack converted to this release's layout (and carried over, while
// the links are switched, by the migration shims), its programs replaced
// behind the same links. Not one connection fails, and the connections
// open across the upgrade stay on their backends.
func TestUpgradeFromPreviousRelease(t *testing.T) {
	e := setup(t)
	before, after := e.upgradeUnderLoad(t, previousAgent(t), previousRelease, "sluice_conntrack",
		func(args []string) []string {
			return withoutFlag(args, "names-file") // newer than the previous release
		})
	// The previous release writes no Service names (the SERVICE column is
	// "-" until the new agent writes them): the maps are what must not
	// change.
	if !slices.EqualFunc(withoutServiceColumn(after), withoutServiceColumn(before), slices.Equal) {
		t.Errorf("services changed across the upgrade:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	for _, name := range []string{"sluice_conntrack", "sluice_services", "sluice_affinity"} {
		if _, err := os.Stat(filepath.Join(e.bpffs, "sluice", name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("pin %s of the previous release still there (%v)", name, err)
		}
	}
	if _, err := os.Stat(filepath.Join(e.bpffs, "sluice", "sluice_conntrack_v2")); err != nil {
		t.Errorf("no sluice_conntrack_v2 after the upgrade: %v", err)
	}
}

// upgradeUnderLoad runs the node on the agent bin (of commit, its
// arguments this build's agent's changed by prevArgs, if not nil) until
// it is ready with its pins (pin one of them), then replaces it under
// load with this build's agent: what `sluicectl services` said before and
// after.
func (e *env) upgradeUnderLoad(t *testing.T, bin, commit, pin string, prevArgs func([]string) []string) (before, after string) {
	t.Helper()
	cur := agentproc.Shared(t)
	a := e.agent(t, agentproc.Binaries{Sluice: bin, Sluicectl: cur.Sluicectl}, []string{e.lb.NodeDev})
	args := a.Args
	if prevArgs != nil {
		a.Args = prevArgs(args)
	}
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	if err := a.WaitReady(60 * time.Second); err != nil {
		t.Fatalf("%v\n%s", err, a.Log.String())
	}
	before, err := a.Services(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(e.bpffs, "sluice", pin)); err != nil {
		t.Fatalf("the pins of %s are not there: %v", commit, err)
	}

	l := e.startLoad(t, 0)
	replace(t, l, a, cur, args)
	l.stop(t, "upgrade from "+commit)

	if after, err = a.Services(t.Context()); err != nil {
		t.Fatal(err)
	}
	return before, after
}

// TestUpgradeFromServicesV1: the agent of the last commit that kept the
// backend slots in the services maps (servicesV1Commit, pins
// sluice_services_v1) runs the node under load; this build's agent,
// started on its pins, converts them into sluice_services_v2 and the
// slots arrays (pkg/datapath's convertServices), and its reverse-NAT
// hashes into the arrays (convertRevNat), the Services, their service and
// backend ids unchanged, and not one connection fails.
// SLUICE_SERVICES_V1_AGENT names that agent built already.
func TestUpgradeFromServicesV1(t *testing.T) {
	e := setup(t)
	bin := os.Getenv("SLUICE_SERVICES_V1_AGENT")
	if bin == "" {
		bin = agentAt(t, servicesV1Commit, "SLUICE_SERVICES_V1_AGENT")
	}
	before, after := e.upgradeUnderLoad(t, bin, servicesV1Commit, "sluice_services_v1", nil)
	if after != before {
		t.Errorf("services changed across the upgrade:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	for name, there := range map[string]bool{"sluice_services_v1": false, "sluice6_services_v1": false,
		"sluice_services_v2": true, "sluice_slots_v1": true, "sluice6_services_v2": true, "sluice6_slots_v1": true,
		// And its reverse-NAT hashes into the arrays (convertRevNat).
		"sluice_rev_nat_v1": false, "sluice6_rev_nat_v1": false, "sluice_rev_nat_v2": true, "sluice6_rev_nat_v2": true} {
		if _, err := os.Stat(filepath.Join(e.bpffs, "sluice", name)); (err == nil) != there {
			t.Errorf("after the upgrade, pin %s: %v (want there: %v)", name, err, there)
		}
	}
}

// TestConntrackResizeUnderLoad: a running node's --max-conntrack (and
// --max-conntrack-new) changes, up and then down, under load: each agent
// started with the new size migrates the table (new map, entries copied,
// pin swapped, programs replaced through their links, the flows added
// meanwhile carried over) and not one connection fails. Before, the agent
// refused to start until `sluice cleanup` dropped every flow. The same
// over IPv6, whose tables are resized with IPv4's (before the IPv6
// migration shims, the IPv6 flows the previous agent started during the
// switch were lost from the new table and their connections failed).
func TestConntrackResizeUnderLoad(t *testing.T) {
	forFamilies(t, testConntrackResizeUnderLoad)
}

// forFamilies runs f as a subtest over IPv4, then over IPv6 (v6).
func forFamilies(t *testing.T, f func(t *testing.T, v6 bool)) {
	for _, v6 := range []bool{false, true} {
		t.Run(map[bool]string{false: "IPv4", true: "IPv6"}[v6], func(t *testing.T) { f(t, v6) })
	}
}

func testConntrackResizeUnderLoad(t *testing.T, v6 bool) {
	e := setupFamily(t, v6)
	cur := agentproc.Shared(t)
	ct, ctNew := "sluice_conntrack_v2", "sluice_ct_new_v1"
	if v6 {
		ct, ctNew = "sluice6_conntrack_v1", "sluice6_ct_new_v1"
	}
	a := e.agent(t, cur, []string{e.lb.NodeDev}, "--max-conntrack=65536")
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	if err := a.WaitReady(60 * time.Second); err != nil {
		t.Fatalf("%v\n%s", err, a.Log.String())
	}
	for _, step := range []struct {
		flag, value string
		mapName     string
		size        uint32
	}{
		{"max-conntrack", "131072", ct, 131072},
		{"max-conntrack", "98304", ct, 98304},
		{"max-conntrack-new", "16384", ctNew, 16384},
	} {
		what := fmt.Sprintf("--%s=%s", step.flag, step.value)
		l := e.startLoad(t, 2*time.Millisecond)
		replace(t, l, a, cur, withFlag(a.Args, step.flag, step.value))
		l.stop(t, what)
		if got := e.pinnedSize(t, step.mapName); got != step.size {
			t.Errorf("after %s, %s has %d entries", what, step.mapName, got)
		}
	}
}

// TestAttachmentsFollowConfiguration (C3): an agent that ran with two
// devices, XDP and socket load balancing is replaced by one with one
// device, --xdp=off and --socket-lb=false: the dropped device, XDP and the
// cgroup programs of both families are detached, the IPv6 XDP program's
// array (sluice6_xdp_v1) unpinned, the IPv6 tc programs' array
// (sluice6_tc_v1) holds the new agent's programs, and traffic through the
// device kept goes on: IPv4 traffic, then (the IPv6 subtest) IPv6
// traffic, which runs through the IPv6 programs that array holds.
func TestAttachmentsFollowConfiguration(t *testing.T) {
	forFamilies(t, testAttachmentsFollowConfiguration)
}

func testAttachmentsFollowConfiguration(t *testing.T, v6 bool) {
	e := setupFamily(t, v6)
	cur := agentproc.Shared(t)
	dropped := e.lb.NodeBackendDevs[0]
	a := e.agent(t, cur, []string{e.lb.NodeDev, dropped}, "--xdp=generic")
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	if err := a.WaitReady(60 * time.Second); err != nil {
		t.Fatalf("%v\n%s", err, a.Log.String())
	}
	att := e.attachments(t)
	for _, want := range []string{"tcx " + e.lb.NodeDev, "tcx " + dropped, "xdp " + e.lb.NodeDev, "xdp " + dropped, "cgroup", "cgroup6", tc6, xdp6} {
		if !att[want] {
			t.Fatalf("%s not attached by the first agent: %v", want, att)
		}
	}
	first6 := e.progArray(t, tc6)
	args := withFlag(withFlag(withFlag(a.Args, "devices", e.lb.NodeDev), "xdp", "off"), "socket-lb", "false")
	args = withFlag(args, "cgroup", "")
	l := e.startLoad(t, 0)
	replace(t, l, a, cur, args)
	l.stop(t, "a change of configuration")
	att = e.attachments(t)
	for _, gone := range []string{"tcx " + dropped, "xdp " + e.lb.NodeDev, "xdp " + dropped, "cgroup", "cgroup6", xdp6} {
		if att[gone] {
			t.Errorf("%s still attached after the agent restarted without it: %v", gone, att)
		}
	}
	if !att["tcx "+e.lb.NodeDev] {
		t.Errorf("%s lost its tc programs: %v", e.lb.NodeDev, att)
	}
	if !att[tc6] {
		t.Errorf("%s lost its IPv6 programs: %v", tc6, att)
	}
	if ids := e.progArray(t, tc6); slices.ContainsFunc(ids, func(id ebpf.ProgramID) bool { return slices.Contains(first6, id) }) {
		t.Errorf("%s holds programs %v after the restart, some of the first agent's %v", tc6, ids, first6)
	}
}

// The pinned program arrays of the IPv6 programs, which the attached
// IPv4 entries tail-call for an IPv6 packet (pkg/datapath, tc6.go).
const (
	tc6  = "sluice6_tc_v1"
	xdp6 = "sluice6_xdp_v1"
)

// progArray returns the ids of the programs in the agent's pinned program
// array name, slot by slot (0: an empty slot), or nil if it is not pinned.
func (e *env) progArray(t *testing.T, name string) []ebpf.ProgramID {
	t.Helper()
	pin := filepath.Join(e.bpffs, "sluice", name)
	if _, err := os.Stat(pin); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return testutil.ProgArrayIDs(t, pin)
}

// tcxPrograms counts the tcx programs on l's ingress and on its egress;
// run in l's network namespace.
func tcxPrograms(l netlink.Link) (ingress, egress int, err error) {
	var n [2]int
	for i, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
		res, err := link.QueryPrograms(link.QueryOptions{Target: l.Attrs().Index, Attach: at})
		if err != nil {
			return 0, 0, fmt.Errorf("query %s programs of %s: %w", at, l.Attrs().Name, err)
		}
		n[i] = len(res.Programs)
	}
	return n[0], n[1], nil
}

// attachments says what is attached in the node: "tcx DEV" and "xdp DEV"
// for each device of the node with such programs, "cgroup" and "cgroup6"
// if the test cgroup has socket programs of IPv4 (connect4) and of IPv6
// (connect6), and tc6 and xdp6 if those program arrays are pinned with
// every slot filled.
func (e *env) attachments(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	err := e.lb.Node.Do(func() error {
		for _, dev := range append([]string{e.lb.NodeDev}, e.lb.NodeBackendDevs...) {
			l, err := netlink.LinkByName(dev)
			if err != nil {
				return err
			}
			in, eg, err := tcxPrograms(l)
			if err != nil {
				return err
			}
			if in+eg > 0 {
				out["tcx "+dev] = true
			}
			if x := l.Attrs().Xdp; x != nil && x.Attached {
				out["xdp "+dev] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	cg, err := os.Open(e.cgroup)
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	for name, at := range map[string]ebpf.AttachType{"cgroup": ebpf.AttachCGroupInet4Connect, "cgroup6": ebpf.AttachCGroupInet6Connect} {
		res, err := link.QueryPrograms(link.QueryOptions{Target: int(cg.Fd()), Attach: at})
		if err != nil {
			t.Fatal(err)
		}
		out[name] = len(res.Programs) > 0
	}
	for _, name := range []string{tc6, xdp6} {
		ids := e.progArray(t, name)
		out[name] = len(ids) > 0 && !slices.Contains(ids, 0)
	}
	return out
}
