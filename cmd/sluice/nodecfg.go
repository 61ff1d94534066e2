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
)

// parseCIDRs parses a comma-separated list of CIDRs for flag, and returns
// the IPv4 ones (IPv6 ones are accepted, as kube-proxy's dual-stack flags
// hold both, and left for the IPv6 datapath).
func parseCIDRs(flag, s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range splitList(s) {
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return nil, fmt.Errorf("--%s %q: %w", flag, f, err)
		}
		if p.Addr().Is4() {
			out = append(out, p.Masked())
		}
	}
	return out, nil
}

// parseNodePortAddresses parses --nodeport-addresses: CIDRs and
// kube-proxy's keywords all (0.0.0.0/0), localhost (127.0.0.0/8) and
// primary (the node's primary addresses, reported apart: they may be known
// only later, from the Node object).
func parseNodePortAddresses(s string) (cidrs []netip.Prefix, primary bool, err error) {
	var rest []string
	for _, f := range splitList(s) {
		switch f {
		case "primary":
			primary = true
		case "all":
			cidrs = append(cidrs, netip.PrefixFrom(netip.IPv4Unspecified(), 0))
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
	// on ("" is every address).
	HealthHosts []string
}

// nodePortsFor follows kube-proxy's --nodeport-addresses: with no CIDRs,
// the node's primary addresses nodeIPs; with 0.0.0.0/0, every address of
// the node (local: its interfaces' addresses, loopback included); else
// the node's addresses inside the CIDRs. Loopback addresses serve
// NodePorts only with localhost (--localhost-nodeports, kube-proxy's
// iptables mode: 127.0.0.1 only), through socket load balancing; the
// health check servers listen on them whatever localhost says.
func nodePortsFor(cidrs []netip.Prefix, nodeIPs, local []netip.Addr, localhost bool) nodePorts {
	var np nodePorts
	if len(cidrs) == 0 {
		np.Addrs = slices.Clone(nodeIPs)
		for _, a := range nodeIPs {
			np.HealthHosts = append(np.HealthHosts, a.String())
		}
		return np
	}
	all := slices.ContainsFunc(cidrs, func(p netip.Prefix) bool { return p.Bits() == 0 })
	if all {
		np.HealthHosts = []string{""}
	}
	for _, a := range local {
		if !all && !slices.ContainsFunc(cidrs, func(p netip.Prefix) bool { return p.Contains(a) }) {
			continue
		}
		if !all {
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

// localAddresses returns the IPv4 addresses of this network namespace's
// interfaces, loopback included.
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
		if ip = ip.Unmap(); ok && ip.Is4() && !ip.IsLinkLocalUnicast() && !slices.Contains(out, ip) {
			out = append(out, ip)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no IPv4 address on any interface")
	}
	return out, nil
}
