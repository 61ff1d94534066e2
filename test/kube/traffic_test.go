package kube

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/agentproc"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/test/kube/kubeenv"
)

// trafficEnv is the real thing, in throwaway namespaces: etcd and
// kube-apiserver run in the node namespace, the real `sluice --kubeconfig`
// agent runs there too with its tc programs on the node's client-facing
// device, backends serve HTTP in their own namespaces, and the client
// connects to ClusterIPs the apiserver allocated. With v6 the topology
// has an IPv6 plane too (LB.AddIPv6), web is a dual-stack Service and the
// client reaches it at its IPv6 ClusterIP.
type trafficEnv struct {
	kube     *kubeenv.Env
	lb       *topology.LB
	agent    *agentproc.Agent
	backends []string // backend names, as their servers answer
	addrs    []string // backend addresses of the family the client uses
	v6       bool     // the client uses IPv6
	slice    string   // web's EndpointSlice of that family
	bins     agentproc.Binaries
	bpffs    string // the agent's --bpffs
}

func setupTraffic(t *testing.T, apiServerArgs ...string) *trafficEnv {
	t.Helper()
	return setupTrafficFamily(t, false, apiServerArgs...)
}

// setupTrafficFamily is setupTraffic, with an IPv6 plane that the client
// uses if v6.
func setupTrafficFamily(t *testing.T, v6 bool, apiServerArgs ...string) *trafficEnv {
	t.Helper()
	return setupTrafficAgent(t, v6, nil, apiServerArgs...)
}

// setupTrafficAgent is setupTrafficFamily with agentArgs added to the
// agent's command line.
func setupTrafficAgent(t *testing.T, v6 bool, agentArgs []string, apiServerArgs ...string) *trafficEnv {
	t.Helper()
	e := setupTrafficNode(t, v6, apiServerArgs...)
	e.agent = agentproc.StartAgent(t, e.bins, e.lb.Node, e.agentConfig(agentArgs), 60*time.Second)
	return e
}

// agentConfig is how setupTrafficAgent runs the agent, with agentArgs
// added to its command line.
func (e *trafficEnv) agentConfig(agentArgs []string) agentproc.AgentConfig {
	return agentproc.AgentConfig{
		Devices: []string{e.lb.NodeDev},
		BPFFS:   e.bpffs,
		Extra:   append([]string{"--kubeconfig", e.kube.AgentKubeconfig, "--min-sync-period", "100ms"}, agentArgs...),
	}
}

// setupTrafficNode is setupTrafficFamily without the agent: the topology
// with its backends serving, the control plane, and the Node "node" with
// its InternalIP and no podCIDRs (as a kubelet registers it).
func setupTrafficNode(t *testing.T, v6 bool, apiServerArgs ...string) *trafficEnv {
	t.Helper()
	if os.Getenv("SLUICE_SKIP_KUBE") != "" {
		t.Skip("SLUICE_SKIP_KUBE set")
	}
	testutil.Privileged(t)
	kubeenv.BinDir(t) // build (or find) the control plane before the namespaces exist
	bins := agentproc.Shared(t)
	topo := topology.NewT(t)
	lb := topo.BuildLBT(t, 3)
	e := &trafficEnv{lb: lb, addrs: lb.BackendAddrStrings(), v6: v6, bins: bins, bpffs: filepath.Join(testutil.BPFFS, topo.Prefix()+"kube")}
	if v6 {
		e.addrs = lb.AddIPv6T(t).BackendAddrStrings()
	}
	var err error
	if e.backends, err = lb.ServeHTTP(8080, "backend-"); err != nil {
		t.Fatal(err)
	}
	// Registered after the topology: stopped before it is torn down.
	e.kube = kubeenv.StartWith(t, kubeenv.Options{NetNS: lb.Node.Path, Dial: lb.Node.DialContext, APIServerArgs: apiServerArgs})
	e.kube.CreateNode(context.Background(), "node", lb.NodeAddr.String())
	return e
}

// get makes one request to vip on a new connection and returns which
// backend answered.
func (e *trafficEnv) get(vip string, timeout time.Duration) (string, error) {
	return topology.WhoAnswered(e.lb.Client.HTTPClient(timeout), "http://"+vip+"/")
}

// answers makes n requests and counts the answers per backend, failing the
// test on any error.
func (e *trafficEnv) answers(t *testing.T, vip string, n int) map[string]int {
	t.Helper()
	seen := map[string]int{}
	for range n {
		who, err := e.get(vip, 3*time.Second)
		if err != nil {
			t.Fatalf("GET %s: %v", vip, err)
		}
		seen[who]++
	}
	return seen
}

// webService creates Service default/web with one slice of the given
// backends and returns its ClusterIP:80. With v6 the Service is dual stack,
// with a slice of each family, and the address is its IPv6 ClusterIP's.
func (e *trafficEnv) webService(t *testing.T, backends ...int) string {
	t.Helper()
	c := e.kube.Client
	var dual func(*corev1.Service)
	if e.v6 {
		dual = func(s *corev1.Service) { s.Spec.IPFamilyPolicy = new(corev1.IPFamilyPolicyRequireDualStack) }
	}
	svc := createService(t, c, "default", "web", dual, svcPort("http", 80, "http"))
	var eps, eps4 []ep
	for _, i := range backends {
		eps = append(eps, ready(e.addrs[i]))
		eps4 = append(eps4, ready(e.lb.BackendAddrs[i].String()))
	}
	createSlice(t, c, makeSlice("default", "web", "web-a", slicePorts{"http": 8080}, eps4...))
	e.slice = "web-a"
	if !e.v6 {
		return svc.Spec.ClusterIP + ":80"
	}
	es := makeSlice("default", "web", "web-a6", slicePorts{"http": 8080}, eps...)
	es.AddressType = discoveryv1.AddressTypeIPv6
	createSlice(t, c, es)
	e.slice = es.Name
	ips := svc.Spec.ClusterIPs
	if len(ips) != 2 || !netip.MustParseAddr(ips[1]).Is6() {
		t.Fatalf("RequireDualStack Service: clusterIPs %v, want an IPv4 and an IPv6 one", ips)
	}
	return net.JoinHostPort(ips[1], "80")
}

// A Service created in the API answers through its VIP; scaled down, new
// connections stop reaching the removed endpoint; deleted, it stops
// answering.
func TestTrafficFollowsTheAPI(t *testing.T) { testTrafficFollowsTheAPI(t, false) }

// TestTrafficFollowsTheAPIIPv6: TestTrafficFollowsTheAPI for a dual-stack
// Service reached at its IPv6 ClusterIP, its IPv6 slice scaled down.
func TestTrafficFollowsTheAPIIPv6(t *testing.T) { testTrafficFollowsTheAPI(t, true) }

func testTrafficFollowsTheAPI(t *testing.T, v6 bool) {
	e := setupTrafficFamily(t, v6)
	c := e.kube.Client
	vip := e.webService(t, 0, 1, 2)

	start := time.Now()
	eventually(t, "the new service to answer on "+vip, 30*time.Second, func() error {
		_, err := e.get(vip, time.Second)
		return err
	})
	t.Logf("service answered %v after it was created", time.Since(start).Round(time.Millisecond))
	// The agent's client read the slices from their protobuf straight
	// into its cache (pkg/source/kube, restslices.go).
	if log := e.agent.Log.String(); !strings.Contains(log, "endpointslices read from protobuf straight into the cache") {
		t.Errorf("the agent did not decode a slice on its fast path; its log:\n%s", log)
	}
	// 60 connections over 3 backends: each is missed with probability
	// (2/3)^60 < 1e-10.
	seen := e.answers(t, vip, 60)
	for _, b := range e.backends {
		if seen[b] == 0 {
			t.Errorf("%s never answered: %v", b, seen)
		}
	}

	updateSlice(t, c, "default", e.slice, ready(e.addrs[0]), ready(e.addrs[1]))
	removed := e.backends[2]
	// The maps first: 30 requests alone pass while the removed backend
	// is still programmed once in 190,000 rounds ((2/3)^30), and the 60
	// below then find it.
	removedAddr := net.JoinHostPort(e.addrs[2], "8080")
	eventually(t, removed+" to get no new connections", 30*time.Second, func() error {
		dump, err := e.agent.Services(t.Context())
		if err != nil {
			return err
		}
		line := ""
		for l := range strings.SplitSeq(dump, "\n") {
			if strings.HasPrefix(l, vip+"/") {
				line = l
			}
		}
		if line == "" || strings.Contains(line, removedAddr) {
			return fmt.Errorf("%s still programmed (or no line for %s):\n%s", removedAddr, vip, dump)
		}
		if n := e.answers(t, vip, 30)[removed]; n > 0 {
			return fmt.Errorf("%s still answered %d of 30", removed, n)
		}
		return nil
	})
	if n := e.answers(t, vip, 60)[removed]; n > 0 {
		t.Errorf("after scale-down %s answered %d of 60 new connections", removed, n)
	}

	if err := c.CoreV1().Services("default").Delete(context.Background(), "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the deleted service to stop answering", 30*time.Second, func() error {
		if e.connects(vip) {
			return fmt.Errorf("%s still accepts connections", vip)
		}
		return nil
	})
	for range 5 {
		if e.connects(vip) {
			t.Fatalf("deleted service %s accepted a connection", vip)
		}
	}
}

// connects reports whether a TCP connection to vip from the client
// succeeds within 500ms. The dial is bounded by its context and returns
// only when the attempt is over, so no attempt outlives the test (an
// http.Client timeout would leave the dial running in the background).
func (e *trafficEnv) connects(vip string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	network := "tcp4"
	if e.v6 {
		network = "tcp6"
	}
	c, err := e.lb.Client.DialContext(ctx, network, vip)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// Restarting the agent under load: not one connection attempt fails, and
// the maps are the same before and after.
func TestTrafficSurvivesAgentRestart(t *testing.T) { testTrafficSurvivesAgentRestart(t, false) }

// TestTrafficSurvivesAgentRestartIPv6: TestTrafficSurvivesAgentRestart
// for a dual-stack Service reached at its IPv6 ClusterIP.
func TestTrafficSurvivesAgentRestartIPv6(t *testing.T) { testTrafficSurvivesAgentRestart(t, true) }

func testTrafficSurvivesAgentRestart(t *testing.T, v6 bool) {
	e := setupTrafficFamily(t, v6)
	vip := e.webService(t, 0, 1, 2)
	eventually(t, "the service to answer", 30*time.Second, func() error {
		_, err := e.get(vip, time.Second)
		return err
	})
	before, err := e.agent.Services(t.Context())
	if err != nil {
		t.Fatal(err)
	}

	traffic := testutil.StartTraffic(2, func() error {
		_, err := e.get(vip, 3*time.Second)
		return err
	})
	defer traffic.Stop()
	time.Sleep(500 * time.Millisecond)
	if err := e.agent.Stop(); err != nil {
		t.Errorf("agent stop: %v", err)
	}
	time.Sleep(time.Second) // traffic with no agent at all
	if err := e.agent.Start(); err != nil {
		t.Fatal(err)
	}
	if err := e.agent.WaitReady(60 * time.Second); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	traffic.Stop()
	t.Logf("%d requests across the restart, %d failed", traffic.OK(), traffic.Failed())
	if n := traffic.Failed(); n > 0 {
		t.Errorf("%d connection attempts failed across the restart; first: %v", n, traffic.FirstErr())
	}
	if traffic.OK() < 10 {
		t.Errorf("only %d requests made: the test proves nothing", traffic.OK())
	}
	after, err := e.agent.Services(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Errorf("maps changed across the restart:\n%s\nwere:\n%s", after, before)
	}
	if !strings.Contains(after, vip) {
		t.Errorf("%s not in the maps:\n%s", vip, after)
	}
}
