package datapath

import (
	"errors"
	"net/netip"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/pkg/model"
)

// The socket path of issue 9, with real sockets in a cgroup and network
// namespace of the test's own (as sock_test.go): the node's sockets are
// internal clients (a two-scope frontend serves them from its internal
// scope), what tc would reject fails with ECONNREFUSED and what it would
// drop with EHOSTUNREACH, NodePorts on 127.0.0.1 leave this namespace's
// loopback its own (it is a pod's to the socket path: the node's reach
// the backends, sockloopback_test.go), and loadBalancerSourceRanges apply
// by the socket's address.

func TestSockSemantics(t *testing.T) {
	d := openTestWith(t, smallConfig, func(cfg *Config) {
		cfg.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("2001:db8:96::/112")}
		// Inside the source ranges below.
		cfg.NodeIPs = []netip.Addr{netip.MustParseAddr("10.200.0.7"), netip.MustParseAddr("2001:db8:200::7")}
		// A local traffic detector: the test's namespace is not the one
		// Open runs in, so its sockets are a pod's to the socket path,
		// served by a two-scope frontend's internal scope only with one
		// (sockscope_test.go tests both).
		cfg.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("2001:db8:244::/56")}
	})
	ns, _ := sockNode(t, d, "socksem", append(sockBackends, "10.200.0.6", "10.201.0.1")...)
	addLoopbackAddrs(t, ns, append(sockBackends6, "2001:db8:200::6", "2001:db8:201::1")...)
	startBackends(t, sockBackends6...)

	b0, b1 := sockBackends[0], sockBackends[1]
	tcp := func(a string) model.Backend { return model.Backend{L4Addr: l4(a, 8080, model.TCP)} }
	udp := func(a string) model.Backend { return model.Backend{L4Addr: l4(a, 5353, model.UDP)} }
	var (
		twoScopes = l4("10.210.0.1", 80, model.TCP)   // eTP Local: default b0, internal b1
		twoNone   = l4("10.210.0.3", 80, model.TCP)   // eTP Local, none here: internal b0
		ranged    = l4("10.210.0.2", 80, model.TCP)   // LoadBalancer IP, 10.200.0.0/24 only
		cip       = l4("10.96.0.30", 80, model.TCP)   // a ClusterIP
		cipDrop   = l4("10.96.0.31", 80, model.TCP)   // iTP Local, none here
		lhTCP     = l4("127.0.0.1", 30080, model.TCP) // localhost NodePorts
		lhUDP     = l4("127.0.0.1", 30053, model.UDP)
	)
	svc := func(kind model.FrontendKind, fe model.L4Addr, bs ...model.Backend) *model.Service {
		return &model.Service{Name: model.ServicePortName{Namespace: "test", Name: fe.String()}, Kind: kind, Frontend: fe, Backends: bs}
	}
	// scoped is one family's Services of two scopes (eTP Local, default
	// scope b0, internal b1), of two scopes with none here (internal b0),
	// of a source range (b0), and the iTP Local one with none here.
	scoped := func(b0, b1 string, twoScopes, twoNone, ranged, cipDrop model.L4Addr, sourceRange string) []*model.Service {
		two := svc(model.LoadBalancer, twoScopes, tcp(b0))
		two.ExternalLocal, two.TwoScopes, two.InternalBackends = true, true, []model.Backend{tcp(b1)}
		none := svc(model.NodePort, twoNone)
		none.ExternalLocal, none.TwoScopes, none.DropWhenEmpty, none.InternalBackends = true, true, true, []model.Backend{tcp(b0)}
		rng := svc(model.LoadBalancer, ranged, tcp(b0))
		rng.SourceRanges = []netip.Prefix{netip.MustParsePrefix(sourceRange)}
		drop := svc(model.ClusterIP, cipDrop)
		drop.DropWhenEmpty = true
		return []*model.Service{two, none, rng, drop}
	}
	// IPv6 twins of the first five.
	c0, c1 := sockBackends6[0], sockBackends6[1]
	var (
		twoScopes6 = l4("2001:db8:210::1", 80, model.TCP)
		twoNone6   = l4("2001:db8:210::3", 80, model.TCP)
		ranged6    = l4("2001:db8:210::2", 80, model.TCP) // 2001:db8:200::/64 only
		cip6       = l4("2001:db8:96::30", 80, model.TCP)
		cipDrop6   = l4("2001:db8:96::31", 80, model.TCP)
	)
	applyServices(t, d, slices.Concat(
		scoped(b0, b1, twoScopes, twoNone, ranged, cipDrop, "10.200.0.0/24"),
		[]*model.Service{svc(model.ClusterIP, cip, tcp(b0), tcp(b1)),
			svc(model.NodePort, lhTCP, tcp(b0), tcp(b1)), svc(model.NodePort, lhUDP, udp(b0), udp(b1))},
		scoped(c0, c1, twoScopes6, twoNone6, ranged6, cipDrop6, "2001:db8:200::/64"),
		[]*model.Service{svc(model.ClusterIP, cip6, tcp(c0), tcp(c1))})...)

	// connect connects a TCP socket of fe's family, bound to src first
	// unless empty, to fe and returns the greeting or the error.
	connect := func(t *testing.T, src string, fe model.L4Addr) (string, error) {
		t.Helper()
		domain := unix.AF_INET
		if fe.Addr.Is6() {
			domain = unix.AF_INET6
		}
		fd := newSocketIn(t, domain, unix.SOCK_STREAM)
		if src != "" {
			if err := unix.Bind(fd, sockaddrIn(domain, l4(src, 0, model.TCP))); err != nil {
				t.Fatalf("bind %s: %v", src, err)
			}
		}
		if err := unix.Connect(fd, sockaddrIn(domain, fe)); err != nil {
			return "", err
		}
		if peer, err := unix.Getpeername(fd); err != nil || addrPort(peer) != apOf(fe) {
			t.Errorf("getpeername = %v (%v), want %s", peer, err, apOf(fe))
		}
		buf := make([]byte, 100)
		n, err := unix.Read(fd, buf)
		if err != nil {
			t.Fatalf("read from %s: %v", fe, err)
		}
		return string(buf[:n]), nil
	}
	// expectBackend connects 16 times, and on until every one of backends
	// answered (at most 64): with two, a fair pick leaves one unreached in
	// 16 once in 32,768 runs, in 64 once in 4.6e18, and a passing run
	// stops at 16.
	expectBackend := func(t *testing.T, src string, fe model.L4Addr, backends ...string) map[string]bool {
		t.Helper()
		seen := map[string]bool{}
		for i := 0; i < 64 && (i < 16 || len(seen) < len(backends)); i++ {
			got, err := connect(t, src, fe)
			if err != nil {
				t.Fatalf("connect %s: %v", fe, err)
			}
			ok := false
			for _, b := range backends {
				ok = ok || got == "backend "+b
			}
			if !ok {
				t.Fatalf("%s answered %q, want one of %v", fe, got, backends)
			}
			seen[got] = true
		}
		return seen
	}
	expectErr := func(t *testing.T, src string, fe model.L4Addr, want error) {
		t.Helper()
		if _, err := connect(t, src, fe); !errors.Is(err, want) {
			t.Errorf("connect %s from %q: %v, want %v", fe, src, err, want)
		}
	}

	t.Run("two scopes: the node gets the internal scope", func(t *testing.T) {
		ns.Enter(t)
		expectBackend(t, "", twoScopes, b1)
		expectBackend(t, "", twoNone, b0) // the default scope drops, the node is served
	})

	t.Run("rejects and drops", func(t *testing.T) {
		ns.Enter(t)
		expectErr(t, "", l4("10.96.0.30", 81, model.TCP), unix.ECONNREFUSED) // a ClusterIP's other port
		expectErr(t, "", cipDrop, unix.EHOSTUNREACH)                         // none here, some elsewhere
		expectErr(t, "", l4("10.96.7.7", 80, model.TCP), unix.EHOSTUNREACH)  // unallocated
		ufd := newSocket(t, unix.SOCK_DGRAM)
		if err := unix.Sendto(ufd, []byte("hi"), 0, sockaddr(l4("10.96.0.30", 53, model.UDP))); !errors.Is(err, unix.ECONNREFUSED) {
			t.Errorf("UDP to a ClusterIP's other protocol: %v, want ECONNREFUSED", err)
		}
		// Not a service address at all: left alone.
		if got, err := connect(t, "", l4(b1, 8080, model.TCP)); err != nil || got != "backend "+b1 {
			t.Errorf("direct connect: %q, %v", got, err)
		}
	})

	// A pod's 127.0.0.1 is its own, as kube-proxy leaves it (audit11
	// M1): nothing listens at lhTCP here, and lhUDP reaches this
	// namespace's own server.
	t.Run("localhost NodePorts, TCP and UDP: not a pod's", func(t *testing.T) {
		ns.Enter(t)
		expectErr(t, "", lhTCP, unix.ECONNREFUSED)
		if _, err := ns.ServeUDPEcho(apOf(lhUDP).String(), "pod"); err != nil {
			t.Fatal(err)
		}
		fd := newSocket(t, unix.SOCK_DGRAM)
		if err := unix.Sendto(fd, []byte("ping"), 0, sockaddr(lhUDP)); err != nil {
			t.Fatalf("sendto %s: %v", lhUDP, err)
		}
		msg, from := recvFrom(t, fd)
		if msg != "pod ping" || from != apOf(lhUDP) {
			t.Errorf("reply %q from %s, want this namespace's own echo from %s", msg, from, apOf(lhUDP))
		}
	})

	t.Run("source ranges by the socket's address", func(t *testing.T) {
		ns.Enter(t)
		expectBackend(t, "10.200.0.6", ranged, b0)
		expectBackend(t, "", ranged, b0) // unbound: the node's address, inside
		expectErr(t, "10.201.0.1", ranged, unix.EHOSTUNREACH)
	})

	// IPv6 sockets: the same.
	t.Run("ipv6", func(t *testing.T) {
		ns.Enter(t)
		expectBackend(t, "", twoScopes6, c1)
		expectBackend(t, "", twoNone6, c0)
		expectErr(t, "", l4("2001:db8:96::30", 81, model.TCP), unix.ECONNREFUSED)
		expectErr(t, "", cipDrop6, unix.EHOSTUNREACH)
		expectErr(t, "", l4("2001:db8:96::77", 80, model.TCP), unix.EHOSTUNREACH) // unallocated
		if seen := expectBackend(t, "", cip6, c0, c1); len(seen) != 2 {
			t.Errorf("64 connections reached %v, want both backends", seen)
		}
		expectBackend(t, "2001:db8:200::6", ranged6, c0)
		expectBackend(t, "", ranged6, c0) // unbound: the node's address, inside
		expectErr(t, "2001:db8:201::1", ranged6, unix.EHOSTUNREACH)
	})

	cs := expectCounted(t, d, "sock_xlate", "sock_unknown_port", "sock_drop")
	if cs["sock_drop"] != 6 {
		t.Errorf("sock_drop = %d, want the three drops of each family", cs["sock_drop"])
	}
}
