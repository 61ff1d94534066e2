package translate

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/sluice-lb/sluice/pkg/model"
)

// North-south frontends of a Service port in one IP family (the family
// of one of its ClusterIPs), as kube-proxy's proxier of that family
// serves them:
//
//   - NodePort (types NodePort and LoadBalancer, when a node port is
//     allocated): <address, nodePort> for every address of the family in
//     Node.Addresses (the node addresses inside --nodeport-addresses, and
//     127.0.0.1 for localhost NodePorts);
//   - ExternalIP: <externalIP, port> for every spec.externalIPs entry of
//     the family;
//   - LoadBalancer: <ingress IP, port> for every status.loadBalancer.ingress
//     IP of the family whose ipMode is not Proxy (KEP-1860: a proxying
//     load balancer sends its traffic to the NodePort, and the node must
//     let traffic to the IP leave for it), with the family's
//     spec.loadBalancerSourceRanges.
//
// An address one Service names as two of these at one port (an externalIP
// that is also a VIP-mode ingress IP) is one frontend, the LoadBalancer
// one with its source ranges: Translate keeps one per address, port and
// protocol (claimRank). A Proxy-mode ingress IP that is also an
// externalIP is served as the externalIP, without the ranges, as
// kube-proxy serves it.
//
// With externalTrafficPolicy Cluster they balance over the Cluster
// policy's endpoints (internalTrafficPolicy does not apply to them). With
// externalTrafficPolicy Local (ExternalLocal) external clients get this
// node's endpoints only, and an empty set drops while the Service has
// endpoints elsewhere; internal clients (pods, by the cluster CIDR, and
// the node itself) are short-circuited to the Cluster policy's endpoints,
// as kube-proxy does: the frontend has TwoScopes. LoadBalancer Services
// with externalTrafficPolicy Local carry their healthCheckNodePort, and
// the ready local endpoints the health check counts, on these frontends
// and on the ClusterIP frontend of the family (Translate), which has them
// whatever north-south frontends there are: kube-proxy serves the port
// for every Service port with a ClusterIP of the family, a Service with
// no NodePorts (allocateLoadBalancerNodePorts false) whose ingress is a
// hostname, ipMode Proxy or not yet published included.

// claimRank orders the kinds of frontend one Service may give the same
// address, port and protocol (an externalIP that is also a LoadBalancer
// ingress IP, an externalIP listed twice, a node address that is an
// externalIP at a port that is also a NodePort), the one served first:
// the frontend kube-proxy's nftables proxier serves there. A LoadBalancer
// IP's, with its loadBalancerSourceRanges: the firewall check, keyed by
// LoadBalancer IP, protocol and port, drops other sources of new
// connections before any DNAT, whether the address is an externalIP too
// or not (the two send to the same external chain); a LoadBalancer IP
// closed for want of a range of its family (sourceRanges) stays closed.
// Then an externalIP's: the service-IPs map holds ClusterIPs, externalIPs
// and LoadBalancer IPs, a Service port's externalIP element written after
// its ClusterIP's, and is looked up before the NodePorts map. (kube-proxy
// writes a port's externalIP and LoadBalancer IP elements only when the
// port has endpoints: without, a NodePort of another port at that address
// and port serves there, where Sluice keeps the higher-ranked frontend and
// rejects; a deviation the README's kube-proxy behaviour table states.
// Following it would need a NodePort frontend carrying a LoadBalancer
// IP's source ranges.) Left to the
// tracker, which settles claims of different Services, two frontends of
// one Service went to the ExternalIP (open to every source) and the
// Service was reported losing a conflict to itself.
var claimRank = [...]int{model.LoadBalancer: 0, model.ExternalIP: 1, model.ClusterIP: 2, model.NodePort: 3}

// external is what a Service's north-south frontends of one family share,
// whatever the port.
type external struct {
	v6          bool         // the family: IPv6, else IPv4
	nodePorts   bool         // type NodePort or LoadBalancer
	externalIPs []netip.Addr // spec.externalIPs of the family
	lbIPs       []netip.Addr // VIP-mode LoadBalancer ingress IPs of the family
	local       bool         // externalTrafficPolicy Local (on an externally accessible Service)
	ranges      []netip.Prefix
	closed      bool // loadBalancerSourceRanges admit no source of the family
	hc          uint16
	localReady  []netip.Addr
	node        Node
	facts       NodeFacts
	warnings    []string

	// noExternalIPs: externalIPs get no frontends (Options.NoExternalIPs);
	// they still count for the traffic policies (policyOf).
	noExternalIPs bool
}

// externalOf reads what svc's north-south frontends of the family (IPv6
// if v6) share, on node; eps are the Service's slices of the family.
func externalOf(svc *Service, eps []*Slice, node Node, v6 bool) external {
	x := external{node: node, v6: v6}
	typ := svc.Type
	x.nodePorts = typ == corev1.ServiceTypeNodePort || typ == corev1.ServiceTypeLoadBalancer
	ext := svc.external()
	for _, ip := range ext.IPs {
		if ip.Is6() == v6 {
			x.externalIPs = append(x.externalIPs, ip)
		}
	}
	for _, ip := range ext.LoadBalancerIPs { // a LoadBalancer Service's, not Proxy mode
		if ip.Is6() == v6 {
			x.lbIPs = append(x.lbIPs, ip)
		}
	}
	// kube-proxy's ExternallyAccessible and ExternalPolicyLocal.
	accessible := x.nodePorts || (typ == "" || typ == corev1.ServiceTypeClusterIP) && len(ext.IPs) > 0
	x.local = accessible && svc.ExternalLocal
	if x.nodePorts {
		// With no address today there is no NodePort frontend, but
		// there will be once the node has one.
		x.facts |= NodeAddresses
	}
	if len(x.lbIPs) > 0 && len(ext.SourceRanges) > 0 {
		x.ranges, x.closed, x.warnings = sourceRanges(ext.SourceRanges, node.primaryIP(v6), x.lbIPs)
		x.facts |= NodeAddresses // node.IPs
	}
	if x.local && typ == corev1.ServiceTypeLoadBalancer && ext.HealthCheckNodePort > 0 && ext.HealthCheckNodePort <= 65535 {
		x.hc = uint16(ext.HealthCheckNodePort)
		x.localReady = localReady(eps, node.Name)
		x.facts |= NodeName
	}
	return x
}

// policyOf returns how the traffic policies apply to port sp of svc.
func policyOf(svc *Service, sp ServicePort, x external) portPolicy {
	return portPolicy{
		internalLocal: svc.InternalLocal,
		externalLocal: x.local,
		accessible:    x.nodePorts && sp.NodePort > 0 || len(x.externalIPs) > 0 || len(x.lbIPs) > 0,
	}
}

// northSouth returns the north-south frontends of service port sp, with
// the port's endpoint categories cat. They share cat's arrays of backends
// with each other and the port's ClusterIP frontend: nothing modifies a
// translation (model.State), and a LoadBalancer Service's port has one
// frontend per node address, external IP and load-balancer IP.
func northSouth(svc *Service, sp ServicePort, proto model.Protocol, cat categories, x external) (out []*model.Service) {
	backends := cat.cluster
	if x.local {
		backends = cat.local
	}
	name := model.ServicePortName{Namespace: svc.Namespace, Name: svc.Name, Port: sp.Name}
	add := func(kind model.FrontendKind, ip netip.Addr, port int32) *model.Service {
		ip = ip.Unmap()
		if ip.Is6() != x.v6 || port < 1 || port > 65535 {
			return nil
		}
		s := &model.Service{
			Name:                name,
			Kind:                kind,
			Frontend:            model.L4Addr{Addr: ip, Port: uint16(port), Proto: proto},
			Backends:            backends,
			DropWhenEmpty:       cat.hasAny && len(backends) == 0,
			ExternalLocal:       x.local,
			HealthCheckNodePort: x.hc,
			LocalReady:          x.localReady,
		}
		if x.local {
			s.TwoScopes = true
			s.InternalBackends = cat.cluster
		}
		out = append(out, s)
		return s
	}
	if x.nodePorts && sp.NodePort > 0 {
		for _, ip := range x.node.Addresses {
			add(model.NodePort, ip, sp.NodePort)
		}
	}
	if !x.noExternalIPs {
		for _, ip := range x.externalIPs {
			add(model.ExternalIP, ip, sp.Port)
		}
	}
	for _, ip := range x.lbIPs {
		s := add(model.LoadBalancer, ip, sp.Port)
		if s == nil {
			continue
		}
		if x.closed {
			// No source may reach it, the node's and pods' included:
			// it drops everything.
			s.Backends, s.InternalBackends, s.TwoScopes = nil, nil, false
			s.DropWhenEmpty = true
			continue
		}
		s.SourceRanges = x.ranges
	}
	return out
}

// sourceRanges reads loadBalancerSourceRanges for the LoadBalancer IPs
// lbIPs (not empty, of one family) as kube-proxy does: entries trimmed of
// whitespace (the API server lets " 203.0.113.0/25" through), parsed
// sloppily, those of the other family left to it, and one that contains
// the node's primary address of the family nodeIP also admits lbIPs
// themselves (a node reaching its own LoadBalancer IP may arrive
// source-NATed to it). 0.0.0.0/0 (::/0 for IPv6) allows everything: no
// check at all.
//
// An entry that does not parse is ignored, as kube-proxy ignores it. But
// where kube-proxy then opens the LoadBalancer IPs to every source if no
// entry of their family is left, Sluice closes them (closed): a Service
// that asks for source ranges must never end up open to all. Both are
// reported in warns.
func sourceRanges(entries []string, nodeIP netip.Addr, lbIPs []netip.Addr) (out []netip.Prefix, closed bool, warns []string) {
	v6 := lbIPs[0].Is6()
	all := false
	for _, e := range entries {
		p, ok := parseCIDRSloppy(strings.TrimSpace(e))
		if !ok {
			warns = append(warns, fmt.Sprintf("loadBalancerSourceRanges entry %q is not a CIDR; ignored", e))
			continue
		}
		if p.Addr().Is6() != v6 {
			continue
		}
		if p.Bits() == 0 {
			all = true
		}
		out = append(out, p)
	}
	if all {
		return nil, false, warns
	}
	if len(out) == 0 {
		fam := familyName(v6)
		warns = append(warns, fmt.Sprintf("loadBalancerSourceRanges %q hold no %s range: the %s LoadBalancer IPs are closed to every source", entries, fam, fam))
		return nil, true, warns
	}
	if nodeIP.IsValid() && slices.ContainsFunc(out, func(p netip.Prefix) bool { return p.Contains(nodeIP) }) {
		for _, ip := range lbIPs {
			out = append(out, netip.PrefixFrom(ip, ip.BitLen()))
		}
	}
	slices.SortFunc(out, netip.Prefix.Compare)
	return slices.Compact(out), false, warns
}

// NodeIPs returns the addresses of node (nil: none), of both families:
// its InternalIP addresses, then its ExternalIP ones, without duplicates,
// in the order of kube-proxy's GetNodeHostIPs, which keeps the first of
// each family (PrimaryIPs): kube-proxy's node IPs, where NodePorts are
// served by default (--nodeport-addresses primary). The agent takes the
// families --node-ip does not give from them (cmd/sluice nodeips.go).
func NodeIPs(node *corev1.Node) []netip.Addr {
	if node == nil {
		return nil
	}
	var out []netip.Addr
	for _, t := range []corev1.NodeAddressType{corev1.NodeInternalIP, corev1.NodeExternalIP} {
		for _, a := range node.Status.Addresses {
			if a.Type != t {
				continue
			}
			ip, ok := parseIPSloppy(a.Address)
			if !ok || slices.Contains(out, ip) {
				continue
			}
			out = append(out, ip)
		}
	}
	return out
}

// PrimaryIPs returns the first address of each family in addrs, in their
// order: the node's primary addresses (Node.IPs) among its node IPs.
func PrimaryIPs(addrs []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, a := range addrs {
		a = a.Unmap()
		if !slices.ContainsFunc(out, func(b netip.Addr) bool { return b.Is6() == a.Is6() }) {
			out = append(out, a)
		}
	}
	return out
}

// primaryIP returns the node's primary address of the family (IPv6 if v6),
// or the zero Addr.
func (n Node) primaryIP(v6 bool) netip.Addr {
	for _, a := range n.IPs {
		if a.Is6() == v6 {
			return a
		}
	}
	return netip.Addr{}
}
