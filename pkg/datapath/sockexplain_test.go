package datapath

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// The socket path's dry run (sluice_sock_explain, ExplainSocket): what it
// says a connect from a namespace would do, compared with where real
// connects from that namespace go (the socket programs on a cgroup the
// test joins, as in sock_affinity_test.go), and that it writes nothing
// while saying it.

// sockExplainIn runs ExplainSocket in ns and fails the test if any map
// changed meanwhile.
func sockExplainIn(t *testing.T, d *Datapath, bpffs string, ns *topology.NS, req SocketExplainRequest) *Explanation {
	t.Helper()
	return sockExplainDetailIn(t, d, bpffs, ns, req).Explanation
}

// sockExplainDetailIn is sockExplainIn's ExplainSocketDetail.
func sockExplainDetailIn(t *testing.T, d *Datapath, bpffs string, ns *topology.NS, req SocketExplainRequest) *SocketExplanation {
	t.Helper()
	before := dumpTCMaps(t, d)
	var se *SocketExplanation
	err := ns.Do(func() error {
		var err error
		se, err = ExplainSocketDetail(bpffs, req)
		return err
	})
	if err != nil {
		t.Fatalf("ExplainSocket %+v in %s: %v", req, ns.Name, err)
	}
	if changed := diffDumps(before, dumpTCMaps(t, d)); len(changed) > 0 {
		t.Fatalf("ExplainSocket %+v changed maps %v", req, changed)
	}
	return se
}

// TestSockExplain runs per family: connect4's dry run for IPv4 sockets,
// connect6's for IPv6 ones (over the IPv6 maps); and connect6's for an
// IPv4-mapped destination, which is the IPv4 service.
func TestSockExplain(t *testing.T) {
	d, bpffs := newTestDatapathAt(t)
	joinSockCgroup(t, d)
	nsA, nsB := affinityNS(t, "sxa"), affinityNS(t, "sxb")
	// One reconciler, as one agent: ids are one space over both families.
	r := reconciler.New(d.Maps(), nil)
	for _, f := range []sockAffFamily{sockAff4, sockAff6} {
		t.Run(f.name, func(t *testing.T) { testSockExplain(t, d, bpffs, r, nsA, nsB, f) })
	}
}

func testSockExplain(t *testing.T, d *Datapath, bpffs string, r *reconciler.Reconciler, nsA, nsB *topology.NS, f sockAffFamily) {
	apply := func(bes ...string) { applySockAffinity(t, r, f, bes...) }
	apply(f.bes...)
	tcpReq := SocketExplainRequest{To: netip.AddrPortFrom(f.vip.Addr, f.vip.Port), Proto: unix.IPPROTO_TCP}

	// A client without an entry yet: a fresh pick among the candidates,
	// and no entry written by asking.
	e := sockExplainIn(t, d, bpffs, nsB, tcpReq)
	if !e.Frontend || e.FrontendAddr != tcpReq.To || !e.Scoped || e.ScopeCount != uint32(len(f.bes)) || !e.DNAT || !e.NewFlow || e.AffinityHit ||
		e.Verdict != "connect to backend" || !slices.Contains(f.bes, e.Backend.Addr().String()) ||
		e.Backend.Port() != 8080 || !slices.Equal(e.Reasons, []string{"sock_xlate"}) {
		t.Fatalf("fresh client: %+v", e)
	}

	// An affine client: the real connect's backend, from its entry.
	a := sockConnect(t, nsA, f)
	e = sockExplainIn(t, d, bpffs, nsA, tcpReq)
	if !e.AffinityHit || e.NewFlow || e.Backend.Addr().String() != a || e.Verdict != "connect to backend" {
		t.Fatalf("affine client (connected to %s): %+v", a, e)
	}
	if got := sockConnect(t, nsA, f); got != a {
		t.Fatalf("the real connect after explain reached %s, want %s", got, a)
	}
	if f.domain == unix.AF_INET {
		// connect6 to the IPv4-mapped VIP is the IPv4 service: the
		// same affinity entry, the same backend, and so says explain.
		mapped := netip.AddrPortFrom(netip.AddrFrom16(f.vip.Addr.As16()), f.vip.Port)
		e = sockExplainIn(t, d, bpffs, nsA, SocketExplainRequest{To: mapped, Proto: unix.IPPROTO_TCP})
		if !e.AffinityHit || e.FrontendAddr != tcpReq.To || e.Backend.Addr().String() != a {
			t.Fatalf("IPv4-mapped %s (an IPv4 connect reached %s): %+v", mapped, a, e)
		}
		if got := sockConnect(t, nsA, sockAffFamily{domain: unix.AF_INET6, vip: f.vip}); got != a {
			t.Fatalf("a real connect6 to %s reached %s, explain said %s", mapped, got, a)
		}
	}

	// Unconnected UDP: a new socket has no stickiness entry; the
	// namespace's affinity decides, as for the real datagram.
	u := sockSendto(t, nsA, f)
	e = sockExplainIn(t, d, bpffs, nsA, SocketExplainRequest{To: netip.AddrPortFrom(f.udp.Addr, f.udp.Port), Proto: unix.IPPROTO_UDP, Unconnected: true})
	if !e.AffinityHit || e.StickyHit || e.Backend.Addr().String() != u || e.Backend.Port() != 5353 {
		t.Fatalf("unconnected UDP (sent to %s): %+v", u, e)
	}

	// Not a frontend: passes untouched.
	other := netip.MustParseAddrPort("192.0.2.9:80")
	if f.domain == unix.AF_INET6 {
		other = netip.MustParseAddrPort("[2001:db8:ff::9]:80")
	}
	e = sockExplainIn(t, d, bpffs, nsA, SocketExplainRequest{To: other, Proto: unix.IPPROTO_TCP})
	if e.Frontend || e.DNAT || e.Verdict != "pass" {
		t.Fatalf("not a frontend: %+v", e)
	}

	// An emptied Service: refused, as the real connect is.
	apply()
	e = sockExplainIn(t, d, bpffs, nsA, tcpReq)
	if !e.Frontend || !e.Scoped || e.ScopeCount != 0 || e.DNAT || e.Verdict != "reject" || e.Errno != "ECONNREFUSED" ||
		!slices.Equal(e.Reasons, []string{"sock_no_backend"}) {
		t.Fatalf("emptied Service: %+v", e)
	}
	err := nsA.Do(func() error {
		fd, err := unix.Socket(f.domain, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Connect(fd, sockaddrIn(f.domain, f.vip))
	})
	if !errors.Is(err, unix.ECONNREFUSED) {
		t.Fatalf("real connect to the emptied Service: %v, want ECONNREFUSED", err)
	}
}

// TestSockExplainFamilies: a source of another family than the
// destination is named, not run.
func TestSockExplainFamilies(t *testing.T) {
	for _, c := range []struct{ from, to, want string }{
		{"10.0.0.1", "[2001:db8:96::10]:80", "different families"},
		{"2001:db8::1", "10.96.0.10:80", "different families"},
		{"2001:db8::1", "[::ffff:10.96.0.10]:80", "different families"},
		{"::ffff:10.0.0.1", "10.96.0.10:80", "::ffff:10.0.0.1 is IPv4-mapped"},
	} {
		_, err := ExplainSocket(t.TempDir(), SocketExplainRequest{From: netip.MustParseAddr(c.from), To: netip.MustParseAddrPort(c.to), Proto: unix.IPPROTO_TCP})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s -> %s: %v, want %q", c.from, c.to, err, c.want)
		}
	}
}
