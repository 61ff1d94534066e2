package datapath

import (
	"errors"
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
	seen := map[string]bool{}
	for range 16 {
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
		t.Errorf("16 connections reached %v, want both backends", seen)
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
