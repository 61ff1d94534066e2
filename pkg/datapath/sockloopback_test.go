package datapath

import (
	"errors"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/model"
)

// NodePorts on 127.0.0.1 (--localhost-nodeports) at the socket, with real
// sockets in two network namespaces of the test's own: "host", where the
// datapath is opened (the agent's namespace, the node's) and the backends
// listen on its loopback device, and "pod", another namespace with its
// own loopback device, whose sockets pass through the same programs (the
// test process is in the cgroup they are attached to, as every pod is
// under the cgroup2 root). kube-proxy serves localhost NodePorts to the
// host's namespace only (iptables mode, route_localnet): a pod's
// 127.0.0.1 is its own, and a NodePort Service must not capture what a
// pod sends to its own loopback (audit11 M1: a tenant's NodePort taking
// over a sidecar's or a local agent's 127.0.0.1:<port> in every pod).

// TestSockLoopbackNodePortNodeOnly: the node's sockets reach the
// localhost NodePorts' backends (TCP, over both; UDP, answered from
// 127.0.0.1), and so does its dry run; a pod's reach the pod's own
// listeners on 127.0.0.1:<nodePort> (TCP from an IPv4 socket and from an
// IPv6 one through ::ffff:127.0.0.1, connect6's IPv4 path; UDP from an
// unconnected socket, sendmsg4's), are refused where nothing listens in
// the pod, as without Sluice, are not counted as translated, and the dry
// run from the pod finds no frontend.
func TestSockLoopbackNodePortNodeOnly(t *testing.T) {
	testutil.Privileged(t)
	tp := topology.NewT(t)
	host, pod := tp.AddNST(t, "host"), tp.AddNST(t, "pod")
	// Opened inside "host": its namespace is the agent's, the node's.
	host.Enter(t)
	bpffs := testPinDir(t)
	d := openTest(t, smallConfig(bpffs))
	var (
		lhTCP   = l4("127.0.0.1", 30080, model.TCP)
		lhUDP   = l4("127.0.0.1", 30053, model.UDP)
		lhEmpty = l4("127.0.0.1", 30081, model.TCP) // nothing listens on it in the pod
	)
	b0, b1 := sockBackends[0], sockBackends[1]
	nodePort := func(fe model.L4Addr, port uint16) *model.Service {
		s := clusterIP(fe, l4(b0, port, fe.Proto), l4(b1, port, fe.Proto))
		s.Kind = model.NodePort
		return s
	}
	applyServices(t, d, nodePort(lhTCP, 8080), nodePort(lhUDP, 5353), nodePort(lhEmpty, 8080))
	joinSockCgroup(t, d)
	addLoopbackAddrs(t, host, sockBackends...)
	startBackends(t, sockBackends...)
	// The pod's own servers on its loopback, at the NodePorts.
	if _, err := pod.ServeTCPEcho(apOf(lhTCP).String(), "pod"); err != nil {
		t.Fatal(err)
	}
	if _, err := pod.ServeUDPEcho(apOf(lhUDP).String(), "pod"); err != nil {
		t.Fatal(err)
	}

	// The node: its connects are translated, to each backend in turn.
	// 16 connects, and on until both answered (at most 64): a fair pick
	// leaves one unreached in 64 once in 4.6e18 runs.
	before := counters(t, d)
	seen := map[string]bool{}
	for i := 0; i < 64 && (i < 16 || len(seen) < 2); i++ {
		fd := socketIn(t, host, unix.AF_INET, unix.SOCK_STREAM)
		connectSeesPeer(t, fd, unix.AF_INET, lhTCP)
		buf := make([]byte, 100)
		n, err := unix.Read(fd, buf)
		if err != nil || !isBackendReply(string(buf[:n])) {
			t.Fatalf("the node's connect to %s read %q, %v: want a backend's greeting", lhTCP, buf[:n], err)
		}
		seen[string(buf[:n])] = true
		unix.Close(fd)
	}
	if len(seen) != 2 {
		t.Errorf("the node's connects to %s reached %v, want both backends", lhTCP, seen)
	}
	ufd := socketIn(t, host, unix.AF_INET, unix.SOCK_DGRAM)
	if err := unix.Sendto(ufd, []byte("ping"), 0, sockaddr(lhUDP)); err != nil {
		t.Fatalf("the node's sendto %s: %v", lhUDP, err)
	}
	if msg, from := recvFrom(t, ufd); !isBackendReply(msg) || from != apOf(lhUDP) {
		t.Errorf("the node's UDP reply %q from %s, want a backend's echo from %s", msg, from, apOf(lhUDP))
	}
	if n := counters(t, d)["sock_xlate"] - before["sock_xlate"]; n < 17 {
		t.Errorf("the node's traffic: sock_xlate +%d, want every connect and the datagram", n)
	}

	// The pod: its loopback is its own.
	before = counters(t, d)
	for _, domain := range []int{unix.AF_INET, unix.AF_INET6} {
		fd := socketIn(t, pod, domain, unix.SOCK_STREAM)
		connectSeesPeer(t, fd, domain, lhTCP)
		if _, err := unix.Write(fd, []byte("hi\n")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 100)
		if n, err := unix.Read(fd, buf); err != nil || string(buf[:n]) != "pod hi\n" {
			t.Errorf("the pod's connect to %s (domain %d) read %q, %v; want its own listener's \"pod hi\\n\"", lhTCP, domain, buf[:n], err)
		}
		efd := socketIn(t, pod, domain, unix.SOCK_STREAM)
		if err := unix.Connect(efd, sockaddrIn(domain, lhEmpty)); !errors.Is(err, unix.ECONNREFUSED) {
			t.Errorf("the pod's connect to %s (domain %d), where nothing listens in the pod: %v, want ECONNREFUSED", lhEmpty, domain, err)
		}
	}
	pfd := socketIn(t, pod, unix.AF_INET, unix.SOCK_DGRAM)
	if err := unix.Sendto(pfd, []byte("ping"), 0, sockaddr(lhUDP)); err != nil {
		t.Fatalf("the pod's sendto %s: %v", lhUDP, err)
	}
	if msg, from := recvFrom(t, pfd); msg != "pod ping" || from != apOf(lhUDP) {
		t.Errorf("the pod's UDP reply %q from %s, want its own listener's \"pod ping\" from %s", msg, from, apOf(lhUDP))
	}
	if n := counters(t, d)["sock_xlate"] - before["sock_xlate"]; n != 0 {
		t.Errorf("the pod's traffic: sock_xlate +%d, want 0", n)
	}

	// The dry run says the same from each namespace.
	for _, req := range []SocketExplainRequest{
		{To: apOf(lhTCP), Proto: unix.IPPROTO_TCP},
		{To: apOf(lhUDP), Proto: unix.IPPROTO_UDP, Unconnected: true},
	} {
		e := sockExplainIn(t, d, bpffs, host, req)
		if !e.Frontend || !e.DNAT || !slices.Contains(sockBackends, e.Backend.Addr().String()) {
			t.Errorf("explain from the node, %s: %+v; want the frontend, a backend", req.To, e)
		}
		e = sockExplainIn(t, d, bpffs, pod, req)
		if e.Frontend || e.DNAT || e.NotServed || e.Verdict != "pass" {
			t.Errorf("explain from the pod, %s: %+v; want no frontend, pass", req.To, e)
		}
	}
}
