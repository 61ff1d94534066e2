package datapath

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// Socket LB with real sockets. The socket programs are attached to a
// cgroup this test creates, and the test process joins it; the backends
// listen on 10.200.0.x (and 2001:db8:200::x), addresses that exist only on
// the loopback device of a network namespace this test creates. Nothing
// outside either is touched.

var (
	sockVIPTCP   = l4("10.96.0.20", 80, model.TCP)
	sockVIPUDP   = l4("10.96.0.21", 53, model.UDP)
	sockVIPEmpty = l4("10.96.0.22", 80, model.TCP)
	sockVIPEmptU = l4("10.96.0.22", 53, model.UDP)
	sockVIPAff   = l4("10.96.0.23", 53, model.UDP)
	sockVIPOther = l4("10.96.0.24", 53, model.UDP)
	// A backend of sockVIPOther only: sockVIPAff must never reach it.
	sockOtherBackend = "10.200.0.4"
	sockBackends     = []string{"10.200.0.2", "10.200.0.3"}
	// The IPv6 twins of the above (TestSockLB).
	sockOtherBackend6 = "2001:db8:200::4"
	sockBackends6     = []string{"2001:db8:200::2", "2001:db8:200::3"}
)

// startBackends runs a TCP server (port 8080) and a UDP echo server (port
// 5353) on each backend address (sockBackends unless addrs are given);
// both answer with the address they serve.
func startBackends(t *testing.T, addrs ...string) {
	t.Helper()
	if len(addrs) == 0 {
		addrs = sockBackends
	}
	for _, a := range addrs {
		ln, err := net.Listen("tcp", net.JoinHostPort(a, "8080"))
		if err != nil {
			t.Fatalf("listen: %v", err)
		}
		serveReply(t, ln, "backend "+a)

		serveUDPBackend(t, a)
	}
}

// serveReply writes reply to each connection ln accepts, and closes it,
// until ln is closed at the end of the test.
func serveReply(t *testing.T, ln net.Listener, reply string) {
	acceptEach(t, ln, func(c net.Conn) {
		// The client checks what it reads; one that hung up early
		// wants nothing.
		_, _ = c.Write([]byte(reply))
		c.Close()
	})
}

// acceptEach hands each connection ln accepts to serve, in the accepting
// goroutine, until ln is closed at the end of the test.
func acceptEach(t *testing.T, ln net.Listener, serve func(c net.Conn)) {
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			serve(c)
		}
	}()
}

// serveUDPBackend answers every datagram to a:5353 with "backend <a> got
// <datagram>", until the test ends.
func serveUDPBackend(t *testing.T, a string) {
	t.Helper()
	closableUDPBackend(t, a)
}

// closableUDPBackend is serveUDPBackend whose server can be stopped
// before the test ends (the func it returns): the endpoint that goes
// away.
func closableUDPBackend(t *testing.T, a string) func() {
	t.Helper()
	pc, err := net.ListenPacket("udp", net.JoinHostPort(a, "5353"))
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo([]byte("backend "+a+" got "+string(buf[:n])), from) // the client checks the answer
		}
	}()
	return func() { pc.Close() }
}

func sockaddr(a model.L4Addr) *unix.SockaddrInet4 {
	return &unix.SockaddrInet4{Addr: a.Addr.As4(), Port: int(a.Port)}
}

// sockaddrIn is a's address for a socket of domain: an IPv4 address is
// IPv4-mapped (::ffff:a.b.c.d) for an AF_INET6 socket.
func sockaddrIn(domain int, a model.L4Addr) unix.Sockaddr {
	if domain == unix.AF_INET {
		return sockaddr(a)
	}
	return &unix.SockaddrInet6{Addr: a.Addr.As16(), Port: int(a.Port)}
}

// addrPort is sa as an address and port; an IPv4-mapped address is
// unmapped, so that it compares equal to the IPv4 one.
func addrPort(sa unix.Sockaddr) netip.AddrPort {
	switch s := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(s.Addr), uint16(s.Port))
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(s.Addr).Unmap(), uint16(s.Port))
	}
	return netip.AddrPort{}
}

func apOf(a model.L4Addr) netip.AddrPort { return netip.AddrPortFrom(a.Addr, a.Port) }

// newSocket returns an AF_INET socket with a 2s receive timeout, closed
// at the end of the test.
func newSocket(t *testing.T, typ int) int {
	t.Helper()
	return newSocketIn(t, unix.AF_INET, typ)
}

// newSocketIn is newSocket for a socket of domain (AF_INET6: dual-stack).
func newSocketIn(t *testing.T, domain, typ int) int {
	t.Helper()
	fd, err := unix.Socket(domain, typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("socket: %v", err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	tv := unix.NsecToTimeval(int64(2 * time.Second))
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	return fd
}

// connectSeesPeer connects fd, a socket of domain, to a, which the socket
// must then name as its peer: whether a is a VIP translated to a backend
// or not, the application sees the address it connected to.
func connectSeesPeer(t *testing.T, fd, domain int, a model.L4Addr) {
	t.Helper()
	if err := unix.Connect(fd, sockaddrIn(domain, a)); err != nil {
		t.Fatalf("connect %s: %v", a, err)
	}
	peer, err := unix.Getpeername(fd)
	if err != nil {
		t.Fatal(err)
	}
	if got := addrPort(peer); got != apOf(a) {
		t.Errorf("getpeername = %s, want %s", got, apOf(a))
	}
}

func recvFrom(t *testing.T, fd int) (string, netip.AddrPort) {
	t.Helper()
	buf := make([]byte, 1500)
	n, from, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		t.Fatalf("recvfrom: %v", err)
	}
	return string(buf[:n]), addrPort(from)
}

func isBackendReply(s string) bool {
	for _, a := range append(sockBackends, sockBackends6...) {
		if strings.HasPrefix(s, "backend "+a) {
			return true
		}
	}
	return false
}

// sockLBFamily is a row of TestSockLB: sockets of domain reaching its
// frontends, served by its backends; services and backends are written
// with ids from id+1.
type sockLBFamily struct {
	name                                   string
	domain                                 int
	id                                     uint32
	tcp, udp, empty, emptyU, aff, otherVIP model.L4Addr
	backends                               []string
	other                                  string // a backend of otherVIP only
}

var sockLBFamilies = []sockLBFamily{
	{"ipv4", unix.AF_INET, 0, sockVIPTCP, sockVIPUDP, sockVIPEmpty, sockVIPEmptU, sockVIPAff, sockVIPOther,
		sockBackends, sockOtherBackend},
	{"ipv6", unix.AF_INET6, 10, l4("2001:db8:96::20", 80, model.TCP), l4("2001:db8:96::21", 53, model.UDP),
		l4("2001:db8:96::22", 80, model.TCP), l4("2001:db8:96::22", 53, model.UDP), l4("2001:db8:96::23", 53, model.UDP),
		l4("2001:db8:96::24", 53, model.UDP), sockBackends6, sockOtherBackend6},
	// A dual-stack socket reaching the IPv4 services as ::ffff:a.b.c.d.
	{"ipv4_mapped", unix.AF_INET6, 0, sockVIPTCP, sockVIPUDP, sockVIPEmpty, sockVIPEmptU, sockVIPAff, sockVIPOther,
		sockBackends, sockOtherBackend},
}

func TestSockLB(t *testing.T) {
	d := newTestDatapath(t)
	ns, cg := sockNode(t, d, "sock", append(sockBackends, sockOtherBackend)...)
	addLoopbackAddrs(t, ns, append(sockBackends6, sockOtherBackend6)...)
	startBackends(t, sockBackends6...)
	// Attaching again replaces the programs in place.
	if err := d.AttachCgroup(cg.Path); err != nil {
		t.Fatalf("AttachCgroup again: %v", err)
	}
	for _, f := range sockLBFamilies {
		t.Run(f.name, func(t *testing.T) { testSockLB(t, d, ns, f) })
	}
	expectCounted(t, d, "sock_xlate", "sock_rev_xlate", "sock_no_backend")
}

func testSockLB(t *testing.T, d *Datapath, ns *topology.NS, f sockLBFamily) {
	sockaddr := func(a model.L4Addr) unix.Sockaddr { return sockaddrIn(f.domain, a) }
	newSocket := func(t *testing.T, typ int) int { t.Helper(); return newSocketIn(t, f.domain, typ) }
	svcID := func(n uint32) reconciler.ServiceID { return reconciler.ServiceID(f.id + n) }
	beID := func(n uint32) reconciler.BackendID { return reconciler.BackendID(f.id + n) }

	m := d.Maps()
	addService(t, m, svcID(1), f.tcp,
		testBackend{beID(1), l4(f.backends[0], 8080, model.TCP)}, testBackend{beID(2), l4(f.backends[1], 8080, model.TCP)})
	addService(t, m, svcID(2), f.udp,
		testBackend{beID(3), l4(f.backends[0], 5353, model.UDP)}, testBackend{beID(4), l4(f.backends[1], 5353, model.UDP)})
	addService(t, m, svcID(3), f.empty)
	addService(t, m, svcID(4), f.emptyU)
	affBackends := []testBackend{{beID(5), l4(f.backends[0], 5353, model.UDP)}, {beID(6), l4(f.backends[1], 5353, model.UDP)}}
	addService(t, m, svcID(5), f.aff, affBackends...)

	// Each subtest runs on a goroutine of its own: enter the netns again
	// there so that its sockets are created inside it.
	t.Run("tcp_connect_to_vip", func(t *testing.T) {
		ns.Enter(t)
		seen := map[string]bool{}
		for range 24 {
			fd := newSocket(t, unix.SOCK_STREAM)
			connectSeesPeer(t, fd, f.domain, f.tcp)
			buf := make([]byte, 100)
			n, err := unix.Read(fd, buf)
			if err != nil || !isBackendReply(string(buf[:n])) {
				t.Fatalf("read %q, %v: want a backend's greeting", buf[:n], err)
			}
			seen[string(buf[:n])] = true
		}
		if len(seen) != len(f.backends) {
			t.Errorf("24 connections reached %v, want both backends", seen)
		}
	})

	t.Run("udp_connected", func(t *testing.T) {
		ns.Enter(t)
		fd := newSocket(t, unix.SOCK_DGRAM)
		connectSeesPeer(t, fd, f.domain, f.udp)
		if _, err := unix.Write(fd, []byte("ping")); err != nil {
			t.Fatal(err)
		}
		msg, from := recvFrom(t, fd)
		if !isBackendReply(msg) || !strings.HasSuffix(msg, " got ping") {
			t.Errorf("reply %q: want a backend's echo", msg)
		}
		if from != apOf(f.udp) {
			t.Errorf("reply from %s, want the VIP %s", from, apOf(f.udp))
		}
	})

	t.Run("udp_unconnected_sendto", func(t *testing.T) {
		ns.Enter(t)
		fd := newSocket(t, unix.SOCK_DGRAM)
		var first string
		for i := range 10 {
			if err := unix.Sendto(fd, []byte("hi"), 0, sockaddr(f.udp)); err != nil {
				t.Fatalf("sendto %s: %v", f.udp, err)
			}
			msg, from := recvFrom(t, fd)
			if !isBackendReply(msg) {
				t.Fatalf("reply %q: want a backend's echo", msg)
			}
			if from != apOf(f.udp) {
				t.Errorf("recvfrom reports %s, want the VIP %s", from, apOf(f.udp))
			}
			if i == 0 {
				first = msg
			} else if msg != first {
				t.Errorf("datagram %d answered by %q, the first by %q: the socket lost its backend", i, msg, first)
			}
		}
	})

	// An unconnected UDP socket keeps its backend only while that backend
	// is still one of its service's: not when it left the service, and
	// not when its id was freed and reused for another service's backend.
	t.Run("udp_unconnected_affinity_revalidated", func(t *testing.T) {
		ns.Enter(t)
		serveUDPBackend(t, f.other)

		// send sends one datagram on fd to f.aff and returns the
		// index in affBackends of the backend that answered.
		send := func(fd int) int {
			t.Helper()
			if err := unix.Sendto(fd, []byte("hi"), 0, sockaddr(f.aff)); err != nil {
				t.Fatalf("sendto %s: %v", f.aff, err)
			}
			msg, from := recvFrom(t, fd)
			if from != apOf(f.aff) {
				t.Errorf("recvfrom reports %s, want the VIP %s", from, apOf(f.aff))
			}
			for i, b := range affBackends {
				if strings.HasPrefix(msg, "backend "+b.addr.Addr.String()+" ") {
					return i
				}
			}
			t.Fatalf("reply %q: not from a backend of %s", msg, f.aff)
			return -1
		}
		// keepOnly shrinks f.aff to affBackends[i] in slot 1, the
		// way the reconciler does: slot, master, then the old slot.
		keepOnly := func(i int) {
			t.Helper()
			if err := m.UpsertSlot(reconciler.DefaultScope(f.aff), 1, affBackends[i].id); err != nil {
				t.Fatal(err)
			}
			if err := m.UpsertMaster(reconciler.DefaultScope(f.aff), reconciler.Master{ID: svcID(5), Count: 1}); err != nil {
				t.Fatal(err)
			}
			if err := m.DeleteSlot(reconciler.DefaultScope(f.aff), 2); err != nil {
				t.Fatal(err)
			}
		}
		restore := func() {
			t.Helper()
			addService(t, m, svcID(5), f.aff, affBackends...)
		}

		// 1. The backend leaves the service but its id stays (another
		// service still names the same address): the address matches,
		// the slot no longer does.
		fd := newSocket(t, unix.SOCK_DGRAM)
		first := send(fd)
		if again := send(fd); again != first {
			t.Fatalf("second datagram went to backend %d, the first to %d", again, first)
		}
		keepOnly(1 - first)
		for range 5 {
			if got := send(fd); got != 1-first {
				t.Fatalf("backend %s left the service, the socket still reaches it", affBackends[first].addr)
			}
		}
		restore()

		// 2. The backend leaves the service, its id is freed and reused
		// for a backend of another service, at another address.
		fd = newSocket(t, unix.SOCK_DGRAM)
		first = send(fd)
		id := affBackends[first].id
		keepOnly(1 - first)
		if err := m.DeleteBackend(id); err != nil {
			t.Fatal(err)
		}
		addService(t, m, svcID(6), f.otherVIP, testBackend{id, l4(f.other, 5353, model.UDP)})
		for range 5 {
			if got := send(fd); got != 1-first {
				t.Fatalf("datagram answered by backend %d, want %s", got, affBackends[1-first].addr)
			}
		}
		// Put the id back as it was, for whoever runs after.
		if err := m.DeleteSlot(reconciler.DefaultScope(f.otherVIP), 0); err != nil {
			t.Fatal(err)
		}
		if err := m.DeleteSlot(reconciler.DefaultScope(f.otherVIP), 1); err != nil {
			t.Fatal(err)
		}
		restore()
	})

	t.Run("no_backends_refused", func(t *testing.T) {
		ns.Enter(t)
		fd := newSocket(t, unix.SOCK_STREAM)
		if err := unix.Connect(fd, sockaddr(f.empty)); !errors.Is(err, unix.ECONNREFUSED) {
			t.Errorf("TCP connect to %s: %v, want ECONNREFUSED", f.empty, err)
		}
		ufd := newSocket(t, unix.SOCK_DGRAM)
		if err := unix.Sendto(ufd, []byte("hi"), 0, sockaddr(f.emptyU)); !errors.Is(err, unix.ECONNREFUSED) {
			t.Errorf("UDP sendto %s: %v, want ECONNREFUSED", f.emptyU, err)
		}
		cfd := newSocket(t, unix.SOCK_DGRAM)
		if err := unix.Connect(cfd, sockaddr(f.emptyU)); !errors.Is(err, unix.ECONNREFUSED) {
			t.Errorf("UDP connect %s: %v, want ECONNREFUSED", f.emptyU, err)
		}
	})

	t.Run("non_service_untouched", func(t *testing.T) {
		ns.Enter(t)
		direct := l4(f.backends[1], 8080, model.TCP)
		fd := newSocket(t, unix.SOCK_STREAM)
		connectSeesPeer(t, fd, f.domain, direct)
		buf := make([]byte, 100)
		if n, _ := unix.Read(fd, buf); string(buf[:n]) != "backend "+f.backends[1] {
			t.Errorf("read %q from %s", buf[:n], direct)
		}

		udirect := l4(f.backends[0], 5353, model.UDP)
		ufd := newSocket(t, unix.SOCK_DGRAM)
		if err := unix.Sendto(ufd, []byte("x"), 0, sockaddr(udirect)); err != nil {
			t.Fatal(err)
		}
		if msg, from := recvFrom(t, ufd); from != apOf(udirect) || msg != "backend "+f.backends[0]+" got x" {
			t.Errorf("reply %q from %s, want it from %s", msg, from, apOf(udirect))
		}

		// A port of the VIP that is not a service: untranslated, so
		// it goes where the VIP goes in this namespace (nowhere).
		other := l4(f.tcp.Addr.String(), 81, model.TCP)
		ofd := newSocket(t, unix.SOCK_STREAM)
		if err := unix.Connect(ofd, sockaddr(other)); !errors.Is(err, unix.ENETUNREACH) {
			t.Errorf("connect %s: %v, want ENETUNREACH (no route: untranslated)", other, err)
		}
	})

}
