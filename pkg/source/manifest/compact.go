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
	"strings"
	"sync"

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
// shared with svc; its names are key's (the loader's copies).
func (c *compacter) service(svc *corev1.Service, key types.NamespacedName) *translate.Service {
	s := translate.ServiceOf(svc)
	// What the API server refuses for a new Service's externalIPs, which
	// a manifest may name: the Service is refused as any invalid one.
	if s.Invalid == nil {
		s.Invalid = translate.CheckExternalIPs(svc)
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
// the decoder packed them (pre.packed), else es's.
func (c *compacter) slice(es *discoveryv1.EndpointSlice, key types.NamespacedName, pre fastObject) *translate.Slice {
	s := new(translate.Slice)
	if pre.packed {
		translate.ReadPackedSlice(s, es, pre.eps)
	} else {
		translate.ReadSlice(s, es)
		// What the API server refuses for an endpoint, which a manifest
		// may name (the decoder packs no such slice).
		if s.Invalid == nil {
			s.Invalid = translate.CheckEndpointIPs(es)
		}
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
