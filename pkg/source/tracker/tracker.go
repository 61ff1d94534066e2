// Package tracker is the change tracker both sources feed: the Kubernetes
// source from informer events, the manifest source from the objects a
// reload found changed (as kpng's file2store feeds the store kube2store
// feeds). It does for them what kube-proxy's ServiceChangeTracker and
// EndpointsChangeTracker do:
//
//   - it folds changes: Set* only record the latest object and mark its
//     Service dirty, so a Service created and deleted between two syncs
//     costs nothing, and an update that changes nothing the translation
//     reads (an informer resync, a status-only update) marks nothing;
//   - Sync translates only the dirty Services (pkg/source/translate), each
//     once however many changes touched it, and makes a new desired state
//     only if a translation changed, by patching the last one with the
//     frontends of the Services that changed;
//   - a change of the node re-translates only the Services whose last
//     translation read the part of the node that changed
//     (translate.Translation.NodeFacts);
//   - two Services claiming one frontend resolve by one rule: first come
//     keeps it. The Service that holds a frontend keeps it while it claims
//     it, and a newcomer is reported as the loser with both names, whatever
//     their names (a newcomer must not take over a frontend in use: the
//     Kubernetes API server prevents ClusterIP clashes, but not
//     ExternalIP, LoadBalancer or NodePort ones, and manifest files prevent
//     nothing). kube-proxy has no rule here: its nftables and iptables
//     proxiers write both Services and the last one written, in map order,
//     wins. Among Services that claim a frontend none of them holds (at
//     start, or when its holder lets it go), the first of: the one the
//     datapath was programmed for before a restart (SetHolds), the oldest
//     by creationTimestamp (Services without one after those with one),
//     the first by namespace/name. So a restart keeps the owner whenever
//     the maps show it, and otherwise every node picks the same one.
//
// It also keeps the endpoints.kubernetes.io/last-change-trigger-time of the
// slice changes each sync brings, for the network programming latency, as
// kube-proxy's EndpointsChangeTracker does: only of a change the tracker
// takes (not of an informer resync: the same resourceVersion), and only
// if it is after the tracker was made. A slice last changed before the
// agent started carries the time of that change, which the agent did not
// wait for: taken, each restart would record one sample per slice, as old
// as the slice's last change.
package tracker

import (
	"cmp"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// Tracker tracks Services, EndpointSlices and the node. Set* may be called
// from any goroutine; Sync and Issues from one goroutine at a time.
type Tracker struct {
	mu sync.Mutex
	// inputs holds, per Service, the objects its translation reads. A
	// Service's slices arrive independently, possibly before the Service
	// itself.
	inputs map[types.NamespacedName]*input
	// dirty lists the Services changed since the last Sync, once each,
	// with their inputs (take then looks none up: an input stays in
	// inputs while it is dirty).
	dirty []dirtyKey
	// ownerOf is the name of the Service each slice was last filed
	// under, so that a slice relabelled to another Service leaves the
	// first. A slice's Service is in the slice's namespace, its key's:
	// the name alone is kept (16 bytes an entry less than the whole
	// name, at 30,000 slices 1 MiB). ownerElsewhere holds the owners of
	// the slices filed in another namespace than their key's (a source
	// whose key is not the object's; nil if none).
	ownerOf        map[types.NamespacedName]string
	ownerElsewhere map[types.NamespacedName]types.NamespacedName
	node           translate.Node
	// nodeChanged are the parts of the node changed since the last Sync.
	nodeChanged translate.NodeFacts
	// cidrs are the service CIDRs (SetServiceCIDRs), hasCIDRs whether
	// they were set, cidrsChanged whether they changed since the last
	// Sync.
	cidrs                  []netip.Prefix
	hasCIDRs, cidrsChanged bool
	// started is when the tracker was made (its wall clock alone: a
	// trigger time, parsed, has no monotonic reading): a trigger at or
	// before it is dropped (kube-proxy's trackerStartTime).
	started time.Time

	// Owned by the goroutine that calls Sync.
	opts translate.Options // opts.Node is the node translations were made for
	// ntranslated counts the inputs that hold a translation
	// (input.translation).
	ntranslated int
	// nfrontends counts the frontends of those translations (claimed
	// twice or not): the size of build's array.
	nfrontends int
	// facts holds what of the node each Service's translation read, for
	// the Services that read any.
	facts map[types.NamespacedName]translate.NodeFacts
	// order lists the inputs that hold a translation, sorted by
	// namespace/name (the conflict rule's order); nil when one came or
	// went since it was sorted.
	order []translated
	state *model.State
	// stateCIDRs are the service CIDRs the states carry (stateHasCIDRs:
	// any), set from the pending ones by Sync.
	stateCIDRs    []netip.Prefix
	stateHasCIDRs bool
	conflicts     []Conflict
	errs          map[types.NamespacedName]error
	skipped       map[types.NamespacedName]string
	// holds reports whether the datapath holds a frontend as a Service
	// port's translation would program it (nil: never).
	holds    func(*model.Service) bool
	warnings map[types.NamespacedName][]string
	// svcRead, sliceRead and reads are what Sync reads of objects (from
	// SetService and SetSlice), reused from one translation to the next
	// (readService, readSlices). Translate keeps none of it.
	svcRead   translate.Service
	sliceRead []translate.Slice
	reads     []*translate.Slice
}

// translation is a Service's last translation that has frontends, and the
// Service's creationTimestamp (zero if it has none), for the conflict
// rule.
type translation struct {
	services []*model.Service
	created  time.Time
}

// translated is a Service that has a translation, and its input.
type translated struct {
	key types.NamespacedName
	in  *input
}

// input is what one Service's translation reads, and its last translation
// with frontends. The translation is the Sync goroutine's: Set* never
// touch it, and it is not a map of its own beside Tracker.inputs (at
// 30,000 Services such a map cost 5 MiB, mostly keys and empty slots).
type input struct {
	svc serviceRef // none (yet, or any more): isNil
	// slices are the Service's slices sorted by name (a stable input
	// gives a stable translation). Most Services have one or two: a
	// sorted slice costs less than a map. It is replaced, never modified
	// in place, as take hands it out to Sync.
	slices []sliceRef
	// triggers are the last-change-trigger-times of the slice changes
	// not yet synced, with their slices' families.
	triggers []model.Trigger
	dirty    bool // listed in Tracker.dirty

	// Owned by the goroutine that calls Sync. The input stays in
	// Tracker.inputs while it has a translation: take drops only inputs
	// with neither a Service nor slices, whose translation the same Sync
	// then drops.
	translation translation
}

// sliceRef is one of a Service's EndpointSlices as its source gave it: what a
// translation reads of it (compact, from SetCompactSlice: both sources
// hand that over, the Kubernetes source's informers and the manifest
// source's loader hold only that), or the API object (obj, from SetSlice,
// for a caller that holds the objects anyway: what a translation reads is
// made from it at each translation, as garbage, rather than held beside
// it).
type sliceRef struct {
	compact *translate.Slice
	obj     *discoveryv1.EndpointSlice
}

func (s sliceRef) isNil() bool { return s.compact == nil && s.obj == nil }

// serviceRef is a Service as its source gave it, as sliceRef is a slice:
// what a translation reads of it (compact, from SetCompactService: both
// sources'), or the API object (obj, from SetService, made into what a
// translation reads at each translation).
type serviceRef struct {
	compact *translate.Service
	obj     *corev1.Service
}

func (s serviceRef) isNil() bool { return s.compact == nil && s.obj == nil }

// readService returns what a translation reads of the Service: the
// compact form as it is, an object read into t.svcRead (valid until the
// next call).
func (t *Tracker) readService(s serviceRef) *translate.Service {
	if s.compact != nil {
		return s.compact
	}
	translate.ReadService(&t.svcRead, s.obj)
	return &t.svcRead
}

// readSlices returns what a translation reads of the slices, as
// readService does (valid until the next call): the translation of a
// Service from objects, 30,000 of them in a first sync, leaves no garbage
// of what it read but what the arrays outgrow.
func (t *Tracker) readSlices(eps []sliceRef) []*translate.Slice {
	if n := len(eps); len(t.sliceRead) < n {
		t.sliceRead = append(t.sliceRead, make([]translate.Slice, n-len(t.sliceRead))...)
	}
	read := t.reads[:0]
	for i, es := range eps {
		if es.compact != nil {
			read = append(read, es.compact)
			continue
		}
		translate.ReadSlice(&t.sliceRead[i], es.obj)
		read = append(read, &t.sliceRead[i])
	}
	t.reads = read
	return read
}

func (s sliceRef) name() string {
	if s.compact != nil {
		return s.compact.Name
	}
	return s.obj.Name
}

func (s sliceRef) resourceVersion() string {
	if s.compact != nil {
		return s.compact.ResourceVersion
	}
	return s.obj.ResourceVersion
}

func (s sliceRef) addressType() discoveryv1.AddressType {
	if s.compact != nil {
		return s.compact.AddressType
	}
	return s.obj.AddressType
}

// serviceName is the Service the slice belongs to (ServiceNameOfSlice).
func (s sliceRef) serviceName() (types.NamespacedName, bool) {
	if s.compact != nil {
		return s.compact.ServiceName()
	}
	return translate.ServiceNameOfSlice(s.obj)
}

// New returns a Tracker that translates with opts; opts.Node is the node
// until SetNode changes it. A slice's trigger time at or before New is
// dropped (triggerOf): make the tracker before the source starts reading.
func New(opts translate.Options) *Tracker {
	return &Tracker{
		inputs:   map[types.NamespacedName]*input{},
		ownerOf:  map[types.NamespacedName]string{},
		started:  time.Now().Round(0),
		node:     opts.Node,
		opts:     opts,
		facts:    map[types.NamespacedName]translate.NodeFacts{},
		errs:     map[types.NamespacedName]error{},
		skipped:  map[types.NamespacedName]string{},
		warnings: map[types.NamespacedName][]string{},
	}
}

// SetHolds gives the tracker a check of what the datapath holds: whether a
// frontend is programmed exactly as a Service port's translation asks (the
// reconciler's Holds). Of Services claiming a frontend none of them holds
// yet, one the datapath holds wins: after a restart, the owner before it.
// Call it before the first Sync; holds is called from Sync.
func (t *Tracker) SetHolds(holds func(*model.Service) bool) {
	t.holds = holds
}

// Reserve makes room for services Services and slices EndpointSlices, for
// a source about to hand over that many to a tracker that holds none (a
// first state: the manifest source counts its objects before it feeds
// them). Grown an entry at a time, the maps of inputs and owners and the
// dirty list left garbage behind (at 30,000 Services, 11.6 MB of the 214
// a first load of the manifest source allocated), and were rehashed at
// each growth. A tracker that holds any is left as it is.
func (t *Tracker) Reserve(services, slices int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.inputs) == 0 && services > 0 {
		t.inputs = make(map[types.NamespacedName]*input, services)
	}
	if len(t.ownerOf) == 0 && slices > 0 {
		t.ownerOf = make(map[types.NamespacedName]string, slices)
	}
	if len(t.dirty) == 0 && services > 0 {
		t.dirty = make([]dirtyKey, 0, services)
	}
}

// input returns the input of Service key, creating it.
func (t *Tracker) input(key types.NamespacedName) *input {
	in := t.inputs[key]
	if in == nil {
		in = &input{}
		t.inputs[key] = in
	}
	return in
}

// markDirty lists the Service key, whose input is in, for the next Sync.
func (t *Tracker) markDirty(key types.NamespacedName, in *input) {
	if !in.dirty {
		in.dirty = true
		t.dirty = append(t.dirty, dirtyKey{key, in})
	}
}

// SetService records the latest version of the Service key (nil: deleted).
// It reports whether anything was marked dirty.
func (t *Tracker) SetService(key types.NamespacedName, svc *corev1.Service) bool {
	var ref serviceRef
	if svc != nil {
		ref.obj = svc
	}
	return t.setService(key, ref)
}

// SetCompactService is SetService for a source that keeps only what a
// translation reads of the Service (translate.ServiceOf; both sources):
// svc translates exactly as the object it was made from.
func (t *Tracker) SetCompactService(key types.NamespacedName, svc *translate.Service) bool {
	var ref serviceRef
	if svc != nil {
		ref.compact = svc
	}
	return t.setService(key, ref)
}

func (t *Tracker) setService(key types.NamespacedName, svc serviceRef) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.setServiceLocked(key, svc)
}

// Batch calls f, which makes its Set* calls through the Batch it is
// given, with the tracker locked once for all of them: for a source that
// hands many objects over at once (the manifest source, every object of
// a load). Each call does what the Tracker's of the same name does;
// none may be made to the Tracker itself until f returns.
func (t *Tracker) Batch(f func(*Batch)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	f(&Batch{t})
}

// Batch makes Set* calls under the lock Tracker.Batch took: at 30,000
// Services, a first load's 60,000 calls took it and let it go 60,000
// times (5 ms of the tracker's 35 ms of feeding).
type Batch struct{ t *Tracker }

// SetCompactService is Tracker.SetCompactService.
func (b *Batch) SetCompactService(key types.NamespacedName, svc *translate.Service) bool {
	var ref serviceRef
	if svc != nil {
		ref.compact = svc
	}
	return b.t.setServiceLocked(key, ref)
}

// SetCompactSlice is Tracker.SetCompactSlice.
func (b *Batch) SetCompactSlice(key types.NamespacedName, es *translate.Slice, trigger string) bool {
	return b.t.setSliceLocked(key, sliceRef{compact: es}, trigger)
}

// setServiceLocked is setService with t.mu held.
func (t *Tracker) setServiceLocked(key types.NamespacedName, svc serviceRef) bool {
	in := t.inputs[key]
	var old serviceRef
	if in != nil {
		old = in.svc
	}
	if old.isNil() && svc.isNil() {
		return false
	}
	if in == nil {
		in = &input{} // not t.input: the lookup is done
		t.inputs[key] = in
	}
	in.svc = svc
	if !old.isNil() && !svc.isNil() && sameVersion(old, svc) {
		return false
	}
	t.markDirty(key, in)
	return true
}

// sameVersion reports whether b translates as a does: the same object
// version (an informer resync), or an update of nothing the translation
// reads (most status updates). Objects read from files carry no
// resourceVersion, so it is compared only when there is one. Of a compact
// Service, everything is read but the resourceVersion (its
// creationTimestamp too, the conflict rule's, and its generation: see
// translate.Service).
func sameVersion(a, b serviceRef) bool {
	if a == b {
		return true
	}
	switch {
	case a.obj != nil && b.obj != nil:
		a, b := a.obj, b.obj
		if a.ResourceVersion != "" && a.ResourceVersion == b.ResourceVersion {
			return true
		}
		return reflect.DeepEqual(a.Spec, b.Spec) && reflect.DeepEqual(a.Labels, b.Labels) &&
			reflect.DeepEqual(a.Annotations, b.Annotations) &&
			reflect.DeepEqual(a.Status.LoadBalancer, b.Status.LoadBalancer)
	case a.compact != nil && b.compact != nil:
		if a.compact.ResourceVersion != "" && a.compact.ResourceVersion == b.compact.ResourceVersion {
			return true
		}
		a, b := *a.compact, *b.compact
		if !a.Created.Equal(b.Created) {
			return false
		}
		a.ResourceVersion, a.Created, b.ResourceVersion, b.Created = "", time.Time{}, "", time.Time{}
		return reflect.DeepEqual(a, b)
	}
	return false
}

// SetSlice records the latest version of the EndpointSlice key (nil:
// deleted). It is filed under the Service its kubernetes.io/service-name
// label names; a slice without one belongs to no Service and is ignored.
// It reports whether anything was marked dirty.
func (t *Tracker) SetSlice(key types.NamespacedName, slice *discoveryv1.EndpointSlice) bool {
	var trigger string
	if slice != nil {
		trigger = slice.Annotations[corev1.EndpointsLastChangeTriggerTime]
	}
	return t.SetSliceTriggered(key, slice, trigger)
}

// SetSliceTriggered is SetSlice for a source that took the slice's
// endpoints.kubernetes.io/last-change-trigger-time annotation off it (the
// Kubernetes source, whose cache need not keep it): trigger is its value,
// "" for none.
func (t *Tracker) SetSliceTriggered(key types.NamespacedName, es *discoveryv1.EndpointSlice, trigger string) bool {
	return t.setSlice(key, sliceRef{obj: es}, trigger)
}

// SetCompactSlice is SetSliceTriggered for a source that keeps only what a
// translation reads of the slice (translate.SliceOf; both sources): es
// translates exactly as the object it was made from.
func (t *Tracker) SetCompactSlice(key types.NamespacedName, es *translate.Slice, trigger string) bool {
	return t.setSlice(key, sliceRef{compact: es}, trigger)
}

func (t *Tracker) setSlice(key types.NamespacedName, es sliceRef, trigger string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.setSliceLocked(key, es, trigger)
}

// setSliceLocked is setSlice with t.mu held.
func (t *Tracker) setSliceLocked(key types.NamespacedName, es sliceRef, trigger string) bool {
	var owner types.NamespacedName
	hasOwner := false
	if !es.isNil() {
		owner, hasOwner = es.serviceName()
	}
	changed := false
	oldOwner, had := t.owner(key)
	if had && (!hasOwner || oldOwner != owner) {
		// Deleted, or relabelled to another Service: it leaves the
		// one it was filed under.
		in := t.input(oldOwner)
		var gone discoveryv1.AddressType
		if i, found := findSlice(in.slices, key.Name); found {
			gone = in.slices[i].addressType()
			in.slices = slices.Delete(slices.Clone(in.slices), i, i+1) // a copy, see input
		}
		delete(t.ownerOf, key)
		delete(t.ownerElsewhere, key)
		if es.isNil() && gone != "" && gone != discoveryv1.AddressTypeFQDN {
			// A deletion drops the Service's trigger times of the
			// slice's family not synced yet (its other slices' too),
			// as kube-proxy's EndpointsChangeTracker of that family
			// does (one a family; an FQDN slice is neither's): a
			// deleted slice's annotation is the time of its last
			// update, not of the deletion, and kube-proxy measures
			// neither.
			v6 := gone == discoveryv1.AddressTypeIPv6
			in.triggers = slices.DeleteFunc(slices.Clone(in.triggers), func(tr model.Trigger) bool { return tr.IPv6 == v6 })
		}
		t.markDirty(oldOwner, in)
		changed = true
	}
	if !hasOwner {
		return changed
	}
	in := t.input(owner)
	i, found := findSlice(in.slices, key.Name)
	if found {
		if old := in.slices[i]; old == es || old.resourceVersion() != "" && old.resourceVersion() == es.resourceVersion() {
			return changed // an informer resync
		}
		eps := slices.Clone(in.slices) // a copy, see input
		eps[i] = es
		in.slices = eps
	} else {
		in.slices = slices.Insert(slices.Clip(in.slices), i, es) // a copy too
		t.setOwner(key, owner)
	}
	if trig, ok := triggerOf(es.addressType(), trigger, t.started); ok {
		in.triggers = append(in.triggers, trig)
	}
	t.markDirty(owner, in)
	return true
}

// owner returns the Service the slice key is filed under.
func (t *Tracker) owner(key types.NamespacedName) (types.NamespacedName, bool) {
	if o, ok := t.ownerElsewhere[key]; ok {
		return o, true
	}
	name, ok := t.ownerOf[key]
	return types.NamespacedName{Namespace: key.Namespace, Name: name}, ok
}

// setOwner files the slice key under the Service owner.
func (t *Tracker) setOwner(key, owner types.NamespacedName) {
	if owner.Namespace == key.Namespace {
		t.ownerOf[key] = owner.Name
		return
	}
	if t.ownerElsewhere == nil {
		t.ownerElsewhere = map[types.NamespacedName]types.NamespacedName{}
	}
	t.ownerElsewhere[key] = owner
}

// findSlice returns where the slice called name is, or would be, in eps.
func findSlice(eps []sliceRef, name string) (int, bool) {
	return slices.BinarySearchFunc(eps, name, func(es sliceRef, name string) int {
		return cmp.Compare(es.name(), name)
	})
}

// SetNode records the node translations are for. It reports whether
// anything changed; the next Sync re-translates the Services that read
// what did.
func (t *Tracker) SetNode(node translate.Node) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.setNodeLocked(node)
}

// SetNodeAddresses records the addresses NodePorts are served on
// (translate.Node.Addresses; the caller's, kept), the rest of the node as
// it is: the node's interfaces' addresses change at run time, apart from
// its Node object. It reports whether they changed; the next Sync then
// re-translates the Services that read them (NodeAddresses).
func (t *Tracker) SetNodeAddresses(addrs []netip.Addr) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := t.node
	n.Addresses = addrs
	return t.setNodeLocked(n)
}

// SetNodeLabels records the Node object's labels (translate.Node.Labels),
// the rest of the node as it is, as SetNodeAddresses.
func (t *Tracker) SetNodeLabels(labels map[string]string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := t.node
	n.Labels = labels
	return t.setNodeLocked(n)
}

func (t *Tracker) setNodeLocked(node translate.Node) bool {
	d := t.node.Diff(node)
	t.node = node
	t.nodeChanged |= d
	return d != 0
}

// SetServiceCIDRs records the service CIDRs the states carry from the
// next Sync on (model.State.ServiceCIDRs): cidrs sorted, masked and
// unique (the caller's; kept, not copied). It reports whether they
// changed; the next Sync then makes a new state even if no Service
// changed.
func (t *Tracker) SetServiceCIDRs(cidrs []netip.Prefix) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.hasCIDRs && slices.Equal(t.cidrs, cidrs) {
		return false
	}
	t.cidrs, t.hasCIDRs, t.cidrsChanged = cidrs, true, true
	return true
}

// triggerOf is the time an endpoints.kubernetes.io/last-change-trigger-time
// v of a slice of addressType at says (when the change it carries, a pod
// becoming ready say, happened), with the slice's family; false for none,
// for a slice of addressType FQDN (no proxier serves it), or for a time at
// or before started, the tracker's start: as kube-proxy's
// EndpointsChangeTracker (t.After(trackerStartTime)), a change made before
// the agent started is no latency of the agent's.
func triggerOf(at discoveryv1.AddressType, v string, started time.Time) (model.Trigger, bool) {
	if v == "" || at == discoveryv1.AddressTypeFQDN {
		return model.Trigger{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil || !t.After(started) {
		return model.Trigger{}, false
	}
	return model.Trigger{At: t, IPv6: at == discoveryv1.AddressTypeIPv6}, true
}

// pending is the input of one sync: the dirty Services with their current
// objects, taken under the lock so that changes can go on meanwhile.
type pending struct {
	services []dirtyService
	triggers []model.Trigger
	node     translate.Node
	// cidrs are the service CIDRs, when cidrsChanged.
	cidrs        []netip.Prefix
	cidrsChanged bool
}

// dirtyKey is a Service listed in Tracker.dirty, and its input.
type dirtyKey struct {
	key types.NamespacedName
	in  *input
}

type dirtyService struct {
	key    types.NamespacedName
	in     *input     // the Service's, for its translation
	svc    serviceRef // isNil: deleted
	slices []sliceRef
}

// maxKeptDirty is the most room Tracker.dirty keeps between syncs.
const maxKeptDirty = 1024

// take returns and clears the pending changes.
func (t *Tracker) take() pending {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.nodeChanged != 0 {
		for k, f := range t.facts {
			if f&t.nodeChanged != 0 {
				t.markDirty(k, t.input(k))
			}
		}
		t.nodeChanged = 0
	}
	p := pending{services: make([]dirtyService, 0, len(t.dirty)), node: t.node,
		cidrs: t.cidrs, cidrsChanged: t.cidrsChanged}
	t.cidrsChanged = false
	for _, dk := range t.dirty {
		k, in := dk.key, dk.in
		p.services = append(p.services, dirtyService{k, in, in.svc, in.slices})
		p.triggers = append(p.triggers, in.triggers...)
		in.triggers, in.dirty = nil, false
		if in.svc.isNil() && len(in.slices) == 0 {
			delete(t.inputs, k)
		}
	}
	t.dirty = t.dirty[:0]
	if cap(t.dirty) > maxKeptDirty {
		t.dirty = nil // the first sync's 30,000: not kept for the next ones
	}
	return p
}

// Result is the outcome of one Sync.
type Result struct {
	// State is the desired state: a new one if Changed > 0 or on the first
	// Sync, else the one the last Sync returned. It is never modified
	// once returned.
	State *model.State
	// Changed counts the Services whose translation changed; Translated
	// those translated.
	Changed, Translated int
	// ServiceCIDRsChanged says State carries other service CIDRs than
	// the last Sync's state (SetServiceCIDRs): State is new.
	ServiceCIDRsChanged bool
	// Triggers are the trigger times of the slice changes this Sync took.
	Triggers []model.Trigger
	// Errors are the Services this Sync failed to translate; each keeps
	// its last good translation until it translates again.
	Errors []ServiceError
	// Skipped are the Services this Sync found deliberately not served.
	Skipped []Skipped
	// Warnings are what of the Services this Sync translated is not
	// served as asked (translate.Translation.Warnings), one per message.
	Warnings []Warning
	// Conflicts are the frontends claimed twice in State, when State is
	// new.
	Conflicts []Conflict
}

// ServiceError is a Service that could not be translated.
type ServiceError struct {
	Service types.NamespacedName
	Err     error
}

// Warning is part of a Service not served as asked
// (translate.Translation.Warnings).
type Warning struct {
	Service types.NamespacedName
	Message string
}

// Skipped is a Service deliberately not served, and why
// (translate.Translation.Skipped).
type Skipped struct {
	Service types.NamespacedName
	Reason  string
}

// Conflict is a frontend two Services claim: Winner holds it (it came
// first, see the package comment), and serves it.
type Conflict struct {
	Frontend      model.L4Addr
	Winner, Loser model.ServicePortName
}

func (c Conflict) String() string {
	return c.Loser.String() + " lost " + c.Frontend.String() + " to " + c.Winner.String()
}

// Sync translates the Services changed since the last Sync and returns the
// desired state.
func (t *Tracker) Sync() Result {
	p := t.take()
	t.opts.Node = p.node
	before := t.state
	r := Result{Triggers: p.triggers}
	var changes []change
	// A first state is built from the translations this loop makes (every
	// Service is dirty in the first Sync), collected as they are made:
	// a walk of t.inputs afterwards read each input and frontend again.
	var first []model.ServiceEntry
	if t.state == nil {
		first = make([]model.ServiceEntry, 0, len(p.services))
	}
	for _, d := range p.services {
		key, svc, in := d.key, d.svc, d.in
		var out []*model.Service
		var created time.Time
		if svc.isNil() {
			delete(t.errs, key)
			delete(t.skipped, key)
			delete(t.facts, key)
			delete(t.warnings, key)
		} else {
			r.Translated++
			read := t.readService(svc)
			created = read.Created
			tr, err := translate.Translate(read, t.readSlices(d.slices), t.opts)
			if err != nil {
				// A malformed Service must not stop the others: it
				// keeps its last good translation until it is fixed.
				t.errs[key] = err
				r.Errors = append(r.Errors, ServiceError{key, err})
				if in.translation.services != nil {
					in.translation.created = created
				}
				continue
			}
			delete(t.errs, key)
			if tr.Skipped != "" {
				t.skipped[key] = tr.Skipped
				r.Skipped = append(r.Skipped, Skipped{key, tr.Skipped})
			} else {
				delete(t.skipped, key)
			}
			if len(tr.Warnings) > 0 {
				t.warnings[key] = tr.Warnings
				for _, w := range tr.Warnings {
					r.Warnings = append(r.Warnings, Warning{key, w})
				}
			} else {
				delete(t.warnings, key)
			}
			if tr.NodeFacts != 0 {
				t.facts[key] = tr.NodeFacts
			} else {
				delete(t.facts, key)
			}
			out = tr.Services
		}
		last := &in.translation
		prev := last.services
		had := prev != nil
		if len(out) == 0 && !had {
			continue
		}
		if had && reflect.DeepEqual(out, prev) {
			if !svc.isNil() && !last.created.Equal(created) {
				last.created = created
			}
			continue
		}
		r.Changed++
		if t.state != nil { // a first state is built, not patched: no list of 30,000 changes
			changes = append(changes, change{key, prev, out})
		}
		t.nfrontends += len(out) - len(prev)
		if len(out) == 0 {
			*last = translation{}
			t.ntranslated--
			t.order = nil
			continue
		}
		if !had {
			t.ntranslated++
			t.order = nil
		}
		*last = translation{out, created}
		if t.state == nil {
			for _, svc := range out {
				first = append(first, model.ServiceEntry{Key: svc.Frontend, Svc: svc})
			}
		}
	}
	switch {
	case t.state == nil:
		t.buildFrom(first)
		r.Conflicts = t.conflicts
	case r.Changed > 0:
		if !t.patch(changes) {
			t.build()
		}
		r.Conflicts = t.conflicts
	}
	if p.cidrsChanged {
		// A new state for the CIDRs alone: the last one's frontends,
		// none changed, so the reconciler looks at none of them.
		r.ServiceCIDRsChanged = true
		t.stateCIDRs, t.stateHasCIDRs = p.cidrs, true
		if t.state == before {
			t.state = &model.State{Services: t.state.Services, Gen: model.NewGeneration(), BaseGen: t.state.Gen}
		}
	}
	if t.state != before {
		t.state.ServiceCIDRs, t.state.HasServiceCIDRs = t.stateCIDRs, t.stateHasCIDRs
		// Every new state lists its conflicts, one for the CIDRs alone
		// too (the last state's): the source forgets those a new
		// state does not list, and would report them again.
		r.Conflicts = t.conflicts
	}
	r.State = t.state
	return r
}

// change is a Service whose translation changed from prev to out.
type change struct {
	key       types.NamespacedName
	prev, out []*model.Service
}

// patch makes the new state from the last one by replacing the frontends of
// the changed Services: what build would make, at the cost of what changed
// instead of a walk of every Service. That holds while no conflict involves
// them; if one does, or would, patch reports false and does nothing.
// Scenario: one endpoint of one of 30,000 Services changes; the state is
// the last one with that Service's frontends replaced, and shares all the
// rest with it (model.Services copies the paths to the changed frontends
// only: the last state does not change, and the cost does not grow with
// the number of Services).
func (t *Tracker) patch(changes []change) bool {
	for _, c := range t.conflicts {
		for _, ch := range changes {
			if sameService(c.Winner, ch.key) || sameService(c.Loser, ch.key) {
				return false
			}
		}
	}
	st := t.state.Services.Edit()
	var touched []model.L4Addr
	for _, ch := range changes {
		for _, svc := range ch.prev {
			if cur := st.Get(svc.Frontend); cur != nil && sameService(cur.Name, ch.key) {
				st.Delete(svc.Frontend)
				touched = append(touched, svc.Frontend)
			}
		}
	}
	for _, ch := range changes {
		for _, svc := range ch.out {
			if st.Has(svc.Frontend) {
				return false // a new conflict
			}
			st.Set(svc.Frontend, svc)
			touched = append(touched, svc.Frontend)
		}
	}
	// The reconciler then looks at these frontends only (model.State).
	slices.SortFunc(touched, model.L4Addr.Compare)
	t.state = &model.State{Services: st.Services(), Gen: model.NewGeneration(), BaseGen: t.state.Gen,
		Changed: slices.Compact(touched)}
	return true
}

// build makes the desired state from every Service's last translation.
// A frontend claimed by several Services goes to the one that holds it in
// the last state, if it still claims it, else to the first by the rule of
// the package comment (claimant.before), which does not depend on the
// order Services are visited in.
//
// Most states have no frontend claimed twice: build then makes the state
// in one pass (model.BuildServices), in the order of t.inputs, without
// sorting the Services by name, which only the conflicts' report needs.
// If a frontend is claimed twice, it builds the state again by
// resolveClaims.
func (t *Tracker) build() {
	ents := make([]model.ServiceEntry, 0, t.nfrontends)
	t.mu.Lock()
	for _, in := range t.inputs {
		for _, svc := range in.translation.services {
			ents = append(ents, model.ServiceEntry{Key: svc.Frontend, Svc: svc})
		}
	}
	t.mu.Unlock()
	t.buildFrom(ents)
}

// buildFrom is build with the frontends of every Service's last
// translation given, in any order.
func (t *Tracker) buildFrom(ents []model.ServiceEntry) {
	if s, ok := model.BuildServices(ents); ok {
		t.conflicts = nil
		t.state = &model.State{Services: s, Gen: model.NewGeneration()}
		return
	}
	t.resolveClaims()
}

// resolveClaims is build for a state in which a frontend is claimed
// twice: it sets the frontends one by one, in Service order, each
// contested one to the claimant that wins it.
func (t *Tracker) resolveClaims() {
	if t.order == nil {
		t.order = make([]translated, 0, t.ntranslated)
		t.mu.Lock()
		for k, in := range t.inputs {
			if in.translation.services != nil {
				t.order = append(t.order, translated{k, in})
			}
		}
		t.mu.Unlock()
		slices.SortFunc(t.order, func(a, b translated) int { return compareNames(a.key, b.key) })
	}
	var prev model.Services
	if t.state != nil {
		prev = t.state.Services
	}
	var b model.ServicesBuilder
	t.conflicts = nil
	// The ranks of the Services in st, for the contested frontends only.
	var holder map[model.L4Addr]*claimant
	contested := false
	for _, o := range t.order {
		for _, svc := range o.in.translation.services {
			cur := b.Get(svc.Frontend)
			if cur == nil {
				b.Set(svc.Frontend, svc)
				continue
			}
			contested = true
			if holder == nil {
				holder = map[model.L4Addr]*claimant{}
			}
			c := holder[svc.Frontend]
			if c == nil {
				c = t.claimant(cur, prev)
			}
			if nc := t.claimant(svc, prev); t.before(nc, c) {
				c = nc
				b.Set(svc.Frontend, svc)
			}
			holder[svc.Frontend] = c
		}
	}
	st := &model.State{Services: b.Services(), Gen: model.NewGeneration()}
	if contested {
		// Every claim that lost, in Service order.
		for _, o := range t.order {
			for _, svc := range o.in.translation.services {
				if w := st.Services.Get(svc.Frontend); w != svc {
					t.conflicts = append(t.conflicts, Conflict{Frontend: svc.Frontend, Winner: w.Name, Loser: svc.Name})
				}
			}
		}
	}
	t.state = st
}

// claimant is a Service port claiming a contested frontend, ranked.
type claimant struct {
	svc     *model.Service
	holder  bool // it holds the frontend in the last state
	held    int8 // the datapath holds the frontend as it asks: 1 yes, -1 no, 0 not asked yet
	created time.Time
}

func (t *Tracker) claimant(svc *model.Service, prev model.Services) *claimant {
	t.mu.Lock()
	in := t.inputs[types.NamespacedName{Namespace: svc.Name.Namespace, Name: svc.Name.Name}]
	t.mu.Unlock()
	c := &claimant{svc: svc}
	if in != nil {
		c.created = in.translation.created
	}
	if p := prev.Get(svc.Frontend); p != nil && p.Name == svc.Name {
		c.holder = true
	}
	return c
}

// isHeld asks (once) whether the datapath holds c's frontend as c asks.
func (t *Tracker) isHeld(c *claimant) bool {
	if c.held == 0 {
		c.held = -1
		if t.holds != nil && t.holds(c.svc) {
			c.held = 1
		}
	}
	return c.held > 0
}

// before reports whether c wins the frontend over d: the holder, then the
// one the datapath holds, then the oldest, then the first by name.
func (t *Tracker) before(c, d *claimant) bool {
	if c.holder != d.holder {
		return c.holder
	}
	if !c.holder {
		if ch, dh := t.isHeld(c), t.isHeld(d); ch != dh {
			return ch
		}
	}
	if !c.created.Equal(d.created) {
		switch {
		case c.created.IsZero():
			return false
		case d.created.IsZero():
			return true
		}
		return c.created.Before(d.created)
	}
	a, b := c.svc.Name, d.svc.Name
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name), cmp.Compare(a.Port, b.Port)) < 0
}

// sameService reports whether a port of a Service is of the Service key.
func sameService(n model.ServicePortName, key types.NamespacedName) bool {
	return n.Namespace == key.Namespace && n.Name == key.Name
}

func compareNames(a, b types.NamespacedName) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
}

// Issues returns what stands in the way of the objects as they are now,
// sorted by Service: the Services whose last translation failed (they
// keep the one before), those deliberately not served, and the frontends
// claimed twice in the state of the last Sync.
func (t *Tracker) Issues() (errs []ServiceError, skipped []Skipped, conflicts []Conflict) {
	for k, err := range t.errs {
		errs = append(errs, ServiceError{k, err})
	}
	slices.SortFunc(errs, func(a, b ServiceError) int { return compareNames(a.Service, b.Service) })
	for k, why := range t.skipped {
		skipped = append(skipped, Skipped{k, why})
	}
	slices.SortFunc(skipped, func(a, b Skipped) int { return compareNames(a.Service, b.Service) })
	return errs, skipped, t.conflicts
}

// Warnings returns what of the Services, as they are now, is not served as
// asked, sorted by Service.
func (t *Tracker) Warnings() []Warning {
	var out []Warning
	for _, k := range slices.SortedFunc(maps.Keys(t.warnings), compareNames) {
		for _, w := range t.warnings[k] {
			out = append(out, Warning{k, w})
		}
	}
	return out
}

// Node returns the node translations are for, as SetNode last set it.
func (t *Tracker) Node() translate.Node {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.node
}
