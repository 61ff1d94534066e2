package datapath

// The socket programs' entries of one socket (bpf/sock.c): written under
// the socket's cookie, and forgotten with the socket.
//
// connect4 (connect6) writes the socket's sock_rev entry under its cookie
// and its backend, and sluice_sock_release deletes it when the socket's
// last descriptor is closed, so the LRU holds the live sockets' entries
// instead of filling with closed ones (where every connect then evicts
// one, and a long-lived socket's entry can be evicted by newer ones).
// sendmsg4's stickiness entry of an unconnected UDP socket is the
// socket's own: another socket to the same frontend selects for itself.
// Real sockets in a namespace and cgroup of the test's own: the cgroup
// hooks cannot be run by BPF_PROG_TEST_RUN.

import (
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

func TestSockRevForgottenOnRelease(t *testing.T) {
	d := newTestDatapath(t)
	ns, _ := sockNode(t, d, "sockrel", append(sockBackends, sockOtherBackend)...)
	addLoopbackAddrs(t, ns, append(sockBackends6, sockOtherBackend6)...)
	startBackends(t, sockBackends6...)
	for _, f := range sockLBFamilies {
		t.Run(f.name, func(t *testing.T) { testSockRevForgotten(t, d, ns, f) })
	}
}

func testSockRevForgotten(t *testing.T, d *Datapath, ns *topology.NS, f sockLBFamily) {
	m := d.Maps()
	id := func(n uint32) uint32 { return f.id + 100 + n }
	addService(t, m, reconciler.ServiceID(id(1)), f.tcp,
		testBackend{reconciler.BackendID(id(1)), l4(f.backends[0], 8080, model.TCP)})
	addService(t, m, reconciler.ServiceID(id(2)), f.udp,
		testBackend{reconciler.BackendID(id(2)), l4(f.backends[0], 5353, model.UDP)})
	// The IPv4 map for IPv4 sockets and IPv4-mapped destinations alike.
	v6 := f.name == "ipv6"
	revMap := mapSockRev
	if v6 {
		revMap = mapSockRev6
	}
	rev, err := ebpf.LoadPinnedMap(filepath.Join(d.dir, revMap), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rev.Close()

	for _, c := range []struct {
		name string
		typ  int
		vip  model.L4Addr
	}{{"tcp", unix.SOCK_STREAM, f.tcp}, {"udp_connected", unix.SOCK_DGRAM, f.udp}} {
		t.Run(c.name, func(t *testing.T) {
			ns.Enter(t) // a subtest's goroutine: its sockets in the namespace too
			open := func() (int, uint64) {
				fd, err := unix.Socket(f.domain, c.typ|unix.SOCK_CLOEXEC, 0)
				if err != nil {
					t.Fatal(err)
				}
				connectSeesPeer(t, fd, f.domain, c.vip)
				cookie, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_COOKIE)
				if err != nil {
					unix.Close(fd)
					t.Fatal(err)
				}
				return fd, cookie
			}
			kept, keptCookie := open()
			defer unix.Close(kept)
			closed, closedCookie := open()
			if n := sockRevEntries(t, rev, v6, closedCookie); n != 1 {
				t.Fatalf("sock_rev entries of the connected socket: %d, want 1", n)
			}
			if err := unix.Close(closed); err != nil {
				t.Fatal(err)
			}
			// The release runs as close returns (the last descriptor's
			// final put is done before the syscall goes back to user space).
			if n := sockRevEntries(t, rev, v6, closedCookie); n != 0 {
				t.Errorf("sock_rev entries of the closed socket: %d, want 0", n)
			}
			if n := sockRevEntries(t, rev, v6, keptCookie); n != 1 {
				t.Errorf("sock_rev entries of the socket still open: %d, want 1", n)
			}
			// And the open one still shows the VIP.
			peer, err := unix.Getpeername(kept)
			if err != nil {
				t.Fatal(err)
			}
			if got := addrPort(peer); got != apOf(c.vip) {
				t.Errorf("getpeername of the socket still open = %s, want %s", got, apOf(c.vip))
			}
		})
	}
}

// sockRevEntries counts the entries of rev (sluice_sock_rev_v1, or with
// v6 sluice6_sock_rev_v1) under socket cookie cookie.
func sockRevEntries(t *testing.T, rev *ebpf.Map, v6 bool, cookie uint64) int {
	t.Helper()
	n := 0
	var val []byte
	if v6 {
		var k sockSock6RevKey
		for it := rev.Iterate(); it.Next(&k, &val); {
			if k.Cookie == cookie {
				n++
			}
		}
		return n
	}
	var k sockSockRevKey
	for it := rev.Iterate(); it.Next(&k, &val); {
		if k.Cookie == cookie {
			n++
		}
	}
	return n
}

// TestSockStickyPerSocket: two unconnected UDP sockets sending to one
// frontend each get a stickiness entry under their own cookie.
func TestSockStickyPerSocket(t *testing.T) {
	d := newTestDatapath(t)
	sockNode(t, d, "sockstick", sockBackends...)
	m := d.Maps()
	vip := l4("10.96.0.77", 53, model.UDP)
	addService(t, m, 77, vip, testBackend{77, l4(sockBackends[0], 5353, model.UDP)},
		testBackend{78, l4(sockBackends[1], 5353, model.UDP)})
	stick, err := ebpf.LoadPinnedMap(filepath.Join(d.dir, mapUDPStick), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stick.Close()
	var cookies []uint64
	for range 2 {
		fd := newSocket(t, unix.SOCK_DGRAM)
		if err := unix.Sendto(fd, []byte("hi"), 0, sockaddr(vip)); err != nil {
			t.Fatalf("sendto %s: %v", vip, err)
		}
		if msg, _ := recvFrom(t, fd); !isBackendReply(msg) {
			t.Fatalf("reply %q: want a backend's echo", msg)
		}
		c, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_COOKIE)
		if err != nil {
			t.Fatal(err)
		}
		cookies = append(cookies, c)
	}
	seen := map[uint64]int{}
	var k sockSockUdpStickKey
	var val []byte
	for it := stick.Iterate(); it.Next(&k, &val); {
		if k.Vip == be32(vip.Addr) {
			seen[k.Cookie]++
		}
	}
	for _, c := range cookies {
		if seen[c] != 1 {
			t.Errorf("stickiness entries of %s: %v, want one under each socket's cookie %v", vip, seen, cookies)
			break
		}
	}
}
