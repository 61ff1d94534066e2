// Package northsouth proves NodePort, ExternalIP and LoadBalancer traffic
// end to end across two nodes, each running its own sluice agent, with real
// clients and servers in network namespaces:
//
//	client  10.0.0.2 ─┐                 ┌─ node-a 192.168.1.1 (eth0) ── pod-a 10.1.0.2
//	client2 10.0.2.2 ─┼── router ───────┤
//	                  │  (routes pods,  └─ node-b 192.168.2.1 (eth0) ── pod-b 10.2.0.2
//	                  │   ExternalIP and LB IPs to node-a)
//
// Each agent reads the same manifest (Services and EndpointSlices with
// nodeName) with its own --node-name and --node-ip, attaches tc to the
// device holding its node IP, and pins under a bpffs directory of its own.
// Addresses exist only inside the namespaces. The IPv6 twins of the tests
// (TestNodePortIPv6, ...) give every link an IPv6 twin (buildFamilies),
// route the IPv6 ExternalIP and LB IP to node-a too, and read
// testdata/ipv6's Services: the same tests over the addresses of family
// v6 instead of v4.
package northsouth

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/agentproc"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/datapath"
)

// helperEnv makes the test binary a client instead: the hairpin test runs
// it in a pod namespace and in node-a's socket load balancing cgroup.
const helperEnv = "SLUICE_NS_HELPER"

func TestMain(m *testing.M) {
	if addr := os.Getenv(helperEnv); addr != "" {
		os.Exit(helperMain(addr))
	}
	os.Exit(agentproc.RunTests(m))
}

// helperMain connects to addr, sends a line and prints
// "<answer>|<peer address the socket reports>".
func helperMain(addr string) int {
	c, err := net.DialTimeout(familyNetwork("tcp4", addr), addr, 5*time.Second)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(c, "hello\n"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("%s|%s\n", strings.TrimSpace(line), c.RemoteAddr())
	return 0
}

type cluster struct {
	client, client2, nodeA, nodeB, podA, podB *topology.NS
	agents                                    []*agentproc.Agent
	xdp                                       string
	podCgroup                                 *topology.Cgroup // node-a's socket LB cgroup
}

// counter returns a datapath counter of agent i (0: node-a, 1: node-b).
func (c *cluster) counter(t *testing.T, i int, name string) uint64 {
	t.Helper()
	n, err := c.agents[i].Counter(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// expectXDP checks, in the XDP modes, that node i's XDP program forwarded
// requests and replies itself.
func (c *cluster) expectXDP(t *testing.T, i int) {
	t.Helper()
	if c.xdp == "off" {
		return
	}
	if f, r := c.counter(t, i, "xdp_fwd"), c.counter(t, i, "xdp_rev"); f == 0 || r == 0 {
		t.Errorf("xdp=%s: XDP forwarded %d requests and %d replies on node %d, want both > 0", c.xdp, f, r, i)
	}
}

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func ip(s string) netip.Addr    { return netip.MustParseAddr(s) }

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// The IPv6 addresses of the topology (buildFamilies with v6), beside the
// IPv4 ones: client 2001:db8:a::2, client2 2001:db8:c::2, node-a
// 2001:db8:1::1, node-b 2001:db8:2::1, pod-a 2001:db8:11::2, pod-b
// 2001:db8:12::2.
const (
	client6 = "2001:db8:a::2"
	nodeA6  = "2001:db8:1::1"
	nodeB6  = "2001:db8:2::1"
)

// family names the addresses of one family in the topology and in its
// manifest, so that a test and its IPv6 twin share one body.
type family struct {
	v6                           bool
	client, nodeA, nodeB, podA   string
	clusterIPA, externalIP, lbIP string // web-a's ClusterIP, web-b's ExternalIP, web-local's LB IP
}

var (
	ipv4 = family{
		client: "10.0.0.2", nodeA: "192.168.1.1", nodeB: "192.168.2.1", podA: "10.1.0.2",
		clusterIPA: "10.96.0.1", externalIP: "203.0.113.10", lbIP: "198.51.100.10",
	}
	ipv6 = family{
		v6:     true,
		client: client6, nodeA: nodeA6, nodeB: nodeB6, podA: "2001:db8:11::2",
		clusterIPA: "2001:db8:96::1", externalIP: "2001:db8:ff::10", lbIP: "2001:db8:ff::20",
	}
)

// at is host:port, with IPv6 hosts in brackets.
func at(host string, port int) string { return net.JoinHostPort(host, fmt.Sprint(port)) }

// buildFamilies creates the topology, starts the servers and both agents
// with extra agent arguments, and waits for them to be ready; with v6 it
// also gives every link and route an IPv6 twin, the servers IPv6 sockets,
// and the agents the IPv6 node addresses and testdata/ipv6's Services.
func buildFamilies(t *testing.T, v6 bool, extra ...string) *cluster {
	t.Helper()
	testutil.Privileged(t)
	b := agentproc.Shared(t)
	topo := topology.NewT(t)
	var c cluster
	router := topo.AddNST(t, "router")
	c.client, c.client2 = topo.AddNST(t, "client"), topo.AddNST(t, "client2")
	c.nodeA, c.nodeB = topo.AddNST(t, "node-a"), topo.AddNST(t, "node-b")
	c.podA, c.podB = topo.AddNST(t, "pod-a"), topo.AddNST(t, "pod-b")

	link := func(a *topology.NS, aDev, aAddr string, b *topology.NS, bDev, bAddr string) {
		must(t, topo.Veth(a, aDev, b, bDev))
		must(t, a.AddAddr(aDev, pfx(aAddr)))
		must(t, b.AddAddr(bDev, pfx(bAddr)))
	}
	link(router, "c1", "10.0.0.1/24", c.client, "eth0", "10.0.0.2/24")
	link(router, "c2", "10.0.2.1/24", c.client2, "eth0", "10.0.2.2/24")
	link(router, "na", "192.168.1.254/24", c.nodeA, "eth0", "192.168.1.1/24")
	must(t, c.nodeA.AddAddr("eth0", pfx("192.168.1.11/24"))) // a second address: NodePorts answer there too
	link(router, "nb", "192.168.2.254/24", c.nodeB, "eth0", "192.168.2.1/24")
	link(c.nodeA, "pa", "10.1.0.1/24", c.podA, "eth0", "10.1.0.2/24")
	link(c.nodeB, "pb", "10.2.0.1/24", c.podB, "eth0", "10.2.0.2/24")
	// Every end host's default route, over IPv4 and (with v6) IPv6.
	defaults := []struct {
		ns         *topology.NS
		via4, via6 string
	}{
		{c.client, "10.0.0.1", "2001:db8:a::1"}, {c.client2, "10.0.2.1", "2001:db8:c::1"},
		{c.nodeA, "192.168.1.254", "2001:db8:1::fe"}, {c.nodeB, "192.168.2.254", "2001:db8:2::fe"},
		{c.podA, "10.1.0.1", "2001:db8:11::1"}, {c.podB, "10.2.0.1", "2001:db8:12::1"},
	}
	for _, d := range defaults {
		must(t, d.ns.AddRoute(pfx("0.0.0.0/0"), ip(d.via4)))
	}
	must(t, router.AddRoute(pfx("10.1.0.0/24"), ip("192.168.1.1")))
	must(t, router.AddRoute(pfx("10.2.0.0/24"), ip("192.168.2.1")))
	must(t, router.AddRoute(pfx("203.0.113.10/32"), ip("192.168.1.1")))
	must(t, router.AddRoute(pfx("198.51.100.10/32"), ip("192.168.1.1")))
	for _, n := range []*topology.NS{router, c.nodeA, c.nodeB} {
		must(t, n.Sysctl("net/ipv4/ip_forward", "1"))
	}
	if v6 {
		for _, a := range []struct {
			ns        *topology.NS
			dev, addr string
		}{
			{router, "c1", "2001:db8:a::1/64"}, {c.client, "eth0", client6 + "/64"},
			{router, "c2", "2001:db8:c::1/64"}, {c.client2, "eth0", "2001:db8:c::2/64"},
			{router, "na", "2001:db8:1::fe/64"}, {c.nodeA, "eth0", nodeA6 + "/64"},
			{router, "nb", "2001:db8:2::fe/64"}, {c.nodeB, "eth0", nodeB6 + "/64"},
			{c.nodeA, "pa", "2001:db8:11::1/64"}, {c.podA, "eth0", "2001:db8:11::2/64"},
			{c.nodeB, "pb", "2001:db8:12::1/64"}, {c.podB, "eth0", "2001:db8:12::2/64"},
		} {
			must(t, a.ns.AddAddr(a.dev, pfx(a.addr)))
			must(t, a.ns.WaitLocal(pfx(a.addr).Addr()))
		}
		for _, d := range defaults {
			must(t, d.ns.AddRoute(pfx("::/0"), ip(d.via6)))
		}
		must(t, router.AddRoute(pfx("2001:db8:11::/64"), ip(nodeA6)))
		must(t, router.AddRoute(pfx("2001:db8:12::/64"), ip(nodeB6)))
		must(t, router.AddRoute(pfx(ipv6.externalIP+"/128"), ip(nodeA6)))
		must(t, router.AddRoute(pfx(ipv6.lbIP+"/128"), ip(nodeA6)))
		for _, n := range []*topology.NS{router, c.nodeA, c.nodeB} {
			must(t, n.Sysctl("net/ipv6/conf/all/forwarding", "1"))
		}
	}
	// Native XDP on a veth transmits (XDP_TX, redirect) into the peer's
	// NAPI queue. The kernel documents GRO on the peer as enough to get
	// one, but here frames XDP_TXed into a GRO-only peer never reached
	// its IP layer (IpInReceives did not count them); with an XDP program
	// on the peer they are delivered. So the router's ends (a switch
	// port, in a real network) run an XDP program that passes everything.
	for _, dev := range []string{"na", "nb"} {
		must(t, router.AttachXDPPass(dev))
	}
	// Packets from a real wire carry complete checksums; a local stack
	// sending over a veth leaves them to "hardware" (CHECKSUM_PARTIAL),
	// which the receiving stack trusts but which an XDP frame, having no
	// skb, loses. Every host's eth0 (clients, pods, and the nodes, whose
	// own connections leave through eth0 too) computes checksums in
	// software, as a NIC would have by the time a packet reaches another
	// machine.
	for _, n := range []*topology.NS{c.client, c.client2, c.podA, c.podB, c.nodeA, c.nodeB} {
		must(t, n.Do(func() error { return topology.SetTxChecksumOffload("eth0", false) }))
	}

	for _, p := range []struct {
		ns   *topology.NS
		name string
	}{{c.podA, "pod-a"}, {c.podB, "pod-b"}} {
		serveWhoami(t, p.ns, p.name, "4")
		if v6 {
			serveWhoami(t, p.ns, p.name, "6")
		}
	}

	cgMount, err := datapath.CgroupV2Mount()
	must(t, err)
	c.podCgroup, err = topo.AddCgroup(cgMount, "pods-a")
	must(t, err)

	mf, err := filepath.Abs(filepath.Join("testdata", "cluster.yaml"))
	must(t, err)
	nodeIPs, npAddrs := [2]string{"192.168.1.1", "192.168.2.1"}, "192.168.0.0/16"
	if v6 {
		mf, err = filepath.Abs(filepath.Join("testdata", "ipv6", "cluster.yaml"))
		must(t, err)
		nodeIPs = [2]string{"192.168.1.1," + nodeA6, "192.168.2.1," + nodeB6}
		npAddrs += ",2001:db8:1::/64,2001:db8:2::/64"
	}
	for _, n := range []struct {
		ns         *topology.NS
		name, addr string
	}{{c.nodeA, "node-a", nodeIPs[0]}, {c.nodeB, "node-b", nodeIPs[1]}} {
		bpffs := filepath.Join(datapath.DefaultBPFFS, topo.Prefix()+n.name)
		cfg := agentproc.AgentConfig{
			Manifests: mf, BPFFS: bpffs,
			// NodePorts on every address of the node's subnets, not
			// only --node-ip (kube-proxy's default): node-a's second
			// address serves them too.
			Extra: append([]string{"--node-name", n.name, "--node-ip", n.addr, "--nodeport-addresses", npAddrs}, extra...),
		}
		if n.name == "node-a" {
			cfg.Cgroup = c.podCgroup.Path // socket load balancing for node-a's pods
		}
		a := agentproc.StartAgent(t, b, n.ns, cfg, 30*time.Second)
		c.agents = append(c.agents, a)
	}
	// Registered last, so it runs before the agents are stopped.
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, n := range []*topology.NS{router, c.nodeA, c.nodeB} {
			out, _ := n.Command(context.Background(), "ip", "-s", "-d", "link").CombinedOutput()
			nst, _ := n.Command(context.Background(), "nstat", "-az").CombinedOutput()
			t.Logf("%s links:\n%s\nnstat:\n%s", n.Name, out, nst)
		}
	})
	return &c
}

// serveWhoami serves TCP :8080 and UDP :5353 of family ("4" or "6") in
// ns, answering each line or datagram with "<name> <peer address>": the
// backend's view of the client.
func serveWhoami(t *testing.T, ns *topology.NS, name, family string) {
	t.Helper()
	l, err := ns.Listen("tcp"+family, ":8080")
	must(t, err)
	pc, err := ns.ListenPacket("udp"+family, ":5353")
	must(t, err)
	var wg sync.WaitGroup
	t.Cleanup(func() { l.Close(); pc.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					if _, err := fmt.Fprintf(c, "%s %s\n", name, c.RemoteAddr()); err != nil {
						return
					}
				}
			})
		}
	})
	wg.Go(func() {
		buf := make([]byte, 2048)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo([]byte(fmt.Sprintf("%s %s", name, from)), from) // the client checks the answer
		}
	})
}

// familyNetwork is network nw ("tcp4" or "udp4") in the family of addr's host:
// "tcp6" or "udp6" for "[v6]:port".
func familyNetwork(nw, addr string) string {
	if strings.HasPrefix(addr, "[") {
		return strings.TrimSuffix(nw, "4") + "6"
	}
	return nw
}

// dial connects from ns to addr, within timeout, over the family of
// addr's host (network).
func dial(ns *topology.NS, nw, addr string, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return ns.DialContext(ctx, familyNetwork(nw, addr), addr)
}

// askTCP connects from ns to addr, sends a line and returns the answer:
// "<backend> <address:port the backend saw>".
func askTCP(ns *topology.NS, addr string, timeout time.Duration) (string, error) {
	c, err := dial(ns, "tcp4", addr, timeout)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := fmt.Fprintf(c, "hello\n"); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(line), nil
}

func askUDP(ns *topology.NS, addr string, timeout time.Duration) (string, error) {
	c, err := dial(ns, "udp4", addr, timeout)
	if err != nil {
		return "", err
	}
	defer c.Close()
	buf := make([]byte, 2048)
	var lastErr error
	for range 5 { // datagrams may be lost while neighbours resolve
		c.SetDeadline(time.Now().Add(timeout / 5))
		if _, err := c.Write([]byte("hello")); err != nil {
			return "", err
		}
		n, err := c.Read(buf)
		if err == nil {
			return string(buf[:n]), nil
		}
		lastErr = err
	}
	return "", lastErr
}

// seenFrom returns the address part of the peer a backend reported.
func seenFrom(answer string) string {
	_, peer, _ := strings.Cut(answer, " ")
	host, _, _ := net.SplitHostPort(peer)
	return host
}

func expectAnswer(t *testing.T, what, answer string, err error, backend, from string) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if !strings.HasPrefix(answer, backend+" ") || seenFrom(answer) != from {
		t.Fatalf("%s: answered %q, want %s seeing the client as %s", what, answer, backend, from)
	}
}

// expectFromCgroup runs the test binary as a client (helperMain) in ns and
// in node-a's socket load balancing cgroup, dialling addr: backend must
// answer, seeing the client as from, and the socket must report addr as
// its peer.
func (c *cluster) expectFromCgroup(t *testing.T, ns *topology.NS, nsName, addr, backend, from string) {
	t.Helper()
	out, err := c.fromCgroup(t, ns, addr)
	if err != nil {
		t.Fatalf("%s -> %s: %v", nsName, addr, err)
	}
	answer, peer, _ := strings.Cut(strings.TrimSpace(string(out)), "|")
	expectAnswer(t, nsName+" -> "+addr, answer, nil, backend, from)
	if peer != addr {
		t.Errorf("%s -> %s: the socket reports its peer as %s", nsName, addr, peer)
	}
}

// fromCgroup runs this test binary as a client of addr in ns, in the pod
// cgroup (socket load balancing), and returns what it printed.
func (c *cluster) fromCgroup(t *testing.T, ns *topology.NS, addr string) ([]byte, error) {
	t.Helper()
	exe, err := os.Executable()
	must(t, err)
	cmd := ns.Command(context.Background(), exe)
	cmd.Env = append(os.Environ(), helperEnv+"="+addr)
	c.podCgroup.Put(cmd)
	return cmd.Output()
}

// expectFailFromCgroup connects from a process of ns in the pod cgroup to
// addr, which must not answer.
func (c *cluster) expectFailFromCgroup(t *testing.T, ns *topology.NS, nsName, addr string) {
	t.Helper()
	if out, err := c.fromCgroup(t, ns, addr); err == nil {
		t.Errorf("%s -> %s: answered %q, want no answer", nsName, addr, strings.TrimSpace(string(out)))
	}
}

// request is one request a client makes and the answer it must get: from
// backend, which sees the client as from.
type request struct{ proto, what, addr, backend, from string }

// expectAnswers makes each request from ns in turn (proto TCP or UDP) and
// fails t at the first wrong or missing answer.
func expectAnswers(t *testing.T, ns *topology.NS, reqs ...request) {
	t.Helper()
	for _, r := range reqs {
		ask := askTCP
		if r.proto == "UDP" {
			ask = askUDP
		}
		a, err := ask(ns, r.addr, 5*time.Second)
		expectAnswer(t, r.proto+" "+r.what, a, err, r.backend, r.from)
	}
}

// modes are the --xdp settings every test runs with.
var modes = []string{"off", "generic", "native"}

func forEachMode(t *testing.T, fn func(t *testing.T, c *cluster)) {
	forEachModeFamilies(t, false, fn)
}

// forEachModeFamilies is forEachMode over buildFamilies(t, v6).
func forEachModeFamilies(t *testing.T, v6 bool, fn func(t *testing.T, c *cluster)) {
	for _, mode := range modes {
		t.Run("xdp="+mode, func(t *testing.T) {
			var extra []string
			if mode != "off" {
				extra = append(extra, "--xdp="+mode)
			}
			c := buildFamilies(t, v6, extra...)
			c.xdp = mode
			fn(t, c)
		})
	}
}

func TestNodePort(t *testing.T) {
	forEachMode(t, func(t *testing.T, c *cluster) {
		expectAnswers(t, c.client,
			// Local backend: DNAT only, the pod sees the client.
			request{"TCP", "node-a -> local pod", "192.168.1.1:30001", "pod-a", "10.0.0.2"},
			request{"UDP", "node-a -> local pod", "192.168.1.1:30001", "pod-a", "10.0.0.2"},
			// Remote backend: DNAT and SNAT, the pod sees the node.
			request{"TCP", "node-a -> pod on node-b", "192.168.1.1:30002", "pod-b", "192.168.1.1"},
			request{"UDP", "node-a -> pod on node-b", "192.168.1.1:30002", "pod-b", "192.168.1.1"},
			request{"TCP", "node-a's second address -> pod on node-b", "192.168.1.11:30002", "pod-b", "192.168.1.1"},
			request{"TCP", "node-b -> pod on node-a", "192.168.2.1:30001", "pod-a", "192.168.2.1"},
			request{"UDP", "node-b -> pod on node-a", "192.168.2.1:30001", "pod-a", "192.168.2.1"},
			request{"TCP", "node-b -> local pod", "192.168.2.1:30002", "pod-b", "10.0.0.2"},
		)
		c.expectXDP(t, 0)
		c.expectXDP(t, 1)
	})
}

// TestNodePortIPv6: TestNodePort over IPv6: an external client to a
// NodePort whose endpoint is on the other node is DNATed and SNATed to the
// node's IPv6 address, and the reply comes back; to a local endpoint it
// keeps its address. With --xdp, XDP forwards the requests and replies of
// the source-NATed flows itself (only IPv6 flows run here, so its
// counters are IPv6's); without, tc does.
func TestNodePortIPv6(t *testing.T) {
	forEachModeFamilies(t, true, func(t *testing.T, c *cluster) {
		expectAnswers(t, c.client,
			request{"TCP", "node-a -> local pod", at(nodeA6, 30001), "pod-a", client6},
			request{"UDP", "node-a -> local pod", at(nodeA6, 30001), "pod-a", client6},
			request{"TCP", "node-a -> pod on node-b", at(nodeA6, 30002), "pod-b", nodeA6},
			request{"UDP", "node-a -> pod on node-b", at(nodeA6, 30002), "pod-b", nodeA6},
			request{"TCP", "node-b -> pod on node-a", at(nodeB6, 30001), "pod-a", nodeB6},
			request{"UDP", "node-b -> pod on node-a", at(nodeB6, 30001), "pod-a", nodeB6},
			request{"TCP", "node-b -> local pod", at(nodeB6, 30002), "pod-b", client6},
		)
		for i := range 2 {
			if n := c.counter(t, i, "tc_snat_new") + c.counter(t, i, "xdp_snat_new"); n == 0 {
				t.Errorf("node %d source-NATed no flow (tc_snat_new and xdp_snat_new 0)", i)
			}
			c.expectXDP(t, i)
		}
	})
}

func TestExternalIPAndLoadBalancer(t *testing.T) { testExternalIPAndLoadBalancer(t, ipv4) }

// TestExternalIPAndLoadBalancerIPv6: TestExternalIPAndLoadBalancer over
// IPv6: an IPv6 ExternalIP to a remote endpoint (DNAT and SNAT to node-a's
// IPv6 address), an IPv6 LoadBalancer IP of externalTrafficPolicy Local
// that admits the client's IPv6 subnet and refuses client2's.
func TestExternalIPAndLoadBalancerIPv6(t *testing.T) { testExternalIPAndLoadBalancer(t, ipv6) }

func testExternalIPAndLoadBalancer(t *testing.T, f family) {
	answered := []request{
		{"TCP", "ExternalIP -> pod on node-b", at(f.externalIP, 80), "pod-b", f.nodeA},
		{"UDP", "ExternalIP -> pod on node-b", at(f.externalIP, 53), "pod-b", f.nodeA},
		// LoadBalancer IP, externalTrafficPolicy Local, source ranges
		// client's subnet: client is allowed and seen as itself.
		{"TCP", "LB IP (Local, allowed source)", at(f.lbIP, 80), "pod-a", f.client},
	}
	forEachModeFamilies(t, f.v6, func(t *testing.T, c *cluster) {
		expectAnswers(t, c.client, answered...)
		if a, err := askTCP(c.client2, at(f.lbIP, 80), time.Second); err == nil {
			t.Fatalf("client2 outside loadBalancerSourceRanges got an answer: %q", a)
		}
		if n := c.counter(t, 0, "tc_src_range_deny"); n == 0 {
			t.Errorf("tc_src_range_deny is 0 on node-a after a denied client")
		}
	})
}

func TestExternalTrafficPolicyLocal(t *testing.T) { testExternalTrafficPolicyLocal(t, ipv4) }

// TestExternalTrafficPolicyLocalIPv6: TestExternalTrafficPolicyLocal over
// IPv6: the Local NodePort answers on node-a's IPv6 address, keeping the
// client's, and not on node-b's; the health check answers on both nodes'
// IPv6 addresses.
func TestExternalTrafficPolicyLocalIPv6(t *testing.T) { testExternalTrafficPolicyLocal(t, ipv6) }

func testExternalTrafficPolicyLocal(t *testing.T, f family) {
	forEachModeFamilies(t, f.v6, func(t *testing.T, c *cluster) {
		a, err := askTCP(c.client, at(f.nodeA, 30003), 5*time.Second)
		expectAnswer(t, "Local NodePort on the endpoint's node", a, err, "pod-a", f.client)
		if a, err := askTCP(c.client, at(f.nodeB, 30003), time.Second); err == nil {
			t.Fatalf("Local NodePort on a node without endpoints answered %q", a)
		}
		for _, n := range []struct {
			addr  string
			code  int
			count int
		}{{f.nodeA, 200, 1}, {f.nodeB, 503, 0}} {
			resp, err := c.client.HTTPClient(5 * time.Second).Get("http://" + at(n.addr, 32100) + "/")
			if err != nil {
				t.Fatalf("health check %s: %v", n.addr, err)
			}
			var body struct {
				LocalEndpoints int `json:"localEndpoints"`
			}
			err = json.NewDecoder(resp.Body).Decode(&body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != n.code || body.LocalEndpoints != n.count {
				t.Fatalf("health check %s: %d %+v (%v), want %d with %d local endpoints", n.addr, resp.StatusCode, body, err, n.code, n.count)
			}
		}
	})
}

// TestManyClientsOneRemoteBackend: many connections open at the same time
// through one node to one remote backend: every one is answered (no reset,
// no tuple collision), each from a source port of its own, and each keeps
// working until all have been answered.
func TestManyClientsOneRemoteBackend(t *testing.T) { testManyClientsOneRemoteBackend(t, ipv4) }

// TestManyClientsOneRemoteBackendIPv6: TestManyClientsOneRemoteBackend
// over IPv6: the connections are SNATed to node-a's IPv6 address, each to
// a source port of its own.
func TestManyClientsOneRemoteBackendIPv6(t *testing.T) { testManyClientsOneRemoteBackend(t, ipv6) }

func testManyClientsOneRemoteBackend(t *testing.T, f family) {
	forEachModeFamilies(t, f.v6, func(t *testing.T, c *cluster) {
		const n = 200
		answers := make([]string, n)
		errs := make([]error, n)
		var answered, wg sync.WaitGroup
		release := make(chan struct{})
		answered.Add(n)
		for i := range n {
			wg.Go(func() {
				var once sync.Once
				defer once.Do(answered.Done)
				conn, err := dial(c.client, "tcp4", at(f.nodeA, 30002), 10*time.Second)
				if err != nil {
					errs[i] = err
					return
				}
				defer conn.Close()
				conn.SetDeadline(time.Now().Add(20 * time.Second))
				r := bufio.NewReader(conn)
				ask := func() (string, error) {
					if _, err := fmt.Fprintf(conn, "hello\n"); err != nil {
						return "", err
					}
					line, err := r.ReadString('\n')
					return strings.TrimSpace(line), err
				}
				if answers[i], errs[i] = ask(); errs[i] != nil {
					return
				}
				once.Do(answered.Done)
				<-release // all connections are open now
				var again string
				if again, errs[i] = ask(); errs[i] == nil && again != answers[i] {
					errs[i] = fmt.Errorf("second answer %q differs from the first %q", again, answers[i])
				}
			})
		}
		answered.Wait()
		close(release)
		wg.Wait()
		ports := map[string]int{}
		for i := range n {
			expectAnswer(t, fmt.Sprintf("connection %d", i), answers[i], errs[i], "pod-b", f.nodeA)
			_, peer, _ := strings.Cut(answers[i], " ")
			if j, dup := ports[peer]; dup {
				t.Fatalf("connections %d and %d reached the backend from the same %s", j, i, peer)
			}
			ports[peer] = i
		}
		c.expectXDP(t, 0)
	})
}

// TestHairpin: a pod that reaches its own Service, through the ClusterIP
// or through a NodePort of its own node, is sent to itself and gets its
// reply from the address it dialled. The socket hooks translate the
// connection before any packet exists, so it never leaves the pod and
// needs no hairpin mode anywhere.
func TestHairpin(t *testing.T) { testHairpin(t, ipv4) }

// TestHairpinIPv6: TestHairpin over IPv6 (connect6, getpeername6).
func TestHairpinIPv6(t *testing.T) { testHairpin(t, ipv6) }

func testHairpin(t *testing.T, f family) {
	forEachModeFamilies(t, f.v6, func(t *testing.T, c *cluster) {
		for _, addr := range []string{at(f.clusterIPA, 80), at(f.nodeA, 30001)} {
			c.expectFromCgroup(t, c.podA, "pod-a", addr, "pod-a", f.podA)
		}
	})
}

// TestFromNode: ExternalIPs and NodePorts answer to a process on the node
// itself: socket load balancing translates its connect() straight to a
// backend, local or remote, and the socket still reports the address it
// dialled. The LoadBalancer IP of web-local admits only the client's
// subnet, which the node's addresses are not in: the node is refused
// there, as kube-proxy's firewall chain drops it (its source is the node's
// address).
func TestFromNode(t *testing.T) { testFromNode(t, ipv4) }

// TestFromNodeIPv6: TestFromNode over IPv6, node-a's IPv6 address being
// the source that node-b sees and that web-local's IPv6 source ranges
// refuse.
func TestFromNodeIPv6(t *testing.T) { testFromNode(t, ipv6) }

func testFromNode(t *testing.T, f family) {
	forEachModeFamilies(t, f.v6, func(t *testing.T, c *cluster) {
		for _, x := range []struct{ addr, backend, from string }{
			{at(f.externalIP, 80), "pod-b", f.nodeA}, // ExternalIP, remote backend
			{at(f.nodeB, 30001), "pod-a", f.nodeB},   // another node's NodePort: node-b SNATs back
			{at(f.nodeA, 30002), "pod-b", f.nodeA},   // own NodePort, remote backend
		} {
			c.expectFromCgroup(t, c.nodeA, "node-a", x.addr, x.backend, x.from)
		}
		c.expectFailFromCgroup(t, c.nodeA, "node-a", at(f.lbIP, 80))
	})
}
