// Package explain tests `sluicectl explain` against a live agent: the
// real sluicectl binary asks the agent's attached tc program (in its
// dry-run mode) what it would do with a packet, and its answer is
// compared with where real connections from the client go. Every pinned
// map is dumped before and after each explain: a dry run changes none.
// The Services are dual-stack (and the source-range LoadBalancer has an
// IPv6 twin): each family is asked, and checked, the same way.
package explain

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/agentproc"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
)

func TestMain(m *testing.M) {
	os.Exit(agentproc.RunTests(m))
}

// family is what a test asks in one family: the client's address, the
// affine and empty Services' ClusterIPs and the guarded LoadBalancer IP.
type family struct {
	name                                   string
	client                                 string
	affineVIP, emptyVIP, blockedLB, mapped string // mapped: affineVIP as an IPv6 socket reaches it ("" for IPv6)
}

var families = []family{
	{"IPv4", "10.0.0.1", "10.96.0.20:80", "10.96.0.21:80", "198.51.100.20:80", "[::ffff:10.96.0.20]:80"},
	{"IPv6", "2001:db8::1", "[2001:db8:96::20]:80", "[2001:db8:96::21]:80", "[2001:db8:200::20]:80", ""},
}

// at is addr:port, [addr]:port for IPv6.
func at(addr string, port int) string {
	return netip.AddrPortFrom(netip.MustParseAddr(addr), uint16(port)).String()
}

// blockedService is a LoadBalancer whose loadBalancerSourceRanges leave
// the client (10.0.0.1) out; blockedService6 its IPv6 twin (the client
// 2001:db8::1 is out of its ranges too).
const blockedService6 = `apiVersion: v1
kind: Service
metadata: {name: guarded6, namespace: default}
spec:
  type: LoadBalancer
  clusterIP: 2001:db8:96::23
  ipFamilies: [IPv6]
  loadBalancerSourceRanges: [2001:db8:77::/48]
  ports:
  - {name: http, port: 80, protocol: TCP, targetPort: 8080, nodePort: 30023}
status:
  loadBalancer:
    ingress: [{ip: 2001:db8:200::20}]
`

const blockedService = `apiVersion: v1
kind: Service
metadata: {name: guarded, namespace: default}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.22
  loadBalancerSourceRanges: [192.0.2.0/24]
  ports:
  - {name: http, port: 80, protocol: TCP, targetPort: 8080, nodePort: 30022}
status:
  loadBalancer:
    ingress: [{ip: 198.51.100.20}]
`

// explained is the part of `sluicectl explain -o json` the test reads.
type explained struct {
	Frontend     string   `json:"frontend"`
	Service      string   `json:"service"`
	Backend      string   `json:"backend"`
	Verdict      string   `json:"verdict"`
	Reason       string   `json:"reason"`
	Reasons      []string `json:"reasons"`
	AffinityHit  bool     `json:"affinityHit"`
	ConntrackHit bool     `json:"conntrackHit"`
	Candidates   []struct {
		Addr string `json:"addr"`
	} `json:"candidates"`
}

type env struct {
	lb       *topology.LB
	agent    *agentproc.Agent
	backends map[string]string // backend address:8080 -> the name its server answers with
}

func setup(t *testing.T) *env {
	t.Helper()
	testutil.Privileged(t)
	bins := agentproc.Shared(t)
	topo := topology.NewT(t)
	lb := topo.BuildLBT(t, 3)
	v6 := lb.AddIPv6T(t)
	names, err := lb.ServeHTTP(8080, "backend-") // on both families' addresses
	if err != nil {
		t.Fatal(err)
	}
	e := &env{lb: lb, backends: map[string]string{}}
	var addrs, addrs6 []string
	for i, a := range lb.BackendAddrs {
		e.backends[netip.AddrPortFrom(a, 8080).String()] = names[i]
		e.backends[netip.AddrPortFrom(v6.BackendAddrs[i], 8080).String()] = names[i]
		addrs = append(addrs, a.String())
		addrs6 = append(addrs6, v6.BackendAddrs[i].String())
	}
	if err := lb.Client.AddRoute(netip.MustParsePrefix("198.51.100.0/24"), lb.NodeAddr); err != nil {
		t.Fatal(err)
	}
	if err := lb.Client.AddRoute(netip.MustParsePrefix("2001:db8:200::/64"), v6.NodeAddr); err != nil {
		t.Fatal(err)
	}
	http := []agentproc.Port{{Name: "http", Protocol: "TCP", Port: 80, TargetPort: "8080", EndpointPort: 8080}}
	both := append(slices.Clone(addrs), addrs6...)
	affine := agentproc.Service{Name: "affine", ClusterIP: "10.96.0.20", ClusterIP6: "2001:db8:96::20", Endpoints: both, Ports: http}.YAML()
	affine = strings.Replace(affine, "  type: ClusterIP\n", "  type: ClusterIP\n  sessionAffinity: ClientIP\n", 1)
	empty := agentproc.Service{Name: "empty", ClusterIP: "10.96.0.21", ClusterIP6: "2001:db8:96::21", Ports: http}.YAML()
	// The LoadBalancers: their EndpointSlices as generated, their
	// Services written above.
	withSlices := func(s agentproc.Service, svc string) string {
		y := s.YAML()
		return svc + "---\n" + y[strings.Index(y, "apiVersion: discovery.k8s.io/v1"):]
	}
	guarded := withSlices(agentproc.Service{Name: "guarded", ClusterIP: "10.96.0.22", Endpoints: addrs, Ports: http}, blockedService)
	guarded6 := withSlices(agentproc.Service{Name: "guarded6", ClusterIP: "2001:db8:96::23", Endpoints: addrs6, Ports: http}, blockedService6)
	manifest := filepath.Join(t.TempDir(), "services.yaml")
	if err := agentproc.WriteFile(manifest, agentproc.Manifest(affine, empty, guarded, guarded6)); err != nil {
		t.Fatal(err)
	}
	e.agent = agentproc.StartAgent(t, bins, lb.Node, agentproc.AgentConfig{
		Manifests: manifest,
		Devices:   []string{lb.NodeDev},
		BPFFS:     filepath.Join(testutil.BPFFS, topo.Prefix()+"explain"),
	}, 30*time.Second)
	// The agent loads its dry-run programs after its first sync
	// (datapath.Config.DeferDryRun): until then explain says the
	// program has no dry-run mode.
	testutil.Eventually(t, "sluicectl explain answering", time.Minute, func() error {
		_, err := e.runExplain(t, "10.0.0.1", 40999, "10.96.0.20:80")
		return err
	})
	return e
}

// dumpPins renders every map pinned under the agent's bpffs, by pin.
func (e *env) dumpPins(t *testing.T) map[string]string {
	t.Helper()
	dir := filepath.Join(e.agent.BPFFS, "sluice")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, ent := range entries {
		if ent.IsDir() {
			continue // links/
		}
		m, err := ebpf.LoadPinnedMap(filepath.Join(dir, ent.Name()), &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			t.Fatalf("open %s: %v", ent.Name(), err)
		}
		out[ent.Name()] = testutil.DumpMap(t, ent.Name(), m)
		m.Close()
	}
	if len(out) < 10 {
		t.Fatalf("only %d maps pinned under %s: %v", len(out), dir, out)
	}
	return out
}

// explain runs the real `sluicectl explain -o json` in the agent's
// namespace, from the client's address client and the source port sport.
func (e *env) explain(t *testing.T, client string, sport int, to string) explained {
	t.Helper()
	out, err := e.runExplain(t, client, sport, to)
	if err != nil {
		t.Fatal(err)
	}
	var x explained
	if err := json.Unmarshal(out, &x); err != nil {
		t.Fatalf("sluicectl explain output: %v\n%s", err, out)
	}
	t.Logf("explain %s -> %s: %s", at(client, sport), to, out)
	return x
}

// runExplain runs `sluicectl explain -o json` and returns its output.
func (e *env) runExplain(t *testing.T, client string, sport int, to string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := e.agent.NS.Command(ctx, e.agent.Bin.Sluicectl, "--bpffs", e.agent.BPFFS, "--names-file", e.agent.NamesFile,
		"explain", "--device", e.lb.NodeDev, "--from", at(client, sport), "--to", to, "-o", "json")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("sluicectl explain --to %s: %w: %s", to, err, stderr.String())
	}
	return out, nil
}

// explainUnchanged is explain, asserting that no pinned map changed. The
// agent's conntrack GC may delete an expired entry meanwhile, so a run
// whose dumps differ is repeated (with another source port: a dry run
// that wrote would write anew each time, and its counters would move
// every time); one run must leave every map as it was.
func (e *env) explainUnchanged(t *testing.T, client string, sport int, to string) explained {
	t.Helper()
	var x explained
	try := 0
	if diffs := e.unchangedRound(t, func() { x = e.explain(t, client, sport+try, to); try++ }); diffs != nil {
		t.Fatalf("every explain of %s changed pinned maps: %v", to, diffs)
	}
	return x
}

// unchangedRound runs round, up to three times, until one run leaves every
// pinned map as it found it, and returns nil; else what each run changed.
func (e *env) unchangedRound(t *testing.T, round func()) []string {
	t.Helper()
	var diffs []string
	for range 3 {
		before := e.dumpPins(t)
		round()
		after := e.dumpPins(t)
		var changed []string
		for name := range before {
			if before[name] != after[name] {
				changed = append(changed, name)
			}
		}
		if len(changed) == 0 {
			return nil
		}
		diffs = append(diffs, fmt.Sprint(changed))
	}
	return diffs
}

func TestExplainMatchesRealConnections(t *testing.T) {
	e := setup(t)
	for _, f := range families {
		t.Run(f.name, func(t *testing.T) { e.matchesRealConnections(t, f) })
	}
}

func (e *env) matchesRealConnections(t *testing.T, f family) {
	client := e.lb.Client.HTTPClient(3 * time.Second)

	// Affinity: a real request pins the client to a backend; explain
	// names that backend for the client's next connection, from the
	// affinity entry, and real requests keep going there.
	first, err := topology.WhoAnswered(client, "http://"+f.affineVIP+"/")
	if err != nil {
		t.Fatal(err)
	}
	x := e.explainUnchanged(t, f.client, 41000, f.affineVIP)
	if x.Service != "default/affine:http" || !x.AffinityHit || x.Verdict != "pass" || len(x.Candidates) != 3 {
		t.Fatalf("affine client: %+v", x)
	}
	if got := e.backends[x.Backend]; got != first {
		t.Fatalf("explain sends the affine client to %s (%s), its real connection went to %s", x.Backend, got, first)
	}
	// The table says the same, for a person.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	table, err := e.agent.NS.Command(ctx, e.agent.Bin.Sluicectl, "--bpffs", e.agent.BPFFS, "--names-file", e.agent.NamesFile,
		"explain", "--device", e.lb.NodeDev, "--from", at(f.client, 41500), "--to", f.affineVIP).CombinedOutput()
	cancel()
	if err != nil {
		t.Fatalf("sluicectl explain: %v: %s", err, table)
	}
	t.Logf("sluicectl explain:\n%s", table)
	for _, want := range []string{"default/affine:http", "session affinity", x.Backend, "VERDICT", "pass"} {
		if !strings.Contains(string(table), want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	for i := range 5 {
		who, err := topology.WhoAnswered(client, "http://"+f.affineVIP+"/")
		if err != nil {
			t.Fatal(err)
		}
		if who != e.backends[x.Backend] {
			t.Fatalf("request %d went to %s, explain said %s", i, who, e.backends[x.Backend])
		}
	}

	// An emptied Service: explain says reject, a real connection is
	// refused at once.
	x = e.explainUnchanged(t, f.client, 42000, f.emptyVIP)
	if x.Service != "default/empty:http" || x.Verdict != "reject" || x.Backend != "" || !strings.HasPrefix(x.Reason, "tc_no_backend") {
		t.Fatalf("empty service: %+v", x)
	}
	ctx, cancel = context.WithTimeout(t.Context(), 3*time.Second)
	c, err := e.lb.Client.DialContext(ctx, "tcp", f.emptyVIP)
	cancel()
	if err == nil {
		c.Close()
		t.Fatal("a connection to the empty service was accepted")
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("connection to the empty service: %v, want connection refused (explain said reject)", err)
	}

	// A source outside loadBalancerSourceRanges: explain says drop, a
	// real connection times out.
	x = e.explainUnchanged(t, f.client, 43000, f.blockedLB)
	if !strings.HasPrefix(x.Service, "default/guarded") || x.Verdict != "drop" || !strings.HasPrefix(x.Reason, "tc_src_range_deny") {
		t.Fatalf("blocked source: %+v", x)
	}
	ctx, cancel = context.WithTimeout(t.Context(), 2*time.Second)
	c, err = e.lb.Client.DialContext(ctx, "tcp", f.blockedLB)
	cancel()
	if err == nil {
		c.Close()
		t.Fatal("a connection from outside the source ranges was accepted")
	}
	if !errors.Is(err, context.DeadlineExceeded) && !os.IsTimeout(err) {
		t.Fatalf("connection from outside the source ranges: %v, want a timeout (explain said drop)", err)
	}
}

// TestExplainSocket asks the socket path (sluicectl explain --socket: its
// dry run, loaded by sluicectl against the agent's pins) what a connect
// from the node would do. pkg/datapath compares its answers with real
// connects from a cgroup; here it runs against a live agent's pins,
// through the real binary, and changes no pinned map.
func TestExplainSocket(t *testing.T) {
	e := setup(t)
	run := func(args ...string) []byte {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		args = append([]string{"--bpffs", e.agent.BPFFS, "--names-file", e.agent.NamesFile, "explain", "--socket"}, args...)
		out, err := e.agent.NS.Command(ctx, e.agent.Bin.Sluicectl, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("sluicectl %v: %v: %s", args, err, out)
		}
		t.Logf("sluicectl %v:\n%s", args, out)
		return out
	}
	type socketExplained struct {
		explained
		Socket bool   `json:"socket"`
		Errno  string `json:"errno"`
	}
	runJSON := func(args ...string) socketExplained {
		t.Helper()
		var x socketExplained
		out := run(append(args, "-o", "json")...)
		if err := json.Unmarshal(out, &x); err != nil {
			t.Fatalf("sluicectl explain --socket output: %v\n%s", err, out)
		}
		return x
	}
	explainFamily := func(f family) {
		t.Helper()
		hook := map[string]string{"IPv4": "connect4", "IPv6": "connect6"}[f.name]
		table := run("--to", f.affineVIP)
		for _, want := range []string{"sluice_sock_explain", hook, "default/affine:http", "CANDIDATES", "VERDICT"} {
			if !strings.Contains(string(table), want) {
				t.Errorf("%s table lacks %q:\n%s", f.name, want, table)
			}
		}
		// An IPv4-mapped destination: connect6 reaches the IPv4 service.
		for _, to := range []string{f.affineVIP, f.mapped} {
			if to == "" {
				continue
			}
			x := runJSON("--to", to)
			if !x.Socket || x.Service != "default/affine:http" || x.Frontend != f.affineVIP+"/TCP" || len(x.Candidates) != 3 ||
				x.Verdict != "connect to backend" || e.backends[x.Backend] == "" {
				t.Fatalf("affine service at %s: %+v", to, x)
			}
		}
		x := runJSON("--to", f.emptyVIP)
		if x.Service != "default/empty:http" || x.Verdict != "reject" || x.Errno != "ECONNREFUSED" || x.Backend != "" ||
			!strings.HasPrefix(x.Reason, "sock_no_backend") {
			t.Fatalf("empty service: %+v", x)
		}
		run("--to", f.emptyVIP)
		x = runJSON("--from", f.client, "--to", f.blockedLB)
		if !strings.HasPrefix(x.Service, "default/guarded") || x.Verdict != "drop" || x.Errno != "EHOSTUNREACH" || !strings.HasPrefix(x.Reason, "sock_drop") {
			t.Fatalf("blocked source: %+v", x)
		}
	}
	explainAll := func() {
		t.Helper()
		for _, f := range families {
			explainFamily(f)
		}
	}

	// As explainUnchanged: the agent's conntrack GC may write its maps
	// meanwhile (a collection rewrites sluice_ct_admit's words: the
	// LRU's gate, which the first one after the start clears), so a
	// round whose dumps differ is repeated; a dry run that wrote would
	// write in every round. (CI saw sluice_ct_admit_v1 change once.)
	if diffs := e.unchangedRound(t, explainAll); diffs != nil {
		t.Errorf("every round of explain --socket changed pinned maps: %v", diffs)
	}
}
