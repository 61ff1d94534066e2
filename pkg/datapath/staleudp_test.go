package datapath

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// skipEndStaleUDP, set by hand, plays main (the agent without
// EndStaleUDP): every test of this file that calls EndStaleUDP skips the
// call then, and each that shows something ended (SocketInCgroup,
// ConntrackPod, HostNetnsOnly, FrontendsIterLoadFails) must fail. The ones that show what is left
// open (SocketScope, NotOurs) pass either way: they are to fail when the
// pass ends too much, not too little.
var skipEndStaleUDP = false

// staleFamily is the kube-proxy the tests play, in one family: its Service
// VIP (UDP, and TCP on another port), the endpoint its DNAT picked (A,
// which then stops serving), the one Sluice is given (B), and a frontend
// whose traffic no one NATs (a server on its own address).
type staleFamily struct {
	name                string
	domain              int // of the client's sockets
	vip, vipTCP, direct model.L4Addr
	a, b                string
}

var staleFamilies = []staleFamily{
	{"ipv4", unix.AF_INET, l4("10.96.7.53", 53, model.UDP), l4("10.96.7.53", 80, model.TCP), l4("10.96.7.54", 5353, model.UDP),
		"10.200.7.2", "10.200.7.3"},
	{"ipv6", unix.AF_INET6, l4("fd00:96:7::53", 53, model.UDP), l4("fd00:96:7::53", 80, model.TCP), l4("fd00:96:7::54", 5353, model.UDP),
		"fd00:200:7::2", "fd00:200:7::3"},
	// A dual-stack socket connected to ::ffff:a.b.c.d: its datagrams are
	// IPv4, NATed and tracked as IPv4.
	{"ipv4_mapped", unix.AF_INET6, l4("10.96.7.53", 53, model.UDP), l4("10.96.7.53", 80, model.TCP), l4("10.96.7.54", 5353, model.UDP),
		"10.200.7.2", "10.200.7.3"},
}

// The pod test's, IPv4.
var (
	staleVIP = staleFamilies[0].vip
	staleA   = staleFamilies[0].a
	staleB   = staleFamilies[0].b
)

// kubeProxyDNAT adds to ns the DNAT rule kube-proxy's iptables mode would
// have in chain (OUTPUT for the node's own sockets, PREROUTING for pods'
// traffic) for vip to backend, and returns the function that deletes it.
func kubeProxyDNAT(t *testing.T, ns *topology.NS, chain string, vip model.L4Addr, backend netip.AddrPort) func() {
	t.Helper()
	proto := "udp"
	if vip.Proto == model.TCP {
		proto = "tcp"
	}
	rule := []string{"-t", "nat", "%s", chain, "-d", vip.Addr.String(), "-p", proto, "--dport", strconv.Itoa(int(vip.Port)),
		"-j", "DNAT", "--to-destination", backend.String()}
	cmd := "iptables"
	if vip.Addr.Is6() {
		cmd = "ip6tables"
	}
	run := func(op string) error {
		args := append([]string{}, rule...)
		args[2] = op
		return ns.Run(context.Background(), cmd, args...)
	}
	if err := run("-A"); err != nil {
		t.Fatal(err)
	}
	return func() {
		t.Helper()
		if err := run("-D"); err != nil {
			t.Fatal(err)
		}
	}
}

// conntrackFlows returns the calling thread's namespace's netfilter
// conntrack entries whose original destination is dst.
func conntrackFlows(t *testing.T, dst model.L4Addr) []*netlink.ConntrackFlow {
	t.Helper()
	family := netlink.InetFamily(unix.AF_INET)
	if dst.Addr.Is6() {
		family = unix.AF_INET6
	}
	flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, family)
	if err != nil {
		t.Fatalf("list conntrack: %v", err)
	}
	var out []*netlink.ConntrackFlow
	for _, f := range flows {
		d, _ := netip.AddrFromSlice(f.Forward.DstIP)
		if d.Unmap() == dst.Addr && f.Forward.DstPort == dst.Port && f.Forward.Protocol == uint8(protoNumber(dst.Proto)) {
			out = append(out, f)
		}
	}
	return out
}

func protoNumber(p model.Protocol) int {
	if p == model.TCP {
		return unix.IPPROTO_TCP
	}
	return unix.IPPROTO_UDP
}

// replySources are the reply sources of flows.
func replySources(flows []*netlink.ConntrackFlow) []netip.AddrPort {
	var out []netip.AddrPort
	for _, f := range flows {
		s, _ := netip.AddrFromSlice(f.Reverse.SrcIP)
		out = append(out, netip.AddrPortFrom(s.Unmap(), f.Reverse.SrcPort))
	}
	return out
}

// attachAndApply is Sluice's start: socket load balancing on cgroup,
// then st applied.
func attachAndApply(t *testing.T, d *Datapath, cgroup string, st *model.State) {
	t.Helper()
	if err := d.AttachCgroup(cgroup); err != nil {
		t.Fatal(err)
	}
	if err := reconciler.New(d.Maps(), nil).Apply(st); err != nil {
		t.Fatal(err)
	}
}

// endStaleWantOpen runs EndStaleUDP (unless skipEndStaleUDP) and wants
// no socket ended, by method, and fd (what names it) left open.
func endStaleWantOpen(t *testing.T, d *Datapath, cgroup string, st *model.State, method SockDestroyMethod, fd int, what string) {
	t.Helper()
	if !skipEndStaleUDP {
		res := d.EndStaleUDP(cgroup, UDPFrontends(st))
		if res.Sockets.Err != nil || res.Sockets.Method != method || res.Sockets.Destroyed != 0 {
			t.Errorf("sockets: %+v, want none ended by %s", res.Sockets, method)
		}
	}
	if soerr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR); err != nil || soerr != 0 {
		t.Errorf("%s: SO_ERROR %d (%v), want it left open", what, soerr, err)
	}
}

// connectedBeforeSluice is a UDP socket of ns connected to vip (IPv4)
// before anything translates, as a node's is through its default route
// (here a route by lo), closed at the end of the test.
func connectedBeforeSluice(t *testing.T, ns *topology.NS, vip model.L4Addr) int {
	t.Helper()
	if err := ns.AddRouteDev(netip.PrefixFrom(vip.Addr, 32), "lo"); err != nil {
		t.Fatal(err)
	}
	fd := -1
	err := ns.Do(func() error {
		var err error
		if fd, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0); err != nil {
			return err
		}
		return unix.Connect(fd, sockaddr(vip))
	})
	if fd >= 0 {
		t.Cleanup(func() { unix.Close(fd) })
	}
	if err != nil {
		t.Fatal(err)
	}
	return fd
}

// staleState is the state Sluice starts with: f's VIP (and its TCP port)
// and its direct frontend served by B.
func staleState(f staleFamily) *model.State {
	st := model.NewState()
	st.Services.Set(f.vip, clusterIP(f.vip, l4(f.b, 5353, model.UDP)))
	st.Services.Set(f.vipTCP, clusterIP(f.vipTCP, l4(f.b, 8080, model.TCP)))
	st.Services.Set(f.direct, clusterIP(f.direct, l4(f.b, 5353, model.UDP)))
	return st
}

// TestStaleUDPSocketInCgroup (audit 6, finding 6): a node's UDP socket
// connected to a ClusterIP while kube-proxy served the node (its DNAT in
// OUTPUT, endpoint A) rides kube-proxy's conntrack entry after Sluice
// takes over: connect4 translates at connect only. At Sluice's start
// (EndStaleUDP after the first apply, Service VIP -> B; kube-proxy's rule
// gone, A no longer serving) the socket is ended (ECONNABORTED), the
// entry is deleted, and a socket connected again reaches B. A TCP
// connection kube-proxy DNATed is left alone, and so is its entry, and
// the entry of a frontend's flow no one NATed. IPv4, IPv6 and a
// dual-stack socket to ::ffff:a.b.c.d. On main the socket went on sending
// to A.
// Both methods: the bpf_sock_destroy iterator and netlink SOCK_DESTROY.
func TestStaleUDPSocketInCgroup(t *testing.T) {
	testutil.Privileged(t)
	forEachSockDestroyMethod(t, func(t *testing.T, method SockDestroyMethod) {
		for _, f := range staleFamilies {
			t.Run(f.name, func(t *testing.T) { testStaleUDPSocket(t, f, method) })
		}
	})
}

func testStaleUDPSocket(t *testing.T, f staleFamily, method SockDestroyMethod) {
	sockaddr := func(a model.L4Addr) unix.Sockaddr { return sockaddrIn(f.domain, a) }
	newSocket := func(t *testing.T, typ int) int { t.Helper(); return newSocketIn(t, f.domain, typ) }
	staleVIP, staleVIPTCP, staleDirect, staleA, staleB := f.vip, f.vipTCP, f.direct, f.a, f.b
	d := openTest(t, smallConfig(testPinDir(t)))
	cg := newTestCgroup(t)
	cg.Join(t)
	ns := topology.NewNS(t, "udpstale")
	ns.Enter(t)
	addLoopbackAddrs(t, ns, staleA, staleB)
	// A route to the VIP, as a node has one (its default route): the
	// client connects before anything translates.
	if err := ns.AddRouteDev(netip.PrefixFrom(staleVIP.Addr, staleVIP.Addr.BitLen()), "lo"); err != nil {
		t.Fatal(err)
	}
	stopA := closableUDPBackend(t, staleA)
	serveUDPBackend(t, staleB)
	addLoopbackAddrs(t, ns, staleDirect.Addr.String())
	serveUDPBackend(t, staleDirect.Addr.String())
	ln, err := net.Listen("tcp", net.JoinHostPort(staleA, "8080"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- c
		}
	}()

	// kube-proxy serves the node.
	a := netip.AddrPortFrom(addr(staleA), 5353)
	delUDP := kubeProxyDNAT(t, ns, "OUTPUT", staleVIP, a)
	delTCP := kubeProxyDNAT(t, ns, "OUTPUT", staleVIPTCP, netip.AddrPortFrom(addr(staleA), 8080))
	client := newSocket(t, unix.SOCK_DGRAM)
	if err := unix.Connect(client, sockaddr(staleVIP)); err != nil {
		t.Fatal(err)
	}
	if who, err := udpExchange(client, nil, "k0"); err != nil || who != staleA {
		t.Fatalf("through kube-proxy's DNAT the client reached %q (%v), want %s", who, err, staleA)
	}
	tcpConn := newSocket(t, unix.SOCK_STREAM)
	if err := unix.Connect(tcpConn, sockaddr(staleVIPTCP)); err != nil {
		t.Fatal(err)
	}
	srv := <-accepted
	t.Cleanup(func() { srv.Close() })
	// Unconnected: only its conntrack entry is of interest.
	direct := newSocket(t, unix.SOCK_DGRAM)
	if who, err := udpExchange(direct, sockaddr(staleDirect), "d0"); err != nil || who != staleDirect.Addr.String() {
		t.Fatalf("the server on %s answered %q (%v)", staleDirect, who, err)
	}
	if got := replySources(conntrackFlows(t, staleDirect)); len(got) != 1 || got[0] != apOf(staleDirect) {
		t.Fatalf("conntrack entries to %s reply from %v, want one, not NATed", staleDirect, got)
	}
	if got := replySources(conntrackFlows(t, staleVIP)); len(got) != 1 || got[0] != a {
		t.Fatalf("conntrack entries to %s reply from %v, want one from %s (kube-proxy's DNAT)", staleVIP, got, a)
	}

	// kube-proxy goes, and A with it; Sluice starts.
	delUDP()
	delTCP()
	stopA()
	st := staleState(f)
	attachAndApply(t, d, cg.Path, st)
	if !skipEndStaleUDP {
		res := d.EndStaleUDP(cg.Path, UDPFrontends(st))
		t.Logf("EndStaleUDP: %+v", res)
		if res.ConntrackErr != nil || res.Sockets.Err != nil {
			t.Errorf("EndStaleUDP: conntrack %v, sockets %v", res.ConntrackErr, res.Sockets.Err)
		}
		if res.Sockets.Method != method || res.ConntrackDeleted != 1 || res.Sockets.Destroyed != 1 || res.Sockets.Failed != 0 {
			t.Errorf("EndStaleUDP deleted %d entries and ended %d sockets (%d failed), want 1 and 1", res.ConntrackDeleted, res.Sockets.Destroyed, res.Sockets.Failed)
		}
	}

	if _, err := unix.Read(client, make([]byte, 100)); !errors.Is(err, unix.ECONNABORTED) {
		t.Errorf("receive on the socket connected to %s before Sluice: %v, want ECONNABORTED", staleVIP, err)
		who, err := udpExchange(client, nil, "k1")
		t.Errorf("its next datagram reached %q (%v): kube-proxy's entry sends it to %s, which no longer serves", who, err, staleA)
	}
	again := newSocket(t, unix.SOCK_DGRAM)
	if err := unix.Connect(again, sockaddr(staleVIP)); err != nil {
		t.Fatal(err)
	}
	if who, err := udpExchange(again, nil, "s1"); err != nil || who != staleB {
		t.Errorf("connected again, the client reached %q (%v), want %s", who, err, staleB)
	}
	if got := replySources(conntrackFlows(t, staleVIP)); len(got) != 0 {
		t.Errorf("conntrack entries to %s left, replying from %v", staleVIP, got)
	}
	if got := replySources(conntrackFlows(t, staleDirect)); len(got) != 1 {
		t.Errorf("conntrack entries to %s, not NATed, reply from %v: want the one kept", staleDirect, got)
	}
	// TCP: the connection and its entry stay.
	if soerr, err := unix.GetsockoptInt(tcpConn, unix.SOL_SOCKET, unix.SO_ERROR); err != nil || soerr != 0 {
		t.Errorf("the TCP connection: SO_ERROR %d (%v), want it left alone", soerr, err)
	}
	if got := replySources(conntrackFlows(t, staleVIPTCP)); len(got) != 1 {
		t.Errorf("TCP conntrack entries to %s reply from %v, want kube-proxy's one kept", staleVIPTCP, got)
	}
}

// TestStaleUDPConntrackPod (audit 6, finding 6): a pod's UDP socket
// connected to a ClusterIP while kube-proxy served the node, outside the
// sockets socket load balancing covers (its process is not in the
// cgroup), sends through the node (its bridge, with
// bridge-nf-call-iptables on, as Kubernetes has it), where kube-proxy's
// DNAT (PREROUTING, endpoint A) left a conntrack entry. At Sluice's start
// (EndStaleUDP after the first apply, VIP -> B; A no longer serving) the
// entry is deleted, the pod's socket is left open (it is not socket load
// balancing's to end), and its next datagram reaches B through Sluice's
// tc program on the bridge. On main the entry stayed; the datagram
// reached B all the same: tc translates it before netfilter sees it (and
// forwards it around netfilter), so only a packet that reaches netfilter
// untranslated ever met that entry.
func TestStaleUDPConntrackPod(t *testing.T) {
	testutil.Privileged(t)
	d := openTest(t, smallConfig(testPinDir(t)))
	// Socket load balancing covers a cgroup the test is not in.
	cg := newTestCgroup(t)
	if err := d.AttachCgroup(cg.Path); err != nil {
		t.Fatal(err)
	}
	tp := topology.NewT(t)
	node, pod := tp.AddNST(t, "udpnode"), tp.AddNST(t, "udppod")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(node.AddBridge("br0"))
	must(tp.Veth(node, "n0", pod, "c0"))
	must(node.SetMaster("n0", "br0"))
	must(node.AddAddr("br0", netip.MustParsePrefix("10.244.7.1/24")))
	must(pod.AddAddr("c0", netip.MustParsePrefix("10.244.7.2/24")))
	must(pod.AddRoute(netip.MustParsePrefix("0.0.0.0/0"), addr("10.244.7.1")))
	must(node.Sysctl("net/bridge/bridge-nf-call-iptables", "1"))
	node.Enter(t)
	addLoopbackAddrs(t, node, staleA, staleB)
	stopA := closableUDPBackend(t, staleA)
	serveUDPBackend(t, staleB)
	must(d.AttachDevices([]string{"br0"}))

	a := netip.MustParseAddrPort(staleA + ":5353")
	delUDP := kubeProxyDNAT(t, node, "PREROUTING", staleVIP, a)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pod.DialContext(ctx, "udp4", apOf(staleVIP).String())
	must(err)
	t.Cleanup(func() { conn.Close() })
	exchange := func(msg string) (string, error) {
		if err := conn.SetReadDeadline(time.Now().Add(2 * time.Second)); err != nil {
			return "", err
		}
		if _, err := conn.Write([]byte(msg)); err != nil {
			return "", err
		}
		buf := make([]byte, 1500)
		n, err := conn.Read(buf)
		if err != nil {
			return "", err
		}
		who, ok := strings.CutPrefix(string(buf[:n]), "backend ")
		if !ok {
			return "", fmt.Errorf("reply %q", buf[:n])
		}
		return strings.Fields(who)[0], nil
	}
	if who, err := exchange("p0"); err != nil || who != staleA {
		t.Fatalf("through kube-proxy's DNAT the pod reached %q (%v), want %s", who, err, staleA)
	}
	if got := replySources(conntrackFlows(t, staleVIP)); len(got) != 1 || got[0] != a {
		t.Fatalf("conntrack entries to %s reply from %v, want one from %s (kube-proxy's DNAT)", staleVIP, got, a)
	}

	delUDP()
	stopA()
	st := staleState(staleFamilies[0])
	must(reconciler.New(d.Maps(), nil).Apply(st))
	if !skipEndStaleUDP {
		res := d.EndStaleUDP(cg.Path, UDPFrontends(st))
		t.Logf("EndStaleUDP: %+v", res)
		if res.ConntrackErr != nil || res.Sockets.Err != nil {
			t.Errorf("EndStaleUDP: conntrack %v, sockets %v", res.ConntrackErr, res.Sockets.Err)
		}
		if res.ConntrackDeleted != 1 || res.Sockets.Destroyed != 0 {
			t.Errorf("EndStaleUDP deleted %d entries and ended %d sockets, want 1 and none (the pod's socket is not socket load balancing's)", res.ConntrackDeleted, res.Sockets.Destroyed)
		}
	}
	if who, err := exchange("p1"); err != nil || who != staleB {
		t.Errorf("the pod's next datagram reached %q (%v), want %s", who, err, staleB)
	}
	if got := replySources(conntrackFlows(t, staleVIP)); len(got) != 0 {
		t.Errorf("conntrack entries to %s left, replying from %v", staleVIP, got)
	}
	if soerr, err := unix.GetsockoptInt(connFd(t, conn), unix.SOL_SOCKET, unix.SO_ERROR); err != nil || soerr != 0 {
		t.Errorf("the pod's socket: SO_ERROR %d (%v), want it left open", soerr, err)
	}
}

// connFd is the descriptor of c, a UDP connection of the net package.
func connFd(t *testing.T, c net.Conn) int {
	t.Helper()
	raw, err := c.(*net.UDPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var fd int
	if err := raw.Control(func(f uintptr) { fd = int(f) }); err != nil {
		t.Fatal(err)
	}
	return fd
}

// TestStaleUDPFlow: which netfilter conntrack entries EndStaleUDP deletes:
// UDP to a frontend that someone DNATed (its reply comes from elsewhere,
// of either family, an IPv4-mapped one as IPv4); not TCP, not an entry
// whose reply comes from its original destination (not NATed), not UDP to
// an address and port that is no frontend, nor to a frontend's address on
// another port.
func TestStaleUDPFlow(t *testing.T) {
	frontends := map[netip.AddrPort]bool{
		netip.MustParseAddrPort("10.96.0.10:53"):     true,
		netip.MustParseAddrPort("[fd00::10]:53"):     true,
		netip.MustParseAddrPort("192.168.1.5:30053"): true, // a NodePort on a node address
	}
	flow := func(proto uint8, dst, replySrc string) *netlink.ConntrackFlow {
		d, r := netip.MustParseAddrPort(dst), netip.MustParseAddrPort(replySrc)
		f := &netlink.ConntrackFlow{}
		f.Forward.Protocol, f.Reverse.Protocol = proto, proto
		f.Forward.DstIP, f.Forward.DstPort = d.Addr().AsSlice(), d.Port()
		f.Reverse.SrcIP, f.Reverse.SrcPort = r.Addr().AsSlice(), r.Port()
		return f
	}
	for _, c := range []struct {
		name          string
		proto         uint8
		dst, replySrc string
		want          bool
	}{
		{"DNATed ClusterIP", unix.IPPROTO_UDP, "10.96.0.10:53", "10.244.1.7:5353", true},
		{"DNATed, same address other port", unix.IPPROTO_UDP, "10.96.0.10:53", "10.96.0.10:5353", true},
		{"DNATed IPv6", unix.IPPROTO_UDP, "[fd00::10]:53", "[fd00:244::7]:53", true},
		{"DNATed IPv4-mapped", unix.IPPROTO_UDP, "[::ffff:10.96.0.10]:53", "[::ffff:10.244.1.7]:53", true},
		{"DNATed NodePort", unix.IPPROTO_UDP, "192.168.1.5:30053", "10.244.2.3:53", true},
		{"not NATed", unix.IPPROTO_UDP, "10.96.0.10:53", "10.96.0.10:53", false},
		{"TCP", unix.IPPROTO_TCP, "10.96.0.10:53", "10.244.1.7:5353", false},
		{"no frontend", unix.IPPROTO_UDP, "10.96.0.11:53", "10.244.1.7:5353", false},
		{"frontend address, other port", unix.IPPROTO_UDP, "10.96.0.10:54", "10.244.1.7:5353", false},
	} {
		if got := staleUDPFlow(frontends, flow(c.proto, c.dst, c.replySrc)); got != c.want {
			t.Errorf("%s: deleted %v, want %v", c.name, got, c.want)
		}
	}
}

// TestStaleUDPSocketScope: the socket pass of EndStaleUDP ends only the
// sockets socket load balancing covers: a socket connected to a frontend
// by a process outside the cgroup is left open, by either method.
func TestStaleUDPSocketScope(t *testing.T) {
	testutil.Privileged(t)
	forEachSockDestroyMethod(t, func(t *testing.T, method SockDestroyMethod) {
		d := openTest(t, smallConfig(testPinDir(t)))
		cg := newTestCgroup(t) // the test's process is not in it
		ns := topology.NewNS(t, "udpscope")
		ns.Enter(t)
		f := staleFamilies[0]
		fd := connectedBeforeSluice(t, ns, f.vip)
		st := staleState(f)
		if err := reconciler.New(d.Maps(), nil).Apply(st); err != nil {
			t.Fatal(err)
		}
		endStaleWantOpen(t, d, cg.Path, st, method, fd, "the socket outside the cgroup")
	})
}

// TestStaleUDPHostNetnsOnly: with --socket-lb-host-netns-only socket load
// balancing covers the host's namespace only, and so does the socket pass
// of EndStaleUDP, which runs in it (here the test's node namespace): a
// socket of the cgroup connected to a frontend there is ended, one of the
// same cgroup in a pod's namespace is left open (tc serves the pod).
func TestStaleUDPHostNetnsOnly(t *testing.T) {
	testutil.Privileged(t)
	forEachSockDestroyMethod(t, func(t *testing.T, method SockDestroyMethod) {
		d := openTestWith(t, smallConfig, func(c *Config) { c.SocketLBHostNetnsOnly = true })
		cg := newTestCgroup(t)
		cg.Join(t)
		tp := topology.NewT(t)
		node, pod := tp.AddNST(t, "udphost"), tp.AddNST(t, "udppod")
		f := staleFamilies[0]
		hostFd, podFd := connectedBeforeSluice(t, node, f.vip), connectedBeforeSluice(t, pod, f.vip)
		st := staleState(f)
		attachAndApply(t, d, cg.Path, st)
		node.Enter(t)
		if !skipEndStaleUDP {
			res := d.EndStaleUDP(cg.Path, UDPFrontends(st))
			if res.Sockets.Err != nil || res.Sockets.Destroyed != 1 || res.Sockets.Namespaces != 1 {
				t.Errorf("sockets: %+v, want 1 ended, in 1 namespace", res.Sockets)
			}
		}
		if soerr, err := unix.GetsockoptInt(hostFd, unix.SOL_SOCKET, unix.SO_ERROR); err != nil || soerr != int(unix.ECONNABORTED) {
			t.Errorf("the node's socket: SO_ERROR %d (%v), want ECONNABORTED", soerr, err)
		}
		if soerr, err := unix.GetsockoptInt(podFd, unix.SOL_SOCKET, unix.SO_ERROR); err != nil || soerr != 0 {
			t.Errorf("the pod's socket: SO_ERROR %d (%v), want it left open", soerr, err)
		}
	})
}

// TestStaleUDPNotOurs: a socket connect4 (connect6) translated at Sluice's
// start is left open by EndStaleUDP though its peer, the backend picked,
// is itself a UDP frontend (here an EndpointSlice naming another
// Service's VIP; an ExternalIP equal to a hostNetwork backend's node
// address and port is the same): its sock_rev entry says Sluice put it
// there. Both methods, IPv4, IPv6 and a dual-stack socket to
// ::ffff:a.b.c.d. Before, matching on the kernel's peer alone, it was
// ended at every agent start.
func TestStaleUDPNotOurs(t *testing.T) {
	testutil.Privileged(t)
	forEachSockDestroyMethod(t, func(t *testing.T, method SockDestroyMethod) {
		for _, f := range staleFamilies {
			t.Run(f.name, func(t *testing.T) {
				d := openTest(t, smallConfig(testPinDir(t)))
				cg := newTestCgroup(t)
				cg.Join(t)
				ns := topology.NewNS(t, "udpnotours")
				ns.Enter(t)
				// The outer Service's backend is the inner's VIP.
				inner := f.vip
				outer := l4("10.96.7.60", 53, model.UDP)
				if inner.Addr.Is6() {
					outer = l4("fd00:96:7::60", 53, model.UDP)
				}
				for _, a := range []netip.Addr{inner.Addr, outer.Addr} {
					if err := ns.AddRouteDev(netip.PrefixFrom(a, a.BitLen()), "lo"); err != nil {
						t.Fatal(err)
					}
				}
				st := staleState(f)
				st.Services.Set(outer, clusterIP(outer, inner))
				attachAndApply(t, d, cg.Path, st)
				fd := newSocketIn(t, f.domain, unix.SOCK_DGRAM)
				if err := unix.Connect(fd, sockaddrIn(f.domain, outer)); err != nil {
					t.Fatal(err)
				}
				endStaleWantOpen(t, d, cg.Path, st, method, fd, fmt.Sprintf("the socket connect4 translated to %s", inner))
			})
		}
	})
}

// TestStaleUDPFrontendSocketNoCgroup: the netlink path's judgement of a
// socket connected to a frontend. With a scope set (--cgroup not the
// root) and no cgroup from sock_diag (INET_DIAG_CGROUP_ID, Linux 5.7) it
// is left open and said so (destroyNetlinkFrontends then returns an
// error, logged at Warn), where it was skipped in silence before.
func TestStaleUDPFrontendSocketNoCgroup(t *testing.T) {
	fe := netip.MustParseAddrPort("10.96.0.10:53")
	frontends := map[netip.AddrPort]bool{fe: true}
	sock := func(dst netip.AddrPort, cgroup uint64, has bool) diagUDP {
		return diagUDP{id: udpSocketID{family: unix.AF_INET, dst: dst}, cgroup: cgroup, hasCgroup: has}
	}
	scope := map[uint64]bool{7: true}
	for _, c := range []struct {
		name  string
		s     diagUDP
		scope map[uint64]bool
		want  int
	}{
		{"no frontend", sock(netip.MustParseAddrPort("10.96.0.11:53"), 7, true), scope, frontendSocketSkip},
		{"in scope", sock(fe, 7, true), scope, frontendSocketEnd},
		{"out of scope", sock(fe, 8, true), scope, frontendSocketSkip},
		{"no cgroup, scope set", sock(fe, 0, false), scope, frontendSocketNoCgroup},
		{"no cgroup, no scope", sock(fe, 0, false), nil, frontendSocketEnd},
		{"no frontend, no cgroup", sock(netip.MustParseAddrPort("10.96.0.11:53"), 0, false), scope, frontendSocketSkip},
	} {
		if got := frontendSocket(c.s, frontends, c.scope); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
}

// TestStaleUDPFrontendsIterLoadFails: the frontends iterator is loaded
// for the start's pass only, best effort. When it does not load, Open
// has already succeeded (the backends' iterator with it) and the pass
// falls back to netlink SOCK_DESTROY, ending the socket all the same and
// saying why (its Err, the start's Warn line). Before, both iterators
// were loaded at Open, and a load failure of this one failed the start.
func TestStaleUDPFrontendsIterLoadFails(t *testing.T) {
	testutil.Privileged(t)
	if haveSockDestroyKfunc() != nil || haveNetlinkDestroy() != nil {
		t.Skip("needs bpf_sock_destroy (Linux 6.5+) and SOCK_DESTROY")
	}
	forceSockDestroy(t, SockDestroyBPF)
	orig := loadFrontendsIter
	loadFrontendsIter = func(*sockTerminator, uint64) (*frontendsIter, error) {
		return nil, errors.New("verifier says no")
	}
	t.Cleanup(func() { loadFrontendsIter = orig })
	d := openTest(t, smallConfig(testPinDir(t)))
	if d.maps.sockTerm == nil || d.maps.sockTerm.method != SockDestroyBPF || d.maps.sockTerm.iter == nil {
		t.Fatalf("socket terminator %+v, want the bpf iterator of removed backends", d.maps.sockTerm)
	}
	cg := newTestCgroup(t)
	cg.Join(t)
	ns := topology.NewNS(t, "udpnoiter")
	ns.Enter(t)
	f := staleFamilies[0]
	fd := connectedBeforeSluice(t, ns, f.vip)
	st := staleState(f)
	attachAndApply(t, d, cg.Path, st)
	if !skipEndStaleUDP {
		res := d.EndStaleUDP(cg.Path, UDPFrontends(st))
		if res.Sockets.Method != SockDestroyNetlink || res.Sockets.Destroyed != 1 ||
			res.Sockets.Err == nil || !strings.Contains(res.Sockets.Err.Error(), "verifier says no") {
			t.Errorf("sockets: %+v, want 1 ended by netlink and the load error", res.Sockets)
		}
	}
	if soerr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR); err != nil || soerr != int(unix.ECONNABORTED) {
		t.Errorf("the socket connected to %s before Sluice: SO_ERROR %d (%v), want ECONNABORTED", f.vip, soerr, err)
	}
}
