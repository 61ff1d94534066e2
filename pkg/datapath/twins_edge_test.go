package datapath

import (
	"fmt"
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/internal/testutil/packet"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// IPv6 twins of the edge-case tests (issue 10): the end-to-end PMTU,
// ICMP error and fragment tests, and the tables of fragments, ICMP errors,
// TTL and MTU, were written for IPv4; each now runs per family
// (forFamilies) over the same steps, its IPv4 assertions kept, the IPv6
// run with the twins of its addresses and the IPv6 forms of what differs
// (ICMPv6 types, a fragment header instead of IPv4's fragment fields, no
// DF: an IPv6 router never fragments). The helpers below give a test the
// addresses of one family.

// netOf is a Go network name ("tcp", "udp") of a's family: "tcp4" or
// "tcp6".
func netOf(proto string, a netip.Addr) string {
	if a.Is6() {
		return proto + "6"
	}
	return proto + "4"
}

// vipOf is the IPv4 VIP a of topology.ServiceRange (10.96.x.y), or with
// v6 its twin in topology.ServiceRange6 (2001:db8:96::xxyy), the range the
// client of an LB with an IPv6 plane routes to the node.
func vipOf(v6 bool, a string) string {
	if !v6 {
		return a
	}
	b := addr(a).As4()
	return fmt.Sprintf("2001:db8:96::%x", uint16(b[2])<<8|uint16(b[3]))
}

// lbPlane is the address plane, IPv4 or IPv6, of an LB topology that a
// per-family test runs over.
type lbPlane struct {
	client, node netip.Addr
	backends     []netip.Addr // backends[i] is lb.Backends[i]'s
}

// lbDatapathOf is lbDatapath over the family of v6: with v6 the LB gets
// its IPv6 plane (topology.LB.AddIPv6) and the plane returned is that one.
func lbDatapathOf(t *testing.T, v6 bool) (*Datapath, *topology.LB, lbPlane) {
	t.Helper()
	return lbDatapathOfWith(t, v6, newTestDatapath(t))
}

// lbDatapathOfWith is lbDatapathOf with d, a datapath of the test's own
// configuration.
func lbDatapathOfWith(t *testing.T, v6 bool, d *Datapath) (*Datapath, *topology.LB, lbPlane) {
	t.Helper()
	d, lb := lbDatapath(t, d)
	if !v6 {
		return d, lb, lbPlane{lb.ClientAddr, lb.NodeAddr, lb.BackendAddrs}
	}
	p6, err := lb.AddIPv6()
	if err != nil {
		t.Fatal(err)
	}
	return d, lb, lbPlane{p6.ClientAddr, p6.NodeAddr, p6.BackendAddrs}
}

// addNode3IPv6 is addNodeIPv6 for nodeNetns's eth1: 2001:db8:103::1/64
// towards node 3 (2001:db8:103::2, a static neighbour), which routes node
// 3's pods, 2001:db8:3::/64.
func addNode3IPv6(t testing.TB) {
	t.Helper()
	eth1 := mustLink(t, "eth1")
	a, _ := netlink.ParseAddr("2001:db8:103::1/64")
	a.Flags = unix.IFA_F_NODAD
	if err := netlink.AddrAdd(eth1, a); err != nil {
		t.Fatalf("address eth1: %v", err)
	}
	if err := netlink.NeighAdd(&netlink.Neigh{LinkIndex: eth1.Attrs().Index, Family: netlink.FAMILY_V6,
		State: netlink.NUD_PERMANENT, IP: net.ParseIP("2001:db8:103::2"), HardwareAddr: node3MAC}); err != nil {
		t.Fatalf("neighbour 2001:db8:103::2: %v", err)
	}
	_, pods, _ := net.ParseCIDR("2001:db8:3::/64")
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: eth1.Attrs().Index, Dst: pods, Gw: net.ParseIP("2001:db8:103::2")}); err != nil {
		t.Fatalf("route to node 3's pods: %v", err)
	}
}

// nodeNetnsOf is nodeNetns for a test run per family: with v6, the
// node's IPv6 addresses too (addNodeIPv6, addNode3IPv6). It returns
// eth0's ifindex.
func nodeNetnsOf(t testing.TB, v6 bool) int {
	t.Helper()
	_, eth0 := nodeNetns(t)
	if v6 {
		addNodeIPv6(t)
		addNode3IPv6(t)
	}
	return eth0
}

// nsTwin is an address of the north-south tables' node namespace
// (nodeNetns) as a test written for IPv4 names it, or with v6 its IPv6
// twin there (addNodeIPv6, addNode3IPv6): the node's, node 2's and the
// client's own, and a pod 10.N.0.H of node N as 2001:db8:N::H.
func nsTwin(v6 bool, a string) string {
	if !v6 {
		return a
	}
	switch a {
	case nsNodeIP:
		return nsNodeIP6
	case nsNode2IP:
		return nsNode2IP6
	case nsClientIP:
		return nsClientIP6
	}
	b := addr(a).As4()
	return fmt.Sprintf("2001:db8:%x::%x", b[1], b[3])
}

// nsTwinL4 is nsTwin of a frontend or backend.
func nsTwinL4(v6 bool, a model.L4Addr) model.L4Addr {
	a.Addr = addr(nsTwin(v6, a.Addr.String()))
	return a
}

// snatPortFam is snatPortOf, or snatPort6Of for an IPv6 flow.
func snatPortFam(t testing.TB, d *Datapath, client string, cport uint16, fe model.L4Addr) uint16 {
	t.Helper()
	if fe.Addr.Is6() {
		return snatPort6Of(t, d, client, cport, fe)
	}
	return snatPortOf(t, d.Maps(), client, cport, fe)
}

// outTTL is the TTL (IPv6: hop limit) of an output frame.
func outTTL(b []byte) uint8 {
	if out6(b) {
		return b[14+7]
	}
	return b[14+8]
}

// icmpKind is an ICMP message of the tables as either family says it: its
// ICMP type and code, and its ICMPv6 ones.
type icmpKind struct{ typ4, code4, typ6, code6 uint8 }

var (
	icmpPortUnreach  = icmpKind{packet.ICMPUnreachable, 3, packet.ICMPv6Unreachable, packet.ICMPv6PortUnreach}
	icmpTooBig       = icmpKind{packet.ICMPUnreachable, 4, packet.ICMPv6PacketTooBig, 0} // IPv4: fragmentation needed
	icmpTimeExceeded = icmpKind{11, 0, packet.ICMPv6TimeExceeded, 0}
	icmpEcho         = icmpKind{packet.ICMPEcho, 0, packet.ICMPv6EchoRequest, 0}
)

// icmpMsg is icmpErr for a message of kind k: an ICMPv6 one between IPv6
// addresses.
func icmpMsg(src, dst string, k icmpKind, rest uint32, q []byte) packet.Packet {
	p := icmpErr(src, dst, k.typ4, k.code4, rest, q)
	if p.Src.Is6() {
		p.Proto, p.ICMPType, p.ICMPCode = packet.ICMPv6, k.typ6, k.code6
	}
	return p
}

// ipHdrLen is the length of the IP header of v6's family, without options
// or extension headers: what an error's minimal quote has before the 8
// bytes of L4 header it adds.
func ipHdrLen(v6 bool) int {
	if v6 {
		return 40
	}
	return 20
}

// icmpAboutFam is icmpAbout for an IPv4 frame in, and its ICMPv6 twin
// for an IPv6 one: an error of kind k, quoting as much as its IPv4 twin
// does (the IP header and the whole L4 header), rest its MTU for a too
// big.
func icmpAboutFam(in []byte, k icmpKind, rest uint32) []byte {
	if !out6(in) {
		return icmpAbout(in, k.typ4, k.code4, rest)
	}
	ip := in[14:]
	l4len := 8
	if ip[6] == packet.TCP {
		l4len = 20
	}
	src, dst := netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40]))
	return frame([6]byte(in[6:12]), [6]byte(in[0:6]), icmpMsg(dst.String(), src.String(), k, rest, ip[:40+l4len]))
}

// nsNode is a north-south tables' node of one family: nodeNetns entered,
// a datapath of base on eth0, and its NodePorts np (TCP) and npU (UDP) to
// the backends be and beU on node 2.
type nsNode struct {
	ifindex int
	d       *Datapath
	np, npU model.L4Addr
	be, beU testBackend
}

// nsNodeOf is the node with IPv4's NodePorts npRemote and npUDP (ids 1
// and 3), or with v6 nodeDatapath6's IPv6 ones.
func nsNodeOf(t *testing.T, v6 bool, base func(bpffs string) Config) nsNode {
	t.Helper()
	if v6 {
		_, ifindex, d := nodeDatapath6(t, base)
		return nsNode{ifindex, d, np6Remote, np6UDP, be6Remote, be6RemU}
	}
	_, ifindex, d := nodeDatapath(t, base, "eth0")
	addExternal(t, d.Maps(), 1, npRemote, reconciler.FlagExternal, beRemote)
	addExternal(t, d.Maps(), 3, npUDP, reconciler.FlagExternal, beRemU)
	return nsNode{ifindex, d, npRemote, npUDP, beRemote, beRemU}
}
