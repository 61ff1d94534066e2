package runner

import (
	"context"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/test/flows"
)

// TestNetwork checks the runner's network with no agent, for each family:
// every client reaches the places a flow may land, with its own address,
// and an untranslated packet to a frontend lands in the router's trap.
// What the runner then reports about Sluice is Sluice's doing.
func TestNetwork(t *testing.T) {
	testutil.Privileged(t)
	testutil.NeedCommands(t, "nsenter", "ip", "nft")
	for _, x := range []struct {
		family, file string
		// addr maps the IPv4 rows' addresses to the family's.
		addr map[string]string
	}{
		{"IPv4", "network.yaml", nil},
		{"IPv6", "network6.yaml", map[string]string{
			"10.0.0.2": "fd00:10::2", "10.0.5.2": "fd00:10::5:2", "10.180.0.1": "fd00:10:180::1", "10.180.1.1": "fd00:10:180::1:1",
			"192.168.0.2": "2001:db8::1", "203.0.113.2": "2001:db8:113::2", "203.0.113.9": "2001:db8:113::9",
			"172.30.0.41": "fd00:172:30::41", "172.30.9.9": "fd00:172:30::9:9", "192.168.99.22": "2001:db8:99::22",
			"198.51.100.4": "2001:db8:100::4",
		}},
	} {
		t.Run(x.family, func(t *testing.T) {
			addr := func(s string) netip.Addr {
				if x.addr != nil {
					s = x.addr[s]
				}
				return netip.MustParseAddr(s)
			}
			checkNetwork(t, testdataCase(t, x.file), addr)
		})
	}
}

// checkNetwork is TestNetwork for case c; addr gives the family's twin of
// an IPv4 address of the rows.
func checkNetwork(t *testing.T, c *flows.Case, addr func(string) netip.Addr) {
	r := newCaseRun(t, c)
	st := c.Steps[0]
	sinks, errs := r.startSinks(st)
	t.Cleanup(func() {
		for _, s := range sinks {
			s.Close()
		}
	})
	for k, err := range errs {
		if err != nil {
			t.Fatalf("sink %v: %v", k, err)
		}
	}
	// The other node drops what it sends to 203.0.113.9: a reply that
	// never comes back, as from an unmasqueraded remote endpoint.
	if err := r.net.other.Run(context.Background(), "ip", "route", "add", "blackhole", host(addr("203.0.113.9")).String()); err != nil {
		t.Fatal(err)
	}

	// The corpus's own UNTOUCHED flows: the original destination sees
	// the original source.
	for _, f := range st.Flows {
		if f.Name == "external with a blackholed return path" {
			continue
		}
		t.Run(f.Name, func(t *testing.T) {
			o := r.attempt(f, 2*time.Second)
			if p := (checker{c, f}).verdictOK(o); p != nil {
				t.Errorf("%s: %s", p.class, p.why)
			}
		})
	}

	flow := func(kind, src, proto, dst string, port uint16) *flows.Flow {
		return &flows.Flow{
			Name:        kind + " " + src + " to " + dst,
			Source:      flows.Source{Kind: kind, IP: addr(src)},
			Protocol:    corev1.Protocol(proto),
			Destination: flows.Destination{IP: addr(dst), Port: port},
		}
	}
	ep := func(a string, port uint16) netip.AddrPort { return netip.AddrPortFrom(addr(a), port) }
	for _, x := range []struct {
		f    *flows.Flow
		want Observation
	}{
		// Pods, the node and external hosts reach the endpoints directly.
		{flow("pod", "10.0.0.2", "TCP", "10.180.1.1", 80), Observation{Kind: Reached, Name: endpointName, Server: ep("10.180.1.1", 80), Seen: addr("10.0.0.2")}},
		{flow("pod", "10.0.0.2", "UDP", "10.180.1.1", 53), Observation{Kind: Reached, Name: endpointName, Server: ep("10.180.1.1", 53), Seen: addr("10.0.0.2")}},
		{flow("pod", "10.0.0.2", "TCP", "10.180.0.1", 80), Observation{Kind: Reached, Name: endpointName, Server: ep("10.180.0.1", 80), Seen: addr("10.0.0.2")}},
		{flow("node", "192.168.0.2", "TCP", "10.180.0.1", 80), Observation{Kind: Reached, Name: endpointName, Server: ep("10.180.0.1", 80), Seen: addr("192.168.0.2")}},
		{flow("node", "192.168.0.2", "UDP", "10.180.1.1", 53), Observation{Kind: Reached, Name: endpointName, Server: ep("10.180.1.1", 53), Seen: addr("192.168.0.2")}},
		{flow("external", "203.0.113.2", "TCP", "10.180.1.1", 80), Observation{Kind: Reached, Name: endpointName, Server: ep("10.180.1.1", 80), Seen: addr("203.0.113.2")}},
		{flow("remotePod", "10.0.5.2", "TCP", "10.180.0.1", 80), Observation{Kind: Reached, Name: endpointName, Server: ep("10.180.0.1", 80), Seen: addr("10.0.5.2")}},
		// A reply that never comes back: the SYN capture (TCP) and the
		// server's log (UDP) still say where the request went.
		{flow("external", "203.0.113.9", "TCP", "10.180.1.1", 80), Observation{Kind: Reached, Name: endpointName, Server: ep("10.180.1.1", 80), Seen: addr("203.0.113.9"), ReplyLost: true}},
		{flow("external", "203.0.113.9", "UDP", "10.180.1.1", 53), Observation{Kind: Reached, Name: endpointName, Server: ep("10.180.1.1", 53), Seen: addr("203.0.113.9"), ReplyLost: true}},
		// Untranslated packets to frontends end in the router's trap,
		// from every kind of client, over TCP and UDP, to a ClusterIP, an
		// ExternalIP on the node's own subnet, and a LoadBalancer IP.
		{flow("pod", "10.0.0.2", "TCP", "172.30.0.41", 80), Observation{Kind: Leaked, Seen: addr("10.0.0.2")}},
		{flow("pod", "10.0.0.2", "UDP", "172.30.0.41", 53), Observation{Kind: Leaked, Seen: addr("10.0.0.2")}},
		{flow("pod", "10.0.0.2", "TCP", "172.30.9.9", 80), Observation{Kind: Leaked, Seen: addr("10.0.0.2")}},
		{flow("external", "203.0.113.2", "TCP", "172.30.0.41", 80), Observation{Kind: Leaked, Seen: addr("203.0.113.2")}},
		{flow("external", "203.0.113.2", "TCP", "192.168.99.22", 80), Observation{Kind: Leaked, Seen: addr("203.0.113.2")}},
		{flow("remotePod", "10.0.5.2", "TCP", "198.51.100.4", 80), Observation{Kind: Leaked, Seen: addr("10.0.5.2")}},
		{flow("node", "192.168.0.2", "TCP", "192.168.99.22", 80), Observation{Kind: Leaked, Seen: addr("192.168.0.2")}},
		{flow("external", "198.51.100.4", "TCP", "172.30.0.41", 80), Observation{Kind: Leaked, Seen: addr("198.51.100.4")}},
		{flow("external", "198.51.100.4", "UDP", "172.30.0.41", 53), Observation{Kind: Leaked, Seen: addr("198.51.100.4")}},
		// A closed port of a pod answers with a reset.
		{flow("pod", "10.0.0.2", "TCP", "10.180.0.1", 81), Observation{Kind: Rejected}},
	} {
		t.Run(x.f.Name, func(t *testing.T) {
			if got := r.attempt(x.f, time.Second); got != x.want {
				t.Errorf("got %+v, want %+v", got, x.want)
			}
		})
	}
}
