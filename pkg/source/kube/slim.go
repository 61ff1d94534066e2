package kube

import (
	"slices"
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
// Dropped, of every object: its managedFields (server-side apply's record
// of each field's manager), kubectl's last-applied-configuration
// annotation (a copy of the whole object) and its owner references (an
// EndpointSlice's names its Service). Of a Service: its selector (the
// endpoints come from the slices) and its labels but the ones a
// translation reads (translate.ServiceLabelsRead); of an EndpointSlice:
// its labels but kubernetes.io/service-name (translate.SliceLabelsRead),
// and of its endpoints the reference to the Pod behind each address
// (seven strings an endpoint) and the deprecated copy of its Node's
// topology labels; of the Node, the images it holds (often hundreds).
// A slice's endpoints.kubernetes.io/last-change-trigger-time annotation
// (a map of its own, most slices' only annotation) is taken off it and
// kept aside until the event handler hands it to the tracker with the
// slice (takeTrigger): nothing reads it afterwards.
// Everything a translation reads stays: annotations (the Service's
// topology mode, say), the Service's spec and load-balancer
// status, the endpoints' addresses, conditions, node names, zones and
// hints (slim_test.go checks it).
//
// Shared: the endpoints' condition pointers (one true, one false) and
// their node names and zones (one *string per name, of the last few
// thousand seen), which a decoded list allocates for every endpoint; and
// a slice's endpoints are copied to an array of their length (a decoded
// list's grows by doubling). Nothing writes to a cached object, so
// sharing is safe.
type slimmer struct {
	mu      sync.Mutex
	strings map[string]*string
	// triggers holds the trigger times taken off the slices that the
	// event handler has not seen yet.
	triggers map[*discoveryv1.EndpointSlice]string
}

// maxShared bounds slimmer.strings: past it, the names seen are forgotten
// (objects keep theirs) and sharing starts over, so that the node names
// of a cluster whose nodes come and go do not pile up.
const maxShared = 4096

var sharedTrue, sharedFalse = new(true), new(false)

// maxTriggers bounds slimmer.triggers, should slices it saw never reach
// the handler (a deletion the informer's queue folds into another): past
// it, the trigger times waiting are dropped, and the programming latency
// of those changes is not measured.
const maxTriggers = 1 << 20

func newSlimmer() *slimmer {
	return &slimmer{strings: map[string]*string{}, triggers: map[*discoveryv1.EndpointSlice]string{}}
}

// takeTrigger returns (and forgets) the trigger time taken off es, "" if
// none.
func (sl *slimmer) takeTrigger(es *discoveryv1.EndpointSlice) string {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	v, ok := sl.triggers[es]
	if ok {
		delete(sl.triggers, es)
	}
	return v
}

func (sl *slimmer) slim(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
		m.SetOwnerReferences(nil)
		if a := m.GetAnnotations(); a != nil {
			delete(a, corev1.LastAppliedConfigAnnotation)
		}
	}
	switch o := obj.(type) {
	case *corev1.Service:
		o.Spec.Selector = nil
		o.Labels = keepOnly(o.Labels, translate.ServiceLabelsRead)
	case *discoveryv1.EndpointSlice:
		o.Labels = keepOnly(o.Labels, translate.SliceLabelsRead)
		if cap(o.Endpoints) > len(o.Endpoints) {
			o.Endpoints = slices.Clone(o.Endpoints)
		}
		sl.mu.Lock()
		if v, ok := o.Annotations[corev1.EndpointsLastChangeTriggerTime]; ok {
			delete(o.Annotations, corev1.EndpointsLastChangeTriggerTime)
			if len(o.Annotations) == 0 {
				o.Annotations = nil
			}
			if len(sl.triggers) >= maxTriggers {
				clear(sl.triggers)
			}
			sl.triggers[o] = v
		}
		for i := range o.Endpoints {
			e := &o.Endpoints[i]
			e.TargetRef = nil
			e.DeprecatedTopology = nil
			c := &e.Conditions
			c.Ready, c.Serving, c.Terminating = shareBool(c.Ready), shareBool(c.Serving), shareBool(c.Terminating)
			e.NodeName, e.Zone = sl.share(e.NodeName), sl.share(e.Zone)
		}
		sl.mu.Unlock()
	case *corev1.Node:
		o.Status.Images = nil
	}
	return obj, nil
}

// keepOnly deletes from labels the keys not in keep; nil if none is left.
func keepOnly(labels map[string]string, keep []string) map[string]string {
	for k := range labels {
		if !slices.Contains(keep, k) {
			delete(labels, k)
		}
	}
	if len(labels) == 0 {
		return nil
	}
	return labels
}

func shareBool(b *bool) *bool {
	switch {
	case b == nil:
		return nil
	case *b:
		return sharedTrue
	}
	return sharedFalse
}

// share returns the shared pointer to *s's value. Called with mu held.
func (sl *slimmer) share(s *string) *string {
	if s == nil {
		return nil
	}
	if p, ok := sl.strings[*s]; ok {
		return p
	}
	if len(sl.strings) >= maxShared {
		clear(sl.strings)
	}
	sl.strings[*s] = s
	return s
}
