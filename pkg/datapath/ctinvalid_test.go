package datapath

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// The node's own netfilter conntrack and Sluice's DNAT-only flows. tc
// ingress DNATs a flow's packets before netfilter, so conntrack records
// <C -> B>; its replies must reach the stack as <B -> C>, the reply tuple
// conntrack expects, and be translated back at the egress of the client's
// device. A reply reverse-NATed at the ingress it meets first (a pod's
// device in --devices) reached the stack as <F -> C>, a tuple conntrack
// never saw, or went round it by redirect: either way conntrack marks
// the flow's packets INVALID, and a node that drops INVALID in FORWARD
// (Calico's workload chains, firewalld, kube-proxy's KUBE-FORWARD) broke
// such flows after the SYN.

// ctInvalidFamily is a family's addresses for TestDNATOnlyConntrackValid.
type ctInvalidFamily struct {
	podNodeAddrs
	network string
}

func ctInvalidFamilyOf(v6 bool) ctInvalidFamily {
	if v6 {
		return ctInvalidFamily{podNodeAddrsOf(v6), "tcp6"}
	}
	return ctInvalidFamily{podNodeAddrsOf(v6), "tcp4"}
}

// podNodeAddrs is a family's addresses of a node whose pods' devices are
// among the attached ones (podNodeTopology), the iptables command that
// programs its netfilter, and the ClusterIPs and the remote backend of
// the tests over it.
type podNodeAddrs struct {
	v6                  bool
	iptables            string
	client, node        netip.Prefix // client and node on the wire
	podA, podB          netip.Addr   // the backend pod, the client pod
	remote              netip.Addr   // a backend on another node (behind the client's namespace)
	cipLocal, cipRemote string       // ClusterIPs
	cipTwin             string       // a ClusterIP sharing cipLocal's backend
	podGW               netip.Prefix // the node's address on the pods' devices (IPv6), or not valid
	dflt                netip.Prefix
}

func podNodeAddrsOf(v6 bool) podNodeAddrs {
	p, a := netip.MustParsePrefix, netip.MustParseAddr
	if v6 {
		return podNodeAddrs{v6: true, iptables: "ip6tables",
			client: p("2001:db8:a::1/64"), node: p("2001:db8:a::2/64"),
			podA: a("2001:db8:b::2"), podB: a("2001:db8:b::3"), remote: a("2001:db8:c::7"),
			cipLocal: "2001:db8:96::80", cipRemote: "2001:db8:96::81", cipTwin: "2001:db8:96::82",
			podGW: p("fe80::1/64"), dflt: p("::/0")}
	}
	return podNodeAddrs{iptables: "iptables",
		client: p("10.0.0.1/24"), node: p("10.0.0.2/24"),
		podA: a("10.1.1.2"), podB: a("10.1.1.3"), remote: a("10.2.0.7"),
		cipLocal: "10.96.0.80", cipRemote: "10.96.0.81", cipTwin: "10.96.0.82", dflt: p("0.0.0.0/0")}
}

// podNode is the topology of podNodeTopology.
type podNode struct {
	client, node, podA, podB *topology.NS
	bits                     int // a host prefix's length in the family
}

// podNodeTopology builds a node whose pods' devices are among the
// attached ones, in a's family:
//
//	client (eth0) <-> eth0 node pod0 <-> pod A (backend)
//	                        pod1 <-> pod B (client)
//
// The node forwards; its default route is the client's namespace, whose
// is the node; it answers the pods for any address (proxy ARP, or its
// address podGW on the pods' devices for IPv6). The caller waits for the
// IPv6 addresses (podNode.waitLocal), after adding its own.
func podNodeTopology(t *testing.T, topo *topology.Topology, a podNodeAddrs) podNode {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	pn := podNode{bits: 32}
	if a.v6 {
		pn.bits = 128
	}
	pn.client, pn.node = topo.AddNST(t, "client"), topo.AddNST(t, "node")
	pn.podA, pn.podB = topo.AddNST(t, "podA"), topo.AddNST(t, "podB")
	client, node, podA, podB := pn.client, pn.node, pn.podA, pn.podB
	must(topo.Veth(client, "eth0", node, "eth0"))
	must(topo.Veth(node, "pod0", podA, "eth0"))
	must(topo.Veth(node, "pod1", podB, "eth0"))
	must(client.AddAddr("eth0", a.client))
	must(node.AddAddr("eth0", a.node))
	must(podA.AddAddr("eth0", netip.PrefixFrom(a.podA, pn.bits)))
	must(podB.AddAddr("eth0", netip.PrefixFrom(a.podB, pn.bits)))
	if a.v6 {
		must(node.Sysctl("net/ipv6/conf/all/forwarding", "1"))
		must(node.AddAddr("pod0", a.podGW))
		must(node.AddAddr("pod1", a.podGW))
	} else {
		must(node.Sysctl("net/ipv4/ip_forward", "1"))
		must(node.Sysctl("net/ipv4/conf/pod0/proxy_arp", "1"))
		must(node.Sysctl("net/ipv4/conf/pod1/proxy_arp", "1"))
	}
	must(node.AddRouteDev(netip.PrefixFrom(a.podA, pn.bits), "pod0"))
	must(node.AddRouteDev(netip.PrefixFrom(a.podB, pn.bits), "pod1"))
	must(node.AddRoute(a.dflt, a.client.Addr()))
	must(client.AddRoute(a.dflt, a.node.Addr()))
	for _, pod := range []*topology.NS{podA, podB} {
		if a.v6 {
			must(pod.Do(func() error {
				l, err := netlink.LinkByName("eth0")
				if err != nil {
					return err
				}
				return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}, Gw: a.podGW.Addr().AsSlice()})
			}))
		} else {
			must(pod.AddRouteDev(a.dflt, "eth0"))
		}
	}
	return pn
}

// attach attaches d to the node's devices: eth0 and the pods' pod0 and
// pod1.
func (pn podNode) attach(t *testing.T, d *Datapath) {
	t.Helper()
	if err := pn.node.Do(func() error { return d.AttachDevices([]string{"eth0", "pod0", "pod1"}) }); err != nil {
		t.Fatal(err)
	}
}

// nsAddr is an address of a namespace.
type nsAddr struct {
	ns *topology.NS
	a  netip.Addr
}

// waitLocal waits, for IPv6, until the topology's addresses and more are
// usable (their duplicate address detection done).
func (pn podNode) waitLocal(t *testing.T, a podNodeAddrs, more ...nsAddr) {
	t.Helper()
	if !a.v6 {
		return
	}
	for _, w := range append([]nsAddr{{pn.client, a.client.Addr()}, {pn.node, a.node.Addr()}, {pn.podA, a.podA}, {pn.podB, a.podB}}, more...) {
		if err := w.ns.WaitLocal(w.a); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDNATOnlyConntrackValid runs DNAT-only flows through a node whose
// pods' devices are among the attached ones, with
// `iptables -I FORWARD -m conntrack --ctstate INVALID -j DROP` (and
// ip6tables') in the node's namespace:
//
//	client (eth0; a remote backend on lo) <-> eth0 node pod0 <-> pod A (backend)
//	                                                   pod1 <-> pod B (client)
//
// NodePorts of both traffic policies from the client to pod A, and
// ClusterIPs from pod B to pod A (local) and to the client's namespace
// (remote), per packet (no socket programs). Each exchange completes and
// the DROP rule matches no packet: conntrack saw every reply as the
// reply of its flow. Over each family.
func TestDNATOnlyConntrackValid(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) { testDNATOnlyConntrackValid(t, ctInvalidFamilyOf(v6)) })
}

func testDNATOnlyConntrackValid(t *testing.T, f ctInvalidFamily) {
	d := newTestDatapath(t)
	topo := topology.NewT(t)
	pn := podNodeTopology(t, topo, f.podNodeAddrs)
	client, node, podA, podB := pn.client, pn.node, pn.podA, pn.podB
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(client.AddAddr("lo", netip.PrefixFrom(f.remote, pn.bits)))
	pn.waitLocal(t, f.podNodeAddrs)
	beA := netip.AddrPortFrom(f.podA, 8080)
	beR := netip.AddrPortFrom(f.remote, 8080)
	if _, err := podA.ServeTCPEcho(beA.String(), "podA"); err != nil {
		t.Fatal(err)
	}
	if _, err := client.ServeTCPEcho(beR.String(), "remote"); err != nil {
		t.Fatal(err)
	}

	m := d.Maps()
	nodeIP := f.node.Addr().String()
	be := testBackend{1, l4(f.podA.String(), 8080, model.TCP)}
	np := l4(nodeIP, 30080, model.TCP)
	npLocal := l4(nodeIP, 30081, model.TCP)
	addExternal(t, m, 1, np, reconciler.FlagExternal, be)
	addExternal(t, m, 2, npLocal, reconciler.FlagExternal|reconciler.FlagLocal, be)
	cipLocal := l4(f.cipLocal, 80, model.TCP)
	cipRemote := l4(f.cipRemote, 80, model.TCP)
	addService(t, m, 3, cipLocal, be)
	addService(t, m, 4, cipRemote, testBackend{2, l4(f.remote.String(), 8080, model.TCP)})
	cipTwin := l4(f.cipTwin, 80, model.TCP)
	addService(t, m, 5, cipTwin, be)
	pn.attach(t, d)
	dropInvalid(t, node, f.iptables, true)

	for _, c := range []struct {
		name string
		from *topology.NS
		fe   model.L4Addr
		want string
	}{
		{"NodePort, externalTrafficPolicy Cluster, local pod", client, np, "podA"},
		{"NodePort, externalTrafficPolicy Local, local pod", client, npLocal, "podA"},
		{"pod to ClusterIP, local backend", podB, cipLocal, "podA"},
		{"pod to ClusterIP, remote backend", podB, cipRemote, "remote"},
	} {
		// Each reply meets tc first at the ingress of the backend's
		// device and leaves by the client's: it is passed up
		// untranslated (tc_rev_at_egress) for that egress to translate.
		before := counters(t, d)["tc_rev_at_egress"]
		if err := echoExchange(c.from, f.network, c.fe, c.want); err != nil {
			t.Errorf("%s (%s): %v", c.name, apOf(c.fe), err)
		}
		if after := counters(t, d)["tc_rev_at_egress"]; after <= before {
			t.Errorf("%s (%s): tc_rev_at_egress %d before the exchange, %d after: its replies were not passed up", c.name, apOf(c.fe), before, after)
		}
	}
	// One client port of pod B to two ClusterIPs sharing pod A: the
	// second flow's reply tuple is the first's, so it is remapped to
	// another client port (lb4_remap), whose replies the egress of pod1
	// gives the client's port back.
	local := netip.AddrPortFrom(f.podB, 40000)
	var conns []net.Conn
	for _, fe := range []model.L4Addr{cipLocal, cipTwin} {
		c, err := dialFromPort(podB, f.network, local, fe)
		if err != nil {
			t.Fatalf("connect from %s to %s: %v", local, apOf(fe), err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	for i, c := range conns {
		if err := say(c, "podA"); err != nil {
			t.Errorf("from %s, connection %d: %v", local, i, err)
		}
	}
	if n := counters(t, d)["tc_ct_clash_remap"]; n != 1 {
		t.Errorf("tc_ct_clash_remap = %d, want 1 (the second connection)", n)
	}
	if n := invalidDrops(t, node, f.iptables); n != 0 {
		t.Errorf("the FORWARD rule dropping conntrack INVALID matched %d packets, want 0 (conntrack saw a flow's packets inconsistently)", n)
	}
	// Every reply was translated, at the egress of its client's device.
	if cs := counters(t, d); cs["tc_rev_nat"] == 0 {
		t.Errorf("tc_rev_nat = 0: %v", cs)
	}
}

// echoExchange connects from ns to fe, says "hello" and expects name's
// echo back: a whole TCP exchange, after the handshake.
func echoExchange(ns *topology.NS, network string, fe model.L4Addr, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	c, err := ns.DialContext(ctx, network, apOf(fe).String())
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer c.Close()
	return say(c, name)
}

// say writes "hello" to c and expects name's echo back.
func say(c net.Conn, name string) error {
	if err := c.SetDeadline(time.Now().Add(3 * time.Second)); err != nil {
		return err
	}
	if _, err := fmt.Fprintf(c, "hello\n"); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return fmt.Errorf("read: %w", err)
	}
	if want := name + " hello\n"; line != want {
		return fmt.Errorf("got %q, want %q", line, want)
	}
	return nil
}

// dialFromPort connects from ns, from local (SO_REUSEADDR: one port may
// connect to several peers), to fe.
func dialFromPort(ns *topology.NS, network string, local netip.AddrPort, fe model.L4Addr) (net.Conn, error) {
	var c net.Conn
	err := ns.Do(func() error {
		d := net.Dialer{
			LocalAddr: net.TCPAddrFromAddrPort(local),
			Timeout:   3 * time.Second,
			Control: func(_, _ string, rc syscall.RawConn) error {
				var serr error
				if err := rc.Control(func(fd uintptr) {
					serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
				}); err != nil {
					return err
				}
				return serr
			},
		}
		var err error
		c, err = d.Dial(network, apOf(fe).String())
		return err
	})
	return c, err
}

// dropInvalid inserts (on) or deletes (not on) the FORWARD rule dropping
// conntrack INVALID in ns (iptables or ip6tables), whose packet counter
// invalidDrops reads.
func dropInvalid(t *testing.T, ns *topology.NS, iptables string, on bool) {
	t.Helper()
	op := "-D"
	if on {
		op = "-I"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := ns.Run(ctx, iptables, "-w", op, "FORWARD", "-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP"); err != nil {
		t.Fatal(err)
	}
}

var dropInvalidRule = regexp.MustCompile(`(?m)^\s*(\d+)\s+\d+\s+DROP\s.*ctstate INVALID`)

// invalidDrops returns the packet counter of the FORWARD rule dropping
// conntrack INVALID in ns (iptables or ip6tables).
func invalidDrops(t *testing.T, ns *topology.NS, iptables string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := ns.Command(ctx, iptables, "-w", "-L", "FORWARD", "-v", "-x", "-n").CombinedOutput()
	if err != nil {
		t.Fatalf("%s -L FORWARD: %v: %s", iptables, err, out)
	}
	m := dropInvalidRule.FindSubmatch(out)
	if m == nil {
		t.Fatalf("no DROP ctstate INVALID rule in FORWARD:\n%s", out)
	}
	n, err := strconv.ParseUint(string(m[1]), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
