package translate

import (
	"net/netip"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Service is a Service as a translation reads it, and nothing else, as
// Slice is an EndpointSlice: a source that keeps every Service
// (pkg/source/kube's informers) keeps these instead of the API objects,
// whose spec and status are mostly strings, pointers and maps nothing
// here reads. ServiceOf makes one; Translate translates with it exactly
// as ServiceToModel does with the object it was made from.
//
// What a translation reads of a Service is why it is skipped (its type,
// its proxy-name label, a clusterIP None), whether it is
// valid (ValidateService says so once, when the Service is made), and of a
// valid one: its ClusterIPs, ports, externalIPs and load-balancer ingress
// IPs parsed, its source ranges as written (their warnings quote them),
// its traffic policies, health check node port and session affinity
// timeout. Its creationTimestamp is the tracker's (the conflict rule), its
// generation the source's. A Service is never modified once made.
type Service struct {
	Namespace, Name, ResourceVersion string
	// Created is its creationTimestamp (zero: none). Generation is its
	// metadata.generation, which no translation reads: a source's change
	// of it (a spec change, even of a part no translation reads) is
	// translated again, so that what the translation warns of is
	// reported again (pkg/source/kube's events).
	Created    time.Time
	Generation int64
	Type       corev1.ServiceType
	// ProxyName is its service.kubernetes.io/service-proxy-name label
	// (nil: none).
	ProxyName *string
	// HeadlessIP: its clusterIP (or clusterIPs[0]) is None. (Its
	// service.kubernetes.io/headless label is not read: kube-proxy reads
	// that label on EndpointSlices, see Slice.Headless.)
	HeadlessIP bool
	// ExternalLocal: externalTrafficPolicy Local (whether the Service is
	// externally accessible is the translation's to say);
	// InternalLocal: internalTrafficPolicy Local.
	ExternalLocal, InternalLocal bool
	// Affinity is the sessionAffinity ClientIP timeout, 0 for none
	// (affinityTimeout).
	Affinity time.Duration
	// Invalid is what ValidateService said of it (nil: valid); the
	// manifest source sets CheckExternalIPs' refusal there too, and
	// keeps no Service it set. The fields below are set only for a
	// Service ValidateService took.
	Invalid error
	// ClusterIPs are its ClusterIPs, at most one per family (clusterIPs).
	ClusterIPs []netip.Addr
	Ports      []ServicePort
	// External is what few Services have (nil: none of it).
	External *ServiceExternal
}

// ServiceExternal is the part of a Service that most have none of: a
// Service holds a pointer to it, 8 bytes where the fields are 76.
type ServiceExternal struct {
	// IPs are its spec.externalIPs, parsed (validation has checked that
	// each does).
	IPs []netip.Addr
	// LoadBalancerIPs are, for a LoadBalancer Service, the ingress IPs
	// whose ipMode is not Proxy that parse (northsouth.go);
	// SourceRanges its loadBalancerSourceRanges as written, if it has
	// any such IP.
	LoadBalancerIPs     []netip.Addr
	SourceRanges        []string
	HealthCheckNodePort int32
}

// ServicePort is a Service port as a translation reads it: its name,
// protocol as written ("" for TCP; SCTP too, which the translation leaves
// out), port and nodePort (0: none).
type ServicePort struct {
	Name           string
	Protocol       corev1.Protocol
	Port, NodePort int32
}

// ServiceOf returns what a translation reads of svc (nil for nil). It
// shares the strings of svc, not its arrays.
func ServiceOf(svc *corev1.Service) *Service {
	if svc == nil {
		return nil
	}
	s := MakeService(svc)
	return &s
}

// MakeService is ServiceOf for a source that embeds the Service in a type
// of its own; svc is not nil.
func MakeService(svc *corev1.Service) Service {
	var s Service
	ReadService(&s, svc)
	return s
}

// ReadService is MakeService into *s, reusing the arrays of its ClusterIPs
// and Ports, as ReadSlice does for a slice: for a source that reads the
// object again at each translation and drops what it read once
// translated. Nothing of what s held before is read or kept.
func ReadService(s *Service, svc *corev1.Service) {
	ips, ports := s.ClusterIPs[:0], s.Ports[:0]
	sp := &svc.Spec
	*s = Service{Namespace: svc.Namespace, Name: svc.Name, ResourceVersion: svc.ResourceVersion,
		Created: svc.CreationTimestamp.Time, Generation: svc.Generation, Type: constant(sp.Type, serviceTypes),
		HeadlessIP: sp.ClusterIP == corev1.ClusterIPNone || (len(sp.ClusterIPs) > 0 && sp.ClusterIPs[0] == corev1.ClusterIPNone)}
	if p, ok := svc.Labels[LabelServiceProxyName]; ok {
		name := p // not p: a variable the map lookup declares would be allocated for every Service
		s.ProxyName = &name
	}
	if s.Invalid = ValidateService(svc); s.Invalid != nil {
		return
	}
	s.ClusterIPs = appendClusterIPs(ips, svc)
	if n := len(sp.Ports); n > 0 {
		s.Ports = slices.Grow(ports, n)[:n]
		for i, p := range sp.Ports {
			s.Ports[i] = ServicePort{Name: p.Name, Protocol: constant(p.Protocol, protocols), Port: p.Port, NodePort: p.NodePort}
		}
	}
	var x ServiceExternal
	x.IPs = parseAll(sp.ExternalIPs, func(ip string) string { return ip })
	if s.Type == corev1.ServiceTypeLoadBalancer {
		x.LoadBalancerIPs = parseAll(svc.Status.LoadBalancer.Ingress, func(ing corev1.LoadBalancerIngress) string {
			if ing.IPMode != nil && *ing.IPMode == corev1.LoadBalancerIPModeProxy {
				return ""
			}
			return ing.IP
		})
		if len(x.LoadBalancerIPs) > 0 {
			x.SourceRanges = sp.LoadBalancerSourceRanges
		}
	}
	x.HealthCheckNodePort = sp.HealthCheckNodePort
	if x.IPs != nil || x.LoadBalancerIPs != nil || x.SourceRanges != nil || x.HealthCheckNodePort != 0 {
		e := x // x stays on the stack: most Services have none of it
		s.External = &e
	}
	s.ExternalLocal = sp.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
	s.InternalLocal = sp.InternalTrafficPolicy != nil && *sp.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal
	s.Affinity = affinityTimeout(svc)
}

// noExternal is the ServiceExternal of a Service with none.
var noExternal ServiceExternal

// external returns s.External, or an empty one.
func (s *Service) external() *ServiceExternal {
	if s.External == nil {
		return &noExternal
	}
	return s.External
}

var serviceTypes = []corev1.ServiceType{corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort,
	corev1.ServiceTypeLoadBalancer, corev1.ServiceTypeExternalName}

// parseAll returns the addresses addr gives of items that parse, in an
// array of their number (nil for none).
func parseAll[T any](items []T, addr func(T) string) []netip.Addr {
	var out []netip.Addr
	for _, it := range items {
		if ip, ok := parseIPSloppy(addr(it)); ok {
			if out == nil {
				out = make([]netip.Addr, 0, len(items))
			}
			out = append(out, ip)
		}
	}
	return out
}

// skipped says why the Service is deliberately not served ("": it is),
// in ServiceToModel's order: ExternalName, another proxy's, headless
// (clusterIP None). kube-proxy's Services informer lists those without
// the service-proxy-name label whose clusterIP is not None
// (cmd/kube-proxy/app/server.go); Sluice also serves those labelled with
// its own proxy name (Options.ProxyName). A Service labelled
// service.kubernetes.io/headless is served, as kube-proxy serves it:
// that label filters EndpointSlices (Slice.Headless).
func (s *Service) skipped(opts Options) string {
	switch {
	case s.Type == corev1.ServiceTypeExternalName:
		return SkipExternalName
	case s.ProxyName != nil && *s.ProxyName != opts.proxyName():
		return LabelServiceProxyName + "=" + *s.ProxyName
	case s.HeadlessIP:
		return SkipHeadless
	}
	return ""
}

// portName names port i in messages.
func (s *Service) portName(i int) string {
	if n := s.Ports[i].Name; n != "" {
		return "port " + strconv.Quote(n)
	}
	return "ports[" + strconv.Itoa(i) + "]"
}
