package datapath

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// forceSockDestroy makes the socket destroy probe answer m until the test
// ends.
func forceSockDestroy(t *testing.T, m SockDestroyMethod) {
	t.Helper()
	override(t, &sockDestroyMethod, func() SockDestroyMethod { return m })
}

// forEachSockDestroyMethod runs test as a subtest per socket destroy
// method, the bpf_sock_destroy iterator and netlink SOCK_DESTROY, with
// the probe forced to answer it; one this kernel lacks is skipped.
func forEachSockDestroyMethod(t *testing.T, test func(t *testing.T, method SockDestroyMethod)) {
	t.Helper()
	for _, method := range []SockDestroyMethod{SockDestroyBPF, SockDestroyNetlink} {
		t.Run(string(method), func(t *testing.T) {
			if method == SockDestroyBPF && haveSockDestroyKfunc() != nil {
				t.Skip("no bpf_sock_destroy (Linux 6.5+)")
			}
			if method == SockDestroyNetlink && haveNetlinkDestroy() != nil {
				t.Skip("no SOCK_DESTROY (CONFIG_INET_DIAG_DESTROY)")
			}
			forceSockDestroy(t, method)
			test(t, method)
		})
	}
}

// socketReaching opens sockets with open, which returns one and the
// backend it reached, until one reaches want, and returns that one. Each
// picks a backend at random: 40 tries all missing it has probability
// 2^-40, so t fails after 40 (what names the sockets, for the message).
func socketReaching(t *testing.T, what, want string, open func() (fd int, who string, err error)) int {
	t.Helper()
	for range 40 {
		fd, who, err := open()
		if err != nil {
			t.Fatal(err)
		}
		if who == want {
			return fd
		}
	}
	t.Fatalf("40 %s never reached %s", what, want)
	return -1
}

// udpExchange sends msg on fd (sendto vip if to is set, else on the
// connected socket) and returns the answering backend's address.
func udpExchange(fd int, to unix.Sockaddr, msg string) (string, error) {
	var err error
	if to != nil {
		err = unix.Sendto(fd, []byte(msg), 0, to)
	} else {
		_, err = unix.Write(fd, []byte(msg))
	}
	if err != nil {
		return "", fmt.Errorf("send: %w", err)
	}
	buf := make([]byte, 1500)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return "", fmt.Errorf("receive: %w", err)
	}
	reply := string(buf[:n])
	who, ok := strings.CutPrefix(reply, "backend ")
	if !ok || !strings.HasSuffix(reply, " got "+msg) {
		return "", fmt.Errorf("reply %q to %q", reply, msg)
	}
	return strings.Fields(who)[0], nil
}

func localPort(t *testing.T, fd int) int {
	t.Helper()
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return int(addrPort(sa).Port())
}

// TestSockDestroyOnBackendRemoval (issue 11 item 6, B5): a UDP socket
// connected to a VIP keeps its backend (connect4 translated it once).
// When the backend leaves the Service, the socket is ended: its next
// receive fails with ECONNABORTED and a new socket reaches the backend that
// remains. Left alone: an unconnected socket that talked to the removed
// backend (it selects again by itself, from the same port), a socket
// connected to the backend's own address rather than a VIP, a socket of
// another Service that still has the backend, and TCP. Both methods, the
// bpf_sock_destroy iterator and netlink SOCK_DESTROY, and both are
// counted. Before, the connected socket sent to the removed backend for
// good.
//
// Each family of TestSockLB (sockLBFamilies): IPv4, IPv6 (issue 10: an
// AF_INET6 socket through connect6 to IPv6 backends, flushed from the
// IPv6 conntrack), and a dual-stack socket reaching the IPv4 Services as
// ::ffff:a.b.c.d, which is ended as its IPv4 twin is.
func TestSockDestroyOnBackendRemoval(t *testing.T) {
	testutil.Privileged(t)
	forEachSockDestroyMethod(t, func(t *testing.T, method SockDestroyMethod) {
		for _, f := range sockLBFamilies {
			t.Run(f.name, func(t *testing.T) { testSockDestroy(t, method, f) })
		}
	})
}

func testSockDestroy(t *testing.T, method SockDestroyMethod, f sockLBFamily) {
	sockaddr := func(a model.L4Addr) unix.Sockaddr { return sockaddrIn(f.domain, a) }
	newSocket := func(t *testing.T, typ int) int { t.Helper(); return newSocketIn(t, f.domain, typ) }
	backends := f.backends
	d := openTest(t, smallConfig(testPinDir(t)))
	if got := d.Features().SockDestroy; got != method {
		t.Fatalf("Features().SockDestroy = %s, want %s", got, method)
	}
	var mu sync.Mutex
	var reports []SocketTermination
	d.Maps().OnSocketTermination(func(st SocketTermination) {
		mu.Lock()
		reports = append(reports, st)
		mu.Unlock()
	})
	ns, _ := sockNode(t, d, "sockterm", sockBackends...)
	addLoopbackAddrs(t, ns, sockBackends6...)
	startBackends(t, sockBackends6...)

	be := func(a string, port uint16, p model.Protocol) model.L4Addr { return l4(a, port, p) }
	vip := f.udp
	other := f.otherVIP // a second UDP Service over the same backends
	tcpVIP := f.tcp
	state := func(udp ...string) *model.State {
		st := model.NewState()
		svc := clusterIP(vip)
		for _, a := range udp {
			svc.Backends = append(svc.Backends, model.Backend{L4Addr: be(a, 5353, model.UDP)})
		}
		svc.Backends = model.SortBackends(svc.Backends)
		st.Services.Set(vip, svc)
		o := clusterIP(other, be(backends[0], 5353, model.UDP), be(backends[1], 5353, model.UDP))
		o.Backends = model.SortBackends(o.Backends)
		st.Services.Set(other, o)
		tcpSvc := clusterIP(tcpVIP)
		for _, a := range udp {
			tcpSvc.Backends = append(tcpSvc.Backends, model.Backend{L4Addr: be(a, 8080, model.TCP)})
		}
		tcpSvc.Backends = model.SortBackends(tcpSvc.Backends)
		st.Services.Set(tcpVIP, tcpSvc)
		return st
	}
	rec := reconciler.New(d.Maps(), nil)
	if err := rec.Apply(state(backends...)); err != nil {
		t.Fatal(err)
	}

	// A connected socket; the backend it reached is the one to remove.
	conn := newSocket(t, unix.SOCK_DGRAM)
	if err := unix.Connect(conn, sockaddr(vip)); err != nil {
		t.Fatal(err)
	}
	removed, err := udpExchange(conn, nil, "c0")
	if err != nil {
		t.Fatal(err)
	}
	remaining := backends[0]
	if removed == remaining {
		remaining = backends[1]
	}
	// Unconnected sockets until one sticks to the same backend.
	unconn := socketReaching(t, "unconnected sockets", removed, func() (int, string, error) {
		fd := newSocket(t, unix.SOCK_DGRAM)
		who, err := udpExchange(fd, sockaddr(vip), "u")
		return fd, who, err
	})
	unconnPort := localPort(t, unconn)
	// A socket connected to the backend itself, not through a VIP.
	direct := newSocket(t, unix.SOCK_DGRAM)
	if err := unix.Connect(direct, sockaddr(be(removed, 5353, model.UDP))); err != nil {
		t.Fatal(err)
	}
	// A socket of the other Service, connected to the same backend.
	otherConn := socketReaching(t, "sockets to "+other.String(), removed, func() (int, string, error) {
		fd := newSocket(t, unix.SOCK_DGRAM)
		if err := unix.Connect(fd, sockaddr(other)); err != nil {
			return fd, "", err
		}
		who, err := udpExchange(fd, nil, "o")
		return fd, who, err
	})
	// A TCP connection through the TCP Service to the same backend.
	tcpConn := socketReaching(t, "TCP connections to "+tcpVIP.String(), removed, func() (int, string, error) {
		fd := newSocket(t, unix.SOCK_STREAM)
		if err := unix.Connect(fd, sockaddr(tcpVIP)); err != nil {
			return fd, "", err
		}
		buf := make([]byte, 100)
		n, err := unix.Read(fd, buf)
		if err != nil {
			return fd, "", err
		}
		who, ok := strings.CutPrefix(string(buf[:n]), "backend ")
		if !ok {
			who = ""
		}
		return fd, who, nil
	})

	// First it terminates while the other is ready: it serves, unused
	// (standby), and the socket connected to it keeps it, as
	// kube-proxy's conntrack cleanup keeps such a flow.
	standby := state(backends...)
	svc := *standby.Services.Get(vip)
	svc.Backends = []model.Backend{{L4Addr: be(remaining, 5353, model.UDP)}}
	svc.Standby = []model.L4Addr{be(removed, 5353, model.UDP)}
	standby.Services.Set(vip, &svc)
	if err := rec.Apply(standby); err != nil {
		t.Fatal(err)
	}
	if who, err := udpExchange(conn, nil, "c-standby"); err != nil || who != removed {
		t.Errorf("the socket connected to %s, serving and terminating, reached %q (%v): want it kept", removed, who, err)
	}

	// The backend leaves the VIP's Service, and the TCP Service; the
	// other UDP Service keeps it.
	if err := rec.Apply(state(remaining)); err != nil {
		t.Fatal(err)
	}

	// The connected socket is ended.
	if _, err := unix.Read(conn, make([]byte, 100)); !errors.Is(err, unix.ECONNABORTED) {
		t.Errorf("receive on the socket connected to the removed backend: %v, want ECONNABORTED", err)
	}
	// A new socket reaches the remaining backend.
	fresh := newSocket(t, unix.SOCK_DGRAM)
	if err := unix.Connect(fresh, sockaddr(vip)); err != nil {
		t.Fatal(err)
	}
	if who, err := udpExchange(fresh, nil, "c1"); err != nil || who != remaining {
		t.Errorf("a new connected socket reached %q (%v), want %s", who, err, remaining)
	}
	// The unconnected socket goes on, from the same port, to the
	// remaining backend.
	for _, fd := range []int{unconn, direct, otherConn, tcpConn} {
		if soerr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR); err != nil || soerr != 0 {
			t.Errorf("socket %d: SO_ERROR %d (%v), want none: it was to be left alone", fd, soerr, err)
		}
	}
	if who, err := udpExchange(unconn, sockaddr(vip), "u1"); err != nil || who != remaining {
		t.Errorf("the unconnected socket reached %q (%v), want %s", who, err, remaining)
	}
	if p := localPort(t, unconn); p != unconnPort {
		t.Errorf("the unconnected socket's port changed from %d to %d", unconnPort, p)
	}
	if who, err := udpExchange(direct, nil, "d"); err != nil || who != removed {
		t.Errorf("the socket connected to %s itself reached %q (%v)", removed, who, err)
	}
	if who, err := udpExchange(otherConn, nil, "o1"); err != nil || who != removed {
		t.Errorf("the other Service's socket reached %q (%v), want %s, which that Service still has", who, err, removed)
	}
	var tcpPeer unix.Sockaddr
	if tcpPeer, err = unix.Getpeername(tcpConn); err != nil || addrPort(tcpPeer) != netip.AddrPortFrom(tcpVIP.Addr, tcpVIP.Port) {
		t.Errorf("the TCP connection: peer %v (%v), want it open to %s", tcpPeer, err, tcpVIP)
	}

	mu.Lock()
	defer mu.Unlock()
	var sum SocketTermination
	for _, r := range reports {
		if r.Err != nil {
			t.Errorf("socket termination error: %v", r.Err)
		}
		if r.Method != method {
			t.Errorf("reported method %s, want %s", r.Method, method)
		}
		sum.Destroyed += r.Destroyed
		sum.Failed += r.Failed
		sum.SparedUnconnected += r.SparedUnconnected
		sum.SparedStillBackend += r.SparedStillBackend
	}
	if sum.Destroyed != 1 || sum.Failed != 0 || sum.SparedUnconnected < 1 || sum.SparedStillBackend != 1 {
		t.Errorf("reported %+v: want 1 destroyed, the unconnected socket(s) and the other Service's socket spared", sum)
	}
	t.Logf("%s: %+v over %d reports", method, sum, len(reports))
}

// TestSockDestroyQuietWithoutSockets: a flush of a backend no socket
// talked to reports nothing and fails nothing.
func TestSockDestroyQuietWithoutSockets(t *testing.T) {
	d := newTestDatapath(t)
	called := false
	d.Maps().OnSocketTermination(func(SocketTermination) { called = true })
	start := time.Now()
	if err := d.Maps().FlushConntrack([]model.L4Addr{l4("10.200.9.9", 53, model.UDP)}); err != nil {
		t.Fatal(err)
	}
	if called {
		t.Error("a flush that ended no socket reported one")
	}
	t.Logf("flush of one backend with %s socket termination over %d namespaces took %v",
		d.Features().SockDestroy, len(networkNamespaces()), time.Since(start))
}

// TestSockTermRecords: the iterator's output mixes IPv4 records (16
// bytes) and IPv6 ones (32, flagged in the IPv4 record they begin with),
// as one pass reports sockets of both kinds; each is counted once, and a
// record cut short is an error, not a count.
func TestSockTermRecords(t *testing.T) {
	var out bytes.Buffer
	for _, rec := range []any{
		sockdestroySockTermRec{Cookie: 1, Verdict: uint8(sockdestroySockTermVerdictSOCK_TERM_DESTROYED)},
		sockdestroySockTerm6Rec{Head: sockdestroySockTermRec{Cookie: 2, Verdict: uint8(sockdestroySockTermVerdictSOCK_TERM_SPARED_UNCONNECTED), V6: 1}},
		sockdestroySockTermRec{Cookie: 3, Verdict: uint8(sockdestroySockTermVerdictSOCK_TERM_SPARED_STILL_BACKEND)},
		sockdestroySockTerm6Rec{Head: sockdestroySockTermRec{Cookie: 4, Verdict: uint8(sockdestroySockTermVerdictSOCK_TERM_DESTROYED), V6: 1}},
	} {
		if err := binary.Write(&out, binary.NativeEndian, rec); err != nil {
			t.Fatal(err)
		}
	}
	if out.Len() != 2*16+2*32 {
		t.Fatalf("records take %d bytes, want %d (struct sock_term_rec and sock_term6_rec)", out.Len(), 2*16+2*32)
	}
	var res SocketTermination
	b := out.Bytes()
	for len(b) > 0 {
		n, v, err := sockTermRecord(b)
		if err != nil {
			t.Fatal(err)
		}
		count(&res, v)
		b = b[n:]
	}
	if res.Destroyed != 2 || res.SparedUnconnected != 1 || res.SparedStillBackend != 1 || res.Failed != 0 {
		t.Errorf("counted %+v, want 2 destroyed, 1 spared unconnected, 1 spared still backend", res)
	}
	// An IPv6 record cut after its IPv4 head.
	if _, _, err := sockTermRecord(out.Bytes()[16 : 16+20]); err == nil {
		t.Error("a cut IPv6 record was read")
	}
	if _, _, err := sockTermRecord(out.Bytes()[:10]); err == nil {
		t.Error("a cut IPv4 record was read")
	}
}
