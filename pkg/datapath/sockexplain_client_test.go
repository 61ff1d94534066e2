package datapath

import (
	"errors"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/internal/testutil/topology"
)

// TestSockExplainPodClient: the socket dry run says what it judged the
// socket by, as the programs do: the namespace it counted as in (the
// agent's for the host's socket, another for the pod's, whatever the
// detector), whether the family's local traffic detector is set, and its
// source (an unbound socket's: the agent's node address, not the route's;
// a given one as given). A two-scope NodePort with no endpoint here: the
// pod's real connect is refused without a detector (EHOSTUNREACH) and the
// dry run in the pod says "other", no detector, scope 0 (sluicectl's
// CLIENT line then says a pod, not this node: cmd/sluicectl
// TestExplainSocketPodClient).
func TestSockExplainPodClient(t *testing.T) {
	for _, detector := range []bool{false, true} {
		t.Run(map[bool]string{false: "no_detector", true: "cluster_cidr"}[detector], func(t *testing.T) {
			forFamilies(t, func(t *testing.T, v6 bool) { testSockExplainPodClient(t, detector, hostNetnsFamily(v6)) })
		})
	}
}

func testSockExplainPodClient(t *testing.T, detector bool, f hostNetnsCase) {
	nodeIP := map[bool]netip.Addr{false: addr("10.200.0.7"), true: addr("2001:db8:200::7")}[f.domain == unix.AF_INET6]
	n := newPodScopeNode(t, detector, f, func(c *Config) { c.NodeIPs = []netip.Addr{nodeIP} })
	host, pod, d, bpffs, fe := n.host, n.pod, n.d, n.bpffs, n.fe
	if err := host.AddRoute(f.dflt, f.pod); err != nil { // a route source that is not the node address
		t.Fatal(err)
	}
	if src := routeSource(fe.Addr); src == nodeIP || !src.IsValid() {
		t.Fatalf("the route to %s picks %v: want a source, not the node address %s (the test's premise)", fe, src, nodeIP)
	}

	pfd := socketIn(t, pod, f.domain, unix.SOCK_STREAM)
	err := unix.Connect(pfd, sockaddrIn(f.domain, fe))
	if !detector && !errors.Is(err, unix.EHOSTUNREACH) || detector && err != nil {
		t.Fatalf("the pod's connect to %s (detector %v): %v", fe, detector, err)
	}

	req := SocketExplainRequest{To: apOf(fe), Proto: unix.IPPROTO_TCP}
	for _, c := range []struct {
		ns        *topology.NS
		wantNetns string
		wantScope uint8
	}{
		{host, NetnsAgent, 1},
		{pod, NetnsOther, map[bool]uint8{false: 0, true: 1}[detector]},
	} {
		se := sockExplainDetailIn(t, d, bpffs, c.ns, req)
		if se.Netns != c.wantNetns || se.Detector != detector || se.Scope != c.wantScope {
			t.Errorf("explain --socket in %s: netns %q, detector %v, scope %d; want %q, %v, %d",
				c.ns.Name, se.Netns, se.Detector, se.Scope, c.wantNetns, detector, c.wantScope)
		}
		if se.Source != nodeIP || se.SourceFrom != SourceNodeIP {
			t.Errorf("explain --socket in %s, no source: source %v (%s), want the agent's node address %s (%s)",
				c.ns.Name, se.Source, se.SourceFrom, nodeIP, SourceNodeIP)
		}
	}
	given := req
	given.From = f.pod
	if se := sockExplainDetailIn(t, d, bpffs, pod, given); se.Source != f.pod || se.SourceFrom != SourceGiven {
		t.Errorf("explain --socket --from %s: source %v (%s), want it as given", f.pod, se.Source, se.SourceFrom)
	}
}
