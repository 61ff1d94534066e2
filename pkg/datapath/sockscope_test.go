package datapath

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/model"
)

// externalTrafficPolicy Local at the socket, as kube-proxy's per-packet
// rule (nftables proxier.go, the external chain): the node's own sockets
// reach every endpoint of a two-scope frontend (its internal scope); a
// pod's only with a local traffic detector (--cluster-cidr), else this
// node's endpoints only, dropped if there are none. Real sockets in two
// network namespaces of the test's own (hostAndPod): "host", where the
// datapath is opened (the agent's), with the backends on its loopback
// device, and "pod", its traffic through the socket programs on a cgroup
// the test process joins.

// TestSockTwoScopesPodScope: a NodePort of externalTrafficPolicy Local
// with no endpoint on this node. Without a detector the pod's connect is
// refused as its packet would be dropped (EHOSTUNREACH) while the host's
// reaches a cluster endpoint; with --cluster-cidr both reach one. The
// socket path's dry run (ExplainSocket) in each namespace says the same.
func TestSockTwoScopesPodScope(t *testing.T) {
	for _, detector := range []bool{false, true} {
		t.Run(map[bool]string{false: "no_detector", true: "cluster_cidr"}[detector], func(t *testing.T) {
			forFamilies(t, func(t *testing.T, v6 bool) { testSockTwoScopesPodScope(t, detector, hostNetnsFamily(v6)) })
		})
	}
}

// podScopeNode is the node of the pod scope tests: hostAndPod's two
// namespaces, the datapath opened in host (the test thread left there)
// with --cluster-cidr the pod's prefix if detector and cfg's changes, a
// two-scope NodePort (externalTrafficPolicy Local) whose endpoints are
// all elsewhere (cluster: f.backends on host's loopback, serving), and
// the socket programs on a cgroup the test process joins.
type podScopeNode struct {
	host, pod *topology.NS
	d         *Datapath
	bpffs     string
	fe        model.L4Addr
	cluster   []model.Backend
}

func newPodScopeNode(t *testing.T, detector bool, f hostNetnsCase, cfg func(*Config)) podScopeNode {
	t.Helper()
	testutil.Privileged(t)
	n := podScopeNode{}
	n.host, n.pod = hostAndPod(t, f)
	n.host.Enter(t)
	n.bpffs = testPinDir(t)
	n.d = openTest(t, configWith(smallConfig, func(c *Config) {
		if detector {
			c.ClusterCIDRs = []netip.Prefix{netip.PrefixFrom(f.pod, f.bits).Masked()}
		}
		if cfg != nil {
			cfg(c)
		}
	})(n.bpffs))
	n.fe = l4(map[bool]string{false: "10.210.0.3", true: "2001:db8:210::3"}[f.domain == unix.AF_INET6], 30080, model.TCP)
	for _, b := range f.backends {
		n.cluster = append(n.cluster, model.Backend{L4Addr: l4(b, 8080, model.TCP)})
	}
	applyServices(t, n.d, &model.Service{Name: model.ServicePortName{Namespace: "test", Name: "local"}, Kind: model.NodePort, Frontend: n.fe,
		ExternalLocal: true, TwoScopes: true, DropWhenEmpty: true, InternalBackends: n.cluster})
	joinSockCgroup(t, n.d)
	addLoopbackAddrs(t, n.host, f.backends...)
	startBackends(t, f.backends...)
	return n
}

func testSockTwoScopesPodScope(t *testing.T, detector bool, f hostNetnsCase) {
	n := newPodScopeNode(t, detector, f, nil)
	host, pod, d, bpffs, fe, cluster := n.host, n.pod, n.d, n.bpffs, n.fe, n.cluster

	// The host's socket: every endpoint, whatever the detector.
	hfd := socketIn(t, host, f.domain, unix.SOCK_STREAM)
	connectSeesPeer(t, hfd, f.domain, fe)
	readGreeting(t, hfd)

	// The pod's: every endpoint with a detector, else dropped.
	pfd := socketIn(t, pod, f.domain, unix.SOCK_STREAM)
	err := unix.Connect(pfd, sockaddrIn(f.domain, fe))
	if detector {
		if err != nil {
			t.Fatalf("the pod's connect to %s with --cluster-cidr: %v, want a cluster endpoint", fe, err)
		}
		readGreeting(t, pfd)
	} else if !errors.Is(err, unix.EHOSTUNREACH) {
		t.Errorf("the pod's connect to %s without a detector: %v, want EHOSTUNREACH (no local endpoint: dropped, as per packet)", fe, err)
	}

	req := SocketExplainRequest{To: apOf(fe), Proto: unix.IPPROTO_TCP}
	for _, c := range []struct {
		name          string
		e             *Explanation
		wantScope     uint8
		wantVerdict   string
		wantEndpoints uint32
	}{
		{"host", sockExplainIn(t, d, bpffs, host, req), 1, "connect to backend", uint32(len(cluster))},
		{"pod", sockExplainIn(t, d, bpffs, pod, req), map[bool]uint8{false: 0, true: 1}[detector],
			map[bool]string{false: "drop", true: "connect to backend"}[detector], map[bool]uint32{false: 0, true: uint32(len(cluster))}[detector]},
	} {
		if !c.e.Scoped || c.e.Scope != c.wantScope || c.e.ScopeCount != c.wantEndpoints || c.e.Verdict != c.wantVerdict {
			t.Errorf("explain --socket in %s: scope %d (scoped %v) of %d endpoints, verdict %q; want scope %d of %d, %q",
				c.name, c.e.Scope, c.e.Scoped, c.e.ScopeCount, c.e.Verdict, c.wantScope, c.wantEndpoints, c.wantVerdict)
		}
	}
}

// BenchmarkSockVerifiedInsns logs the socket programs' verified
// instructions (Linux 5.16+), with no local traffic detector (the
// namespace cookie read in) and with --cluster-cidr (removed).
func BenchmarkSockVerifiedInsns(b *testing.B) {
	testutil.Privileged(b)
	for _, detector := range []bool{false, true} {
		d := openTestWith(b, smallConfig, func(c *Config) {
			if detector {
				c.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32")}
			}
		})
		for _, p := range []*ebpf.Program{d.sock.Connect4, d.sock.Sendmsg4, d.sock.Connect6, d.sock.Sendmsg6} {
			info, err := p.Info()
			if err != nil {
				b.Fatal(err)
			}
			n, ok := info.VerifiedInstructions()
			if !ok {
				b.Skip("the kernel does not report verified instructions (5.16+)")
			}
			b.Logf("verified_insns detector=%v %s %d", detector, info.Name, n)
		}
	}
	for range b.N {
	}
}

// TestSockExplainUnboundSource: loadBalancerSourceRanges at the socket
// judge an unbound socket by the node's primary address (the agent's
// node_ip4, node_ip6: sock.c sock4_src), not by the source the kernel
// then picks; the dry run without a source judges it so too, not by the
// route's source. The node address is in the range, the route's source
// (the host's address on p0, its default route) is not: the host's and
// the pod's unbound connects are admitted (the pod's whatever its own
// address: README, the deviation), and so is the dry run in each.
func TestSockExplainUnboundSource(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		testutil.Privileged(t)
		f := hostNetnsFamily(v6)
		host, pod := hostAndPod(t, f)
		if err := host.AddRoute(f.dflt, f.pod); err != nil {
			t.Fatal(err)
		}
		host.Enter(t)
		bpffs := testPinDir(t)
		nodeIP := map[bool]netip.Addr{false: addr("10.200.0.7"), true: addr("2001:db8:200::7")}[v6]
		d := openTest(t, configWith(smallConfig, func(c *Config) { c.NodeIPs = []netip.Addr{nodeIP} })(bpffs))
		fe := l4(map[bool]string{false: "10.210.0.2", true: "2001:db8:210::2"}[v6], 80, model.TCP)
		svc := &model.Service{Name: model.ServicePortName{Namespace: "test", Name: "ranged"}, Kind: model.LoadBalancer, Frontend: fe,
			Backends: []model.Backend{{L4Addr: l4(f.backends[0], 8080, model.TCP)}}, SourceRanges: []netip.Prefix{netip.PrefixFrom(nodeIP, nodeIP.BitLen())}}
		applyServices(t, d, svc)
		joinSockCgroup(t, d)
		addLoopbackAddrs(t, host, f.backends...)
		startBackends(t, f.backends...)
		if src := routeSource(fe.Addr); src != f.host {
			t.Fatalf("the route to %s picks %v, want %s (the test's premise)", fe, src, f.host)
		}
		req := SocketExplainRequest{To: apOf(fe), Proto: unix.IPPROTO_TCP}
		for _, ns := range []*topology.NS{host, pod} {
			fd := socketIn(t, ns, f.domain, unix.SOCK_STREAM)
			connectSeesPeer(t, fd, f.domain, fe)
			readGreeting(t, fd)
			if e := sockExplainIn(t, d, bpffs, ns, req); e.Verdict != "connect to backend" {
				t.Errorf("explain --socket in %s, no source: verdict %q (%v), want \"connect to backend\" as the unbound connect got (judged by the node's %s)",
					ns.Name, e.Verdict, e.Reasons, nodeIP)
			}
		}
		// A source given is judged as given: the route's is outside.
		req.From = f.host
		if e := sockExplainIn(t, d, bpffs, host, req); e.Verdict != "drop" {
			t.Errorf("explain --socket --from %s: verdict %q, want drop (outside the range)", f.host, e.Verdict)
		}
	})
}
