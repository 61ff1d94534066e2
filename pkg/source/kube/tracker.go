package kube

import (
	"reflect"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-lb/sluice/pkg/model"
)

// tracker folds informer events into net changes, as kube-proxy's
// ServiceChangeTracker and EndpointsChangeTracker do. Events only record the
// latest object and mark its Service dirty; a sync translates each dirty
// Service once, from the latest Service and EndpointSlices, however many
// events touched it, and compares the result with what the last sync
// produced. A Service created and deleted between two syncs costs nothing; a
// slice update that changes nothing the datapath sees (a new
// resourceVersion, a hint) yields an equal translation and no write.
type tracker struct {
	mu       sync.Mutex
	services map[types.NamespacedName]*corev1.Service
	// slices: Service -> slice name -> slice. A Service's slices arrive
	// independently, possibly before the Service itself.
	slices map[types.NamespacedName]map[string]*discoveryv1.EndpointSlice
	dirty  map[types.NamespacedName]struct{}
	// triggers holds, per dirty Service, the last-change-trigger-time of
	// each slice change not yet programmed, for the programming latency.
	triggers map[types.NamespacedName][]time.Time
	// nodeChanged marks every Service dirty at the next sync: node
	// addresses and labels feed the translation of all of them.
	nodeChanged bool
	node        *corev1.Node

	// Owned by the sync goroutine.
	translated map[types.NamespacedName][]*model.Service
}

func newTracker() *tracker {
	return &tracker{
		services:   map[types.NamespacedName]*corev1.Service{},
		slices:     map[types.NamespacedName]map[string]*discoveryv1.EndpointSlice{},
		dirty:      map[types.NamespacedName]struct{}{},
		triggers:   map[types.NamespacedName][]time.Time{},
		translated: map[types.NamespacedName][]*model.Service{},
	}
}

// setService records the latest version of a Service (nil: deleted). It
// reports whether anything was marked dirty.
func (t *tracker) setService(key types.NamespacedName, svc *corev1.Service) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.services[key]
	if svc == nil {
		if old == nil {
			return false
		}
		delete(t.services, key)
	} else {
		// A resync or a status-only update: same spec, nothing to do.
		if old != nil && (old.ResourceVersion == svc.ResourceVersion ||
			reflect.DeepEqual(old.Spec, svc.Spec) && reflect.DeepEqual(old.Labels, svc.Labels) &&
				reflect.DeepEqual(old.Annotations, svc.Annotations)) {
			t.services[key] = svc
			return false
		}
		t.services[key] = svc
	}
	t.dirty[key] = struct{}{}
	return true
}

// setSlice records the latest version of an EndpointSlice of Service key
// (nil: deleted).
func (t *tracker) setSlice(key types.NamespacedName, name string, slice *discoveryv1.EndpointSlice) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := t.slices[key]
	old := m[name]
	if slice == nil {
		if old == nil {
			return false
		}
		delete(m, name)
		if len(m) == 0 {
			delete(t.slices, key)
		}
	} else {
		if old != nil && old.ResourceVersion == slice.ResourceVersion {
			return false // an informer resync
		}
		if m == nil {
			m = map[string]*discoveryv1.EndpointSlice{}
			t.slices[key] = m
		}
		m[name] = slice
		if trig := triggerTime(slice); !trig.IsZero() {
			t.triggers[key] = append(t.triggers[key], trig)
		}
	}
	t.dirty[key] = struct{}{}
	return true
}

func (t *tracker) setNode(node *corev1.Node) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if old := t.node; old != nil && node != nil &&
		reflect.DeepEqual(old.Status.Addresses, node.Status.Addresses) &&
		reflect.DeepEqual(old.Labels, node.Labels) {
		t.node = node
		return false
	}
	t.node = node
	t.nodeChanged = true
	return true
}

// triggerTime is the endpoints.kubernetes.io/last-change-trigger-time of a
// slice: when the change it carries (a pod becoming ready, say) happened.
func triggerTime(slice *discoveryv1.EndpointSlice) time.Time {
	v, ok := slice.Annotations[corev1.EndpointsLastChangeTriggerTime]
	if !ok {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}
	}
	return t
}

// pendingChange is the input of one sync: the dirty Services with their
// current objects, taken under the lock so events can go on meanwhile.
type pendingChange struct {
	services map[types.NamespacedName]*corev1.Service // nil value: deleted
	slices   map[types.NamespacedName][]*discoveryv1.EndpointSlice
	triggers []time.Time
	node     *corev1.Node
}

// take returns and clears the pending changes.
func (t *tracker) take() pendingChange {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.nodeChanged {
		// Every known Service, and every one translated before (it may have
		// been deleted since), is re-translated.
		for k := range t.services {
			t.dirty[k] = struct{}{}
		}
		for k := range t.translated {
			t.dirty[k] = struct{}{}
		}
		t.nodeChanged = false
	}
	pc := pendingChange{
		services: make(map[types.NamespacedName]*corev1.Service, len(t.dirty)),
		slices:   make(map[types.NamespacedName][]*discoveryv1.EndpointSlice, len(t.dirty)),
		node:     t.node,
	}
	for k := range t.dirty {
		pc.services[k] = t.services[k]
		names := make([]string, 0, len(t.slices[k]))
		for n := range t.slices[k] {
			names = append(names, n)
		}
		sort.Strings(names) // a stable input gives a stable translation
		for _, n := range names {
			pc.slices[k] = append(pc.slices[k], t.slices[k][n])
		}
		pc.triggers = append(pc.triggers, t.triggers[k]...)
		delete(t.triggers, k)
	}
	clear(t.dirty)
	return pc
}

// state builds the desired state from every Service's last translation.
// Services are visited in name order so that two Services claiming the same
// frontend resolve the same way on every sync and every node: the first by
// namespace/name wins. conflicts lists the losers.
func (t *tracker) state() (s *model.State, conflicts []string) {
	keys := make([]types.NamespacedName, 0, len(t.translated))
	for k := range t.translated {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].Namespace != keys[j].Namespace {
			return keys[i].Namespace < keys[j].Namespace
		}
		return keys[i].Name < keys[j].Name
	})
	s = model.NewState()
	for _, k := range keys {
		for _, svc := range t.translated[k] {
			if prev, ok := s.Services[svc.Frontend]; ok {
				conflicts = append(conflicts, svc.Name.String()+" lost "+svc.Frontend.String()+" to "+prev.Name.String())
				continue
			}
			s.Services[svc.Frontend] = svc
		}
	}
	return s, conflicts
}
