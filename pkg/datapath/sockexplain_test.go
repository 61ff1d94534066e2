package datapath

import (
	"errors"
	"net/netip"
	"slices"
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
	before := dumpTCMaps(t, d)
	var e *Explanation
	err := ns.Do(func() error {
		var err error
		e, err = ExplainSocket(bpffs, req)
		return err
	})
	if err != nil {
		t.Fatalf("ExplainSocket %+v: %v", req, err)
	}
	if changed := diffDumps(before, dumpTCMaps(t, d)); len(changed) > 0 {
		t.Fatalf("ExplainSocket %+v changed maps %v", req, changed)
	}
	return e
}

func TestSockExplain(t *testing.T) {
	d, bpffs := newTestDatapathAt(t)
	joinSockCgroup(t, d)
	nsA, nsB := affinityNS(t, "sxa"), affinityNS(t, "sxb")
	r := reconciler.New(d.Maps(), nil)
	apply := func(bes ...string) { applySockAffinity(t, r, sockAff4, bes...) }
	apply(sockAffBEs...)
	tcpReq := SocketExplainRequest{To: netip.AddrPortFrom(sockAffVIP.Addr, sockAffVIP.Port), Proto: unix.IPPROTO_TCP}

	// A client without an entry yet: a fresh pick among the candidates,
	// and no entry written by asking.
	e := sockExplainIn(t, d, bpffs, nsB, tcpReq)
	if !e.Frontend || !e.Scoped || e.ScopeCount != uint32(len(sockAffBEs)) || !e.DNAT || !e.NewFlow || e.AffinityHit ||
		e.Verdict != "connect to backend" || !slices.Contains(sockAffBEs, e.Backend.Addr().String()) ||
		e.Backend.Port() != 8080 || !slices.Equal(e.Reasons, []string{"sock_xlate"}) {
		t.Fatalf("fresh client: %+v", e)
	}

	// An affine client: the real connect's backend, from its entry.
	a := sockConnect(t, nsA, sockAff4)
	e = sockExplainIn(t, d, bpffs, nsA, tcpReq)
	if !e.AffinityHit || e.NewFlow || e.Backend.Addr().String() != a || e.Verdict != "connect to backend" {
		t.Fatalf("affine client (connected to %s): %+v", a, e)
	}
	if got := sockConnect(t, nsA, sockAff4); got != a {
		t.Fatalf("the real connect after explain reached %s, want %s", got, a)
	}

	// Unconnected UDP: a new socket has no stickiness entry; the
	// namespace's affinity decides, as for the real datagram.
	u := sockSendto(t, nsA, sockAff4)
	e = sockExplainIn(t, d, bpffs, nsA, SocketExplainRequest{To: netip.AddrPortFrom(sockAffUDP.Addr, sockAffUDP.Port), Proto: unix.IPPROTO_UDP, Unconnected: true})
	if !e.AffinityHit || e.StickyHit || e.Backend.Addr().String() != u || e.Backend.Port() != 5353 {
		t.Fatalf("unconnected UDP (sent to %s): %+v", u, e)
	}

	// Not a frontend: passes untouched.
	e = sockExplainIn(t, d, bpffs, nsA, SocketExplainRequest{To: netip.MustParseAddrPort("192.0.2.9:80"), Proto: unix.IPPROTO_TCP})
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
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Connect(fd, sockaddr(sockAffVIP))
	})
	if !errors.Is(err, unix.ECONNREFUSED) {
		t.Fatalf("real connect to the emptied Service: %v, want ECONNREFUSED", err)
	}
}
