// Package translate turns Kubernetes Service and EndpointSlice objects into
// Sluice's desired-state model. It is the one place that knows the API's
// semantics; pkg/source/tracker calls it for both sources (manifest files
// and the Kubernetes API), one Service at a time. Besides the objects, a
// translation reads what it needs of the node it is for (Options.Node) and
// says which parts it read (Translation.NodeFacts), so that a change of the
// node re-translates only the Services it can change.
//
// The rules follow kube-proxy v1.36 (pkg/proxy/servicechangetracker.go,
// endpointschangetracker.go, topology.go and the nftables proxier): every
// EndpointSlice labelled kubernetes.io/service-name belongs to that
// Service and all of them are merged; a Service port is matched to an
// EndpointSlice port by name (the slice's port number is the already
// resolved targetPort); which endpoints each frontend balances over, for
// which clients, and whether an empty set rejects or drops, is
// CategorizeEndpoints' answer applied to the traffic policies
// (topology.go, northsouth.go). Addresses are read as kube-proxy reads
// them (leading zeros are decimal). sessionAffinity ClientIP gives every
// frontend of the Service, in each of its scopes, its timeout (default
// 10800 s, as the API server defaults it). Headless (clusterIP None) and
// ExternalName Services, and those that ask for another proxy through the
// service.kubernetes.io/service-proxy-name label, are skipped; so are
// EndpointSlices labelled service.kubernetes.io/headless, which belong to
// no Service (kube-proxy's informers filter the label on slices, not on
// Services).
//
// Bad input is handled the kube-proxy way, without failing the whole
// Service: an SCTP port is left out (SCTP needs a CRC32c rewrite the
// datapath does not do) and the others are served; an EndpointSlice port
// numbered 0 (discovery/v1 does not validate them) is ignored, as one
// without a number is, and the slice's other ports and the Service's other
// slices are served; loadBalancerSourceRanges entries are trimmed of
// whitespace and those that do not parse are ignored. Unlike kube-proxy,
// a Service whose source ranges leave none that applies is closed, never
// open to all. All three are reported (Translation.Warnings). A slice port
// out of range (negative, past 65535) fails the Service's translation,
// naming the slice: kube-proxy writes it into its rules, which nft
// refuses, and its whole sync fails while it programs such an endpoint.
//
// An endpoint (address and port) listed twice in a Service's slices is
// served once, from the listing kube-proxy keeps (endpointsFor): one that
// is not terminating over one that is, else as kube-proxy walking the
// slices in name order. The healthCheckNodePort counts the ready local
// endpoints kube-proxy counts, after the same choice (localReady).
//
// Both IP families are translated alike, each as kube-proxy's proxier of
// that family does (servicechangetracker.go, serviceport.go): a Service
// has a ClusterIP frontend per family in clusterIPs, which balances over
// the EndpointSlices of that addressType only (no NAT46/64); its
// externalIPs, LoadBalancer ingress IPs, loadBalancerSourceRanges and the
// node's NodePort addresses are split by family, and each family's apply
// to that family's frontends only. A Service without a ClusterIP of a
// family (SingleStack) serves none of that family's frontends, even if its
// externalIPs name some. ipFamilyPolicy is not read: the ClusterIPs it
// made are what counts. An IPv4-mapped IPv6 address (::ffff:10.0.0.1) is
// IPv4, as netutils.IPFamilyOf reads it; in an IPv6 EndpointSlice it is
// invalid, as the API server's validation says.
package translate

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-lb/sluice/pkg/model"
)

const (
	// LabelServiceProxyName names the proxy that should implement a Service;
	// a Service with another proxy's name is left alone.
	LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"
	// DefaultProxyName is Options.ProxyName when it is empty.
	DefaultProxyName = "sluice"
)

// Options are what the translation needs besides the objects.
type Options struct {
	ProxyName string // the value of service.kubernetes.io/service-proxy-name served; default "sluice"
	// Node is the node the translation is for. Unlike the objects, it is
	// the same input for every Service: a source that learns of a change
	// of it re-translates only the Services whose Translation.NodeFacts
	// name what changed.
	Node Node
	// NoExternalIPs is kube-proxy's feature gate AllowServiceExternalIPs
	// set to false (--allow-service-external-ips=false), as operators set
	// it against CVE-2020-8554: spec.externalIPs get no frontends, as
	// kube-proxy then programs none (pkg/proxy/serviceport.go,
	// ExternalIPs). LoadBalancer ingress IPs, NodePorts and ClusterIPs
	// are served as before; the traffic policies still read the
	// externalIPs, as kube-proxy's ExternallyAccessible does, ungated.
	// The zero value is the gate's default, true.
	NoExternalIPs bool
}

func (o Options) proxyName() string {
	if o.ProxyName == "" {
		return DefaultProxyName
	}
	return o.ProxyName
}

// Node is what the translation knows of the node it runs on.
type Node struct {
	// Name is this node's name: the Local traffic policies keep the
	// endpoints whose nodeName it is, and topology hints forNodes name it.
	Name string
	// IPs are the node's primary addresses, at most one per family
	// (kube-proxy's nodeIPs; PrimaryIPs): a loadBalancerSourceRanges
	// entry that contains the one of its family also admits the
	// LoadBalancer IPs themselves as sources.
	IPs []netip.Addr
	// Addresses are the addresses NodePorts are served on (none without
	// them), of both families, each used by its family's frontends: the
	// node addresses inside --nodeport-addresses, and 127.0.0.1 for
	// localhost NodePorts. See northsouth.go.
	Addresses []netip.Addr
	// Labels are the Node object's labels: topology.kubernetes.io/zone is
	// the zone topology hints (hints.forZones) are matched against.
	Labels map[string]string
}

// NodeFacts is a set of the parts of a Node.
type NodeFacts uint8

const (
	NodeName      NodeFacts = 1 << iota // Node.Name
	NodeAddresses                       // Node.Addresses and Node.IPs
	NodeLabels                          // Node.Labels
)

// Diff returns the parts of the node in which n and m differ.
func (n Node) Diff(m Node) NodeFacts {
	var d NodeFacts
	if n.Name != m.Name {
		d |= NodeName
	}
	if !slices.Equal(n.Addresses, m.Addresses) || !slices.Equal(n.IPs, m.IPs) {
		d |= NodeAddresses
	}
	if !maps.Equal(n.Labels, m.Labels) {
		d |= NodeLabels
	}
	return d
}

// Translation is what one Service translates to.
type Translation struct {
	// Services has one model.Service per frontend, sorted by frontend.
	Services []*model.Service
	// Skipped, if not empty, says why the Service is deliberately not
	// served (headless, ExternalName, another proxy's); it is
	// not an error.
	Skipped string
	// NodeFacts are the parts of Options.Node the result was made from:
	// while only other parts change, translating again gives the same
	// result. Scenario: the Node's zone label changes. A ClusterIP Service
	// without topology hints reads no part of the node, a NodePort Service
	// reads NodeAddresses, and an externalTrafficPolicy Local one NodeName:
	// none of them is translated again.
	NodeFacts NodeFacts
	// Warnings are what of the Service is not served as asked, each naming
	// the part: a port skipped (SCTP), an EndpointSlice port numbered 0
	// ignored, loadBalancerSourceRanges entries ignored, LoadBalancer IPs
	// closed because no source range applies.
	// The rest of the Service is served.
	Warnings []string
}

// Reasons ServiceToModel gives for skipping a Service.
const (
	SkipHeadless     = "headless"
	SkipExternalName = "ExternalName"
	SkipNoClusterIP  = "no cluster IP allocated"
)

// The labels a translation reads, of a Service and of an EndpointSlice: a
// source may drop the others (Service and Slice keep what these say as
// fields). Keep them in step with MakeService and ServiceNameOfSlice.
var (
	ServiceLabelsRead = []string{LabelServiceProxyName}
	SliceLabelsRead   = []string{discoveryv1.LabelServiceName, corev1.IsHeadlessService}
)

// ServiceNameOfSlice returns the Service an EndpointSlice belongs to, from
// its kubernetes.io/service-name label; none if it is labelled
// service.kubernetes.io/headless (Slice.Headless).
func ServiceNameOfSlice(es *discoveryv1.EndpointSlice) (types.NamespacedName, bool) {
	if es == nil {
		return types.NamespacedName{}, false
	}
	if _, headless := es.Labels[corev1.IsHeadlessService]; headless {
		return types.NamespacedName{}, false
	}
	name, ok := es.Labels[discoveryv1.LabelServiceName]
	if !ok || name == "" {
		return types.NamespacedName{}, false
	}
	return types.NamespacedName{Namespace: es.Namespace, Name: name}, true
}

// ServiceToModel returns one model.Service per (ClusterIP frontend,
// ServicePort), plus the NodePort, ExternalIP and LoadBalancer frontends of
// each ServicePort (northsouth.go), with the backends taken from eps (slices
// of other Services are ignored). A Service deliberately not served is not
// an error: its Translation says why it was skipped.
func ServiceToModel(svc *corev1.Service, eps []*discoveryv1.EndpointSlice, opts Options) (Translation, error) {
	return Translate(ServiceOf(svc), SlicesOf(eps), opts)
}

// Translate is ServiceToModel with the Service and slices as a translation
// reads them (Service, Slice): the same result as with the objects they
// were made from.
func Translate(svc *Service, eps []*Slice, opts Options) (Translation, error) {
	if svc == nil {
		return Translation{}, errors.New("nil Service")
	}
	if why := svc.skipped(opts); why != "" {
		return Translation{Skipped: why}, nil
	}
	if svc.Invalid != nil {
		return Translation{}, svc.Invalid
	}

	vips := svc.ClusterIPs
	if len(vips) == 0 {
		return Translation{Skipped: SkipNoClusterIP}, nil
	}

	// What each family serves, as kube-proxy's proxier of that family
	// sees the Service: its ClusterIP, the slices of its addressType
	// (validated) and its north-south addresses.
	type family struct {
		vip    netip.Addr
		slices []*Slice
		ext    external
	}
	node := opts.Node
	affinity := svc.Affinity
	var t Translation
	var famArray [2]family // a ClusterIP of each family at most: no allocation
	fams := famArray[:0]
	for _, vip := range vips {
		fams = append(fams, family{vip: vip})
		f := &fams[len(fams)-1]
		of := func(es *Slice) bool {
			nn, ok := es.ServiceName()
			return ok && nn.Namespace == svc.Namespace && nn.Name == svc.Name && es.AddressType == addressTypeOf(vip)
		}
		all := true
		for _, es := range eps {
			if !of(es) {
				all = false
				continue
			}
			if err := es.Invalid; err != nil {
				return Translation{}, fmt.Errorf("service %q: %w", objName(svc.Namespace, svc.Name), err)
			}
			t.Warnings = zeroPortWarnings(t.Warnings, es)
		}
		if all {
			f.slices = eps // nearly always: every slice of the Service is of its one family
		} else {
			for _, es := range eps {
				if of(es) {
					f.slices = append(f.slices, es)
				}
			}
		}
		if !slices.IsSortedFunc(f.slices, compareSliceNames) {
			// The tracker's slices are sorted by name: a caller's in
			// another order are translated as if they were, so that
			// which listing of an address twice listed wins
			// (endpointsFor) does not depend on the order.
			f.slices = slices.SortedStableFunc(slices.Values(f.slices), compareSliceNames)
		}
		f.ext = externalOf(svc, f.slices, node, vip.Is6())
		f.ext.noExternalIPs = opts.NoExternalIPs
		t.NodeFacts |= f.ext.facts
		for _, w := range f.ext.warnings {
			// A source range that does not parse is each family's.
			if !slices.Contains(t.Warnings, w) {
				t.Warnings = append(t.Warnings, w)
			}
		}
	}
	// Sized for the ClusterIP frontends (north-south ones grow it).
	t.Services = make([]*model.Service, 0, len(svc.Ports)*len(fams))
	var scratch *[]endpoint // taken when a port needs it (not categorizeSorted's)
	defer func() {
		if scratch != nil {
			putEndpointScratch(scratch)
		}
	}()
	for i, sp := range svc.Ports {
		proto, err := protocolOf(sp.Protocol)
		if err != nil {
			// SCTP, the one protocol validation lets through that the
			// datapath cannot serve: the port is left out.
			t.Warnings = append(t.Warnings, fmt.Sprintf("%s: protocol %s is not supported; the port is not served", svc.portName(i), sp.Protocol))
			continue
		}
		for _, f := range fams {
			pol := policyOf(svc, sp, f.ext)
			kproto := cmp.Or(sp.Protocol, corev1.ProtocolTCP)
			cat, ok := categorizeSorted(f.slices, sp.Name, kproto, proto, pol, node.Name)
			var es []endpoint // the port's endpoints, if made
			if !ok {
				if scratch == nil {
					scratch = endpointScratch.Get().(*[]endpoint)
				}
				es = endpointsFor((*scratch)[:0], sp.Name, kproto, proto, f.slices, node.Name)
				*scratch = es[:0]
				cat = categorize(es, pol, node.Name, node.Labels[corev1.LabelTopologyZone])
				if byName, byZone := hintsRead(es); pol.usesCluster() && (byName || byZone) {
					// The hints are matched against this node's name and zone.
					t.NodeFacts |= NodeName | NodeLabels
				}
			}
			if pol.usesLocal() {
				t.NodeFacts |= NodeName
			}

			// ClusterIP traffic gets internalTrafficPolicy's endpoints.
			// With none here but some elsewhere (Local), it is dropped;
			// with none at all, rejected.
			internal := cat.cluster
			if pol.internalLocal {
				internal = cat.local
			}
			first := len(t.Services)
			t.Services = append(t.Services, &model.Service{
				Name:          model.ServicePortName{Namespace: svc.Namespace, Name: svc.Name, Port: sp.Name},
				Kind:          model.ClusterIP,
				Frontend:      model.L4Addr{Addr: f.vip, Port: uint16(sp.Port), Proto: proto},
				Backends:      internal,
				DropWhenEmpty: cat.hasAny && len(internal) == 0,
				// The health check port rides on the ClusterIP
				// frontend too (the health server alone reads it;
				// ExternalLocal stays false: ClusterIP traffic keeps
				// internalTrafficPolicy's endpoints): kube-proxy
				// serves it for every Service port with a ClusterIP
				// of the family, whether or not the Service has a
				// NodePort, externalIP or VIP-mode ingress IP
				// (allocateLoadBalancerNodePorts false with a
				// hostname, Proxy-mode or unpublished ingress).
				HealthCheckNodePort: f.ext.hc,
				LocalReady:          f.ext.localReady,

				AffinityTimeout: affinity,
			})
			ns := northSouth(svc, sp, proto, cat, f.ext)
			for _, s := range ns {
				s.AffinityTimeout = affinity
			}
			t.Services = append(t.Services, ns...)
			if proto == model.UDP {
				// The endpoints, unless made above (the scratch
				// holds them still): UDP ports only, whose flows a
				// flush ends (setStandby).
				if ok {
					if scratch == nil {
						scratch = endpointScratch.Get().(*[]endpoint)
					}
					es = endpointsFor((*scratch)[:0], sp.Name, kproto, proto, f.slices, node.Name)
					*scratch = es[:0]
				}
				setStandby(t.Services[first:], es)
			}
		}
	}
	if len(t.Services) == 0 {
		t.Services = nil // none, as before the array was sized above
	}
	slices.SortFunc(t.Services, func(a, b *model.Service) int {
		if c := a.Frontend.Compare(b.Frontend); c != 0 {
			return c
		}
		if c := claimRank[a.Kind] - claimRank[b.Kind]; c != 0 {
			return c
		}
		// Two ports of one kind at one frontend: ValidateService
		// refuses the Services that have them (two ports with one
		// nodePort and protocol, or one port and protocol), but a
		// Translation does not rest on that: the first port by name,
		// not the sort's whim.
		return cmp.Compare(a.Name.Port, b.Name.Port)
	})
	// One frontend per address, port and protocol: the first of those
	// the Service names twice, by claimRank, then port name.
	t.Services = slices.CompactFunc(t.Services, func(a, b *model.Service) bool { return a.Frontend == b.Frontend })
	return t, nil
}

// zeroPortWarnings appends to w a warning for each port of es numbered 0,
// which is not served (SlicePort.served), naming the slice and the port.
func zeroPortWarnings(w []string, es *Slice) []string {
	for i := range es.Ports {
		if p := &es.Ports[i]; p.HasPort && p.Port == 0 {
			w = append(w, fmt.Sprintf("endpointslice %q: %s: port 0 is not valid; the port is not served", objName(es.Namespace, es.Name), portID(p.Name, i)))
		}
	}
	return w
}

func compareSliceNames(a, b *Slice) int { return cmp.Compare(a.Name, b.Name) }

// endpointScratch holds arrays for endpointsFor's endpoints, which live
// for one Service port's translation only (its backends are copied out of
// them): a first sync of 30,000 Services would otherwise make 30,000 of
// them, a kilobyte each, as garbage.
var endpointScratch = sync.Pool{New: func() any { return new([]endpoint) }}

// maxScratchEndpoints is the largest array endpointScratch keeps.
const maxScratchEndpoints = 4096

// putEndpointScratch returns an array to endpointScratch, cleared (it
// must not keep node names and hints alive), unless it is too large.
func putEndpointScratch(s *[]endpoint) {
	if cap(*s) > maxScratchEndpoints {
		return
	}
	clear((*s)[:cap(*s)])
	*s = (*s)[:0]
	endpointScratch.Put(s)
}

// clusterIPs returns the Service's ClusterIPs, at most one per family
// (ValidateService has checked that): clusterIPs, or clusterIP when a
// manifest gives only that. kube-proxy's GetClusterIPByFamily picks the
// same address for each family's proxier.
func clusterIPs(svc *corev1.Service) []netip.Addr { return appendClusterIPs(nil, svc) }

// appendClusterIPs is clusterIPs appended to out (nil for none).
func appendClusterIPs(out []netip.Addr, svc *corev1.Service) []netip.Addr {
	if svc.Spec.ClusterIP != "" && len(svc.Spec.ClusterIPs) == 0 {
		if ip, ok := parseIPSloppy(svc.Spec.ClusterIP); ok {
			out = append(out, ip)
		}
	}
	for _, s := range svc.Spec.ClusterIPs {
		if ip, ok := parseIPSloppy(s); ok {
			out = append(out, ip)
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// addressTypeOf returns the EndpointSlice addressType of ip's family.
func addressTypeOf(ip netip.Addr) discoveryv1.AddressType {
	if ip.Is6() {
		return discoveryv1.AddressTypeIPv6
	}
	return discoveryv1.AddressTypeIPv4
}

// familyName names ip's family in messages.
func familyName(v6 bool) string {
	if v6 {
		return "IPv6"
	}
	return "IPv4"
}

// DefaultAffinityTimeout is the sessionAffinity ClientIP timeout of a
// Service that does not say (corev1.DefaultClientIPServiceAffinitySeconds:
// the API server writes it into sessionAffinityConfig, a manifest need
// not).
const DefaultAffinityTimeout = time.Duration(corev1.DefaultClientIPServiceAffinitySeconds) * time.Second

// maxAffinitySeconds is the longest timeoutSeconds the API server accepts
// (MaxClientIPServiceAffinitySeconds of its internal API, a day).
const maxAffinitySeconds = 86400

// affinityTimeout returns the Service's session affinity timeout, or 0
// for none (sessionAffinity None or empty). ValidateService has checked
// the values. kube-proxy's affinity applies to every frontend of every
// port of the Service (nftables proxier: one affinity set per endpoint of
// each Service port, ClusterIP, NodePort, ExternalIPs and LoadBalancer
// IPs alike).
func affinityTimeout(svc *corev1.Service) time.Duration {
	if svc.Spec.SessionAffinity != corev1.ServiceAffinityClientIP {
		return 0
	}
	if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
		return time.Duration(*c.ClientIP.TimeoutSeconds) * time.Second
	}
	return DefaultAffinityTimeout
}

// object is a Service or an EndpointSlice, as the validators get it (the
// part of metav1.Object they read).
type object[T any] interface {
	*T
	GetNamespace() string
	GetName() string
}

// checkMeta checks what both kinds are keyed by (a namespaced object with
// a name) and returns the maker of the kind's errors, which name the
// object after prefix: `service "ns/name": ...`.
func checkMeta[T any, P object[T]](kind, prefix string, obj P) (failer, error) {
	if obj == nil {
		return failer{}, errors.New("nil " + kind)
	}
	f := failer{prefix: prefix, ns: obj.GetNamespace(), name: obj.GetName()}
	if f.name == "" {
		return f, f.fail("metadata.name is empty")
	}
	if f.ns == "" {
		return f, f.fail("metadata.namespace is empty")
	}
	return f, nil
}

// failer makes the errors of one object's validation. It is a value, and
// names the object only when it fails: validating a valid object (every
// Service and slice of a first list) allocates nothing for its errors.
type failer struct{ prefix, ns, name string }

func (f failer) fail(format string, a ...any) error {
	return fmt.Errorf("%s %q: %s", f.prefix, objName(f.ns, f.name), fmt.Sprintf(format, a...))
}

// portID names port i, called name, in a validation's messages.
func portID(name string, i int) string {
	if name == "" {
		return "ports[" + strconv.Itoa(i) + "]"
	}
	return "port " + strconv.Quote(name)
}

// smallSet is how many entries a validation compares by a linear scan
// instead of a map (a Service's ports, a slice's port names): nearly all
// objects have fewer, and a scan of them costs less than hashing.
const smallSet = 16

// seenBefore reports whether an element of s before i has the key of
// s[i]; m holds the keys of those before once len(s) > smallSet (the
// caller makes it then, and adds each key after asking).
func seenBefore[E any, K comparable](s []E, i int, key func(*E) K, m map[K]bool) bool {
	k := key(&s[i])
	if m != nil {
		return m[k]
	}
	for j := range i {
		if key(&s[j]) == k {
			return true
		}
	}
	return false
}

// firstWith returns the index of the first element of s whose key is k
// (-1 if none): the other port a validation error names.
func firstWith[E any, K comparable](s []E, key func(*E) K, k K) int {
	for j := range s {
		if key(&s[j]) == k {
			return j
		}
	}
	return -1
}

// ValidateService checks the fields Sluice relies on. Errors name the
// object and, where it applies, the port.
func ValidateService(svc *corev1.Service) error {
	f, err := checkMeta("Service", "service", svc)
	if err != nil {
		return err
	}
	fail := f.fail
	switch svc.Spec.Type {
	case "", corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer, corev1.ServiceTypeExternalName:
	default:
		return fail("unknown type %q", svc.Spec.Type)
	}
	if ip := svc.Spec.ClusterIP; ip != "" && ip != corev1.ClusterIPNone {
		if _, ok := parseIPSloppy(ip); !ok {
			return fail("invalid clusterIP %q", ip)
		}
	}
	var families [2]bool // a clusterIPs entry of each family: IPv4, IPv6
	for i, ip := range svc.Spec.ClusterIPs {
		if ip == corev1.ClusterIPNone {
			continue
		}
		a, ok := parseIPSloppy(ip)
		if !ok {
			return fail("invalid clusterIPs entry %q", ip)
		}
		v6 := a.Is6()
		fam := &families[b2i(v6)]
		if *fam {
			return fail("clusterIPs %q: more than one %s address", svc.Spec.ClusterIPs, familyName(v6))
		}
		*fam = true
		// ipFamilies[i] is clusterIPs[i]'s family: kube-proxy finds a
		// family's ClusterIP by it.
		if i < len(svc.Spec.IPFamilies) && string(svc.Spec.IPFamilies[i]) != familyName(v6) {
			return fail("ipFamilies[%d] is %s, but clusterIPs[%d] %q is %s", i, svc.Spec.IPFamilies[i], i, ip, familyName(v6))
		}
	}
	if len(svc.Spec.ClusterIPs) > 0 && svc.Spec.ClusterIP != "" && svc.Spec.ClusterIPs[0] != svc.Spec.ClusterIP {
		return fail("clusterIP %q is not clusterIPs[0] %q", svc.Spec.ClusterIP, svc.Spec.ClusterIPs[0])
	}
	for _, ip := range svc.Spec.ExternalIPs {
		if _, ok := parseIPSloppy(ip); !ok {
			return fail("invalid externalIPs entry %q", ip)
		}
	}
	switch svc.Spec.SessionAffinity {
	case "", corev1.ServiceAffinityNone:
		// A sessionAffinityConfig beside None (which the API server
		// refuses) asks for nothing: ignored.
	case corev1.ServiceAffinityClientIP:
		if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			if ts := *c.ClientIP.TimeoutSeconds; ts <= 0 || ts > maxAffinitySeconds {
				return fail("sessionAffinityConfig.clientIP.timeoutSeconds %d: want 1 to %d", ts, maxAffinitySeconds)
			}
		}
	default:
		return fail("unknown sessionAffinity %q: want %s or %s", svc.Spec.SessionAffinity, corev1.ServiceAffinityClientIP, corev1.ServiceAffinityNone)
	}
	type pp struct {
		port  int32
		proto corev1.Protocol
	}
	ports := svc.Spec.Ports
	portName := func(sp *corev1.ServicePort) string { return sp.Name }
	portProto := func(sp *corev1.ServicePort) pp { return pp{sp.Port, cmp.Or(sp.Protocol, corev1.ProtocolTCP)} }
	// The API server refuses a Service whose ports repeat a nodePort and
	// protocol (validation.go, ValidateService: "Check for duplicate
	// NodePorts"), whatever its type: two would be one frontend at each
	// node address, and which port's endpoints it reached would be
	// arbitrary. A manifest can hold one: refused as the API server does.
	portNodePort := func(sp *corev1.ServicePort) pp { return pp{sp.NodePort, cmp.Or(sp.Protocol, corev1.ProtocolTCP)} }
	var names map[string]bool
	var seen, nodePorts map[pp]bool
	if len(ports) > smallSet {
		names, seen, nodePorts = make(map[string]bool, len(ports)), make(map[pp]bool, len(ports)), make(map[pp]bool, len(ports))
	}
	for i := range ports {
		sp := &ports[i]
		if sp.Name == "" && len(ports) > 1 {
			return fail("%s: name is required when a Service has several ports", portID(sp.Name, i))
		}
		if seenBefore(ports, i, portName, names) {
			return fail("%s: duplicate port name", portID(sp.Name, i))
		}
		if names != nil {
			names[sp.Name] = true
		}
		// SCTP is valid: ServiceToModel leaves the port out and says so.
		if _, err := protocolOf(sp.Protocol); err != nil && sp.Protocol != corev1.ProtocolSCTP {
			return fail("%s: %v", portID(sp.Name, i), err)
		}
		if sp.Port < 1 || sp.Port > 65535 {
			return fail("%s: port %d out of range", portID(sp.Name, i), sp.Port)
		}
		if seenBefore(ports, i, portProto, seen) {
			j := firstWith(ports, portProto, portProto(sp))
			return fail("%s: duplicate port %d/%s: %s has it too", portID(sp.Name, i), sp.Port, portProto(sp).proto, portID(ports[j].Name, j))
		}
		if seen != nil {
			seen[portProto(sp)] = true
		}
		if sp.NodePort < 0 || sp.NodePort > 65535 {
			return fail("%s: nodePort %d out of range", portID(sp.Name, i), sp.NodePort)
		}
		if sp.NodePort != 0 {
			if seenBefore(ports, i, portNodePort, nodePorts) {
				j := firstWith(ports, portNodePort, portNodePort(sp))
				return fail("%s: duplicate nodePort %d/%s: %s has it too", portID(sp.Name, i), sp.NodePort, portNodePort(sp).proto, portID(ports[j].Name, j))
			}
			if nodePorts != nil {
				nodePorts[portNodePort(sp)] = true
			}
		}
		if sp.TargetPort.Type == 0 && sp.TargetPort.IntVal != 0 && (sp.TargetPort.IntVal < 1 || sp.TargetPort.IntVal > 65535) {
			return fail("%s: targetPort %d out of range", portID(sp.Name, i), sp.TargetPort.IntVal)
		}
	}
	return nil
}

// ValidateEndpointSlice checks the fields Sluice relies on. Errors name the
// object and, where it applies, the port or endpoint.
func ValidateEndpointSlice(es *discoveryv1.EndpointSlice) error {
	return validateEndpointSlice(es, nil)
}

// validateEndpointSlice is ValidateEndpointSlice, telling first (if not
// nil) the first address of endpoint i as it parsed it (an IPv4 or IPv6
// slice's, up to the first error), so that MakeSlice parses it once.
func validateEndpointSlice(es *discoveryv1.EndpointSlice, first func(i int, ip netip.Addr)) error {
	f, err := checkMeta("EndpointSlice", "endpointslice", es)
	if err != nil {
		return err
	}
	fail := f.fail
	if v, ok := es.Labels[discoveryv1.LabelServiceName]; ok && v == "" {
		return fail("label %s is empty", discoveryv1.LabelServiceName)
	}
	switch es.AddressType {
	case discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6, discoveryv1.AddressTypeFQDN:
	default:
		return fail("unknown addressType %q", es.AddressType)
	}
	eports := es.Ports
	epName := func(p *discoveryv1.EndpointPort) string { return ptrOr(p.Name, "") }
	var names map[string]bool
	if len(eports) > smallSet {
		names = make(map[string]bool, len(eports))
	}
	for i := range eports {
		p := &eports[i]
		n := epName(p)
		if seenBefore(eports, i, epName, names) {
			return fail("%s: duplicate port name", portID(n, i))
		}
		if names != nil {
			names[n] = true
		}
		if p.Protocol != nil {
			if _, err := protocolOf(*p.Protocol); err != nil && *p.Protocol != corev1.ProtocolSCTP {
				return fail("%s: %v", portID(n, i), err)
			}
		}
		// 0 is valid: a translation leaves the port out and says so
		// (zeroPortWarnings), as kube-proxy ignores it. A port kube-proxy
		// cannot program (its nftables transaction fails on it, and with
		// it the whole sync) fails the Service's translation.
		if p.Port != nil && (*p.Port < 0 || *p.Port > 65535) {
			return fail("%s: port %d out of range", portID(n, i), *p.Port)
		}
	}
	for i, e := range es.Endpoints {
		if len(e.Addresses) == 0 {
			return fail("endpoints[%d]: no addresses", i)
		}
		for j, a := range e.Addresses {
			switch es.AddressType {
			case discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6:
				ip, ok := parseIPSloppy(a)
				if !ok || ip.Is6() != (es.AddressType == discoveryv1.AddressTypeIPv6) {
					return fail("endpoints[%d]: invalid %s address %q", i, es.AddressType, a)
				}
				if j == 0 && first != nil {
					first(i, ip)
				}
			}
		}
	}
	return nil
}

// EndpointAddress parses a, an address of an endpoint of a slice of type
// t (IPv4 or IPv6), as ValidateEndpointSlice and a translation read it
// (kube-proxy's parseIPSloppy), and says whether it is valid there.
// parseIPSloppy makes an IPv4-mapped address IPv4: valid in an IPv4
// slice, not in an IPv6 one. An address the API server refuses for a
// new endpoint (EndpointIPRefusal) is valid here, as kube-proxy takes
// it: the manifest source refuses it itself (CheckEndpointIPs). a is not
// kept.
func EndpointAddress(t discoveryv1.AddressType, a string) (netip.Addr, bool) {
	ip, ok := parseIPSloppy(a)
	return ip, ok && ip.Is6() == (t == discoveryv1.AddressTypeIPv6)
}

// CheckEndpointIPs refuses an IPv4 or IPv6 slice an address of which the
// API server refuses for an endpoint (EndpointIPRefusal), naming the
// slice, the endpoint, the address and why; es is valid otherwise
// (ValidateEndpointSlice). For the manifest source only: the API server
// keeps such an address in a slice stored before it checked them,
// through every update that leaves its endpoints alone
// (ValidateEndpointSliceUpdate), and kube-proxy programs it, so the
// Kubernetes source does too.
func CheckEndpointIPs(es *discoveryv1.EndpointSlice) error {
	if es.AddressType != discoveryv1.AddressTypeIPv4 && es.AddressType != discoveryv1.AddressTypeIPv6 {
		return nil
	}
	for i, e := range es.Endpoints {
		for _, a := range e.Addresses {
			ip, ok := parseIPSloppy(a)
			if !ok {
				continue
			}
			if why := EndpointIPRefusal(ip, a); why != "" {
				return failer{prefix: "endpointslice", ns: es.Namespace, name: es.Name}.fail("endpoints[%d]: address %q %s", i, a, why)
			}
		}
	}
	return nil
}

// CheckExternalIPs refuses a Service an externalIPs entry of which the
// API server refuses for a new Service, naming the Service, the entry's
// index, the address and why; svc is valid otherwise (ValidateService).
// ValidateService there checks that every entry parses (one the Service
// already had is exempt) and then, "for historical reasons", applies the
// endpoint address rule to it
// (ValidateEndpointIP, so EndpointIPRefusal: unspecified, loopback,
// link-local, link-local multicast). A manifest could name 127.0.0.1 or
// 169.254.169.254, and the node's connections there would reach the
// Service's endpoints. For the manifest source only: a Service stored
// before the API server checked them keeps such an entry for as long as
// its spec or metadata is never updated (a status-only update,
// ValidateServiceStatusUpdate, does not check the spec again;
// ValidateService's existingExternalIPs exempts an existing entry from
// the format check, IsValidIPForLegacyField, only; ValidateEndpointIP
// runs on every entry on create and update alike), and kube-proxy
// serves it, so the Kubernetes source does too.
func CheckExternalIPs(svc *corev1.Service) error {
	for i, a := range svc.Spec.ExternalIPs {
		ip, ok := parseIPSloppy(a)
		if !ok {
			continue // ValidateService's to refuse
		}
		if why := EndpointIPRefusal(ip, a); why != "" {
			return failer{prefix: "service", ns: svc.Namespace, name: svc.Name}.fail("externalIPs[%d]: address %q %s", i, a, why)
		}
	}
	return nil
}

// EndpointIPRefusal says why the API server refuses ip (written is the
// address as the object writes it) as an endpoint's address, in its
// words ("": it does not), for a source that parses addresses its own
// way: its ValidateEndpointIP (pkg/apis/core/validation), which
// EndpointSlice validation applies to every address of an IPv4 or IPv6
// slice it creates or whose endpoints an update changes
// (CheckEndpointIPs). A manifest could name 127.0.0.1 or the cloud
// metadata address 169.254.169.254, which the node's sockets would then
// be sent to. An IPv4-mapped address is judged as the IPv4 one, as
// net.IP's methods judge it there. Only the words for an unspecified
// address quote it, as written, as the API server's do (it formats its
// string): an acceptance, and any other refusal, allocate nothing.
func EndpointIPRefusal(ip netip.Addr, written string) string {
	ip = ip.Unmap()
	switch {
	case ip.IsUnspecified():
		return "may not be unspecified (" + written + ")"
	case ip.IsLoopback():
		return "may not be in the loopback range (127.0.0.0/8, ::1/128)"
	case ip.IsLinkLocalUnicast():
		return "may not be in the link-local range (169.254.0.0/16, fe80::/10)"
	case ip.IsLinkLocalMulticast():
		return "may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)"
	}
	return ""
}

// protocolOf maps a Kubernetes protocol to the datapath's; empty means TCP,
// as the API defaults it.
func protocolOf(p corev1.Protocol) (model.Protocol, error) {
	switch p {
	case "", corev1.ProtocolTCP:
		return model.TCP, nil
	case corev1.ProtocolUDP:
		return model.UDP, nil
	case corev1.ProtocolSCTP:
		return 0, errors.New("protocol SCTP is not supported")
	}
	return 0, fmt.Errorf("unknown protocol %q", p)
}

func objName(ns, name string) string {
	if ns == "" {
		return name
	}
	return ns + "/" + name
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func ptrOr[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}
