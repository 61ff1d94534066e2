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
	// A dual-stack node: the same, and IPv6 addresses (::1 on lo).
	nodeIPs6 := []netip.Addr{a("192.168.0.2"), a("2001:db8::2")}
	local6 := append(local[:len(local):len(local)], a("::1"), a("2001:db8::2"), a("2001:db8:1::2"))
	for _, c := range []struct {
		name      string
		cidrs     []netip.Prefix
		localhost bool
		addrs     string
		health    string
		dual      bool // nodeIPs6 and local6
	}{
		{"default: the node's primary addresses", nil, true, "[192.168.0.2]", `["192.168.0.2"]`, false},
		{"dual stack default: the node's primary address of each family", nil, true, "[192.168.0.2 2001:db8::2]", `["192.168.0.2" "2001:db8::2"]`, true},
		{"dual stack, IPv4 ranges only: every IPv6 address but ::1 (kube-proxy's ::/0 for a family without CIDRs)",
			[]netip.Prefix{p("192.168.0.0/24")}, true, "[192.168.0.2 2001:db8::2 2001:db8:1::2]", `["192.168.0.2" "2001:db8::2" "2001:db8:1::2"]`, true},
		{"dual stack, IPv6 range only: every IPv4 address",
			[]netip.Prefix{p("2001:db8:1::/64")}, false, "[192.168.0.2 192.168.1.2 192.168.99.11 10.0.0.1 2001:db8:1::2]", `[""]`, true},
		{"dual stack, ranges of both families", []netip.Prefix{p("192.168.1.0/24"), p("2001:db8::2/128")}, true, "[192.168.1.2 2001:db8::2]", `["192.168.1.2" "2001:db8::2"]`, true},
		{"dual stack, all: never ::1", []netip.Prefix{p("0.0.0.0/0"), p("::/0")}, true,
			"[127.0.0.1 192.168.0.2 192.168.1.2 192.168.99.11 10.0.0.1 2001:db8::2 2001:db8:1::2]", `[""]`, true},
		{"one address", []netip.Prefix{p("192.168.0.2/32")}, true, "[192.168.0.2]", `["192.168.0.2"]`, false},
		{"0.0.0.0/0 beside a range is every address", []netip.Prefix{p("192.168.0.0/24"), p("0.0.0.0/0")}, false,
			"[192.168.0.2 192.168.1.2 192.168.99.11 10.0.0.1]", `[""]`, false},
		{"dual stack, ::/0 beside an IPv6 range is every IPv6 address", []netip.Prefix{p("192.168.0.0/24"), p("2001:db8::/64"), p("::/0")}, true,
			"[192.168.0.2 2001:db8::2 2001:db8:1::2]", `["192.168.0.2" "2001:db8::2" "2001:db8:1::2"]`, true},
		{"several ranges", []netip.Prefix{p("192.168.0.0/24"), p("192.168.1.0/24")}, false, "[192.168.0.2 192.168.1.2]", `["192.168.0.2" "192.168.1.2"]`, false},
		{"every address, localhost NodePorts", []netip.Prefix{p("0.0.0.0/0")}, true,
			"[127.0.0.1 192.168.0.2 192.168.1.2 192.168.99.11 10.0.0.1]", `[""]`, false},
		{"every address, no localhost NodePorts", []netip.Prefix{p("0.0.0.0/0")}, false,
			"[192.168.0.2 192.168.1.2 192.168.99.11 10.0.0.1]", `[""]`, false},
		{"localhost only: health check there, NodePorts too", []netip.Prefix{p("127.0.0.0/8")}, true, "[127.0.0.1]", `["127.0.0.1"]`, false},
		{"localhost, its NodePorts off: health check only", []netip.Prefix{p("127.0.0.0/8")}, false, "[]", `["127.0.0.1"]`, false},
		{"no local address in the ranges: health checks nowhere, not everywhere (kube-proxy's GetNodeIPs empty)",
			[]netip.Prefix{p("10.99.0.0/16")}, true, "[]", `[]`, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			np := nodePortsFor(c.cidrs, nodeIPs, local, c.localhost)
			if c.dual {
				np = nodePortsFor(c.cidrs, nodeIPs6, local6, c.localhost)
			}
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
	got, err := parseCIDRs("cluster-cidr", "10.0.0.1/8, fd00::1/64,::ffff:10.96.0.0/108")
	if want := "[10.0.0.0/8 fd00::/64 10.96.0.0/12]"; err != nil || fmt.Sprint(got) != want {
		t.Errorf("parseCIDRs = %v, %v; want %s (masked, both families, IPv4-mapped as IPv4)", got, err, want)
	}
	for _, bad := range []string{"10.96.0.0/33", "2001:db8::/129", "::ffff:10.0.0.0/80"} {
		if _, err := parseCIDRs("service-cidr", bad); err == nil {
			t.Errorf("bad CIDR %s parsed", bad)
		}
	}
}

// TestParseNodeIPs: --node-ip takes addresses of both families, a
// dual-stack pair in either order.
func TestParseNodeIPs(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"192.168.1.1", "[192.168.1.1]"},
		{"192.168.1.1,2001:db8::1", "[192.168.1.1 2001:db8::1]"},
		{"2001:db8::1, 192.168.1.1", "[2001:db8::1 192.168.1.1]"},
		{"::ffff:192.168.1.1", "[192.168.1.1]"},
		{"192.168.1.300", "error"},
		{"::", "error"},
		{"::1", "error"},
		{"fe80::1%eth0", "error"},
	} {
		got, err := parseNodeIPs(c.in)
		if s := fmt.Sprint(got); (err != nil) != (c.want == "error") || (err == nil && s != c.want) {
			t.Errorf("parseNodeIPs(%q) = %v, %v; want %s", c.in, got, err, c.want)
		}
	}
}
