package manifest

// What the loader keeps of a decoded object.
//
// The loader keeps every object in effect for the agent's life (to feed
// the tracker what changed, to keep an object's last good version, and
// by content, so that unchanged bytes are not decoded again). It used to
// keep the API objects: at 30,000 Services and their slices of 10
// endpoints (issue 14), 88 MiB of the agent's 174 MiB of live heap, a
// discoveryv1.Endpoint alone 96 bytes and its address a string in an
// array of its own. It keeps what a translation reads of them instead
// (translate.Service and translate.Slice, which the tracker takes as the
// Kubernetes source hands them over), made once when the object is
// decoded and validated: the API object is garbage as soon as it is
// read.
//
// The fast decoder (decode.go) allocates the strings of the objects it
// decodes from chunks shared by many objects, and translate.MakeService
// and MakeSlice share the object's strings: a compact form that kept one
// such string would keep its whole chunk, and the chunk every object
// decoded beside it. So every string the compact forms keep is a copy
// (the names) or shared through compacter (what repeats between objects:
// namespaces, port names, node names, zone names), never the decoded
// object's (TestCompactKeepsNoDecodedBytes). The loader's decoder goes
// further (fastDecoder.reuse): it decodes every object into the same
// object, maps, arrays and chunks, so a compact form that kept any of
// them would change as the next objects are decoded
// (TestReusedDecoderKeepsEachObject). A valid object's type,
// protocols and address type are already translate's constants (its
// validation rejects any other), and an invalid object's compact form is
// not kept.

import (
	"net/netip"
	"strings"
	"sync"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// maxCompactShared bounds compacter.shared: past it, the strings seen
// are forgotten (objects keep theirs) and sharing starts over, so that
// the node names of a cluster whose nodes come and go do not pile up.
const maxCompactShared = 4096

// compacter makes the compact forms of decoded objects, sharing the
// strings that repeat between them. Safe for concurrent use: the loader
// parses files in parallel.
type compacter struct {
	mu sync.Mutex
	// shared holds one copy of each string seen (and a pointer to it,
	// for the endpoints' node names, which the translation reads as
	// *string).
	shared map[string]*string
}

// share returns the shared copy of s.
func (c *compacter) share(s string) *string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p, ok := c.shared[s]; ok {
		return p
	}
	if c.shared == nil || len(c.shared) >= maxCompactShared {
		c.shared = make(map[string]*string)
	}
	p := new(string)
	*p = strings.Clone(s)
	c.shared[*p] = p
	return p
}

// shareValue is share for a string kept by value.
func (c *compacter) shareValue(s string) string {
	if s == "" {
		return ""
	}
	return *c.share(s)
}

// sharePtr is share for a *string (nil: nil).
func (c *compacter) sharePtr(p *string) *string {
	if p == nil {
		return nil
	}
	return c.share(*p)
}

// service returns what the loader keeps of svc, in namespace key's (as
// decodeAs sets it): what a translation reads of it, none of its strings
// shared with svc; its names are key's (the loader's copies). It and its
// ClusterIPs and Ports are carved from a's chunks (nil: allocated apart).
func (c *compacter) service(svc *corev1.Service, key types.NamespacedName, a *compactArena) *translate.Service {
	var s *translate.Service
	if a == nil {
		s = translate.ServiceOf(svc)
	} else {
		s = a.service(svc)
	}
	s.Namespace, s.Name = key.Namespace, keyName(s.Name, key)
	s.ResourceVersion = strings.Clone(s.ResourceVersion)
	s.ProxyName = c.sharePtr(s.ProxyName)
	for i := range s.Ports {
		p := &s.Ports[i]
		p.Name = c.shareValue(p.Name)
	}
	if x := s.External; x != nil && x.SourceRanges != nil {
		ranges := make([]string, len(x.SourceRanges))
		for i, r := range x.SourceRanges {
			ranges[i] = strings.Clone(r)
		}
		e := *x // s.External is s's own
		e.SourceRanges = ranges
		s.External = &e
	}
	return s
}

// slice is service for an EndpointSlice; its endpoints are pre's if
// the decoder packed them (pre.packed), else es's. It and its Ports are
// carved from a (nil: allocated apart); its endpoints are not.
func (c *compacter) slice(es *discoveryv1.EndpointSlice, key types.NamespacedName, pre fastObject, a *compactArena) *translate.Slice {
	var s *translate.Slice
	if a == nil {
		s = new(translate.Slice)
	} else {
		// ReadSlice uses the room of Ports it is given.
		s = &a.slices.carve(1)[0]
		s.Ports = a.slicePorts.carve(len(es.Ports))[:0]
	}
	if pre.packed {
		translate.ReadPackedSlice(s, es, pre.eps)
	} else {
		translate.ReadSlice(s, es)
	}
	s.Namespace, s.Name = key.Namespace, keyName(s.Name, key)
	s.ResourceVersion, s.Service = strings.Clone(s.ResourceVersion), strings.Clone(s.Service)
	for i := range s.Ports {
		p := &s.Ports[i]
		p.Name = c.shareValue(p.Name)
	}
	s.Endpoints.Share(c.sharePtr, c.hints)
	return s
}

// keyName returns key's name if it is name (it is: the loader reads the
// key from the same bytes), else a copy of name.
func keyName(name string, key types.NamespacedName) string {
	if name == key.Name {
		return key.Name
	}
	return strings.Clone(name)
}

// hints returns a copy of h, its names shared.
func (c *compacter) hints(h *discoveryv1.EndpointHints) *discoveryv1.EndpointHints {
	out := &discoveryv1.EndpointHints{}
	if h.ForZones != nil {
		out.ForZones = make([]discoveryv1.ForZone, len(h.ForZones))
		for i, z := range h.ForZones {
			out.ForZones[i].Name = c.shareValue(z.Name)
		}
	}
	if h.ForNodes != nil {
		out.ForNodes = make([]discoveryv1.ForNode, len(h.ForNodes))
		for i, n := range h.ForNodes {
			out.ForNodes[i].Name = c.shareValue(n.Name)
		}
	}
	return out
}

// compactArena carves the compact Services of one parse, and their
// ClusterIPs and Ports, from a few large arrays instead of three
// allocations each, and the compact slices and their Ports likewise
// instead of two (their endpoints are translate's to allocate): at 30,000
// Services and their slices, 150,000 allocations a first load fewer, and
// a translation that reads the objects in file order (a first load's,
// loader.inFileOrder) reads each kind of them contiguously where they
// were apart, among the other objects of their size.
//
// Chunks grow from 8 elements to about 32 KiB, so that a parse decoding
// one changed object carves it from a small chunk. The arena is the
// parse's (docDecoder's) and is dropped with it: what stays is each chunk
// as long as an object carved from it does, the part of the last chunk
// no object took included (at most one chunk of each kind a parse), and
// the room of an object replaced by a later load while another of its
// chunk is kept: at worst (most objects edited since, one in each chunk
// not) what the first load carved, 448 bytes a Service and its slice,
// 13 MB at 30,000.
//
// Every array is carved capacity-limited (s[i:j:j]), and nothing is
// carved twice: an append to one Service's array reallocates it rather
// than writing into its neighbour's, and an object decoded again is
// carved elsewhere, its neighbours untouched
// (TestCompactArenaKeepsObjectsApart). A Service or slice is never
// modified once made (translate.Service, translate.Slice).
type compactArena struct {
	services chunks[translate.Service]
	addrs    chunks[netip.Addr]
	ports    chunks[translate.ServicePort]
	// slices and slicePorts are the EndpointSlices'.
	slices     chunks[translate.Slice]
	slicePorts chunks[translate.SlicePort]
}

// service is translate.ServiceOf, carved from a.
func (a *compactArena) service(svc *corev1.Service) *translate.Service {
	s := &a.services.carve(1)[0]
	sp := &svc.Spec
	// As many as appendClusterIPs may append (ReadService uses the
	// room it is given, and nothing past its capacity).
	nips := len(sp.ClusterIPs)
	if nips == 0 && sp.ClusterIP != "" {
		nips = 1
	}
	s.ClusterIPs, s.Ports = a.addrs.carve(nips)[:0], a.ports.carve(len(sp.Ports))[:0]
	translate.ReadService(s, svc)
	return s
}

// chunks carves arrays of T from chunks it allocates.
type chunks[T any] struct {
	free []T // the rest of the current chunk
	next int // the size of the next chunk
}

// carve returns n zero Ts of their own, capacity n (nil for 0).
func (c *chunks[T]) carve(n int) []T {
	if n == 0 {
		return nil
	}
	if n > len(c.free) {
		var zero T
		size := max(c.next, 8)
		c.next = min(2*size, max(8, (32<<10)/int(unsafe.Sizeof(zero))))
		c.free = make([]T, max(n, size))
	}
	s := c.free[:n:n]
	c.free = c.free[n:]
	return s
}
