package topology

import (
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil"
)

func TestMain(m *testing.M) {
	if IsProber() {
		os.Exit(ProberMain())
	}
	os.Exit(m.Run())
}

// pair is two namespaces on one veth: a 10.9.0.1/24 and 2001:db8:9::1/64,
// b 10.9.0.2/24 and 2001:db8:9::2/64, b also holding 10.9.1.2/32 and
// 2001:db8:9:1::2/128 on lo.
func pair(t *testing.T) (topo *Topology, a, b *NS) {
	t.Helper()
	testutil.Privileged(t)
	topo = NewT(t)
	a, b = topo.AddNST(t, "a"), topo.AddNST(t, "b")
	for _, err := range []error{
		// No DAD on the veth: while its link-local address is tentative,
		// a packet from an address on lo (TestCaptureSYNs) triggers no
		// neighbour solicitation.
		a.Sysctl("net/ipv6/conf/default/accept_dad", "0"), b.Sysctl("net/ipv6/conf/default/accept_dad", "0"),
		topo.Veth(a, "eth0", b, "eth0"),
		a.AddAddr("eth0", netip.MustParsePrefix("10.9.0.1/24")),
		b.AddAddr("eth0", netip.MustParsePrefix("10.9.0.2/24")),
		b.AddAddr("lo", netip.MustParsePrefix("10.9.1.2/32")),
		a.AddRoute(netip.MustParsePrefix("10.9.1.2/32"), netip.MustParseAddr("10.9.0.2")),
		a.AddAddr("eth0", netip.MustParsePrefix("2001:db8:9::1/64")),
		b.AddAddr("eth0", netip.MustParsePrefix("2001:db8:9::2/64")),
		b.AddAddr("lo", netip.MustParsePrefix("2001:db8:9:1::2/128")),
		a.AddRoute(netip.MustParsePrefix("2001:db8:9:1::2/128"), netip.MustParseAddr("2001:db8:9::2")),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	return topo, a, b
}

// TestReportServersAndProbes: a probe from a bound source reaches a
// reporting server, bound to one address or to all (UDP answering from
// the address it was sent to), which reports where it was reached and
// from where, and logs it; a closed port is refused; a silent one times
// out.
func TestReportServersAndProbes(t *testing.T) {
	_, a, b := pair(t)
	var log SeenLog
	for _, x := range []struct{ network, addr string }{
		{"tcp4", "10.9.0.2:80"}, {"udp4", "10.9.0.2:53"}, {"tcp4", "0.0.0.0:81"}, {"udp4", "0.0.0.0:54"},
		{"tcp6", "[2001:db8:9::2]:80"}, {"udp6", "[2001:db8:9::2]:53"}, {"tcp6", "[::]:81"}, {"udp6", "[::]:54"},
	} {
		if _, err := b.ServeReport(x.network, netip.MustParseAddrPort(x.addr), "srv", &log); err != nil {
			t.Fatal(err)
		}
	}
	for i, x := range []struct {
		network, src, dst string
	}{
		{"tcp4", "10.9.0.1", "10.9.0.2:80"}, {"udp4", "10.9.0.1", "10.9.0.2:53"},
		{"tcp4", "10.9.0.1", "10.9.1.2:81"}, {"udp4", "10.9.0.1", "10.9.1.2:54"}, // wildcard servers, reached on a second address
		{"tcp6", "2001:db8:9::1", "[2001:db8:9::2]:80"}, {"udp6", "2001:db8:9::1", "[2001:db8:9::2]:53"},
		{"tcp6", "2001:db8:9::1", "[2001:db8:9:1::2]:81"}, {"udp6", "2001:db8:9::1", "[2001:db8:9:1::2]:54"},
	} {
		token := fmt.Sprintf("tok%d", i)
		src := netip.AddrPortFrom(netip.MustParseAddr(x.src), uint16(41000+i))
		dst := netip.MustParseAddrPort(x.dst)
		r := a.Probe(Probe{Network: x.network, Src: src, Dst: dst, Token: token, Timeout: 2 * time.Second})
		if r.Outcome != Answered {
			t.Fatalf("%s %s: %v", x.network, dst, r)
		}
		rep, err := ParseReport(r.Answer)
		if err != nil {
			t.Fatal(err)
		}
		if want := (Report{Token: token, Name: "srv", Local: dst, Peer: src}); rep != want {
			t.Errorf("%s %s: report %+v, want %+v", x.network, dst, rep, want)
		}
		if r.Local != src {
			t.Errorf("%s %s: client bound to %s, want %s", x.network, dst, r.Local, src)
		}
		if seen := log.Lookup(token); len(seen) == 0 || seen[0].Local != dst || seen[0].Peer != src {
			t.Errorf("%s %s: log has %+v", x.network, dst, seen)
		}
	}
	for _, x := range []struct {
		network, dst string
		want         Outcome
	}{
		{"tcp4", "10.9.0.2:99", Refused},  // nothing listens: a reset
		{"udp4", "10.9.0.2:99", Refused},  // nothing listens: ICMP port unreachable
		{"tcp4", "10.9.0.7:80", TimedOut}, // nobody holds the address
		{"udp4", "10.9.0.7:53", TimedOut},
		{"tcp6", "[2001:db8:9::2]:99", Refused},
		{"udp6", "[2001:db8:9::2]:99", Refused},
	} {
		// A refusal comes at once, and a long bound costs a passing run
		// nothing: 300 ms failed it whenever the machine held the reset
		// or the ICMP error back that long. A probe that must time out
		// keeps the short bound (it waits for all of it).
		timeout := 300 * time.Millisecond
		if x.want == Refused {
			timeout = 5 * time.Second
		}
		r := a.Probe(Probe{Network: x.network, Dst: netip.MustParseAddrPort(x.dst), Token: "x", Timeout: timeout})
		if r.Outcome != x.want {
			t.Errorf("%s %s: %v, want %s", x.network, x.dst, r, x.want)
		}
	}
}

// TestProbeHTTP: an HTTP probe returns the status and body.
func TestProbeHTTP(t *testing.T) {
	_, a, b := pair(t)
	l, err := b.Listen("tcp4", "10.9.0.2:8080")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = fmt.Fprintln(w, `{"localEndpoints": 0}`)
	})}
	go func() { _ = srv.Serve(l) }() // returns ErrServerClosed at cleanup
	t.Cleanup(func() { srv.Close() })
	r := a.Probe(Probe{Network: "tcp4", Dst: netip.MustParseAddrPort("10.9.0.2:8080"), HTTP: true, Timeout: 2 * time.Second})
	if r.Outcome != Answered || r.Status != 503 || r.Answer != `{"localEndpoints": 0}` {
		t.Errorf("HTTP probe: %+v", r)
	}
}

// TestProberRunsInNamespaceAndCgroup: a Prober's probes come from its
// namespace, and the child sits in the cgroup it was given.
func TestProberRunsInNamespaceAndCgroup(t *testing.T) {
	topo, a, b := pair(t)
	cg, err := topo.AddCgroup(cgroupMount(t), "prober")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ServeReport("tcp4", netip.MustParseAddrPort("10.9.0.2:80"), "srv", nil); err != nil {
		t.Fatal(err)
	}
	p, err := a.StartProber(cg)
	if err != nil {
		t.Fatal(err)
	}
	src := netip.MustParseAddrPort("10.9.0.1:42000")
	r := p.Probe(Probe{Network: "tcp4", Src: src, Dst: netip.MustParseAddrPort("10.9.0.2:80"), Token: "child", Timeout: 2 * time.Second})
	rep, err := ParseReport(r.Answer)
	if r.Outcome != Answered || err != nil || rep.Token != "child" || rep.Peer != src {
		t.Fatalf("probe through the prober: %+v (%v)", r, err)
	}
	procs, err := os.ReadFile(cg.Path + "/cgroup.procs")
	if err != nil {
		t.Fatal(err)
	}
	if pid := fmt.Sprint(p.cmd.Process.Pid); !strings.Contains(string(procs), pid) {
		t.Errorf("prober %s not in cgroup %s (procs %q)", pid, cg.Path, procs)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if r := p.Probe(Probe{Network: "tcp4", Dst: netip.MustParseAddrPort("10.9.0.2:80"), Timeout: time.Second}); r.Outcome != Failed {
		t.Errorf("probe after Close: %+v, want an error", r)
	}
}

// TestCaptureSYNs: a SYN whose SYN-ACK never makes it back is still seen
// where it arrived, with its source (IPv4 and IPv6).
func TestCaptureSYNs(t *testing.T) {
	_, a, b := pair(t)
	c, err := b.CaptureSYNs("eth0")
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range []struct{ network, src, dst, lo string }{
		{"tcp4", "10.9.5.5:43000", "10.9.1.2:80", "10.9.5.5/32"},
		{"tcp6", "[2001:db8:9:5::5]:43000", "[2001:db8:9:1::2]:80", "2001:db8:9:5::5/128"},
	} {
		dst, src := netip.MustParseAddrPort(x.dst), netip.MustParseAddrPort(x.src)
		if _, err := b.ServeReport(x.network, dst, "srv", nil); err != nil {
			t.Fatal(err)
		}
		if err := a.AddAddr("lo", netip.MustParsePrefix(x.lo)); err != nil {
			t.Fatal(err)
		}
		// b has no route back to src: the handshake cannot complete.
		r := a.Probe(Probe{Network: x.network, Src: src, Dst: dst, Timeout: 300 * time.Millisecond})
		if r.Outcome == Answered {
			t.Fatalf("%s: answered without a return path: %v", x.network, r)
		}
		testutil.Eventually(t, "the SYN to show up", 10*time.Second, func() error {
			if syns := c.Match(func(s SYN) bool { return s.Src == src }); len(syns) == 0 || syns[0].Dst != dst {
				return fmt.Errorf("captured %+v", c.Match(func(SYN) bool { return true }))
			}
			return nil
		})
	}
}

// TestBridgeAndRouteDev: namespaces on one bridge share a subnet; a route
// out of a device reaches an address held behind it (proxy-ARP style, no
// gateway).
func TestBridgeAndRouteDev(t *testing.T) {
	testutil.Privileged(t)
	topo := NewT(t)
	sw, h1, h2 := topo.AddNST(t, "switch"), topo.AddNST(t, "h1"), topo.AddNST(t, "h2")
	for _, err := range []error{
		sw.AddBridge("br0"),
		topo.Veth(sw, "p1", h1, "eth0"), topo.Veth(sw, "p2", h2, "eth0"),
		sw.SetMaster("p1", "br0"), sw.SetMaster("p2", "br0"),
		h1.AddAddr("eth0", netip.MustParsePrefix("10.8.0.1/24")),
		h2.AddAddr("eth0", netip.MustParsePrefix("10.8.0.2/24")),
		h2.AddAddr("lo", netip.MustParsePrefix("10.8.9.9/32")),
		h1.AddRouteDev(netip.MustParsePrefix("10.8.9.9/32"), "eth0"),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := h2.ServeReport("tcp4", netip.MustParseAddrPort("0.0.0.0:80"), "h2", nil); err != nil {
		t.Fatal(err)
	}
	for _, dst := range []string{"10.8.0.2:80", "10.8.9.9:80"} {
		r := h1.Probe(Probe{Network: "tcp4", Dst: netip.MustParseAddrPort(dst), Token: "t", Timeout: 2 * time.Second})
		if r.Outcome != Answered {
			t.Errorf("h1 -> %s over the bridge: %v", dst, r)
		}
	}
}
