package translate

import (
	"cmp"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/sluice-lb/sluice/pkg/model"
)

// North-south frontends of a Service port, as kube-proxy serves them:
//
//   - NodePort (types NodePort and LoadBalancer, when a node port is
//     allocated): <node IP, nodePort> for every address in Node.Addresses;
//   - ExternalIP: <externalIP, port> for every spec.externalIPs entry;
//   - LoadBalancer: <ingress IP, port> for every status.loadBalancer.ingress
//     IP, with spec.loadBalancerSourceRanges.
//
// With externalTrafficPolicy Local they balance over this node's endpoints
// only (Backend.NodeName == Node.Name), chosen like all endpoints
// are (ready ones, else serving and terminating ones), and carry
// ExternalLocal; LoadBalancer Services with a healthCheckNodePort carry it
// for the health check server.

// northSouth returns the north-south frontends of service port sp, and
// the facts of node they depend on. backends are the port's (cluster-wide)
// backends, mine the Service's slices.
func northSouth(svc *corev1.Service, sp corev1.ServicePort, proto model.Protocol, backends []model.Backend, mine []*discoveryv1.EndpointSlice, node Node) (out []*model.Service, facts NodeFacts) {
	local := svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
	if local {
		backends = backendsFor(sp.Name, cmp.Or(sp.Protocol, corev1.ProtocolTCP), proto, localSlices(mine, node.Name))
		facts |= NodeName
	}
	var hc uint16
	if local && svc.Spec.Type == corev1.ServiceTypeLoadBalancer && svc.Spec.HealthCheckNodePort > 0 && svc.Spec.HealthCheckNodePort <= 65535 {
		hc = uint16(svc.Spec.HealthCheckNodePort)
	}
	name := model.ServicePortName{Namespace: svc.Namespace, Name: svc.Name, Port: sp.Name}
	add := func(kind model.FrontendKind, ip netip.Addr, port int32, ranges []netip.Prefix) {
		ip = ip.Unmap()
		if !ip.Is4() || port < 1 || port > 65535 {
			return
		}
		out = append(out, &model.Service{
			Name:                name,
			Kind:                kind,
			Frontend:            model.L4Addr{Addr: ip, Port: uint16(port), Proto: proto},
			Backends:            slices.Clone(backends),
			ExternalLocal:       local,
			SourceRanges:        ranges,
			HealthCheckNodePort: hc,
		})
	}
	if (svc.Spec.Type == corev1.ServiceTypeNodePort || svc.Spec.Type == corev1.ServiceTypeLoadBalancer) && sp.NodePort > 0 {
		// With no address today there is no NodePort frontend, but
		// there will be once the node has one.
		facts |= NodeAddresses
		for _, ip := range node.Addresses {
			add(model.NodePort, ip, sp.NodePort, nil)
		}
	}
	for _, s := range svc.Spec.ExternalIPs {
		if ip, err := netip.ParseAddr(s); err == nil {
			add(model.ExternalIP, ip, sp.Port, nil)
		}
	}
	if svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
		ranges := sourceRanges(svc.Spec.LoadBalancerSourceRanges)
		for _, ing := range svc.Status.LoadBalancer.Ingress {
			if ip, err := netip.ParseAddr(ing.IP); err == nil {
				add(model.LoadBalancer, ip, sp.Port, ranges)
			}
		}
	}
	return out, facts
}

// sourceRanges parses loadBalancerSourceRanges, keeping the IPv4 ones.
// An entry that does not parse is skipped (the API server validates them).
// 0.0.0.0/0, which allows everything, means no check at all. An IPv4-mapped
// IPv6 range (::ffff:10.0.0.0/104) is an IPv6 one, skipped like the others:
// taking its address as IPv4 with its 104 bits made an invalid prefix.
func sourceRanges(ss []string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		p, err := netip.ParsePrefix(s)
		if err != nil || !p.Addr().Is4() {
			continue
		}
		p = p.Masked()
		if p.Bits() == 0 {
			return nil
		}
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	return slices.Compact(out)
}

// localSlices returns copies of slices holding only the endpoints on node.
func localSlices(in []*discoveryv1.EndpointSlice, node string) []*discoveryv1.EndpointSlice {
	out := make([]*discoveryv1.EndpointSlice, 0, len(in))
	for _, es := range in {
		c := *es
		c.Endpoints = nil
		for _, e := range es.Endpoints {
			if node != "" && ptrOr(e.NodeName, "") == node {
				c.Endpoints = append(c.Endpoints, e)
			}
		}
		out = append(out, &c)
	}
	return out
}

// NodeIPs returns the IPv4 addresses of node that NodePorts are served on
// when --node-ip is not given: its InternalIP addresses, then its
// ExternalIP ones, without duplicates.
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
			ip, err := netip.ParseAddr(a.Address)
			if err != nil || !ip.Unmap().Is4() || slices.Contains(out, ip.Unmap()) {
				continue
			}
			out = append(out, ip.Unmap())
		}
	}
	return out
}
