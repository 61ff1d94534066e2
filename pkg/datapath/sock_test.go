package datapath

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// Socket LB with real sockets. The socket programs are attached to a
// cgroup this test creates, and the test process joins it; the backends
// listen on 10.200.0.x, addresses that exist only on the loopback device of
// a network namespace this test creates. Nothing outside either is touched.

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
)

// startBackends runs a TCP server (port 8080) and a UDP echo server (port
// 5353) on each backend address; both answer with the address they serve.
func startBackends(t *testing.T) {
	t.Helper()
	for _, a := range sockBackends {
		ln, err := net.Listen("tcp4", a+":8080")
		if err != nil {
			t.Fatalf("listen: %v", err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				// The client checks what it reads; one that hung
				// up early wants nothing.
				_, _ = c.Write([]byte("backend " + a))
				c.Close()
			}
		}()

		serveUDPBackend(t, a)
	}
}

// serveUDPBackend answers every datagram to a:5353 with "backend <a> got
// <datagram>", until the test ends.
func serveUDPBackend(t *testing.T, a string) {
	t.Helper()
	pc, err := net.ListenPacket("udp4", a+":5353")
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
}

func sockaddr(a model.L4Addr) *unix.SockaddrInet4 {
	return &unix.SockaddrInet4{Addr: a.Addr.As4(), Port: int(a.Port)}
}

func addrPort(sa unix.Sockaddr) netip.AddrPort {
	if s4, ok := sa.(*unix.SockaddrInet4); ok {
		return netip.AddrPortFrom(netip.AddrFrom4(s4.Addr), uint16(s4.Port))
	}
	return netip.AddrPort{}
}

func apOf(a model.L4Addr) netip.AddrPort { return netip.AddrPortFrom(a.Addr, a.Port) }

// newSocket returns a socket with a 2s receive timeout, closed at the end
// of the test.
func newSocket(t *testing.T, typ int) int {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, typ|unix.SOCK_CLOEXEC, 0)
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
	for _, a := range sockBackends {
		if strings.HasPrefix(s, "backend "+a) {
			return true
		}
	}
	return false
}

func TestSockLB(t *testing.T) {
	d := newTestDatapath(t)
	ns, cg := sockNode(t, d, "sock", append(sockBackends, sockOtherBackend)...)
	// Attaching again replaces the programs in place.
	if err := d.AttachCgroup(cg.Path); err != nil {
		t.Fatalf("AttachCgroup again: %v", err)
	}

	m := d.Maps()
	addService(t, m, 1, sockVIPTCP,
		testBackend{1, l4(sockBackends[0], 8080, model.TCP)}, testBackend{2, l4(sockBackends[1], 8080, model.TCP)})
	addService(t, m, 2, sockVIPUDP,
		testBackend{3, l4(sockBackends[0], 5353, model.UDP)}, testBackend{4, l4(sockBackends[1], 5353, model.UDP)})
	addService(t, m, 3, sockVIPEmpty)
	addService(t, m, 4, sockVIPEmptU)
	affBackends := []testBackend{{5, l4(sockBackends[0], 5353, model.UDP)}, {6, l4(sockBackends[1], 5353, model.UDP)}}
	addService(t, m, 5, sockVIPAff, affBackends...)

	// Each subtest runs on a goroutine of its own: enter the netns again
	// there so that its sockets are created inside it.
	t.Run("tcp_connect_to_vip", func(t *testing.T) {
		ns.Enter(t)
		seen := map[string]bool{}
		for range 24 {
			fd := newSocket(t, unix.SOCK_STREAM)
			if err := unix.Connect(fd, sockaddr(sockVIPTCP)); err != nil {
				t.Fatalf("connect %s: %v", sockVIPTCP, err)
			}
			peer, err := unix.Getpeername(fd)
			if err != nil {
				t.Fatal(err)
			}
			if got := addrPort(peer); got != apOf(sockVIPTCP) {
				t.Errorf("getpeername = %s, want the VIP %s", got, apOf(sockVIPTCP))
			}
			buf := make([]byte, 100)
			n, err := unix.Read(fd, buf)
			if err != nil || !isBackendReply(string(buf[:n])) {
				t.Fatalf("read %q, %v: want a backend's greeting", buf[:n], err)
			}
			seen[string(buf[:n])] = true
		}
		if len(seen) != len(sockBackends) {
			t.Errorf("24 connections reached %v, want both backends", seen)
		}
	})

	t.Run("udp_connected", func(t *testing.T) {
		ns.Enter(t)
		fd := newSocket(t, unix.SOCK_DGRAM)
		if err := unix.Connect(fd, sockaddr(sockVIPUDP)); err != nil {
			t.Fatalf("connect %s: %v", sockVIPUDP, err)
		}
		peer, err := unix.Getpeername(fd)
		if err != nil {
			t.Fatal(err)
		}
		if got := addrPort(peer); got != apOf(sockVIPUDP) {
			t.Errorf("getpeername = %s, want the VIP %s", got, apOf(sockVIPUDP))
		}
		if _, err := unix.Write(fd, []byte("ping")); err != nil {
			t.Fatal(err)
		}
		msg, from := recvFrom(t, fd)
		if !isBackendReply(msg) || !strings.HasSuffix(msg, " got ping") {
			t.Errorf("reply %q: want a backend's echo", msg)
		}
		if from != apOf(sockVIPUDP) {
			t.Errorf("reply from %s, want the VIP %s", from, apOf(sockVIPUDP))
		}
	})

	t.Run("udp_unconnected_sendto", func(t *testing.T) {
		ns.Enter(t)
		fd := newSocket(t, unix.SOCK_DGRAM)
		var first string
		for i := range 10 {
			if err := unix.Sendto(fd, []byte("hi"), 0, sockaddr(sockVIPUDP)); err != nil {
				t.Fatalf("sendto %s: %v", sockVIPUDP, err)
			}
			msg, from := recvFrom(t, fd)
			if !isBackendReply(msg) {
				t.Fatalf("reply %q: want a backend's echo", msg)
			}
			if from != apOf(sockVIPUDP) {
				t.Errorf("recvfrom reports %s, want the VIP %s", from, apOf(sockVIPUDP))
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
		serveUDPBackend(t, sockOtherBackend)

		// send sends one datagram on fd to sockVIPAff and returns the
		// index in affBackends of the backend that answered.
		send := func(fd int) int {
			t.Helper()
			if err := unix.Sendto(fd, []byte("hi"), 0, sockaddr(sockVIPAff)); err != nil {
				t.Fatalf("sendto %s: %v", sockVIPAff, err)
			}
			msg, from := recvFrom(t, fd)
			if from != apOf(sockVIPAff) {
				t.Errorf("recvfrom reports %s, want the VIP %s", from, apOf(sockVIPAff))
			}
			for i, b := range affBackends {
				if strings.HasPrefix(msg, "backend "+b.addr.Addr.String()+" ") {
					return i
				}
			}
			t.Fatalf("reply %q: not from a backend of %s", msg, sockVIPAff)
			return -1
		}
		// keepOnly shrinks sockVIPAff to affBackends[i] in slot 1, the
		// way the reconciler does: slot, master, then the old slot.
		keepOnly := func(i int) {
			t.Helper()
			if err := m.UpsertSlot(reconciler.DefaultScope(sockVIPAff), 1, affBackends[i].id); err != nil {
				t.Fatal(err)
			}
			if err := m.UpsertMaster(reconciler.DefaultScope(sockVIPAff), reconciler.Master{ID: 5, Count: 1}); err != nil {
				t.Fatal(err)
			}
			if err := m.DeleteSlot(reconciler.DefaultScope(sockVIPAff), 2); err != nil {
				t.Fatal(err)
			}
		}
		restore := func() {
			t.Helper()
			addService(t, m, 5, sockVIPAff, affBackends...)
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
		addService(t, m, 6, sockVIPOther, testBackend{id, l4(sockOtherBackend, 5353, model.UDP)})
		for range 5 {
			if got := send(fd); got != 1-first {
				t.Fatalf("datagram answered by backend %d, want %s", got, affBackends[1-first].addr)
			}
		}
		// Put the id back as it was, for whoever runs after.
		if err := m.DeleteSlot(reconciler.DefaultScope(sockVIPOther), 0); err != nil {
			t.Fatal(err)
		}
		if err := m.DeleteSlot(reconciler.DefaultScope(sockVIPOther), 1); err != nil {
			t.Fatal(err)
		}
		restore()
	})

	t.Run("no_backends_refused", func(t *testing.T) {
		ns.Enter(t)
		fd := newSocket(t, unix.SOCK_STREAM)
		if err := unix.Connect(fd, sockaddr(sockVIPEmpty)); !errors.Is(err, unix.ECONNREFUSED) {
			t.Errorf("TCP connect to %s: %v, want ECONNREFUSED", sockVIPEmpty, err)
		}
		ufd := newSocket(t, unix.SOCK_DGRAM)
		if err := unix.Sendto(ufd, []byte("hi"), 0, sockaddr(sockVIPEmptU)); !errors.Is(err, unix.ECONNREFUSED) {
			t.Errorf("UDP sendto %s: %v, want ECONNREFUSED", sockVIPEmptU, err)
		}
		cfd := newSocket(t, unix.SOCK_DGRAM)
		if err := unix.Connect(cfd, sockaddr(sockVIPEmptU)); !errors.Is(err, unix.ECONNREFUSED) {
			t.Errorf("UDP connect %s: %v, want ECONNREFUSED", sockVIPEmptU, err)
		}
	})

	t.Run("non_service_untouched", func(t *testing.T) {
		ns.Enter(t)
		direct := l4(sockBackends[1], 8080, model.TCP)
		fd := newSocket(t, unix.SOCK_STREAM)
		if err := unix.Connect(fd, sockaddr(direct)); err != nil {
			t.Fatalf("connect %s: %v", direct, err)
		}
		peer, _ := unix.Getpeername(fd)
		if got := addrPort(peer); got != apOf(direct) {
			t.Errorf("getpeername = %s, want %s", got, apOf(direct))
		}
		buf := make([]byte, 100)
		if n, _ := unix.Read(fd, buf); string(buf[:n]) != "backend "+sockBackends[1] {
			t.Errorf("read %q from %s", buf[:n], direct)
		}

		udirect := l4(sockBackends[0], 5353, model.UDP)
		ufd := newSocket(t, unix.SOCK_DGRAM)
		if err := unix.Sendto(ufd, []byte("x"), 0, sockaddr(udirect)); err != nil {
			t.Fatal(err)
		}
		if msg, from := recvFrom(t, ufd); from != apOf(udirect) || msg != "backend "+sockBackends[0]+" got x" {
			t.Errorf("reply %q from %s, want it from %s", msg, from, apOf(udirect))
		}

		// A port of the VIP that is not a service: untranslated, so
		// it goes where 10.96.0.20 goes in this namespace (nowhere).
		other := l4("10.96.0.20", 81, model.TCP)
		ofd := newSocket(t, unix.SOCK_STREAM)
		if err := unix.Connect(ofd, sockaddr(other)); !errors.Is(err, unix.ENETUNREACH) {
			t.Errorf("connect %s: %v, want ENETUNREACH (no route: untranslated)", other, err)
		}
	})

	expectCounted(t, d, "sock_xlate", "sock_rev_xlate", "sock_no_backend")
}
