package main

// The node's settings for the Service semantics of issue 9, kube-proxy's
// flags under the names the flow runner passes: --node-zone,
// --cluster-cidr, --service-cidr, --nodeport-addresses,
// --localhost-nodeports and --masquerade-all.

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/sluice-lb/sluice/pkg/model"
)

// parseCIDRs parses a comma-separated list of CIDRs of either family for
// flag, as kube-proxy's dual-stack flags (--cluster-cidr) hold them,
// masked; an IPv4-mapped prefix is IPv4.
func parseCIDRs(flag, s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range splitList(s) {
		p, err := parsePrefix(f)
		if err != nil {
			return nil, fmt.Errorf("--%s %q: %w", flag, f, err)
		}
		out = append(out, p)
	}
	return out, nil
}

// parsePrefix parses one CIDR of either family, in model.NormalPrefix's
// form (netip.ParsePrefix refuses zones).
func parsePrefix(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return p, err
	}
	return model.NormalPrefix(p)
}

// parseNodePortAddresses parses --nodeport-addresses: CIDRs of both
// families and the keywords all (0.0.0.0/0 and ::/0), localhost
// (127.0.0.0/8: IPv4 only, as kube-proxy's localhost NodePorts) and
// primary (kube-proxy's: the node's primary addresses, reported apart:
// they may be known only later, from the Node object).
func parseNodePortAddresses(s string) (cidrs []netip.Prefix, primary bool, err error) {
	var rest []string
	for _, f := range splitList(s) {
		switch f {
		case "primary":
			primary = true
		case "all":
			cidrs = append(cidrs, netip.PrefixFrom(netip.IPv4Unspecified(), 0), netip.PrefixFrom(netip.IPv6Unspecified(), 0))
		case "localhost":
			cidrs = append(cidrs, netip.PrefixFrom(netip.AddrFrom4([4]byte{127, 0, 0, 0}), 8))
		default:
			rest = append(rest, f)
		}
	}
	more, err := parseCIDRs("nodeport-addresses", strings.Join(rest, ","))
	if err != nil {
		return nil, false, err
	}
	return append(cidrs, more...), primary, nil
}

// nodePorts says where NodePorts and health checks are served.
type nodePorts struct {
	// Addrs are the addresses NodePort frontends are made for.
	Addrs []netip.Addr
	// HealthHosts are the hosts the healthCheckNodePort servers listen
	// on ("" is every address; none is nowhere: no address inside the
	// CIDRs, health.NewNodePortServer).
	HealthHosts []string
}

// takesAll reports whether the family (v6) takes every address of its own
// under --nodeport-addresses cidrs (given: not the default): a /0 of it,
// or no CIDR of it.
func takesAll(cidrs []netip.Prefix, v6 bool) bool {
	ofFamily := slices.DeleteFunc(slices.Clone(cidrs), func(p netip.Prefix) bool { return p.Addr().Is6() != v6 })
	return len(ofFamily) == 0 || slices.ContainsFunc(ofFamily, func(p netip.Prefix) bool { return p.Bits() == 0 })
}

// nodePortsFor follows kube-proxy's --nodeport-addresses: with no CIDRs,
// the node's primary addresses nodeIPs that are local (kube-proxy's
// primary is their /32 and /128, matched against the interfaces'
// addresses as any CIDR: a node IP on no interface serves no NodePorts
// until it is on one), its health checks on all of nodeIPs as before
// (they listen once, at start); else, in each family (kube-proxy's
// NewNodePortAddresses), the node's addresses (local: its interfaces'
// addresses, loopback included) inside the CIDRs of that family, and all
// of them when there is none of that family or a /0 of it. Loopback
// addresses serve NodePorts only with localhost (--localhost-nodeports,
// kube-proxy's iptables mode: 127.0.0.1 only, never ::1), through socket
// load balancing; the health check servers listen on 127.0.0.0/8 ones
// whatever localhost says, and on every address ("") when IPv4 takes all
// of its own (as before there were IPv6 NodePorts: an IPv4-only node
// keeps its health checks where they were), and nowhere when no local
// address is inside the CIDRs (kube-proxy's GetNodeIPs empty: its servers
// listen nowhere).
func nodePortsFor(cidrs []netip.Prefix, nodeIPs, local []netip.Addr, localhost bool) nodePorts {
	var np nodePorts
	if len(cidrs) == 0 {
		for _, a := range nodeIPs {
			if slices.Contains(local, a) {
				np.Addrs = append(np.Addrs, a)
			}
			np.HealthHosts = append(np.HealthHosts, a.String())
		}
		return np
	}
	all := map[bool]bool{false: takesAll(cidrs, false), true: takesAll(cidrs, true)}
	if all[false] {
		np.HealthHosts = []string{""}
	}
	for _, a := range local {
		if a.IsLoopback() && a.Is6() {
			continue
		}
		if !all[a.Is6()] && !slices.ContainsFunc(cidrs, func(p netip.Prefix) bool { return p.Contains(a) }) {
			continue
		}
		if !all[false] {
			np.HealthHosts = append(np.HealthHosts, a.String())
		}
		if a.IsLoopback() && (!localhost || a != netip.AddrFrom4([4]byte{127, 0, 0, 1})) {
			continue
		}
		if !slices.Contains(np.Addrs, a) {
			np.Addrs = append(np.Addrs, a)
		}
	}
	return np
}

// localAddresses returns the addresses of both families of this network
// namespace's interfaces, loopback included, link-local ones not.
func localAddresses() ([]netip.Addr, error) {
	as, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("interface addresses: %w", err)
	}
	var out []netip.Addr
	for _, a := range as {
		ipn, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(ipn.IP)
		if ip = ip.Unmap(); ok && !ip.IsLinkLocalUnicast() && !slices.Contains(out, ip) {
			out = append(out, ip)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no address on any interface")
	}
	return out, nil
}
