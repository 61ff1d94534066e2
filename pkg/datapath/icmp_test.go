package datapath

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/sluice-lb/sluice/internal/testutil/packet"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/model"
)

// ICMP errors about translated flows (B7). An error quotes the packet that
// caused it as that packet was where it failed: translated. A client
// connected to a VIP gets a fragmentation needed (or a backend's port
// unreachable) about <client -> backend>, which matches none of its
// sockets, so path MTU discovery and ECONNREFUSED never work through a VIP.
// The programs translate such errors back, outer and inner headers, with
// the flow's conntrack entries: the quote becomes <client -> VIP>, a
// backend's own address as the outer source becomes the VIP, and for a
// source-NATed flow the error goes on to the client. Errors about replies
// (from the client's side) go the other way, to the backend.

// quoteOf returns the first n bytes of the IP packet p (n <= 0: all of
// it): what an ICMP error quotes of it.
func quoteOf(p packet.Packet, n int) []byte {
	b := p.L3()
	if n <= 0 || n > len(b) {
		return b
	}
	return b[:n]
}

func TestTCICMPErrors(t *testing.T) {
	forFamilies(t, tcICMPErrors)
}

// tcICMPErrors is TestTCICMPErrors over IPv4, or with v6 over IPv6 with
// the twins of its addresses (twinAddr) and ICMPv6's messages, whose
// checksum covers a pseudo-header of the outer addresses too.
func tcICMPErrors(t *testing.T, v6 bool) {
	d := newTestDatapath(t)
	m := d.Maps()
	vipU := l4(twinAddr(v6, "10.96.0.90"), 53, model.UDP)
	vipT := l4(twinAddr(v6, "10.96.0.90"), 80, model.TCP)
	beU := testBackend{91, l4(twinAddr(v6, "10.1.9.1"), 5353, model.UDP)}
	beT := testBackend{92, l4(twinAddr(v6, "10.1.9.1"), 8080, model.TCP)}
	addService(t, m, 1, vipU, beU)
	addService(t, m, 2, vipT, beT)
	client, router := twinAddr(v6, "10.0.0.1"), twinAddr(v6, "10.1.9.254")
	vip, be := vipU.Addr.String(), beU.addr.Addr.String()
	hl := ipHdrLen(v6)

	query := []byte("a query")
	udp := func(src string, sport uint16, dst string, dport uint16) packet.Packet {
		return udpPacket(src, sport, dst, dport, query).With(func(p *packet.Packet) { p.ID, p.TTL = 0x0901, 63 })
	}
	// A TCP segment of 1400 bytes, of which an error quotes 128.
	data := bytes.Repeat([]byte("s"), 1360)
	tcp := func(src string, sport uint16, dst string, dport uint16) packet.Packet {
		return tcpPacket(src, sport, dst, dport, 0x18, data).With(func(p *packet.Packet) { p.ID, p.FragOff, p.TTL = 0x0902, packet.DF, 63 })
	}

	// The flows: a UDP query and a TCP connection to the VIP.
	runEdgeSteps(t, d, []edgeStep{
		{name: "udp flow", in: ether(udp(client, 5300, vip, 53)), verdict: tcActOK, want: ether(udp(client, 5300, be, 5353))},
		{name: "tcp flow", in: ether(tcp(client, 40000, vip, 80)), verdict: tcActOK, want: ether(tcp(client, 40000, be, 8080))},
	})

	portUnreach := func(from string, q []byte) packet.Packet { return icmpMsg(from, client, icmpPortUnreach, 0, q) }
	fragNeeded := func(from string, q []byte) packet.Packet { return icmpMsg(from, client, icmpTooBig, 1400, q) }
	steps := []edgeStep{
		// The backend's port unreachable about the query, leaving
		// towards the client: from the VIP, about <client -> VIP>.
		{name: "port unreachable from the backend, egress", egress: true,
			in:      ether(portUnreach(be, quoteOf(udp(client, 5300, be, 5353), 0))),
			verdict: tcActOK,
			want:    ether(portUnreach(vip, quoteOf(udp(client, 5300, vip, 53), 0)))},
		{name: "port unreachable from the backend, ingress",
			in:      ether(portUnreach(be, quoteOf(udp(client, 5300, be, 5353), 0))),
			verdict: tcActOK,
			want:    ether(portUnreach(vip, quoteOf(udp(client, 5300, vip, 53), 0)))},
		// A router's fragmentation needed (IPv6: packet too big) about
		// a TCP segment: the router stays the source; the quote (128
		// bytes, a truncated segment whose TCP checksum covers all of
		// it) is translated.
		{name: "frag needed from a router, egress", egress: true,
			in:      ether(fragNeeded(router, quoteOf(tcp(client, 40000, be, 8080), 128))),
			verdict: tcActOK,
			want:    ether(fragNeeded(router, quoteOf(tcp(client, 40000, vip, 80), 128)))},
		// RFC 792's minimum quote: the IP header and 8 bytes (the TCP
		// checksum is not in it).
		{name: "frag needed, 8-byte quote", egress: true,
			in:      ether(fragNeeded(router, quoteOf(tcp(client, 40000, be, 8080), hl+8))),
			verdict: tcActOK,
			want:    ether(fragNeeded(router, quoteOf(tcp(client, 40000, vip, 80), hl+8)))},
		// The client's port unreachable about a reply (its socket is
		// gone), to the VIP: on to the backend, about <backend -> client>.
		{name: "port unreachable from the client about a reply",
			in:      ether(icmpMsg(client, vip, icmpPortUnreach, 0, quoteOf(udp(vip, 53, client, 5300), 0))),
			verdict: tcActOK,
			want:    ether(icmpMsg(client, be, icmpPortUnreach, 0, quoteOf(udp(be, 5353, client, 5300), 0)))},
		// Left alone: errors about flows Sluice did not translate, a
		// quote too short to name the flow, errors about ICMP, and
		// ICMP that is not an error.
		{name: "error about another flow", egress: true,
			in: ether(portUnreach(be, quoteOf(udp(client, 5399, be, 5353), 0))), verdict: tcActOK},
		{name: "quote without ports", egress: true,
			in: ether(portUnreach(be, quoteOf(udp(client, 5300, be, 5353), hl+2))), verdict: tcActOK},
		{name: "error about ICMP", egress: true,
			in: ether(portUnreach(be, icmpMsg(client, be, icmpEcho, 0, nil).L3())), verdict: tcActOK},
		// (An echo request to a ClusterIP is refused, as any protocol's
		// new connection: TestTCOtherProtocols. A reply starts none.)
		{name: "echo reply to the VIP",
			in: ether(icmpMsg(client, vip, icmpKind{packet.ICMPEchoReply, 0, packet.ICMPv6EchoReply, 0}, 0x00010001, []byte("ping"))), verdict: tcActOK},
	}
	runEdgeSteps(t, d, steps)

	cs := counters(t, d)
	if cs["tc_icmp_xlate"] != 5 {
		t.Errorf("tc_icmp_xlate = %d, want 5", cs["tc_icmp_xlate"])
	}
}

// TestTCICMPErrorsNorthSouth: errors about source-NATed flows go on to the
// other end, translated: a router's fragmentation needed about <node:port
// -> backend> to the client as about <client -> NodePort>, and the
// client's port unreachable about a reply on to the backend. Per family
// (the IPv6 NodePorts of nodeDatapath6; a packet too big for IPv6).
func TestTCICMPErrorsNorthSouth(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		n := nsNodeOf(t, v6, smallConfig)
		ifindex, d, np, npU, beT, beU := n.ifindex, n.d, n.np, n.npU, n.be, n.beU
		ing := d.TCIngress()
		eth, n2 := macOf(nodeEthMAC), macOf(node2MAC)
		client, node := nsTwin(v6, nsClientIP), nsTwin(v6, nsNodeIP)
		beTS, beUS := beT.addr.Addr.String(), beU.addr.Addr.String()
		router := nsTwin(v6, nsNode2IP) // the other node, routing the backends

		// A TCP flow and a UDP flow.
		seg := func(src string, sport uint16, dst string, dport uint16) packet.Packet {
			return tcpPacket(src, sport, dst, dport, 0x18, bytes.Repeat([]byte("d"), 1400)).With(func(p *packet.Packet) { p.FragOff, p.TTL = packet.DF, 63 })
		}
		dg := func(src string, sport uint16, dst string, dport uint16) packet.Packet {
			return udpPacket(src, sport, dst, dport, []byte("q")).With(func(p *packet.Packet) { p.TTL = 63 })
		}
		const cport = 45000
		for _, in := range [][]byte{
			frame(eth, clientMAC, seg(client, cport, node, np.Port)),
			frame(eth, clientMAC, dg(client, cport, node, npU.Port)),
		} {
			if v, _ := runOn(t, ing, ifindex, in); v != tcActRedirect {
				t.Fatalf("flow: verdict %d", v)
			}
		}
		spT := snatPortFam(t, d, client, cport, np)
		spU := snatPortFam(t, d, client, cport, npU)

		fwd := func(p packet.Packet) packet.Packet { p.TTL = 63; return p }
		for _, c := range []struct {
			name    string
			in, out []byte
		}{
			{"frag needed from a router about a request",
				frame(eth, n2, icmpMsg(router, node, icmpTooBig, 1400, quoteOf(seg(node, spT, beTS, 8080), 128))),
				frame(clientMAC, eth, fwd(icmpMsg(router, client, icmpTooBig, 1400, quoteOf(seg(client, cport, node, np.Port), 128))))},
			{"port unreachable from the backend",
				frame(eth, n2, icmpMsg(beUS, node, icmpPortUnreach, 0, quoteOf(dg(node, spU, beUS, 5353), 0))),
				frame(clientMAC, eth, fwd(icmpMsg(node, client, icmpPortUnreach, 0, quoteOf(dg(client, cport, node, npU.Port), 0))))},
			{"port unreachable from the client about a reply",
				frame(eth, clientMAC, icmpMsg(client, node, icmpPortUnreach, 0, quoteOf(dg(node, npU.Port, client, cport), 0))),
				frame(n2, eth, fwd(icmpMsg(node, beUS, icmpPortUnreach, 0, quoteOf(dg(beUS, 5353, node, spU), 0))))},
		} {
			verdict, out := runOn(t, ing, ifindex, c.in)
			if verdict != tcActRedirect || !bytes.Equal(out, c.out) {
				t.Errorf("%s: verdict %d (want redirect), output %s", c.name, verdict, packet.Diff(out, c.out))
			}
		}
	})
}

// TestICMPPortUnreachableEndToEnd: a connected UDP socket to a ClusterIP
// whose backend has nothing listening gets ECONNREFUSED: the backend's
// port unreachable (ICMPv6's over IPv6), translated at the node, matches
// the socket.
func TestICMPPortUnreachableEndToEnd(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		d, lb, plane := lbDatapathOf(t, v6)
		vip := l4(vipOf(v6, "10.96.0.91"), 53, model.UDP)
		addService(t, d.Maps(), 1, vip, testBackend{1, l4(plane.backends[0].String(), 5353, model.UDP)})
		if err := lb.Node.Do(func() error { return d.AttachDevices([]string{lb.NodeDev}) }); err != nil {
			t.Fatal(err)
		}
		c := dialFrom(t, lb.Client, netOf("udp", vip.Addr), vip, 5*time.Second)
		if _, err := c.Write([]byte("anyone?")); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err := c.Read(make([]byte, 64))
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("read from %s, whose backend has no listener: %v, want ECONNREFUSED", vip, err)
		}
		expectCounted(t, d, "tc_icmp_xlate")
	})
}

// TestPMTUThroughVIPEndToEnd: path MTU discovery works through a
// ClusterIP. The node's link to the backend has MTU 1400 (the backend's
// end keeps 1500, so neither end's MSS shows it): the client's 1500-byte
// segments to the VIP get a fragmentation needed (over IPv6 a packet too
// big) from the node about <client -> backend>, which only works once
// translated to <client -> VIP>. Without it the transfer stalls (a PMTU
// black hole).
func TestPMTUThroughVIPEndToEnd(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		d, lb, plane := lbDatapathOf(t, v6)
		setMTU(t, lb.Node, lb.NodeBackendDevs[0], 1400)
		be := netip.AddrPortFrom(plane.backends[0], 8080)
		vip := l4(vipOf(v6, "10.96.0.92"), 80, model.TCP)
		addService(t, d.Maps(), 1, vip, testBackend{1, l4(be.Addr().String(), be.Port(), model.TCP)})
		if err := lb.Node.Do(func() error { return d.AttachDevices([]string{lb.NodeDev}) }); err != nil {
			t.Fatal(err)
		}
		pmtuTransfer(t, lb, be, vip, "a 1400-byte MTU hop")
		cs := counters(t, d)
		if cs["tc_icmp_xlate"] == 0 {
			t.Errorf("tc_icmp_xlate = 0: the transfer needed no translated ICMP error?")
		}
	})
}

// lbDatapath is d, a datapath (not attached yet), and the topology of
// topology.BuildLB with one backend: a client, a node and the backend.
func lbDatapath(t *testing.T, d *Datapath) (*Datapath, *topology.LB) {
	t.Helper()
	lb, err := topology.NewT(t).BuildLB(1)
	if err != nil {
		t.Fatal(err)
	}
	return d, lb
}

// setMTU sets the MTU of dev in ns.
func setMTU(t *testing.T, ns *topology.NS, dev string, mtu int) {
	t.Helper()
	if err := ns.Do(func() error {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		return netlink.LinkSetMTU(l, mtu)
	}); err != nil {
		t.Fatal(err)
	}
}

// pmtuTransfer writes 256 KiB and a newline from lb's client to target,
// whose backend (lb's first, at be) counts what it reads until the newline
// and answers how much; t fails unless the whole count comes back. A
// transfer that stalls in a path MTU black hole (via says which hop has
// the smaller MTU) fails it.
func pmtuTransfer(t *testing.T, lb *topology.LB, be netip.AddrPort, target model.L4Addr, via string) {
	t.Helper()
	ln, err := lb.Backends[0].Listen(netOf("tcp", be.Addr()), be.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		line, _ := bufio.NewReaderSize(c, 1<<20).ReadString('\n')
		_, _ = fmt.Fprintf(c, "%d\n", len(line)) // the client checks the answer
	}()

	c := dialFrom(t, lb.Client, netOf("tcp", target.Addr), target, 10*time.Second)
	c.SetDeadline(time.Now().Add(5 * time.Second))
	msg := strings.Repeat("x", 256<<10) + "\n"
	if _, err := io.WriteString(c, msg); err != nil {
		t.Fatalf("write 256 KiB through %s with %s: %v", target, via, err)
	}
	answer, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || answer != fmt.Sprintf("%d\n", len(msg)) {
		t.Fatalf("backend counted %q, %v; want %d bytes (PMTU black hole?)", answer, err, len(msg))
	}
}

// TestTCICMPErrorTruncated runs every prefix of ICMP errors about a
// translated flow (their IPv4 total length, or IPv6 payload length, set to
// the prefix) through both programs: each is left alone, or translated in
// the fields translation changes only, never rewritten beyond what is
// there. Per family.
func TestTCICMPErrorTruncated(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		d := newTestDatapath(t)
		vip, be := twinAddr(v6, "10.96.0.93"), twinAddr(v6, "10.1.9.3")
		addService(t, d.Maps(), 1, l4(vip, 80, model.TCP), testBackend{1, l4(be, 8080, model.TCP)})
		client := twinAddr(v6, "10.0.0.1")
		seg := func(dst string, dport uint16) packet.Packet {
			return tcpPacket(client, 40000, dst, dport, 0, []byte("data"))
		}
		if v, _ := runProg(t, d.TCIngress(), ether(seg(vip, 80))); v != tcActOK {
			t.Fatalf("flow: verdict %d", v)
		}
		full := ether(icmpMsg(be, client, icmpPortUnreach, 0, seg(be, 8080).L3()))
		// The bytes translation changes (the rest must stay): the outer
		// source, the ICMP checksum, the quoted destination and
		// destination port, and the quoted TCP checksum; IPv4's outer
		// and quoted header checksums too.
		changes := func(i int) bool {
			return (i >= 24 && i < 30) || (i >= 36 && i < 38) || (i >= 52 && i < 54) ||
				(i >= 58 && i < 62) || (i >= 64 && i < 66) || (i >= 78 && i < 80)
		}
		hl, lenOff, uncounted := 20, 16, 0 // the IP header, where its length is, what it leaves out
		if v6 {
			hl, lenOff, uncounted = 40, 18, 40
			changes = func(i int) bool {
				return (i >= 22 && i < 38) || (i >= 56 && i < 58) || (i >= 86 && i < 102) ||
					(i >= 104 && i < 106) || (i >= 118 && i < 120)
			}
		}
		translated := 0
		for n := 14 + hl; n <= len(full); n++ {
			in := append([]byte(nil), full[:n]...)
			binary.BigEndian.PutUint16(in[lenOff:], uint16(n-14-uncounted))
			for _, prog := range []*ebpf.Program{d.TCIngress(), d.TCEgress()} {
				verdict, out := runProg(t, prog, in)
				if verdict != tcActOK || len(out) != len(in) {
					t.Fatalf("prefix %d: verdict %d, %d bytes out", n, verdict, len(out))
				}
				if bytes.Equal(out, in) {
					continue
				}
				translated++
				for i := range in {
					if in[i] != out[i] && !changes(i) {
						t.Fatalf("prefix %d: byte %d changed: %s", n, i, packet.Diff(out, in))
					}
				}
			}
		}
		if translated == 0 {
			t.Error("no prefix was translated, not even the whole error")
		}
	})
}

// TestTCICMPErrorsClashRemap: errors about a flow remapped to another port
// of its client (lb4_remap) are translated as a DNATed flow's, at egress
// as at ingress, the quote getting the client's own port back: a
// backend's or a router's error about <client:62000 -> backend> reaches
// the client as about <client:5300 -> VIP2>, and the client's error about
// a reply goes on to the backend as about <backend -> client:62000>. The
// first flow's errors are as ever. Per family.
func TestTCICMPErrorsClashRemap(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		d := openTestWith(t, smallConfig, oneSNATPort)
		m := d.Maps()
		vip1, vip2 := l4(twinAddr(v6, "10.96.0.92"), 53, model.UDP), l4(twinAddr(v6, "10.96.0.93"), 53, model.UDP)
		be := testBackend{93, l4(twinAddr(v6, "10.1.9.3"), 5353, model.UDP)}
		addService(t, m, 1, vip1, be)
		addService(t, m, 2, vip2, be)
		client, router := twinAddr(v6, "10.0.0.1"), twinAddr(v6, "10.1.9.254")
		v1, v2, b := vip1.Addr.String(), vip2.Addr.String(), be.addr.Addr.String()
		udp := func(src string, sport uint16, dst string, dport uint16) packet.Packet {
			return udpPacket(src, sport, dst, dport, []byte("a query")).With(func(p *packet.Packet) { p.ID, p.TTL = 0x0903, 63 })
		}
		portUnreach := func(from string, q []byte) packet.Packet { return icmpMsg(from, client, icmpPortUnreach, 0, q) }
		fragNeeded := func(from string, q []byte) packet.Packet { return icmpMsg(from, client, icmpTooBig, 1400, q) }
		remapped := quoteOf(udp(client, 62000, b, 5353), 0)
		asVIP2 := quoteOf(udp(client, 5300, v2, 53), 0)
		runEdgeSteps(t, d, []edgeStep{
			{name: "first flow", in: ether(udp(client, 5300, v1, 53)), verdict: tcActOK, want: ether(udp(client, 5300, b, 5353))},
			{name: "second flow: remapped", in: ether(udp(client, 5300, v2, 53)), verdict: tcActOK, want: ether(udp(client, 62000, b, 5353))},
			{name: "port unreachable from the backend about the remapped flow, egress", egress: true,
				in: ether(portUnreach(b, remapped)), verdict: tcActOK, want: ether(portUnreach(v2, asVIP2))},
			{name: "port unreachable from the backend about the remapped flow, ingress",
				in: ether(portUnreach(b, remapped)), verdict: tcActOK, want: ether(portUnreach(v2, asVIP2))},
			{name: "frag needed from a router about the remapped flow, egress", egress: true,
				in: ether(fragNeeded(router, remapped)), verdict: tcActOK, want: ether(fragNeeded(router, asVIP2))},
			{name: "port unreachable from the client about a reply of the remapped flow",
				in:      ether(icmpMsg(client, v2, icmpPortUnreach, 0, quoteOf(udp(v2, 53, client, 5300), 0))),
				verdict: tcActOK,
				want:    ether(icmpMsg(client, b, icmpPortUnreach, 0, quoteOf(udp(b, 5353, client, 62000), 0)))},
			{name: "port unreachable from the backend about the first flow", egress: true,
				in:      ether(portUnreach(b, quoteOf(udp(client, 5300, b, 5353), 0))),
				verdict: tcActOK,
				want:    ether(portUnreach(v1, quoteOf(udp(client, 5300, v1, 53), 0)))},
		})
		if got := counters(t, d)["tc_icmp_xlate"]; got != 5 {
			t.Errorf("tc_icmp_xlate = %d, want 5", got)
		}
	})
}
