package translate

import (
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Slice is an EndpointSlice as a translation reads it, and nothing else: a
// source that keeps every slice (pkg/source/kube's informers) keeps these
// instead of the API objects, which cost about three times as much (the
// API's Endpoint is 96 bytes and its address a string in an array of its
// own; its labels a map). SliceOf makes one; Translate
// translates with them exactly as ServiceToModel does with the objects
// they were made from.
//
// What a translation reads of an endpoint is its first address (the API
// says the others are fungible copies), its conditions as kube-proxy
// defaults them, its node's name and its hints; what it reads of the slice
// is whether it is valid, which ValidateEndpointSlice says once, when the
// Slice is made. A Slice is never modified once made.
type Slice struct {
	Namespace, Name, ResourceVersion string
	// Service is its kubernetes.io/service-name label ("": none, or
	// empty: the slice belongs to no Service).
	Service     string
	AddressType discoveryv1.AddressType
	Ports       []SlicePort
	Endpoints   []SliceEndpoint
	// Invalid is what ValidateEndpointSlice said of the slice (nil:
	// valid). A translation of its Service fails with it.
	Invalid error
}

// SlicePort is an EndpointSlice port as a translation reads it: its name
// ("" for none), protocol (TCP for none) and port (HasPort false for none:
// the port is not served).
type SlicePort struct {
	Name     string
	Protocol corev1.Protocol
	Port     int32
	HasPort  bool
}

// SliceEndpoint is an endpoint as a translation reads it.
type SliceEndpoint struct {
	// Addr is its first address as kube-proxy reads it (parseIPSloppy);
	// the zero Addr if it has none or it does not parse (the endpoint is
	// not served).
	Addr netip.Addr
	// NodeName is the API's (nil: none), shared with the object, or
	// between endpoints by a source that shares them.
	NodeName *string
	Hints    *discoveryv1.EndpointHints
	// The conditions, defaulted as kube-proxy reads them: ready and
	// serving if unknown, not terminating if unknown.
	Ready, Serving, Terminating bool
}

// SliceOf returns what a translation reads of es (nil for nil). It shares
// the node names and hints of es, not its arrays.
func SliceOf(es *discoveryv1.EndpointSlice) *Slice {
	if es == nil {
		return nil
	}
	s := MakeSlice(es)
	return &s
}

// MakeSlice is SliceOf for a source that embeds the Slice in a type of its
// own; es is not nil.
func MakeSlice(es *discoveryv1.EndpointSlice) Slice {
	var s Slice
	ReadSlice(&s, es)
	return s
}

// ReadSlice is MakeSlice into *s, reusing the arrays of s: for a source
// that reads the object again at each translation and drops what it read
// once translated (pkg/source/tracker's objects from SetSlice), so that a
// first sync of 30,000 slices makes no garbage of them. Nothing of what s
// held before is read or kept.
func ReadSlice(s *Slice, es *discoveryv1.EndpointSlice) {
	eps, ports := s.Endpoints[:0], s.Ports[:0]
	*s = Slice{Namespace: es.Namespace, Name: es.Name, ResourceVersion: es.ResourceVersion,
		Service: es.Labels[discoveryv1.LabelServiceName], AddressType: constant(es.AddressType, addressTypes)}
	if n := len(es.Endpoints); n > 0 {
		s.Endpoints = slices.Grow(eps, n)[:n]
		clear(s.Endpoints)
	}
	// Validation parses the addresses: it gives the first ones of the
	// endpoints 0 to given-1 (all of them, in a valid IPv4 or IPv6
	// slice); the others are parsed below.
	given := 0
	s.Invalid = validateEndpointSlice(es, func(i int, ip netip.Addr) {
		s.Endpoints[i].Addr = ip
		given = i + 1
	})
	if n := len(es.Ports); n > 0 {
		s.Ports = slices.Grow(ports, n)[:n]
		for i, p := range es.Ports {
			s.Ports[i] = SlicePort{Name: ptrOr(p.Name, ""), Protocol: constant(ptrOr(p.Protocol, corev1.ProtocolTCP), protocols),
				HasPort: p.Port != nil}
			if p.Port != nil {
				s.Ports[i].Port = *p.Port
			}
		}
	}
	for i := range es.Endpoints {
		e := &es.Endpoints[i]
		out := &s.Endpoints[i]
		if i >= given && len(e.Addresses) > 0 {
			out.Addr, _ = parseIPSloppy(e.Addresses[0])
		}
		out.NodeName, out.Hints = e.NodeName, e.Hints
		c := &e.Conditions
		out.Ready, out.Serving, out.Terminating = ptrOr(c.Ready, true), ptrOr(c.Serving, true), ptrOr(c.Terminating, false)
	}
}

var (
	addressTypes = []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6, discoveryv1.AddressTypeFQDN}
	protocols    = []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP}
)

// constant returns the one of consts that equals v, else v: a decoded
// object's "TCP" is a string of its own, the constant's is shared.
func constant[T ~string](v T, consts []T) T {
	for _, c := range consts {
		if c == v {
			return c
		}
	}
	return v
}

// SlicesOf returns SliceOf of each of eps.
func SlicesOf(eps []*discoveryv1.EndpointSlice) []*Slice {
	out := make([]*Slice, len(eps))
	for i, es := range eps {
		out[i] = SliceOf(es)
	}
	return out
}

// ServiceName returns the Service s belongs to, as ServiceNameOfSlice
// says of the object it was made from.
func (s *Slice) ServiceName() (types.NamespacedName, bool) {
	if s == nil || s.Service == "" {
		return types.NamespacedName{}, false
	}
	return types.NamespacedName{Namespace: s.Namespace, Name: s.Service}, true
}

func (e *SliceEndpoint) nodeName() string { return ptrOr(e.NodeName, "") }
