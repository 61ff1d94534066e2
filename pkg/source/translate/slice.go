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
	Service string
	// Headless: it is labelled service.kubernetes.io/headless, and
	// belongs to no Service whatever its service-name label says
	// (ServiceName): kube-proxy's EndpointSlices informer lists only
	// slices without that label (cmd/kube-proxy/app/server.go), and
	// never sees the others.
	Headless    bool
	AddressType discoveryv1.AddressType
	Ports       []SlicePort
	Endpoints   SliceEndpoints
	// Invalid is what ValidateEndpointSlice said of the slice (nil:
	// valid). A translation of its Service fails with it.
	Invalid error
}

// SlicePort is an EndpointSlice port as a translation reads it: its name
// ("" for none), protocol (TCP for none) and port (HasPort false for none).
// A port without a number, or numbered 0, is not served (served).
type SlicePort struct {
	Name     string
	Protocol corev1.Protocol
	Port     int32
	HasPort  bool
}

// served says whether the port's endpoints are served on it: not if it
// has no number or its number is 0, which kube-proxy ignores
// (endpointslicecache.go, endpointInfoByServicePort: "Ignoring invalid
// endpoint port"). discovery/v1 does not validate a slice's ports, so the
// API server stores either.
func (p *SlicePort) served() bool { return p.HasPort && p.Port != 0 }

// SliceEndpoint is an endpoint as a translation reads it: what
// SliceEndpoints.At returns (a Slice does not keep its endpoints in this
// form: see SliceEndpoints).
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
	ports := s.Ports[:0]
	eps := s.Endpoints.reuse()
	*s = Slice{Namespace: es.Namespace, Name: es.Name, ResourceVersion: es.ResourceVersion,
		Service: es.Labels[discoveryv1.LabelServiceName], AddressType: constant(es.AddressType, addressTypes)}
	_, s.Headless = es.Labels[corev1.IsHeadlessService]
	eps.start(len(es.Endpoints))
	// Validation parses the addresses: it gives the first ones of the
	// endpoints 0 to given-1 (all of them, in a valid IPv4 or IPv6
	// slice); the others are parsed below.
	given := 0
	s.Invalid = validateEndpointSlice(es, func(i int, ip netip.Addr) {
		eps.setAddr(i, ip)
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
		if i >= given && len(e.Addresses) > 0 {
			ip, _ := parseIPSloppy(e.Addresses[0])
			eps.setAddr(i, ip)
		}
		ready, serving, terminating := EndpointConditions(&e.Conditions)
		eps.setRest(i, e.NodeName, e.Hints, ready, serving, terminating)
	}
	s.Endpoints = eps.done()
}

// EndpointConditions returns an endpoint's conditions defaulted as
// kube-proxy reads them (SliceEndpoint's).
func EndpointConditions(c *discoveryv1.EndpointConditions) (ready, serving, terminating bool) {
	return ptrOr(c.Ready, true), ptrOr(c.Serving, true), ptrOr(c.Terminating, false)
}

// ReadPackedSlice is ReadSlice of es, whose endpoints a source read as
// eps instead of es.Endpoints (which it left empty): each endpoint as At
// would return it, its address parsed by EndpointAddress for es's type,
// every address of it valid, so that ValidateEndpointSlice, which checks
// the endpoints after everything else, would find nothing wrong with
// them. eps is not kept (its node names and hints are, as ReadSlice keeps
// es's).
func ReadPackedSlice(s *Slice, es *discoveryv1.EndpointSlice, eps []SliceEndpoint) {
	ReadSlice(s, es)
	s.Endpoints = MakeSliceEndpoints(eps)
}

// SliceEndpoints are a slice's endpoints, each read as a SliceEndpoint
// (At), kept in 16 bytes where SliceEndpoint takes 48: a source keeps
// every slice of the cluster (300,000 endpoints at 30,000 Services of 10:
// 14 MB as SliceEndpoints, under 5 as these). An endpoint keeps its node
// name's pointer, its conditions as flags and its address if it is IPv4
// (or none); the addresses of a slice with any other (IPv6) are all kept
// as netip.Addrs beside, and so are the hints of a slice with any. The
// zero value has no endpoints. Like a Slice, never modified once made
// (but by Share, before it is handed on).
type SliceEndpoints struct {
	eps  []packedEndpoint
	wide *wideEndpoints // nil: every address IPv4 or none, and no hints
}

// packedEndpoint is an endpoint of a SliceEndpoints: 13 bytes, 16 in an
// array.
type packedEndpoint struct {
	node  *string // SliceEndpoint.NodeName
	v4    [4]byte // the address if flags has epIPv4
	flags endpointFlags
}

type endpointFlags uint8

const (
	epIPv4 endpointFlags = 1 << iota // v4 is the address (unless wideEndpoints.addrs has them all)
	epReady
	epServing
	epTerminating
)

// wideEndpoints is what few slices need: addrs, if not nil, holds the
// address of every endpoint (of a slice with one neither IPv4 nor none);
// hints, if not nil, the hints of every endpoint (of a slice with some).
type wideEndpoints struct {
	addrs []netip.Addr
	hints []*discoveryv1.EndpointHints
}

// Len returns the number of endpoints.
func (e *SliceEndpoints) Len() int { return len(e.eps) }

// At returns endpoint i as a translation reads it.
func (e *SliceEndpoints) At(i int) SliceEndpoint {
	p := &e.eps[i]
	out := SliceEndpoint{NodeName: p.node, Ready: p.flags&epReady != 0, Serving: p.flags&epServing != 0,
		Terminating: p.flags&epTerminating != 0}
	switch w := e.wide; {
	case w != nil && w.addrs != nil:
		out.Addr = w.addrs[i]
	case p.flags&epIPv4 != 0:
		out.Addr = netip.AddrFrom4(p.v4)
	}
	if w := e.wide; w != nil && w.hints != nil {
		out.Hints = w.hints[i]
	}
	return out
}

// MakeSliceEndpoints returns eps as SliceEndpoints.
func MakeSliceEndpoints(eps []SliceEndpoint) SliceEndpoints {
	var b sliceEndpointsBuilder
	b.start(len(eps))
	for i := range eps {
		e := &eps[i]
		b.setAddr(i, e.Addr)
		b.setRest(i, e.NodeName, e.Hints, e.Ready, e.Serving, e.Terminating)
	}
	return b.done()
}

// Share replaces each endpoint's node name by node's answer for it (not
// called for none), and its hints by hints' (not called for none; nil:
// left as they are): for a source that shares them between slices, as it
// makes the Slice, before anything else reads it.
func (e *SliceEndpoints) Share(node func(*string) *string, hints func(*discoveryv1.EndpointHints) *discoveryv1.EndpointHints) {
	for i := range e.eps {
		if p := &e.eps[i]; p.node != nil {
			p.node = node(p.node)
		}
	}
	if w := e.wide; w != nil && hints != nil {
		for i, h := range w.hints {
			if h != nil {
				w.hints[i] = hints(h)
			}
		}
	}
}

// sliceEndpointsBuilder makes a SliceEndpoints, reusing the arrays of one
// no longer read (reuse).
type sliceEndpointsBuilder struct {
	e SliceEndpoints
	// The arrays of the SliceEndpoints reused, length 0.
	eps   []packedEndpoint
	wide  *wideEndpoints
	addrs []netip.Addr
	hints []*discoveryv1.EndpointHints
}

// reuse returns a builder that makes its SliceEndpoints in e's arrays: e
// is not read afterwards.
func (e *SliceEndpoints) reuse() sliceEndpointsBuilder {
	b := sliceEndpointsBuilder{eps: e.eps[:0], wide: e.wide}
	if w := e.wide; w != nil {
		b.addrs, b.hints = w.addrs[:0], w.hints[:0]
	}
	return b
}

// start makes room for n endpoints, all zero.
func (b *sliceEndpointsBuilder) start(n int) {
	b.e = SliceEndpoints{}
	if n > 0 {
		b.e.eps = slices.Grow(b.eps, n)[:n]
		clear(b.e.eps)
	}
}

// wideOf returns b.e.wide, made if nil.
func (b *sliceEndpointsBuilder) wideOf() *wideEndpoints {
	if b.e.wide == nil {
		w := b.wide
		if w == nil {
			w = new(wideEndpoints)
		}
		*w = wideEndpoints{}
		b.e.wide = w
	}
	return b.e.wide
}

// setAddr sets the address of endpoint i (once for each).
func (b *sliceEndpointsBuilder) setAddr(i int, a netip.Addr) {
	p := &b.e.eps[i]
	if a.Is4() {
		p.v4, p.flags = a.As4(), p.flags|epIPv4
	}
	w := b.e.wide
	switch {
	case w != nil && w.addrs != nil:
		w.addrs[i] = a
	case a.IsValid() && !a.Is4():
		// The first that is not IPv4: every address goes into
		// addrs, those set before too.
		w = b.wideOf()
		n := len(b.e.eps)
		w.addrs = slices.Grow(b.addrs, n)[:n]
		clear(w.addrs)
		for j := range b.e.eps {
			if q := &b.e.eps[j]; q.flags&epIPv4 != 0 {
				w.addrs[j] = netip.AddrFrom4(q.v4)
			}
		}
		w.addrs[i] = a
	}
}

// setRest sets the rest of endpoint i.
func (b *sliceEndpointsBuilder) setRest(i int, node *string, hints *discoveryv1.EndpointHints, ready, serving, terminating bool) {
	p := &b.e.eps[i]
	p.node = node
	if ready {
		p.flags |= epReady
	}
	if serving {
		p.flags |= epServing
	}
	if terminating {
		p.flags |= epTerminating
	}
	if hints != nil {
		w := b.wideOf()
		if w.hints == nil {
			n := len(b.e.eps)
			w.hints = slices.Grow(b.hints, n)[:n]
			clear(w.hints)
		}
		w.hints[i] = hints
	}
}

// done returns the SliceEndpoints made.
func (b *sliceEndpointsBuilder) done() SliceEndpoints { return b.e }

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
	if s == nil || s.Service == "" || s.Headless {
		return types.NamespacedName{}, false
	}
	return types.NamespacedName{Namespace: s.Namespace, Name: s.Service}, true
}

func (e *SliceEndpoint) nodeName() string { return ptrOr(e.NodeName, "") }
