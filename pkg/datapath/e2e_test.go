package datapath

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/pkg/model"
)

// TestTCEndToEnd runs real traffic through the tc programs: a client in one
// network namespace reaches ClusterIPs routed to a "node" namespace over a
// veth pair, with the programs on the node's end. The backends are local
// to the node. No socket programs are attached, so every translation here
// is per packet: DNAT at n0 ingress, reverse NAT of the replies at n0
// egress, and ICMP port unreachable for a service without backends.
//
//	client ns: c0 10.201.0.2/24, default via 10.201.0.1
//	node ns:   n0 10.201.0.1/24 (tc ingress+egress), lo 10.200.0.2, 10.200.0.3
func TestTCEndToEnd(t *testing.T) {
	d := newTestDatapath(t)

	vip := l4("10.96.0.30", 80, model.TCP)
	vipU := l4("10.96.0.30", 53, model.UDP)
	empty := l4("10.96.0.31", 80, model.TCP)
	emptyU := l4("10.96.0.31", 53, model.UDP)
	applyServices(t, d,
		clusterIP(vip, l4(sockBackends[0], 8080, model.TCP), l4(sockBackends[1], 8080, model.TCP)),
		clusterIP(vipU, l4(sockBackends[0], 5353, model.UDP), l4(sockBackends[1], 5353, model.UDP)),
		clusterIP(empty), clusterIP(emptyU))

	_, clientNS := clientAndNode(t, d, "10.201.0")
	clientNS.Enter(t)

	connect := func(a model.L4Addr) (int, error) {
		fd := newSocket(t, unix.SOCK_STREAM)
		tv := unix.NsecToTimeval(int64(3 * time.Second))
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv); err != nil {
			t.Fatal(err)
		}
		return fd, unix.Connect(fd, sockaddr(a))
	}

	// All in this goroutine: it is the one inside the client namespace.
	// At least 16 connections, and on until both backends answered (at
	// most 64): a fair pick leaves one of two unreached in 16 once in
	// 32,768 runs, in 64 once in 4.6e18, and a passing run stops at 16.
	seen := map[string]bool{}
	tries := 0
	for ; tries < 64 && (tries < 16 || len(seen) < 2); tries++ {
		fd, err := connect(vip)
		if err != nil {
			t.Fatalf("TCP connect %s: %v", vip, err)
		}
		buf := make([]byte, 100)
		n, err := unix.Read(fd, buf)
		if err != nil || !isBackendReply(string(buf[:n])) {
			t.Fatalf("read %q, %v: want a backend's greeting", buf[:n], err)
		}
		seen[string(buf[:n])] = true
	}
	if len(seen) != 2 {
		t.Errorf("%d connections reached %v, want both backends", tries, seen)
	}

	ufd := newSocket(t, unix.SOCK_DGRAM)
	for range 3 {
		if err := unix.Sendto(ufd, []byte("q"), 0, sockaddr(vipU)); err != nil {
			t.Fatalf("sendto %s: %v", vipU, err)
		}
		msg, from := recvFrom(t, ufd)
		if !isBackendReply(msg) || from != apOf(vipU) {
			t.Errorf("UDP reply %q from %s, want a backend's echo from the VIP %s", msg, from, apOf(vipU))
		}
	}

	if _, err := connect(empty); !errors.Is(err, unix.ECONNREFUSED) {
		t.Errorf("TCP connect to %s (no backends): %v, want ECONNREFUSED", empty, err)
	}
	cfd := newSocket(t, unix.SOCK_DGRAM)
	if err := unix.Connect(cfd, sockaddr(emptyU)); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Write(cfd, []byte("q")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := unix.Recvfrom(cfd, make([]byte, 10), 0); !errors.Is(err, unix.ECONNREFUSED) {
		t.Errorf("UDP to %s (no backends): %v, want ECONNREFUSED", emptyU, err)
	}

	cs := expectCounted(t, d, "tc_dnat_new", "tc_dnat_ct", "tc_rev_nat", "tc_no_backend")
	if cs["tc_rewrite_err"] != 0 {
		t.Errorf("tc_rewrite_err = %d: a rewrite failed", cs["tc_rewrite_err"])
	}
}

// TestTCClashRemapEndToEnd: a client binds one port for two connections
// at once, to two ClusterIPs whose only endpoint is the same (and two
// connected UDP sockets the same way). kube-proxy serves both: netfilter
// moves the second to another source port. So does tc (lb4_remap): the
// endpoint sees two peers, the client's port and another, and both
// connections carry data both ways, interleaved, each answered as its own
// VIP. Topology as TestTCEndToEnd's, over each family.
func TestTCClashRemapEndToEnd(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		d := newTestDatapath(t)
		subnet, domain, be, vips := "10.202.0", unix.AF_INET, sockBackends[0], []string{"10.96.0.40", "10.96.0.41"}
		if v6 {
			subnet, domain, be, vips = "2001:db8:202::", unix.AF_INET6, sockBackends6[0], []string{"2001:db8:96::40", "2001:db8:96::41"}
		}
		var svcs []*model.Service
		for _, v := range vips {
			svcs = append(svcs, clusterIP(l4(v, 80, model.TCP), l4(be, 9090, model.TCP)), clusterIP(l4(v, 53, model.UDP), l4(be, 5353, model.UDP)))
		}
		applyServices(t, d, svcs...)
		_, clientNS := clientAndNode(t, d, subnet)
		peers := serveTCPEcho(t, l4(be, 9090, model.TCP))
		clientNS.Enter(t)
		client := netip.MustParseAddr(subnet + map[bool]string{false: ".2", true: "2"}[v6])

		const cport = 47400
		// open binds a socket of typ to the client's port cport (shared:
		// SO_REUSEADDR) and connects it to vip.
		open := func(typ int, vip model.L4Addr) int {
			fd := newSocketIn(t, domain, typ)
			tv := unix.NsecToTimeval(int64(3 * time.Second))
			if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
				t.Fatal(err)
			}
			if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv); err != nil {
				t.Fatal(err)
			}
			var sa unix.Sockaddr
			if v6 {
				sa = &unix.SockaddrInet6{Addr: client.As16(), Port: cport}
			} else {
				sa = &unix.SockaddrInet4{Addr: client.As4(), Port: cport}
			}
			if err := unix.Bind(fd, sa); err != nil {
				t.Fatalf("bind %s: %v", netip.AddrPortFrom(client, cport), err)
			}
			if err := unix.Connect(fd, sockaddrIn(domain, vip)); err != nil {
				t.Fatalf("connect %s from port %d: %v", vip, cport, err)
			}
			return fd
		}
		var tcp, udp []int
		for _, v := range vips {
			tcp = append(tcp, open(unix.SOCK_STREAM, l4(v, 80, model.TCP)))
			udp = append(udp, open(unix.SOCK_DGRAM, l4(v, 53, model.UDP)))
		}
		// Both connections are open; each carries data both ways, in
		// turn, twice.
		for round := range 2 {
			for i, fd := range tcp {
				msg := fmt.Sprintf("round %d to %s", round, vips[i])
				if _, err := unix.Write(fd, []byte(msg)); err != nil {
					t.Fatalf("write to %s: %v", vips[i], err)
				}
				buf := make([]byte, 100)
				n, err := unix.Read(fd, buf)
				if err != nil || string(buf[:n]) != msg {
					t.Fatalf("TCP to %s: read %q, %v, want the echo %q", vips[i], buf[:n], err, msg)
				}
			}
			for i, fd := range udp {
				msg := fmt.Sprintf("round %d to %s", round, vips[i])
				if _, err := unix.Write(fd, []byte(msg)); err != nil {
					t.Fatalf("send to %s: %v", vips[i], err)
				}
				got, from := recvFrom(t, fd)
				if want := "backend " + be + " got " + msg; got != want || from != netip.AddrPortFrom(addr(vips[i]), 53) {
					t.Fatalf("UDP to %s: %q from %s, want %q from the VIP", vips[i], got, from, want)
				}
			}
		}
		// The endpoint saw the client's port and another.
		seen := map[netip.AddrPort]bool{<-peers: true, <-peers: true}
		if !seen[netip.AddrPortFrom(client, cport)] || len(seen) != 2 {
			t.Errorf("the endpoint's peers: %v, want %s and another port of it", seen, netip.AddrPortFrom(client, cport))
		}
		for p := range seen {
			if p.Addr() != client {
				t.Errorf("the endpoint saw %s, not the client's own address %s", p, client)
			}
		}
		if got := counters(t, d)["tc_ct_clash_remap"]; got != 2 {
			t.Errorf("tc_ct_clash_remap = %d, want 2 (the second TCP connection, the second UDP socket)", got)
		}
		expectCounted(t, d, "tc_dnat_new", "tc_dnat_ct", "tc_rev_nat")
	})
}

// serveTCPEcho echoes what each connection to a sends, until the test
// ends, in the calling goroutine's network namespace; it sends each
// connection's peer on the channel it returns.
func serveTCPEcho(t *testing.T, a model.L4Addr) <-chan netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", apOf(a).String())
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	t.Cleanup(func() { ln.Close() })
	peers := make(chan netip.AddrPort, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
			peers <- netip.MustParseAddrPort(c.RemoteAddr().String())
			go func() { _, _ = io.Copy(c, c) }()
		}
	}()
	return peers
}
