package kube

import (
	"sync"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// slimmer is the informers' transform: it drops from an object the
// informers cache what nothing here reads, and shares what repeats. The
// caches hold every Service and EndpointSlice for the agent's life; they
// are most of its memory.
//
// A Service is cached as what a translation reads of it (cachedService,
// translate.Service: its namespace, name, resourceVersion, generation and
// creationTimestamp, why it is skipped, whether it is valid, and of a
// valid one its ClusterIPs, ports, external and load-balancer IPs parsed,
// source ranges, traffic policies, health check node port and affinity
// timeout), with its uid for the events: about 360 bytes where the
// decoded API object, slimmed as it was before, was about 980.
//
// An EndpointSlice is cached as what a translation reads of it
// (cachedSlice, translate.Slice: the namespace, name, resourceVersion,
// service-name label, whether it is labelled headless, addressType, ports, and of each endpoint its first
// address parsed, its conditions, node name and hints, and whether the
// slice is valid), without its annotations (keptAnnotations): an IPv4
// endpoint in 16 bytes (translate.SliceEndpoints), where the API's
// Endpoint alone is 96 and its address a string in an array of its own.
// Its
// endpoints.kubernetes.io/last-change-trigger-time annotation is kept
// aside until the event handler hands it to the tracker with the slice
// (takeTrigger): nothing reads it afterwards.
//
// Dropped, of the Node: its managedFields (server-side apply's record of
// each field's manager), kubectl's last-applied-configuration annotation
// (a copy of the whole object), its owner references and the images it
// holds (often hundreds).
//
// Shared: the endpoints' node names (one *string per name, of the last few
// thousand seen), the namespaces, the port names and a Service's
// proxy-name label, which a decoded list allocates for every object; and
// the arrays of ports of one or two (a slice's, a Service's): most
// Services of a cluster have one of a few port lists (80/TCP, 443/TCP,
// ...), so most objects share one array instead of 48 bytes each of
// their own. Nothing writes to a cached object, so sharing is safe.
type slimmer struct {
	mu      sync.Mutex
	strings map[string]*string
	// slicePorts and servicePorts are the port arrays shared, by their
	// ports (of the last few hundred lists seen).
	slicePorts   map[portsKey[translate.SlicePort]][]translate.SlicePort
	servicePorts map[portsKey[translate.ServicePort]][]translate.ServicePort
	// triggers holds the trigger times taken off the slices that the
	// event handler has not seen yet; triggersPeak is the most it held
	// since it was made. A Go map keeps the room it grew to: once the
	// first list's 30,000 are taken, a new map replaces it.
	triggers     map[*cachedSlice]string
	triggersPeak int
}

// shrinkTriggers is the peak past which slimmer.triggers is replaced once
// empty.
const shrinkTriggers = 1024

// maxShared bounds slimmer.strings: past it, the names seen are forgotten
// (objects keep theirs) and sharing starts over, so that the node names
// of a cluster whose nodes come and go do not pile up.
const maxShared = 4096

// maxTriggers bounds slimmer.triggers, should slices it saw never reach
// the handler (a deletion the informer's queue folds into another): past
// it, the trigger times waiting are dropped, and the programming latency
// of those changes is not measured.
const maxTriggers = 1 << 20

// maxSharedPorts bounds slimmer.slicePorts and servicePorts, as
// maxShared does strings: a NodePort Service's ports are its own (its
// nodePorts), and a cluster of them should not fill the maps.
const maxSharedPorts = 512

func newSlimmer() *slimmer {
	return &slimmer{strings: map[string]*string{}, triggers: map[*cachedSlice]string{},
		slicePorts:   map[portsKey[translate.SlicePort]][]translate.SlicePort{},
		servicePorts: map[portsKey[translate.ServicePort]][]translate.ServicePort{}}
}

// takeTrigger returns (and forgets) the trigger time taken off es, "" if
// none.
func (sl *slimmer) takeTrigger(es *cachedSlice) string {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	v, ok := sl.triggers[es]
	if ok {
		delete(sl.triggers, es)
		if len(sl.triggers) == 0 && sl.triggersPeak > shrinkTriggers {
			sl.triggers, sl.triggersPeak = map[*cachedSlice]string{}, 0
		}
	}
	return v
}

func (sl *slimmer) slim(obj any) (any, error) {
	switch o := obj.(type) {
	case *cachedSlice, *cachedService:
		return o, nil // made already
	case *discoveryv1.EndpointSlice:
		return sl.slimSlice(o), nil
	case *corev1.Service:
		return sl.slimService(o), nil
	}
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
		m.SetOwnerReferences(nil)
		if a := m.GetAnnotations(); a != nil {
			delete(a, corev1.LastAppliedConfigAnnotation)
		}
	}
	if n, ok := obj.(*corev1.Node); ok {
		n.Status.Images = nil
	}
	return obj, nil
}

// slimService returns what the cache keeps of svc.
func (sl *slimmer) slimService(svc *corev1.Service) *cachedService {
	c := &cachedService{Service: translate.MakeService(svc), uid: svc.UID}
	sl.mu.Lock()
	defer sl.mu.Unlock()
	c.Namespace = sl.shareValue(c.Namespace)
	c.ProxyName = sl.share(c.ProxyName)
	for i := range c.Ports {
		p := &c.Ports[i]
		p.Name = sl.shareValue(p.Name)
	}
	c.Ports = sharePorts(sl.servicePorts, c.Ports)
	return c
}

// keptAnnotations returns the only annotation a cached slice keeps, the
// one a reflector reads of a bookmark at the end of a streamed list
// (metav1.InitialEventsAnnotationKey), or nil. Nothing reads the others
// (the trigger time is kept aside), and keeping them would let whoever
// may write EndpointSlices grow every agent's cache by up to 256 KiB a
// slice, against the chart's memory limit.
func keptAnnotations(a map[string]string) map[string]string {
	if v, ok := a[metav1.InitialEventsAnnotationKey]; ok {
		return map[string]string{metav1.InitialEventsAnnotationKey: v}
	}
	return nil
}

// slimSlice returns what the cache keeps of es.
func (sl *slimmer) slimSlice(es *discoveryv1.EndpointSlice) *cachedSlice {
	c := &cachedSlice{Slice: translate.MakeSlice(es)}
	trigger, triggered := es.Annotations[corev1.EndpointsLastChangeTriggerTime]
	c.annotations = keptAnnotations(es.Annotations)
	sl.mu.Lock()
	defer sl.mu.Unlock()
	sl.keepSlice(c, trigger, triggered, true)
	return c
}

// keepSlice shares what c repeats of other slices (its namespace, port
// names and ports, and its endpoints' node names if shareNodes: false if
// they are shared already) and keeps its trigger time aside (if
// triggered). Called with mu held.
func (sl *slimmer) keepSlice(c *cachedSlice, trigger string, triggered, shareNodes bool) {
	c.Namespace = sl.shareValue(c.Namespace)
	for i := range c.Ports {
		p := &c.Ports[i]
		p.Name = sl.shareValue(p.Name)
	}
	c.Ports = sharePorts(sl.slicePorts, c.Ports)
	if shareNodes {
		c.Endpoints.Share(sl.share, nil)
	}
	if triggered {
		if len(sl.triggers) >= maxTriggers {
			clear(sl.triggers)
		}
		sl.triggers[c] = trigger
		sl.triggersPeak = max(sl.triggersPeak, len(sl.triggers))
	}
}

// share returns the shared pointer to *s's value. Called with mu held.
func (sl *slimmer) share(s *string) *string {
	if s == nil {
		return nil
	}
	if p, ok := sl.strings[*s]; ok {
		return p
	}
	sl.put(s)
	return s
}

// add shares s, which is not shared yet, and returns its pointer.
// Called with mu held.
func (sl *slimmer) add(s string) *string {
	p := &s
	sl.put(p)
	return p
}

// put makes p the shared pointer to its value. Called with mu held.
func (sl *slimmer) put(p *string) {
	if len(sl.strings) >= maxShared {
		clear(sl.strings)
	}
	sl.strings[*p] = p
}

// shareValue returns the shared copy of s. Called with mu held.
func (sl *slimmer) shareValue(s string) string {
	if p, ok := sl.strings[s]; ok {
		return *p
	}
	if s == "" {
		return s
	}
	return *sl.add(s)
}

// portsKey is a list of one or two ports, as slimmer's maps of shared
// port arrays key it.
type portsKey[P comparable] struct {
	n int
	p [2]P
}

// sharePorts returns the array in shared that holds the same ports as
// ports, if it has one, else ports (then shared, if ports are one or two).
// Called with mu held.
func sharePorts[P comparable](shared map[portsKey[P]][]P, ports []P) []P {
	if len(ports) == 0 || len(ports) > 2 {
		return ports
	}
	var k portsKey[P]
	k.n = copy(k.p[:], ports)
	if s, ok := shared[k]; ok {
		return s
	}
	if len(shared) >= maxSharedPorts {
		clear(shared)
	}
	shared[k] = ports
	return ports
}
