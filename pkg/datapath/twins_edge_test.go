package datapath

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/sluice-lb/sluice/internal/testutil/topology"
)

// IPv6 twins of the edge-case tests (issue 10): the end-to-end PMTU,
// ICMP error and fragment tests, and the tables of fragments, ICMP errors,
// TTL and MTU, were written for IPv4; each now runs per family
// (forFamilies) over the same steps, its IPv4 assertions kept, the IPv6
// run with the twins of its addresses and the IPv6 forms of what differs
// (ICMPv6 types, a fragment header instead of IPv4's fragment fields, no
// DF: an IPv6 router never fragments). The helpers below give a test the
// addresses of one family.

// netOf is a Go network name ("tcp", "udp") of a's family: "tcp4" or
// "tcp6".
func netOf(proto string, a netip.Addr) string {
	if a.Is6() {
		return proto + "6"
	}
	return proto + "4"
}

// vipOf is the IPv4 VIP a of topology.ServiceRange (10.96.x.y), or with
// v6 its twin in topology.ServiceRange6 (2001:db8:96::xxyy), the range the
// client of an LB with an IPv6 plane routes to the node.
func vipOf(v6 bool, a string) string {
	if !v6 {
		return a
	}
	b := addr(a).As4()
	return fmt.Sprintf("2001:db8:96::%x", uint16(b[2])<<8|uint16(b[3]))
}

// lbPlane is the address plane, IPv4 or IPv6, of an LB topology that a
// per-family test runs over.
type lbPlane struct {
	client, node netip.Addr
	backends     []netip.Addr // backends[i] is lb.Backends[i]'s
}

// lbDatapathOf is lbDatapath over the family of v6: with v6 the LB gets
// its IPv6 plane (topology.LB.AddIPv6) and the plane returned is that one.
func lbDatapathOf(t *testing.T, v6 bool) (*Datapath, *topology.LB, lbPlane) {
	t.Helper()
	d, lb := lbDatapath(t)
	if !v6 {
		return d, lb, lbPlane{lb.ClientAddr, lb.NodeAddr, lb.BackendAddrs}
	}
	p6, err := lb.AddIPv6()
	if err != nil {
		t.Fatal(err)
	}
	return d, lb, lbPlane{p6.ClientAddr, p6.NodeAddr, p6.BackendAddrs}
}
