package main

import (
	"fmt"
	"net/netip"
	"testing"
)

// TestNodePortsFor: --nodeport-addresses as kube-proxy reads it, with
// --localhost-nodeports (kube-proxy's iptables-only localhost NodePorts,
// served here through socket load balancing).
func TestNodePortsFor(t *testing.T) {
	a := netip.MustParseAddr
	p := netip.MustParsePrefix
	nodeIPs := []netip.Addr{a("192.168.0.2")}
	local := []netip.Addr{a("127.0.0.1"), a("192.168.0.2"), a("192.168.1.2"), a("192.168.99.11"), a("10.0.0.1")}
	for _, c := range []struct {
		name      string
		cidrs     []netip.Prefix
		localhost bool
		addrs     string
		health    string
	}{
		{"default: the node's primary addresses", nil, true, "[192.168.0.2]", `["192.168.0.2"]`},
		{"one address", []netip.Prefix{p("192.168.0.2/32")}, true, "[192.168.0.2]", `["192.168.0.2"]`},
		{"several ranges", []netip.Prefix{p("192.168.0.0/24"), p("192.168.1.0/24")}, false, "[192.168.0.2 192.168.1.2]", `["192.168.0.2" "192.168.1.2"]`},
		{"every address, localhost NodePorts", []netip.Prefix{p("0.0.0.0/0")}, true,
			"[127.0.0.1 192.168.0.2 192.168.1.2 192.168.99.11 10.0.0.1]", `[""]`},
		{"every address, no localhost NodePorts", []netip.Prefix{p("0.0.0.0/0")}, false,
			"[192.168.0.2 192.168.1.2 192.168.99.11 10.0.0.1]", `[""]`},
		{"localhost only: health check there, NodePorts too", []netip.Prefix{p("127.0.0.0/8")}, true, "[127.0.0.1]", `["127.0.0.1"]`},
		{"localhost, its NodePorts off: health check only", []netip.Prefix{p("127.0.0.0/8")}, false, "[]", `["127.0.0.1"]`},
	} {
		t.Run(c.name, func(t *testing.T) {
			np := nodePortsFor(c.cidrs, nodeIPs, local, c.localhost)
			if got := fmt.Sprint(np.Addrs); got != c.addrs {
				t.Errorf("NodePorts on %s, want %s", got, c.addrs)
			}
			if got := fmt.Sprintf("%q", np.HealthHosts); got != c.health {
				t.Errorf("health checks on %s, want %s", got, c.health)
			}
		})
	}
}

func TestParseCIDRs(t *testing.T) {
	got, err := parseCIDRs("cluster-cidr", "10.0.0.1/8, fd00::/64")
	if err != nil || fmt.Sprint(got) != "[10.0.0.0/8]" {
		t.Errorf("parseCIDRs = %v, %v; want [10.0.0.0/8] (masked, IPv6 left out)", got, err)
	}
	if _, err := parseCIDRs("service-cidr", "10.96.0.0/33"); err == nil {
		t.Error("a bad CIDR parsed")
	}
}
