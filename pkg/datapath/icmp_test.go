package datapath

import (
	"bufio"
	"bytes"
	"context"
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

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
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

// quoteOf returns the first n bytes of the IPv4 packet h (n <= 0: all of
// it): what an ICMP error quotes of it.
func quoteOf(h ip4, n int) []byte {
	b := h.bytes()
	if n <= 0 || n > len(b) {
		return b
	}
	return b[:n]
}

// icmpErr is an ICMP error (typ, code, rest) from src to dst quoting q.
func icmpErr(src, dst string, typ, code uint8, rest uint32, q []byte) ip4 {
	return ip4{src: src, dst: dst, proto: 1, payload: icmpMessage(typ, code, rest, q)}
}

func TestTCICMPErrors(t *testing.T) {
	d := newTestDatapath(t)
	m := d.Maps()
	vipU := l4("10.96.0.90", 53, model.UDP)
	vipT := l4("10.96.0.90", 80, model.TCP)
	beU := testBackend{91, l4("10.1.9.1", 5353, model.UDP)}
	beT := testBackend{92, l4("10.1.9.1", 8080, model.TCP)}
	addService(t, m, 1, vipU, beU)
	addService(t, m, 2, vipT, beT)
	const client, router = "10.0.0.1", "10.1.9.254"
	vip, be := vipU.Addr.String(), beU.addr.Addr.String()

	query := []byte("a query")
	udp := func(src string, sport uint16, dst string, dport uint16) ip4 {
		return ip4{src: src, dst: dst, proto: 17, id: 0x0901, ttl: 63, payload: udpDatagram(src, dst, sport, dport, query, false)}
	}
	// A TCP segment of 1400 bytes, of which an error quotes 128.
	data := bytes.Repeat([]byte("s"), 1360)
	tcp := func(src string, sport uint16, dst string, dport uint16) ip4 {
		return ip4{src: src, dst: dst, proto: 6, id: 0x0902, df: true, ttl: 63, payload: tcpSegment(src, dst, sport, dport, 0x18, data)}
	}

	// The flows: a UDP query and a TCP connection to the VIP.
	runEdgeSteps(t, d, []edgeStep{
		{name: "udp flow", in: ether(udp(client, 5300, vip, 53).bytes()), verdict: tcActOK, want: ether(udp(client, 5300, be, 5353).bytes())},
		{name: "tcp flow", in: ether(tcp(client, 40000, vip, 80).bytes()), verdict: tcActOK, want: ether(tcp(client, 40000, be, 8080).bytes())},
	})

	portUnreach := func(from string, q []byte) ip4 { return icmpErr(from, client, 3, 3, 0, q) }
	fragNeeded := func(from string, q []byte) ip4 { return icmpErr(from, client, 3, 4, 1400, q) }
	steps := []edgeStep{
		// The backend's port unreachable about the query, leaving
		// towards the client: from the VIP, about <client -> VIP>.
		{name: "port unreachable from the backend, egress", egress: true,
			in:      ether(portUnreach(be, quoteOf(udp(client, 5300, be, 5353), 0)).bytes()),
			verdict: tcActOK,
			want:    ether(portUnreach(vip, quoteOf(udp(client, 5300, vip, 53), 0)).bytes())},
		{name: "port unreachable from the backend, ingress",
			in:      ether(portUnreach(be, quoteOf(udp(client, 5300, be, 5353), 0)).bytes()),
			verdict: tcActOK,
			want:    ether(portUnreach(vip, quoteOf(udp(client, 5300, vip, 53), 0)).bytes())},
		// A router's fragmentation needed about a TCP segment: the
		// router stays the source; the quote (128 bytes, a truncated
		// segment whose TCP checksum covers all of it) is translated.
		{name: "frag needed from a router, egress", egress: true,
			in:      ether(fragNeeded(router, quoteOf(tcp(client, 40000, be, 8080), 128)).bytes()),
			verdict: tcActOK,
			want:    ether(fragNeeded(router, quoteOf(tcp(client, 40000, vip, 80), 128)).bytes())},
		// RFC 792's minimum quote: the IP header and 8 bytes (the TCP
		// checksum is not in it).
		{name: "frag needed, 8-byte quote", egress: true,
			in:      ether(fragNeeded(router, quoteOf(tcp(client, 40000, be, 8080), 28)).bytes()),
			verdict: tcActOK,
			want:    ether(fragNeeded(router, quoteOf(tcp(client, 40000, vip, 80), 28)).bytes())},
		// The client's port unreachable about a reply (its socket is
		// gone), to the VIP: on to the backend, about <backend -> client>.
		{name: "port unreachable from the client about a reply",
			in:      ether(icmpErr(client, vip, 3, 3, 0, quoteOf(udp(vip, 53, client, 5300), 0)).bytes()),
			verdict: tcActOK,
			want:    ether(icmpErr(client, be, 3, 3, 0, quoteOf(udp(be, 5353, client, 5300), 0)).bytes())},
		// Left alone: errors about flows Sluice did not translate, a
		// quote too short to name the flow, errors about ICMP, and
		// ICMP that is not an error.
		{name: "error about another flow", egress: true,
			in: ether(portUnreach(be, quoteOf(udp(client, 5399, be, 5353), 0)).bytes()), verdict: tcActOK},
		{name: "quote without ports", egress: true,
			in: ether(portUnreach(be, quoteOf(udp(client, 5300, be, 5353), 22)).bytes()), verdict: tcActOK},
		{name: "error about ICMP", egress: true,
			in: ether(portUnreach(be, icmpErr(client, be, 8, 0, 0, nil).bytes()).bytes()), verdict: tcActOK},
		{name: "echo request to the VIP",
			in: ether(icmpErr(client, vip, 8, 0, 0x00010001, []byte("ping")).bytes()), verdict: tcActOK},
	}
	runEdgeSteps(t, d, steps)

	cs, err := d.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if cs["tc_icmp_xlate"] != 5 {
		t.Errorf("tc_icmp_xlate = %d, want 5", cs["tc_icmp_xlate"])
	}
}

// TestTCICMPErrorsNorthSouth: errors about source-NATed flows go on to the
// other end, translated: a router's fragmentation needed about <node:port
// -> backend> to the client as about <client -> NodePort>, and the
// client's port unreachable about a reply on to the backend.
func TestTCICMPErrorsNorthSouth(t *testing.T) {
	testutil.Privileged(t)
	_, ifindex := nodeNetns(t)
	d := openTest(t, smallConfig(testPinDir(t)))
	m := d.Maps()
	if err := d.AttachDevices([]string{"eth0"}); err != nil {
		t.Fatal(err)
	}
	addExternal(t, m, 1, npRemote, reconciler.FlagExternal, beRemote)
	addExternal(t, m, 3, npUDP, reconciler.FlagExternal, beRemU)
	ing := d.TCIngress()
	eth, n2 := macOf(nodeEthMAC), macOf(node2MAC)
	const router = "192.168.1.2" // the other node, routing the backends

	// A TCP flow and a UDP flow.
	seg := func(src string, sport uint16, dst string, dport uint16) ip4 {
		return ip4{src: src, dst: dst, proto: 6, df: true, ttl: 63,
			payload: tcpSegment(src, dst, sport, dport, 0x18, bytes.Repeat([]byte("d"), 1400))}
	}
	dg := func(src string, sport uint16, dst string, dport uint16) ip4 {
		return ip4{src: src, dst: dst, proto: 17, ttl: 63, payload: udpDatagram(src, dst, sport, dport, []byte("q"), false)}
	}
	const cport = 45000
	for _, in := range [][]byte{
		frame(eth, clientMAC, seg(nsClientIP, cport, nsNodeIP, npRemote.Port).bytes()),
		frame(eth, clientMAC, dg(nsClientIP, cport, nsNodeIP, npUDP.Port).bytes()),
	} {
		if v, _ := runOn(t, ing, ifindex, in); v != tcActRedirect {
			t.Fatalf("flow: verdict %d", v)
		}
	}
	spT := snatPortOf(t, m, nsClientIP, cport, npRemote)
	spU := snatPortOf(t, m, nsClientIP, cport, npUDP)

	fwd := func(h ip4) ip4 { h.ttl = 63; return h }
	for _, c := range []struct {
		name    string
		in, out []byte
	}{
		{"frag needed from a router about a request",
			frame(eth, n2, icmpErr(router, nsNodeIP, 3, 4, 1400, quoteOf(seg(nsNodeIP, spT, "10.2.0.7", 8080), 128)).bytes()),
			frame(clientMAC, eth, fwd(icmpErr(router, nsClientIP, 3, 4, 1400, quoteOf(seg(nsClientIP, cport, nsNodeIP, npRemote.Port), 128))).bytes())},
		{"port unreachable from the backend",
			frame(eth, n2, icmpErr("10.2.0.8", nsNodeIP, 3, 3, 0, quoteOf(dg(nsNodeIP, spU, "10.2.0.8", 5353), 0)).bytes()),
			frame(clientMAC, eth, fwd(icmpErr(nsNodeIP, nsClientIP, 3, 3, 0, quoteOf(dg(nsClientIP, cport, nsNodeIP, npUDP.Port), 0))).bytes())},
		{"port unreachable from the client about a reply",
			frame(eth, clientMAC, icmpErr(nsClientIP, nsNodeIP, 3, 3, 0, quoteOf(dg(nsNodeIP, npUDP.Port, nsClientIP, cport), 0)).bytes()),
			frame(n2, eth, fwd(icmpErr(nsNodeIP, "10.2.0.8", 3, 3, 0, quoteOf(dg("10.2.0.8", 5353, nsNodeIP, spU), 0))).bytes())},
	} {
		verdict, out := runOn(t, ing, ifindex, c.in)
		if verdict != tcActRedirect || !bytes.Equal(out, c.out) {
			t.Errorf("%s: verdict %d (want redirect), output %s", c.name, verdict, packetDiff(out, c.out))
		}
	}
}

// TestICMPPortUnreachableEndToEnd: a connected UDP socket to a ClusterIP
// whose backend has nothing listening gets ECONNREFUSED: the backend's
// port unreachable, translated at the node, matches the socket.
func TestICMPPortUnreachableEndToEnd(t *testing.T) {
	d := newTestDatapath(t)
	topo := topology.NewT(t)
	lb, err := topo.BuildLB(1)
	if err != nil {
		t.Fatal(err)
	}
	vip := l4("10.96.0.91", 53, model.UDP)
	addService(t, d.Maps(), 1, vip, testBackend{1, l4(lb.BackendAddrs[0].String(), 5353, model.UDP)})
	if err := lb.Node.Do(func() error { return d.AttachDevices([]string{lb.NodeDev}) }); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := lb.Client.DialContext(ctx, "udp4", apOf(vip).String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("anyone?")); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, err = c.Read(make([]byte, 64))
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("read from %s, whose backend has no listener: %v, want ECONNREFUSED", vip, err)
	}
}

// TestPMTUThroughVIPEndToEnd: path MTU discovery works through a
// ClusterIP. The node's link to the backend has MTU 1400 (the backend's
// end keeps 1500, so neither end's MSS shows it): the client's 1500-byte
// segments to the VIP get a fragmentation needed from the node about
// <client -> backend>, which only works once translated to <client -> VIP>.
// Without it the transfer stalls (a PMTU black hole).
func TestPMTUThroughVIPEndToEnd(t *testing.T) {
	d := newTestDatapath(t)
	topo := topology.NewT(t)
	lb, err := topo.BuildLB(1)
	if err != nil {
		t.Fatal(err)
	}
	if err := lb.Node.Do(func() error {
		l, err := netlink.LinkByName(lb.NodeBackendDevs[0])
		if err != nil {
			return err
		}
		return netlink.LinkSetMTU(l, 1400)
	}); err != nil {
		t.Fatal(err)
	}
	be := netip.AddrPortFrom(lb.BackendAddrs[0], 8080)
	vip := l4("10.96.0.92", 80, model.TCP)
	addService(t, d.Maps(), 1, vip, testBackend{1, l4(be.Addr().String(), be.Port(), model.TCP)})
	if err := lb.Node.Do(func() error { return d.AttachDevices([]string{lb.NodeDev}) }); err != nil {
		t.Fatal(err)
	}

	// The backend counts what it reads until a newline and says how much.
	ln, err := lb.Backends[0].Listen("tcp4", be.String())
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

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := lb.Client.DialContext(ctx, "tcp4", apOf(vip).String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	msg := strings.Repeat("x", 256<<10) + "\n"
	if _, err := io.WriteString(c, msg); err != nil {
		t.Fatalf("write 256 KiB through %s with a 1400-byte MTU hop: %v", vip, err)
	}
	answer, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || answer != fmt.Sprintf("%d\n", len(msg)) {
		t.Fatalf("backend counted %q, %v; want %d bytes (PMTU black hole?)", answer, err, len(msg))
	}
	cs, err := d.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if cs["tc_icmp_xlate"] == 0 {
		t.Errorf("tc_icmp_xlate = 0: the transfer needed no translated ICMP error?")
	}
}

// TestTCICMPErrorTruncated runs every prefix of ICMP errors about a
// translated flow (their IPv4 total length set to the prefix) through both
// programs: each is left alone, or translated in the fields translation
// changes only, never rewritten beyond what is there.
func TestTCICMPErrorTruncated(t *testing.T) {
	d := newTestDatapath(t)
	addService(t, d.Maps(), 1, l4("10.96.0.93", 80, model.TCP), testBackend{1, l4("10.1.9.3", 8080, model.TCP)})
	const client = "10.0.0.1"
	seg := func(dst string, dport uint16) ip4 {
		return ip4{src: client, dst: dst, proto: 6, payload: tcpSegment(client, dst, 40000, dport, 0, []byte("data"))}
	}
	if v, _ := runProg(t, d.TCIngress(), ether(seg("10.96.0.93", 80).bytes())); v != tcActOK {
		t.Fatalf("flow: verdict %d", v)
	}
	full := ether(icmpErr("10.1.9.3", client, 3, 3, 0, seg("10.1.9.3", 8080).bytes()).bytes())
	translated := 0
	for n := 14 + 20; n <= len(full); n++ {
		in := append([]byte(nil), full[:n]...)
		binary.BigEndian.PutUint16(in[16:], uint16(n-14))
		for _, prog := range []*ebpf.Program{d.TCIngress(), d.TCEgress()} {
			verdict, out := runProg(t, prog, in)
			if verdict != tcActOK || len(out) != len(in) {
				t.Fatalf("prefix %d: verdict %d, %d bytes out", n, verdict, len(out))
			}
			if bytes.Equal(out, in) {
				continue
			}
			translated++
			// Outer source and checksum, the ICMP checksum, the
			// quoted checksum and destination, and the quoted
			// destination port and TCP checksum.
			for i := range in {
				ok := (i >= 24 && i < 30) || (i >= 36 && i < 38) || (i >= 52 && i < 54) ||
					(i >= 58 && i < 62) || (i >= 64 && i < 66) || (i >= 78 && i < 80)
				if in[i] != out[i] && !ok {
					t.Fatalf("prefix %d: byte %d changed: %s", n, i, packetDiff(out, in))
				}
			}
		}
	}
	if translated == 0 {
		t.Error("no prefix was translated, not even the whole error")
	}
}
