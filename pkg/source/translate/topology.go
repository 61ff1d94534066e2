package translate

// Which endpoints a Service port's traffic reaches from this node: a port
// of kube-proxy's CategorizeEndpoints (pkg/proxy/topology.go, v1.36.3),
// rule for rule, with its table of cases as translation cases in
// test/flows/kubeproxy/categorize-endpoints.yaml.
//
//   - The Cluster policy's endpoints are the ready ones, narrowed by
//     topology hints when every ready endpoint has one and one names this
//     node (hints.forNodes, PreferSameNode) or else this node's zone
//     (hints.forZones, PreferSameZone); with none ready anywhere, the
//     serving and terminating ones (KEP-1669), hints ignored.
//   - The Local policy's endpoints are this node's ready ones, or with none
//     ready here, this node's serving and terminating ones; never narrowed
//     by topology.
//   - hasAny says whether the port has a usable endpoint anywhere (ready,
//     or serving and terminating): with none, traffic is rejected; with
//     some but none for a policy here, that policy's traffic is dropped.
//
// kube-proxy never reads trafficDistribution itself: the EndpointSlice
// controller turns it into the hints read here.

import (
	"encoding/binary"
	"net"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	netutils "k8s.io/utils/net"

	"github.com/sluice-lb/sluice/pkg/model"
)

// endpoint is one endpoint of a Service port, with what CategorizeEndpoints
// reads of it.
type endpoint struct {
	b                           model.Backend
	node                        string // the node it runs on ("": unknown)
	ready, serving, terminating bool
	local                       bool     // on this node
	zones, nodes                []string // hints.forZones, hints.forNodes
}

// portPolicy is how a Service port's traffic policies apply (kube-proxy's
// BaseServicePortInfo).
type portPolicy struct {
	internalLocal bool // internalTrafficPolicy Local
	externalLocal bool // externalTrafficPolicy Local on an externally accessible Service
	accessible    bool // the port has a NodePort, an ExternalIP or a LoadBalancer IP
}

// usesCluster: the port's traffic uses Cluster-policy endpoints (even with
// externalTrafficPolicy Local, internal clients short-circuit to them).
func (p portPolicy) usesCluster() bool { return !p.internalLocal || p.accessible }

// usesLocal: the port's traffic uses Local-policy endpoints.
func (p portPolicy) usesLocal() bool { return p.internalLocal || (p.externalLocal && p.accessible) }

// categories are CategorizeEndpoints' results: nil when the port never
// uses that policy's endpoints.
type categories struct {
	cluster, local []model.Backend
	hasAny         bool
}

// categorize is CategorizeEndpoints: eps (sorted by address) as seen from
// node nodeName in zone.
func categorize(eps []endpoint, pol portPolicy, nodeName, zone string) (c categories) {
	if len(eps) == 0 {
		return c
	}
	var mode string
	if pol.usesCluster() {
		mode = topologyMode(eps, nodeName, zone)
		c.cluster = filterEndpoints(eps, func(e *endpoint) bool {
			return e.ready && availableForTopology(e, mode, nodeName, zone)
		})
		// No ready endpoint for this topology means none anywhere: the
		// mode falls back to "" when this node's zone has none.
		if len(c.cluster) == 0 {
			c.cluster = filterEndpoints(eps, func(e *endpoint) bool { return e.serving && e.terminating })
		}
		c.hasAny = len(c.cluster) > 0
	}
	if !pol.usesLocal() {
		return c
	}
	var localReady, localServingTerminating bool
	for i := range eps {
		e := &eps[i]
		switch {
		case e.ready:
			c.hasAny = true
			localReady = localReady || e.local
		case e.serving && e.terminating:
			c.hasAny = true
			localServingTerminating = localServingTerminating || e.local
		}
	}
	switch {
	case localReady:
		c.local = filterEndpoints(eps, func(e *endpoint) bool { return e.local && e.ready })
	case localServingTerminating:
		c.local = filterEndpoints(eps, func(e *endpoint) bool { return e.local && e.serving && e.terminating })
	}
	return c
}

// categorizeSorted is categorize(endpointsFor(...), pol, nodeName, zone)
// for the shape nearly every Service port has, without either: its
// endpoints in one slice (eps, the Service's slices of the family), which
// lists the port once, their addresses IPv4 and in increasing order (no
// duplicate to drop, nothing to sort), none with hints (no topology: the
// zone is not read, and hintsRead says false). It makes each policy's
// backends straight from the packed endpoints: at 30,000 Services of 10
// endpoints, a first sync's endpointsFor made 300,000 endpoints of 104
// bytes, sorted them and filtered them again. ok is false for any other
// shape (several slices, an address of another family or none, hints,
// addresses out of order or listed twice), which the caller categorizes
// the long way.
func categorizeSorted(eps []*Slice, portName string, kproto corev1.Protocol, proto model.Protocol, pol portPolicy, nodeName string) (c categories, ok bool) {
	if len(eps) != 1 {
		return c, false
	}
	es := eps[0]
	port := -1
	for i := range es.Ports {
		if p := &es.Ports[i]; p.Name == portName && p.Protocol == kproto && p.served() {
			if port >= 0 {
				return c, false // listed twice: endpointsFor's candidates of both
			}
			port = i
		}
	}
	packed := es.Endpoints.eps
	if port < 0 || len(packed) == 0 {
		return c, true // no endpoint: categorize's nothing
	}
	if es.Endpoints.wide != nil {
		return c, false
	}
	isReady := func(p *packedEndpoint) bool { return p.flags&epReady != 0 }
	isServingTerminating := func(p *packedEndpoint) bool {
		return p.flags&(epServing|epTerminating) == epServing|epTerminating
	}
	// One pass to check the shape and count each set, one to fill them.
	var ready, servingTerminating, localReady, localServingTerminating int
	var last uint32
	for i := range packed {
		p := &packed[i]
		if p.flags&epIPv4 == 0 {
			return c, false
		}
		a := binary.BigEndian.Uint32(p.v4[:])
		if i > 0 && a <= last {
			return c, false
		}
		last = a
		local := p.isLocal(nodeName)
		switch {
		case isReady(p):
			ready++
			if local {
				localReady++
			}
		case isServingTerminating(p):
			servingTerminating++
			if local {
				localServingTerminating++
			}
		}
	}
	backends := func(n int, keep func(*packedEndpoint) bool) []model.Backend {
		out := make([]model.Backend, 0, n)
		for i := range packed {
			if p := &packed[i]; keep(p) {
				out = append(out, model.Backend{L4Addr: model.L4Addr{Addr: netip.AddrFrom4(p.v4), Port: uint16(es.Ports[port].Port), Proto: proto},
					Terminating: !isReady(p)})
			}
		}
		return out
	}
	if pol.usesCluster() {
		// No hints: topologyMode's "", every ready endpoint; with none,
		// the serving and terminating ones.
		if ready > 0 {
			c.cluster = backends(ready, isReady)
		} else {
			c.cluster = backends(servingTerminating, isServingTerminating)
		}
		c.hasAny = len(c.cluster) > 0
	}
	if !pol.usesLocal() {
		return c, true
	}
	c.hasAny = c.hasAny || ready+servingTerminating > 0
	switch {
	case localReady > 0:
		c.local = backends(localReady, func(p *packedEndpoint) bool { return p.isLocal(nodeName) && isReady(p) })
	case localServingTerminating > 0:
		c.local = backends(localServingTerminating, func(p *packedEndpoint) bool {
			return p.isLocal(nodeName) && isServingTerminating(p)
		})
	}
	return c, true
}

// isLocal says whether the endpoint is on node nodeName (endpoint.local).
func (p *packedEndpoint) isLocal(nodeName string) bool {
	return nodeName != "" && p.node != nil && *p.node == nodeName
}

// Topology modes (kube-proxy's, the values of Service.trafficDistribution
// that the hints stand for).
const (
	topologySameNode = corev1.ServiceTrafficDistributionPreferSameNode
	topologySameZone = corev1.ServiceTrafficDistributionPreferSameZone
)

// topologyMode is kube-proxy's topologyModeFromHints: PreferSameNode if
// every ready endpoint has a node hint and one names this node; else
// PreferSameZone if every ready endpoint has a zone hint and one names
// this node's zone; else "" (no topology). The PreferSameTrafficDistribution
// feature gate it checks is GA and locked on in v1.36.
func topologyMode(eps []endpoint, nodeName, zone string) string {
	ready, forNode, allNode, forZone, allZone := false, false, true, false, true
	for i := range eps {
		e := &eps[i]
		if !e.ready {
			continue
		}
		ready = true
		if len(e.nodes) == 0 {
			allNode = false
		} else if slices.Contains(e.nodes, nodeName) {
			forNode = true
		}
		if len(e.zones) == 0 {
			allZone = false
		} else if slices.Contains(e.zones, zone) {
			forZone = true
		}
	}
	switch {
	case !ready:
		return ""
	case allNode && forNode:
		return topologySameNode
	case allZone && forZone:
		return topologySameZone
	}
	return ""
}

// availableForTopology: whether e may be used under mode.
func availableForTopology(e *endpoint, mode, nodeName, zone string) bool {
	switch mode {
	case "":
		return true
	case topologySameNode:
		return slices.Contains(e.nodes, nodeName)
	case topologySameZone:
		return slices.Contains(e.zones, zone)
	}
	return false
}

// filterEndpoints returns the backends of the endpoints keep accepts,
// terminating ones marked, never nil, in an array of their number: the
// frontends of a Service port share it (model.State is never modified).
func filterEndpoints(eps []endpoint, keep func(*endpoint) bool) []model.Backend {
	n := 0
	for i := range eps {
		if keep(&eps[i]) {
			n++
		}
	}
	out := make([]model.Backend, 0, n)
	for i := range eps {
		if e := &eps[i]; keep(e) {
			b := e.b
			b.Terminating = !e.ready
			out = append(out, b)
		}
	}
	return out
}

// endpointsFor returns the endpoints of all slices for the Service port
// named portName, sorted by address. An endpoint (address and port)
// listed by several slices, or twice by one, is counted once, with the
// listing kube-proxy keeps when it walks the slices in the order of eps.
// kube-proxy walks them in a map's order: between two listings both
// terminating or both not, its choice changes from one sync to the next.
// Translate gives eps sorted by name, so Sluice's choice is kube-proxy's
// for that order, whatever the order the slices came in. Only ports with
// a number not 0 are read (SlicePort.served).
// Addresses are read as kube-proxy reads them (netutils.ParseIPSloppy:
// leading zeros are decimal), and only the first of an endpoint's
// addresses is used: the API says the others are fungible copies. The
// endpoints are appended to cands (a scratch array, length 0), which is
// grown as needed.
func endpointsFor(cands []endpoint, portName string, kproto corev1.Protocol, proto model.Protocol, eps []*Slice, nodeName string) []endpoint {
	n := 0
	for _, es := range eps {
		n += es.Endpoints.Len()
	}
	cands = slices.Grow(cands[:0], n)
	for _, es := range eps {
		for _, ep := range es.Ports {
			if ep.Name != portName || ep.Protocol != kproto || !ep.served() {
				continue
			}
			for i := range es.Endpoints.Len() {
				e := es.Endpoints.At(i)
				if !e.Addr.IsValid() {
					continue
				}
				node := e.nodeName()
				c := endpoint{
					b:           model.Backend{L4Addr: model.L4Addr{Addr: e.Addr, Port: uint16(ep.Port), Proto: proto}},
					node:        node,
					ready:       e.Ready,
					serving:     e.Serving,
					terminating: e.Terminating,
					local:       nodeName != "" && node == nodeName,
				}
				if h := e.Hints; h != nil {
					for _, z := range h.ForZones {
						c.zones = append(c.zones, z.Name)
					}
					for _, n := range h.ForNodes {
						c.nodes = append(c.nodes, n.Name)
					}
				}
				cands = append(cands, c)
			}
		}
	}
	// Sorted by address, listings of one endpoint are next to each other
	// in the order they were seen (a stable sort), and the result comes
	// out sorted. A map to find duplicates would cost more: most
	// endpoints are listed once.
	slices.SortStableFunc(cands, func(a, b endpoint) int { return a.b.L4Addr.Compare(b.b.L4Addr) })
	out := cands[:0]
	for i := 0; i < len(cands); {
		c := cands[i]
		j := i + 1
		for ; j < len(cands) && cands[j].b.L4Addr == c.b.L4Addr; j++ {
			// kube-proxy's rule (endpointslicecache.go, addEndpoints):
			// a listing replaces those before it unless it is
			// terminating. So a listing that is not terminating wins
			// over one that is, whatever their order (a pod IP reused
			// by a new pod while the old one terminates reaches the
			// new pod); of several that are not, the last; of several
			// that are, the first.
			if !cands[j].terminating {
				c = cands[j]
			}
		}
		i = j
		out = append(out, c)
	}
	return out
}

// localReady returns the addresses of the ready endpoints on this node in
// eps, sorted and unique: what the health check counts. That is kube-proxy's
// LocalReadyEndpoints, which counts by address across its endpoints map:
// the endpoints of every port of the slices (named in the Service or not)
// that has a number not 0, one listing per address and port, the one
// endpointsFor chooses.
func localReady(eps []*Slice, nodeName string) []netip.Addr {
	if nodeName == "" {
		return nil
	}
	if out, ok := localReadySorted(eps, nodeName); ok {
		return out
	}
	return localReadyAll(eps, nodeName)
}

// localReadyAll is localReady the long way, through endpointsFor, for
// slices of any shape.
func localReadyAll(eps []*Slice, nodeName string) []netip.Addr {
	type portKey struct {
		name  string
		proto corev1.Protocol
	}
	var done []portKey // the ports read: kube-proxy's ServicePortNames
	var out []netip.Addr
	scratch := endpointScratch.Get().(*[]endpoint)
	defer putEndpointScratch(scratch)
	cands := (*scratch)[:0]
	defer func() { *scratch = cands[:0] }()
	for _, es := range eps {
		for i := range es.Ports {
			p := &es.Ports[i]
			k := portKey{p.Name, p.Protocol}
			if !p.served() || slices.Contains(done, k) {
				continue
			}
			done = append(done, k)
			// The protocol of the backends made is not read.
			cands = endpointsFor(cands[:0], p.Name, p.Protocol, 0, eps, nodeName)
			for j := range cands {
				if e := &cands[j]; e.local && e.ready {
					out = append(out, e.b.Addr)
				}
			}
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// localReadySorted is localReady for the shape categorizeSorted takes,
// without endpointsFor: one slice, which lists no port name and protocol
// twice, its addresses IPv4 and in increasing order. Every served port
// then has the same endpoints, each listed once: the count is the slice's
// ready endpoints on this node, already sorted and unique, if it has a
// served port. Without it, a Local LoadBalancer Service with a
// healthCheckNodePort paid endpointsFor's copy and sort once more per
// port on a first sync. ok is false for any other shape.
func localReadySorted(eps []*Slice, nodeName string) (out []netip.Addr, ok bool) {
	if len(eps) != 1 {
		return nil, false
	}
	es := eps[0]
	served := false
	for i := range es.Ports {
		p := &es.Ports[i]
		if !p.served() {
			continue
		}
		served = true
		for j := range i {
			if q := &es.Ports[j]; q.served() && q.Name == p.Name && q.Protocol == p.Protocol {
				return nil, false // listed twice: endpointsFor's candidates of both
			}
		}
	}
	if !served {
		return nil, true // no port read: nothing counted
	}
	if es.Endpoints.wide != nil && es.Endpoints.wide.addrs != nil {
		return nil, false
	}
	packed := es.Endpoints.eps
	n := 0
	var last uint32
	for i := range packed {
		p := &packed[i]
		if p.flags&epIPv4 == 0 {
			return nil, false
		}
		a := binary.BigEndian.Uint32(p.v4[:])
		if i > 0 && a <= last {
			return nil, false
		}
		last = a
		if p.flags&epReady != 0 && p.isLocal(nodeName) {
			n++
		}
	}
	if n == 0 {
		return nil, true
	}
	out = make([]netip.Addr, 0, n)
	for i := range packed {
		if p := &packed[i]; p.flags&epReady != 0 && p.isLocal(nodeName) {
			out = append(out, netip.AddrFrom4(p.v4))
		}
	}
	return out, true
}

// hintsRead says which parts of the node the hints of eps make
// CategorizeEndpoints read: the node's name for node hints, its zone for
// zone hints (of ready endpoints: the only ones topologyMode looks at).
func hintsRead(eps []endpoint) (name, zone bool) {
	for i := range eps {
		if e := &eps[i]; e.ready {
			name = name || len(e.nodes) > 0
			zone = zone || len(e.zones) > 0
		}
	}
	return name, zone
}

// parseIPSloppy parses an address of either family as kube-proxy does
// (netutils.ParseIPSloppy: "10.180.00.001" is 10.180.0.1), an IPv4-mapped
// one as IPv4 (netutils.IPFamilyOf). netip parses what both accept without
// allocating (netutils makes a net.IP of every address: a 30,000-Service
// cluster's first list has hundreds of thousands); what netip refuses
// (leading zeros) or takes and netutils does not (a zone) goes to
// netutils.
func parseIPSloppy(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil && a.Zone() == "" {
		return a.Unmap(), true
	}
	ip := netutils.ParseIPSloppy(s)
	if ip == nil {
		return netip.Addr{}, false
	}
	if v4 := ip.To4(); v4 != nil {
		return netip.AddrFrom4([4]byte(v4)), true
	}
	a, ok := netip.AddrFromSlice(ip)
	return a, ok
}

// parseCIDRSloppy parses a CIDR as kube-proxy does
// (netutils.ParseCIDRSloppy), masked.
func parseCIDRSloppy(s string) (netip.Prefix, bool) {
	_, n, err := netutils.ParseCIDRSloppy(s)
	if err != nil {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	ip := n.IP
	if v4 := ip.To4(); v4 != nil && len(n.Mask) == net.IPv4len {
		return netip.PrefixFrom(netip.AddrFrom4([4]byte(v4)), ones).Masked(), true
	}
	a, ok := netip.AddrFromSlice(ip)
	if !ok {
		return netip.Prefix{}, false
	}
	p := netip.PrefixFrom(a, ones).Masked()
	if p.Addr().Is4In6() {
		// An IPv4-mapped prefix ("::ffff:10.0.0.0/104") is the IPv4
		// one it maps (10.0.0.0/8), as kube-proxy's family test
		// (To4) takes it: the datapath has no 4in6 ranges.
		p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	return p, true
}
