package datapath

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// ICMP errors about DNAT-only flows and the node's netfilter conntrack,
// as ctinvalid_test.go's replies: conntrack recorded such a flow as
// <C -> B> (tc ingress translates before netfilter), so an error from B
// (or a router between) must reach it quoting [C -> B], which it takes
// for RELATED, and be translated back at the egress of the client's
// device. Translated at the ingress it meets first, it quoted [C -> F],
// a flow conntrack never saw: INVALID, and dropped by rules that drop
// INVALID in FORWARD; the client never learnt of the port unreachable
// or of the path MTU.

// icmpRelFamily is a family's addresses for TestDNATOnlyICMPErrorValid.
type icmpRelFamily struct {
	udp, iptables       string
	client, node        netip.Prefix // client and node on the wire
	clientFar, far      netip.Prefix // the client's namespace, a router, and far's
	podA, podB          netip.Addr   // the backend pod, the client pod
	remote              netip.Addr   // a backend on another node (far's lo)
	cipLocal, cipRemote string       // ClusterIPs
	podGW               netip.Prefix // the node's address on the pods' devices (IPv6), or not valid
	dflt                netip.Prefix
	ratelimit           string // the sysctl of ICMP errors' rate limit
}

func icmpRelFamilyOf(v6 bool) icmpRelFamily {
	p, a := netip.MustParsePrefix, netip.MustParseAddr
	if v6 {
		return icmpRelFamily{udp: "udp6", iptables: "ip6tables",
			client: p("2001:db8:a::1/64"), node: p("2001:db8:a::2/64"),
			clientFar: p("2001:db8:d::1/64"), far: p("2001:db8:d::2/64"),
			podA: a("2001:db8:b::2"), podB: a("2001:db8:b::3"), remote: a("2001:db8:c::7"),
			cipLocal: "2001:db8:96::80", cipRemote: "2001:db8:96::81",
			podGW: p("fe80::1/64"), dflt: p("::/0"), ratelimit: "net/ipv6/icmp/ratelimit"}
	}
	return icmpRelFamily{udp: "udp4", iptables: "iptables",
		client: p("10.0.0.1/24"), node: p("10.0.0.2/24"),
		clientFar: p("10.3.0.1/24"), far: p("10.3.0.2/24"),
		podA: a("10.1.1.2"), podB: a("10.1.1.3"), remote: a("10.2.0.7"),
		cipLocal: "10.96.0.80", cipRemote: "10.96.0.81", dflt: p("0.0.0.0/0"),
		ratelimit: "net/ipv4/icmp_ratelimit"}
}

// farMTU is the MTU of the link from the client's namespace, a router, to
// far, the remote backend's namespace: what a frag-needed or packet-too-big
// tells pod B.
const farMTU = 1300

// TestDNATOnlyICMPErrorValid runs UDP flows that DNAT only through a node
// whose pods' devices are among the attached ones, with
// `iptables -I FORWARD -m conntrack --ctstate INVALID -j DROP` (and
// ip6tables') in the node's namespace:
//
//	client (eth0; router) <-> eth0 node pod0 <-> pod A (local backend)
//	  | far0, MTU 1300                 pod1 <-> pod B (client)
//	far (remote backend on lo)
//
// to ports nothing listens on: a NodePort with externalTrafficPolicy
// Local from the client to pod A, and ClusterIPs from pod B to pod A and
// to far. Each backend answers with a port unreachable; each client's
// connected UDP socket gets ECONNREFUSED. And pod B's datagram bigger than
// far's link gets a frag-needed (ICMPv6 packet too big) from the router:
// its socket gets EMSGSIZE, and the route to the ClusterIP the path's MTU.
// The DROP rule matches no packet, every error went up untranslated at
// the ingress it met first (tc_rev_at_egress) and was translated at the
// client device's egress (tc_icmp_xlate). Over each family.
func TestDNATOnlyICMPErrorValid(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) { testDNATOnlyICMPErrorValid(t, icmpRelFamilyOf(v6)) })
}

func testDNATOnlyICMPErrorValid(t *testing.T, f icmpRelFamily) {
	d := newTestDatapath(t)
	topo := topology.NewT(t)
	client, node := topo.AddNST(t, "client"), topo.AddNST(t, "node")
	podA, podB := topo.AddNST(t, "podA"), topo.AddNST(t, "podB")
	far := topo.AddNST(t, "far")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	v6 := f.udp == "udp6"
	bits := 32
	if v6 {
		bits = 128
	}
	must(topo.Veth(client, "eth0", node, "eth0"))
	must(topo.Veth(node, "pod0", podA, "eth0"))
	must(topo.Veth(node, "pod1", podB, "eth0"))
	must(topo.Veth(client, "far0", far, "eth0"))
	setMTU(t, client, "far0", farMTU)
	setMTU(t, far, "eth0", farMTU)
	must(client.AddAddr("eth0", f.client))
	must(node.AddAddr("eth0", f.node))
	must(client.AddAddr("far0", f.clientFar))
	must(far.AddAddr("eth0", f.far))
	must(far.AddAddr("lo", netip.PrefixFrom(f.remote, bits)))
	must(podA.AddAddr("eth0", netip.PrefixFrom(f.podA, bits)))
	must(podB.AddAddr("eth0", netip.PrefixFrom(f.podB, bits)))
	fwd := "net/ipv4/ip_forward"
	if v6 {
		fwd = "net/ipv6/conf/all/forwarding"
	}
	for _, ns := range []*topology.NS{node, client} {
		must(ns.Sysctl(fwd, "1"))
	}
	// Every error the test waits for is sent: none held back by the
	// senders' rate limit.
	for _, ns := range []*topology.NS{podA, far, client} {
		must(ns.Sysctl(f.ratelimit, "0"))
	}
	if v6 {
		must(node.AddAddr("pod0", f.podGW))
		must(node.AddAddr("pod1", f.podGW))
	} else {
		must(node.Sysctl("net/ipv4/conf/pod0/proxy_arp", "1"))
		must(node.Sysctl("net/ipv4/conf/pod1/proxy_arp", "1"))
	}
	must(node.AddRouteDev(netip.PrefixFrom(f.podA, bits), "pod0"))
	must(node.AddRouteDev(netip.PrefixFrom(f.podB, bits), "pod1"))
	// The node's default route is the client's namespace, which routes
	// to far's backend; far's is the client's namespace.
	must(node.AddRoute(f.dflt, f.client.Addr()))
	must(client.AddRoute(f.dflt, f.node.Addr()))
	must(client.AddRoute(netip.PrefixFrom(f.remote, bits), f.far.Addr()))
	must(far.AddRoute(f.dflt, f.clientFar.Addr()))
	for _, pod := range []*topology.NS{podA, podB} {
		if v6 {
			must(pod.Do(func() error {
				l, err := netlink.LinkByName("eth0")
				if err != nil {
					return err
				}
				return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}, Gw: f.podGW.Addr().AsSlice()})
			}))
		} else {
			must(pod.AddRouteDev(f.dflt, "eth0"))
		}
	}
	if v6 {
		for _, w := range []struct {
			ns *topology.NS
			a  netip.Addr
		}{{client, f.client.Addr()}, {client, f.clientFar.Addr()}, {far, f.far.Addr()}, {node, f.node.Addr()}, {podA, f.podA}, {podB, f.podB}} {
			must(w.ns.WaitLocal(w.a))
		}
	}

	// Nothing listens on port 9 of pod A or far.
	m := d.Maps()
	nodeIP := f.node.Addr().String()
	beA := testBackend{1, l4(f.podA.String(), 9, model.UDP)}
	beR := testBackend{2, l4(f.remote.String(), 9, model.UDP)}
	npLocal := l4(nodeIP, 30090, model.UDP)
	addExternal(t, m, 1, npLocal, reconciler.FlagExternal|reconciler.FlagLocal, beA)
	cipLocal := l4(f.cipLocal, 53, model.UDP)
	cipRemote := l4(f.cipRemote, 53, model.UDP)
	cipFar := l4(f.cipRemote, 54, model.UDP)
	addService(t, m, 2, cipLocal, beA)
	addService(t, m, 3, cipRemote, beR)
	addService(t, m, 4, cipFar, beR)
	if err := node.Do(func() error { return d.AttachDevices([]string{"eth0", "pod0", "pod1"}) }); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	must(node.Run(ctx, f.iptables, "-w", "-I", "FORWARD", "-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP"))

	for _, c := range []struct {
		name string
		from *topology.NS
		fe   model.L4Addr
	}{
		{"NodePort, externalTrafficPolicy Local, local pod", client, npLocal},
		{"pod to ClusterIP, local backend", podB, cipLocal},
		{"pod to ClusterIP, remote backend", podB, cipRemote},
	} {
		if err := udpRefused(c.from, f.udp, c.fe); err != nil {
			t.Errorf("%s (%s): %v", c.name, apOf(c.fe), err)
		}
	}
	if err := udpTooBig(podB, f.udp, cipFar); err != nil {
		t.Errorf("pod to ClusterIP, remote backend behind a smaller MTU (%s): %v", apOf(cipFar), err)
	}
	if n := invalidDrops(t, node, f.iptables); n != 0 {
		t.Errorf("the FORWARD rule dropping conntrack INVALID matched %d packets, want 0 (conntrack saw an ICMP error about a flow it did not know)", n)
	}
	cs := counters(t, d)
	if cs["tc_rev_at_egress"] < 4 || cs["tc_icmp_xlate"] < 4 {
		t.Errorf("tc_rev_at_egress = %d, tc_icmp_xlate = %d; want at least 4 each (an error per exchange, passed up at its first ingress, translated at the client device's egress)",
			cs["tc_rev_at_egress"], cs["tc_icmp_xlate"])
	}
}

// icmpRelExchange connects a UDP socket in ns to fe, sends size bytes and
// returns the error its receive gets; a receive that times out sends
// again (a datagram may be lost while a neighbour is resolved), up to
// three times.
func icmpRelExchange(ns *topology.NS, network string, fe model.L4Addr, size int, after func(net.Conn) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	c, err := ns.DialContext(ctx, network, apOf(fe).String())
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer c.Close()
	msg := []byte(strings.Repeat("x", size))
	var rerr error
	for range 3 {
		if _, err := c.Write(msg); err != nil {
			rerr = err
		} else {
			if err := c.SetReadDeadline(time.Now().Add(2 * time.Second)); err != nil {
				return err
			}
			_, rerr = c.Read(make([]byte, 2048))
		}
		var nerr net.Error
		if !errors.As(rerr, &nerr) || !nerr.Timeout() {
			break
		}
	}
	if after != nil {
		if err := after(c); err != nil {
			return err
		}
	}
	return rerr
}

// udpRefused expects a datagram from ns to fe answered by an ICMP port
// unreachable: ECONNREFUSED on the connected socket.
func udpRefused(ns *topology.NS, network string, fe model.L4Addr) error {
	err := icmpRelExchange(ns, network, fe, 5, nil)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("receive: %v, want ECONNREFUSED (the backend's port unreachable)", err)
	}
	return nil
}

// udpTooBig expects a datagram of 1400 bytes from ns to fe answered by a
// frag-needed (packet too big) saying farMTU: EMSGSIZE on the connected
// socket, and the socket's path MTU farMTU.
func udpTooBig(ns *topology.NS, network string, fe model.L4Addr) error {
	mtu := 0
	err := icmpRelExchange(ns, network, fe, 1400, func(c net.Conn) error {
		rc, err := c.(*net.UDPConn).SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		if err := rc.Control(func(fd uintptr) {
			if network == "udp6" {
				mtu, serr = unix.GetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_MTU)
			} else {
				mtu, serr = unix.GetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU)
			}
		}); err != nil {
			return err
		}
		return serr
	})
	if !errors.Is(err, syscall.EMSGSIZE) {
		return fmt.Errorf("receive: %v, want EMSGSIZE (the router's frag-needed)", err)
	}
	if mtu != farMTU {
		return fmt.Errorf("path MTU %d, want %d", mtu, farMTU)
	}
	return nil
}
