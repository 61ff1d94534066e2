// Package kube is the Kubernetes source: it watches Services, EndpointSlices
// (discovery.k8s.io/v1) and this node's Node object with shared informers and
// feeds them to pkg/source/tracker, the change tracker the manifest source
// feeds too.
//
// The flow is kube-proxy's: informer events go to the tracker, which folds a
// burst of updates into net changes per Service; a bounded-frequency runner
// coalesces syncs between MinSyncPeriod and SyncPeriod; each sync translates
// only the dirty Services and hands the whole desired state to the agent,
// whose reconciler writes only the differences. The agent retries a failed
// apply and tells the source when a state is programmed (Programmed), which
// is when the network programming latency of the changes it brought is
// taken: of the slices changed after New, which makes the tracker before
// any informer runs (the tracker drops older trigger times, as kube-proxy's
// EndpointsChangeTracker those before its creation).
//
// Nothing is handed over until the Service, EndpointSlice and Node caches
// have synced: an agent that restarts while the API server is slow keeps the
// services its pinned maps hold rather than programming an empty world.
//
// It also follows the ServiceCIDR objects (networking.k8s.io/v1), whose
// union with Config.ServiceCIDRs every state carries as its service CIDRs
// (servicecidrs.go); their cache is waited for too, when the API server
// serves them.
//
// The source also keeps what kube-proxy's health server needs (KEP-3836):
// how long the oldest change read from the API has waited to be programmed
// (OldestPending: /livez fails once that is too long), and whether this Node
// is going away or missing (being deleted, tainted
// ToBeDeletedByClusterAutoscaler, deleted, or not found once the caches
// synced: /healthz fails, so load balancers drain the node), told to
// Config.Health.
package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	discoveryinformers "k8s.io/client-go/informers/discovery/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/source/tracker"
	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// Config configures a Source.
type Config struct {
	Client kubernetes.Interface
	// REST, if set, is the client configuration the EndpointSlices are
	// watched with, over a client of their own that reads each slice's
	// protobuf straight into what the cache keeps of it (restslices.go);
	// nil: through Client, decoded as any object (a fake clientset's
	// objects have no bytes). cmd/sluice sets it.
	REST *rest.Config
	// Options are the translation's; Options.Node.Name is the Node
	// watched. The Node object's labels replace Options.Node.Labels as
	// they change; Options.Node.Addresses, where NodePorts are served,
	// are the caller's, which SetNodeAddresses changes (they follow the
	// node's interfaces, not the Node object); Options.Node.IPs stay.
	Options translate.Options
	// MinSyncPeriod is the shortest time between two syncs: changes that
	// arrive faster are folded into one sync. SyncPeriod is the longest: a
	// full sync runs at least that often, repairing any drift of the maps.
	MinSyncPeriod, SyncPeriod time.Duration
	// ResyncPeriod is the informers' resync period (0: none).
	ResyncPeriod time.Duration
	// ObserveProgrammed, if set, is told when a state was programmed
	// (now) and the trigger times of the changes it brought: the network
	// programming latency (pkg/metrics.Metrics.ObserveProgrammed).
	ObserveProgrammed func(now time.Time, triggers []model.Trigger)
	Logger            *slog.Logger

	// Events, if set, records the Events on Services this node cannot
	// serve as asked (events.go); nil: the source sends events.k8s.io/v1
	// Events through Client.
	Events events.EventRecorder
	// Health, if set, is told when a state was programmed and whether
	// this Node is eligible for traffic (pkg/health.Proxier).
	Health Health
	// Changes, if set, is told of the changes read and synced
	// (pkg/metrics.Metrics: kube-proxy's change and last-queued metrics).
	Changes Changes

	// ServiceCIDRs are --service-cidr's: among the service CIDRs of every
	// state, beside the ServiceCIDR objects' (servicecidrs.go), alone
	// when the API server does not serve those.
	ServiceCIDRs []netip.Prefix

	// PodCIDRs, if set, are the Node's spec.podCIDRs the agent took at
	// start for its local traffic detector (--detect-local-mode
	// NodeCIDR). The datapath holds them from its start, so a Node seen
	// with others makes Run fail (a PodCIDRsChangedError), and the
	// DaemonSet restarts the agent, which takes the new ones: what
	// kube-proxy's node manager does (it exits). Re-programming the
	// node's CIDRs in place would be a write the reconciler does not
	// order.
	PodCIDRs []string
}

// PodCIDRsChangedError is Run's error when this Node's spec.podCIDRs are
// no longer those of Config.PodCIDRs.
type PodCIDRsChangedError struct {
	Node     string
	Old, New []string
}

func (e *PodCIDRsChangedError) Error() string {
	return fmt.Sprintf("node %s: spec.podCIDRs changed from %v to %v: exiting, to be restarted with the new ones (detect-local-mode NodeCIDR)",
		e.Node, e.Old, e.New)
}

// Health is what the source tells the health probes (pkg/health.Proxier).
type Health interface {
	// Updated is called when a state handed over was programmed.
	Updated()
	// SetNode says whether this Node may receive load balancers' traffic:
	// not when it is being deleted, is tainted
	// ToBeDeletedByClusterAutoscaler, or does not exist.
	SetNode(eligible bool, why string)
}

// Changes is what the source tells kube-proxy's change metrics
// (pkg/metrics.Metrics).
type Changes interface {
	// ObserveChange: a Service (service) or EndpointSlice event was
	// read; queued: it changed what is to be programmed.
	ObserveChange(service, queued bool)
	// ObserveQueued: a change asked for a sync at now (from the first
	// sync on, and once as the caches start syncing, as kube-proxy).
	ObserveQueued(now time.Time)
	// ObserveTaken: a sync took every change pending.
	ObserveTaken()
}

// toBeDeletedTaint is the taint the cluster autoscaler puts on a Node it is
// about to delete (pkg/health.ToBeDeletedTaint, kube-proxy's).
const toBeDeletedTaint = "ToBeDeletedByClusterAutoscaler"

// Source is the Kubernetes source. Create it with New; Run it once.
type Source struct {
	cfg     Config
	log     *slog.Logger
	tracker *tracker.Tracker
	runner  *runner
	apply   func(*model.State) // Run's, for the runner
	synced  atomic.Bool        // the caches synced and the first state was handed over

	// slimmer is the informers' transform (set by Run).
	slimmer *slimmer
	// decodes counts the slices the REST client decoded (Config.REST).
	decodes sliceDecodes

	// Owned by the sync goroutine: the last state handed over.
	state *model.State

	// handed lists the states handed over whose programming has not been
	// reported yet, oldest first, with the trigger times of the changes
	// each one brought. When the agent reports a state programmed, it and
	// every older state are done: a newer state holds all older changes.
	handedMu sync.Mutex
	handed   []handedState
	// What events.go needs: the recorder and the Service cache (set by
	// Run before any state is handed over), and under evMu the causes
	// reported.
	recorder events.EventRecorder
	services cache.Store // of *cachedService
	evMu     sync.Mutex
	emitted  map[eventKey]origin
	// nodeUID is this node's Node's UID (a types.UID), once its
	// informer saw it: the events about the node name it.
	nodeUID atomic.Value
	// cidrs are the service CIDRs (servicecidrs.go); lastCIDRs, owned
	// by the sync goroutine, the last ones logged.
	cidrs     *serviceCIDRs
	lastCIDRs []netip.Prefix

	// queued is when the oldest change not yet taken by a sync arrived
	// (zero: none); counted from the first sync on, as kube-proxy counts
	// from its initialisation.
	queued time.Time

	// nodeMu serializes what Health is told of this node's eligibility:
	// onNode's verdict, and Run's "not found" once the caches synced. Run
	// holds it from its look at the Node cache to its SetNode, so that a
	// Node created in between (its onNode waits) is not overwritten as
	// missing: with no resync, it would stay so until its next update.
	nodeMu sync.Mutex
	// nodeChecked, when set (by tests), is called between Run's finding
	// no Node in the cache and its telling Health so.
	nodeChecked func()

	// fail ends Run with an error (set by Run: nil before).
	fail func(error)

	// reserved makes the tracker room for the first lists, once
	// (reserve), with reserveTracker (the tracker's Reserve; tests
	// watch it).
	reserved       sync.Once
	reserveTracker func(services, slices int)
}

type handedState struct {
	state    *model.State
	triggers []model.Trigger
	// queued is when the oldest change this state brought arrived (zero:
	// none, or it was programmed).
	queued time.Time
}

// maxHanded bounds handed when nobody reports programmed states.
const maxHanded = 64

// New returns a Source. It does not talk to the API server until Run.
func New(cfg Config) (*Source, error) {
	if cfg.Client == nil {
		return nil, errors.New("kube source: no client")
	}
	if cfg.Options.Node.Name == "" {
		return nil, errors.New("kube source: no node name")
	}
	if cfg.SyncPeriod <= 0 {
		cfg.SyncPeriod = 30 * time.Second
	}
	if cfg.MinSyncPeriod < 0 || cfg.MinSyncPeriod > cfg.SyncPeriod {
		return nil, fmt.Errorf("kube source: min sync period %v outside [0, %v]", cfg.MinSyncPeriod, cfg.SyncPeriod)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Source{cfg: cfg, log: cfg.Logger.With("source", "kube"), tracker: tracker.New(cfg.Options),
		emitted: map[eventKey]origin{}, cidrs: newServiceCIDRs(cfg.ServiceCIDRs)}
	s.reserveTracker = s.tracker.Reserve
	// Made here, not in Run: SetNodeAddresses may request a sync from
	// another goroutine before Run starts (it runs once the caches
	// synced, with Run's apply).
	s.runner = newRunner(func(periodic bool) { s.syncOnce(s.apply, periodic) },
		cfg.MinSyncPeriod, cfg.SyncPeriod)
	return s, nil
}

// handOver records that st, carrying the changes of triggers that arrived
// from queued on, was handed to the caller.
func (s *Source) handOver(st *model.State, triggers []model.Trigger, queued time.Time) {
	s.handedMu.Lock()
	defer s.handedMu.Unlock()
	if n := len(s.handed); n > 0 && s.handed[n-1].state == st {
		h := &s.handed[n-1]
		h.triggers = append(h.triggers, triggers...)
		h.queued = earliest(h.queued, queued)
		return
	}
	s.handed = append(s.handed, handedState{st, triggers, queued})
	if len(s.handed) > maxHanded {
		// The dropped states' changes are still pending: the oldest
		// kept state carries their wait.
		drop := len(s.handed) - maxHanded
		for _, h := range s.handed[:drop] {
			s.handed[drop].queued = earliest(s.handed[drop].queued, h.queued)
		}
		s.handed = s.handed[drop:]
	}
}

// earliest returns the earlier of two times, zero meaning none.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// queue records that a change arrived now, after the first sync.
func (s *Source) queue() {
	if !s.synced.Load() {
		return // starting: healthy until the first state is handed over
	}
	now := time.Now()
	s.handedMu.Lock()
	s.queued = earliest(s.queued, now)
	s.handedMu.Unlock()
	if s.cfg.Changes != nil {
		s.cfg.Changes.ObserveQueued(now)
	}
}

// takeQueued returns when the oldest change not yet synced arrived, and
// forgets it: the sync taking it hands it over (or finds it nets to
// nothing).
func (s *Source) takeQueued() time.Time {
	if s.cfg.Changes != nil {
		s.cfg.Changes.ObserveTaken()
	}
	s.handedMu.Lock()
	defer s.handedMu.Unlock()
	q := s.queued
	s.queued = time.Time{}
	return q
}

// OldestPending returns when the oldest change read from the API that is
// not programmed yet arrived (zero: none): a change not synced yet, or in a
// state handed over whose programming was not reported. Its age is how
// stale the datapath is (pkg/health.Proxier, /livez).
func (s *Source) OldestPending() time.Time {
	s.handedMu.Lock()
	defer s.handedMu.Unlock()
	oldest := s.queued
	for _, h := range s.handed {
		oldest = earliest(oldest, h.queued)
	}
	return oldest
}

// Programmed tells the source that st reached the maps: the changes of st
// and of every state handed over before it are live. The agent calls it
// after every successful apply.
func (s *Source) Programmed(st *model.State) {
	now := time.Now()
	s.handedMu.Lock()
	i := len(s.handed) - 1
	for ; i >= 0 && s.handed[i].state != st; i-- {
	}
	if i < 0 {
		s.handedMu.Unlock()
		return // not ours, or already reported
	}
	var triggers []model.Trigger
	for _, h := range s.handed[:i+1] {
		triggers = append(triggers, h.triggers...)
	}
	// Keep st itself (with no triggers left) so a re-apply of it is
	// recognised and costs nothing.
	s.handed = append([]handedState{{state: st}}, s.handed[i+1:]...)
	s.handedMu.Unlock()
	if s.cfg.Health != nil {
		s.cfg.Health.Updated()
	}
	if s.cfg.ObserveProgrammed != nil {
		s.cfg.ObserveProgrammed(now, triggers)
	}
}

// SetHolds tells the change tracker what the datapath holds, to settle a
// frontend claimed twice after a restart (agent.HoldsSource). Call it
// before Run.
func (s *Source) SetHolds(holds func(*model.Service) bool) { s.tracker.SetHolds(holds) }

// SliceDecodes returns how many EndpointSlices the source's own client
// decoded (Config.REST): fast, straight from their protobuf into the
// cache's form; standard, decoded as any object first (declined by the
// fast path, bookmarks, JSON answers). Both zero without Config.REST.
func (s *Source) SliceDecodes() (fast, standard int64) {
	return s.decodes.fast.Load(), s.decodes.standard.Load()
}

// Synced reports whether the caches have synced and the first state has
// been handed over: the readiness of a node proxy.
func (s *Source) Synced() bool { return s.synced.Load() }

// Run satisfies the agent's Source interface: it watches the API until ctx
// is done, calling apply with the desired state after every folded change
// and at least every SyncPeriod. apply must not block; the agent applies
// the state, retries failures and records sync metrics (its Observer). It
// returns nil when ctx is done, or an error if the informers could not be
// set up, or this Node's podCIDRs changed (Config.PodCIDRs).
func (s *Source) Run(ctx context.Context, apply func(*model.State)) (err error) {
	parent := ctx
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	s.fail = cancel
	defer func() {
		// A failure cancelled ctx: that, not the caller, ended the run.
		if cause := context.Cause(ctx); err == nil && parent.Err() == nil && cause != nil && !errors.Is(cause, context.Canceled) {
			err = cause
		}
	}()

	nodeName := s.cfg.Options.Node.Name
	s.slimmer = newSlimmer()
	factory := informers.NewSharedInformerFactoryWithOptions(s.cfg.Client, s.cfg.ResyncPeriod, informers.WithTransform(s.slimmer.slim))
	nodeFactory := informers.NewSharedInformerFactoryWithOptions(s.cfg.Client, s.cfg.ResyncPeriod,
		informers.WithTransform(s.slimmer.slim),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", nodeName).String()
		}))
	// Shutdown waits for the informer goroutines; it runs after cancel.
	defer nodeFactory.Shutdown()
	defer factory.Shutdown()
	defer cancel(nil)

	// The Services and EndpointSlices without the namespace index the
	// factory's informers keep: a set of keys per namespace, which
	// nothing here looks up (the events' lister gets Services by key).
	// Headless ones are not listed (selectors.go).
	factory.InformerFor(&corev1.Service{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		return coreinformers.NewFilteredServiceInformer(c, metav1.NamespaceAll, resync, cache.Indexers{}, selectServices)
	})
	if s.cfg.REST != nil {
		s.decodes.firstFast = func() { s.log.Info(firstFastLog) }
		rc, err := newSliceClient(s.cfg.REST, s.slimmer, &s.decodes)
		if err != nil {
			return err
		}
		factory.InformerFor(&discoveryv1.EndpointSlice{}, func(_ kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
			return newSliceInformer(rc, resync, selectSlices)
		})
	} else {
		factory.InformerFor(&discoveryv1.EndpointSlice{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
			return discoveryinformers.NewFilteredEndpointSliceInformer(c, metav1.NamespaceAll, resync, cache.Indexers{}, selectSlices)
		})
	}

	s.apply = apply
	s.services = factory.Core().V1().Services().Informer().GetStore()
	s.recorder = s.cfg.Events
	if s.recorder == nil {
		rec, stop, err := s.newEventRecorder(ctx)
		if err != nil {
			return err
		}
		// Deferred last, so runs first on return: the broadcaster
		// stops before the informers (an event still queued then is
		// dropped; the next agent reports the cause again).
		defer stop()
		s.recorder = rec
	}

	sliceStore := factory.Discovery().V1().EndpointSlices().Informer().GetStore()
	reserve := func() { s.reserve(s.services, sliceStore) }
	svcReg, err := factory.Core().V1().Services().Informer().AddEventHandler(initialHandler(reserve, s.onService))
	if err != nil {
		return fmt.Errorf("watch services: %w", err)
	}
	sliceReg, err := factory.Discovery().V1().EndpointSlices().Informer().AddEventHandler(initialHandler(reserve, s.onSlice))
	if err != nil {
		return fmt.Errorf("watch endpointslices: %w", err)
	}
	nodeReg, err := nodeFactory.Core().V1().Nodes().Informer().AddEventHandler(handler(s.onNode))
	if err != nil {
		return fmt.Errorf("watch node %s: %w", nodeName, err)
	}
	if s.cfg.Changes != nil {
		// kube-proxy's SyncLoop "synthesizes" a change queued as the
		// informers start syncing.
		s.cfg.Changes.ObserveQueued(time.Now())
	}
	factory.Start(ctx.Done())
	nodeFactory.Start(ctx.Done())

	s.log.Info("waiting for caches to sync")
	start := time.Now()
	// The registrations' HasSynced, not the informers': it turns true only
	// once our handlers have seen every object of the initial list.
	if !cache.WaitForCacheSync(ctx.Done(), svcReg.HasSynced, sliceReg.HasSynced, nodeReg.HasSynced) {
		return nil // ctx done before the caches synced: nothing was programmed
	}
	// The ServiceCIDRs once the others are read: an API server that
	// has just started answers 403 to every request until its RBAC
	// cache is filled, so a 403 means a missing permission only once
	// the same role was granted the other lists (servicecidrs.go).
	cidrSynced, err := s.followServiceCIDRs(ctx, factory)
	if err != nil {
		return err
	}
	if cidrSynced != nil && !cache.WaitForCacheSync(ctx.Done(), cidrSynced) {
		return nil
	}
	if ctx.Err() != nil {
		return nil
	}
	s.log.Info("caches synced", "after", time.Since(start).Round(time.Millisecond))
	s.reportStarting() // proxyevents.go
	if s.cfg.Health != nil {
		s.nodeMu.Lock()
		if len(nodeFactory.Core().V1().Nodes().Informer().GetStore().ListKeys()) == 0 {
			// No Node by this name: not eligible, as kube-proxy's
			// NodeEligible with no Node; its creation makes it so
			// (onNode, after this under nodeMu).
			if s.nodeChecked != nil {
				s.nodeChecked()
			}
			s.cfg.Health.SetNode(false, "node "+nodeName+" not found")
		}
		s.nodeMu.Unlock()
	}
	// The first state carries the service CIDRs even if no ServiceCIDR
	// object named any (the flag's alone, or none).
	s.publishServiceCIDRs("", nil)
	s.runner.Request()
	s.runner.Loop(ctx)
	return nil
}

func (s *Source) request(changed bool) {
	if changed {
		s.queue()
		s.runner.Request()
	}
}

// objectOf unwraps the tombstone a delete event may carry.
func objectOf(obj any) any {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return t.Obj
	}
	return obj
}

// onService hands the tracker what a translation reads of a Service: the
// cache holds nothing else (slimmer).
func (s *Source) onService(old, obj any, deleted bool) {
	if svc, ok := objectOf(obj).(*cachedService); ok {
		o, _ := old.(*cachedService)
		s.followService(o, svc, deleted) // events.go: before the tracker sees it
	}
	onObject(s, obj, deleted, true, true, func(key types.NamespacedName, svc *cachedService) bool {
		if svc == nil {
			return s.tracker.SetCompactService(key, nil)
		}
		return s.tracker.SetCompactService(key, &svc.Service)
	})
}

// onSlice hands the tracker what a translation reads of a slice: the cache
// holds nothing else (slimmer).
func (s *Source) onSlice(_, obj any, deleted bool) {
	var trigger string
	counted := true
	if es, ok := objectOf(obj).(*cachedSlice); ok {
		trigger = s.slimmer.takeTrigger(es) // forgotten for a deleted slice too
		// kube-proxy's endpoint change trackers drop a slice of
		// addressType FQDN before counting it (no proxier serves one).
		counted = es.AddressType != discoveryv1.AddressTypeFQDN
	}
	onObject(s, obj, deleted, false, counted, func(key types.NamespacedName, es *cachedSlice) bool {
		if es == nil {
			return s.tracker.SetCompactSlice(key, nil, trigger)
		}
		return s.tracker.SetCompactSlice(key, &es.Slice, trigger)
	})
}

// onObject hands a Service (service) or an EndpointSlice to set under its
// name: the object as it is now, or nil once it is deleted; counted: the
// event is one of kube-proxy's change metrics (Config.Changes).
func onObject[T any, P interface {
	*T
	metav1.Object
}](s *Source, obj any, deleted, service, counted bool, set func(types.NamespacedName, P) bool) {
	o, ok := objectOf(obj).(P)
	if !ok {
		return
	}
	key := types.NamespacedName{Namespace: o.GetNamespace(), Name: o.GetName()}
	if deleted {
		o = nil
	}
	changed := set(key, o)
	if s.cfg.Changes != nil && counted {
		s.cfg.Changes.ObserveChange(service, changed)
	}
	s.request(changed)
}

// onNode follows the labels of this node's Node object, and whether it is
// going away.
func (s *Source) onNode(_, obj any, deleted bool) {
	node, ok := objectOf(obj).(*corev1.Node)
	if !ok || node.Name != s.cfg.Options.Node.Name {
		return
	}
	if !deleted {
		s.nodeUID.Store(node.UID)
		if want := s.cfg.PodCIDRs; len(want) > 0 && !slices.Equal(node.Spec.PodCIDRs, want) {
			err := &PodCIDRsChangedError{Node: node.Name, Old: want, New: node.Spec.PodCIDRs}
			s.log.Error("the node's podCIDRs changed", "node", node.Name, "old", want, "new", node.Spec.PodCIDRs)
			s.fail(err)
			return
		}
	}
	if s.cfg.Health != nil {
		s.nodeMu.Lock()
		eligible, why := nodeEligible(node, deleted)
		s.cfg.Health.SetNode(eligible, why)
		s.nodeMu.Unlock()
	}
	if deleted {
		// The last labels stay, as kube-proxy's node topology handler
		// ignores deletes: the zone hints keep steering to this zone
		// while the node's pods are still served.
		return
	}
	s.request(s.tracker.SetNodeLabels(node.Labels))
}

// SetNodeAddresses changes the addresses NodePorts are served on
// (Options.Node.Addresses; addrs are kept, not copied): the next sync
// re-translates the Services that read them. It may be called from any
// goroutine, before Run too.
func (s *Source) SetNodeAddresses(addrs []netip.Addr) {
	s.request(s.tracker.SetNodeAddresses(addrs))
}

// handler routes an informer's adds, updates and deletes to on, which is
// told the version the cache held before an update (nil otherwise) and
// whether the object went.
func handler(on func(old, obj any, deleted bool)) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { on(nil, obj, false) },
		UpdateFunc: func(old, obj any) { on(old, obj, false) },
		DeleteFunc: func(obj any) { on(nil, obj, true) },
	}
}

// initialHandler is handler, calling first before the first object of an
// informer's initial list is handed on.
func initialHandler(first func(), on func(old, obj any, deleted bool)) cache.ResourceEventHandlerDetailedFuncs {
	h := handler(on)
	return cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj any, initial bool) {
			if initial {
				first()
			}
			h.AddFunc(obj)
		},
		UpdateFunc: h.UpdateFunc,
		DeleteFunc: h.DeleteFunc,
	}
}

// reserve makes the tracker room for the first lists, once, before the
// first object of either is handed to it: as many Services and slices as
// the informers' stores hold then. An informer hands its initial list on
// only once its store holds all of it; the other's may not yet, and then
// as many as the first's are reserved for it (a Service has one slice,
// most often). Grown an entry at a time, the tracker's maps leave their
// smaller tables behind as garbage and rehash what they hold at each
// growth (Tracker.Reserve).
func (s *Source) reserve(services, slices cache.Store) {
	s.reserved.Do(func() {
		nSvc, nSlice := len(services.ListKeys()), len(slices.ListKeys())
		if nSvc == 0 {
			nSvc = nSlice
		}
		if nSlice == 0 {
			nSlice = nSvc
		}
		s.reserveTracker(nSvc, nSlice)
	})
}

// nodeEligible says whether load balancers should keep sending traffic to
// this node (kube-proxy's SyncNode): not once its Node is being deleted or
// is tainted ToBeDeletedByClusterAutoscaler. A Node object already gone is
// not eligible either: a deliberate difference, kube-proxy v1.36 keeps the
// last copy of a deleted Node (its OnNodeDelete only logs), so a Node
// deleted without finalizers, never seen with a deletionTimestamp, stays
// eligible there while the cluster forgets the node and its pods. Here no
// Node is ineligible whether it never existed (as in kube-proxy) or went.
func nodeEligible(node *corev1.Node, deleted bool) (bool, string) {
	switch {
	case deleted:
		return false, "node " + node.Name + " deleted"
	case node.DeletionTimestamp != nil:
		return false, "node " + node.Name + " is being deleted"
	}
	for _, t := range node.Spec.Taints {
		if t.Key == toBeDeletedTaint {
			return false, "node " + node.Name + " is tainted " + toBeDeletedTaint
		}
	}
	return true, ""
}

// syncOnce translates what changed and hands the state to apply. periodic
// says no change is pending: the state is handed over anyway, so the
// reconciler re-checks the maps against it.
func (s *Source) syncOnce(apply func(*model.State), periodic bool) {
	start := time.Now()
	queued := s.takeQueued()
	r := s.tracker.Sync()
	for _, e := range r.Errors {
		s.log.Warn("service not translated", "service", e.Service, "err", e.Err)
	}
	for _, sk := range r.Skipped {
		s.log.Debug("service skipped", "service", sk.Service, "reason", sk.Reason)
	}
	for _, w := range r.Warnings {
		s.log.Warn("service not served as asked", "service", w.Service, "reason", w.Message)
	}
	for _, c := range r.Conflicts {
		s.log.Warn("frontend claimed twice", "conflict", c.String())
	}
	s.reportSync(r, r.State != s.state)
	if r.ServiceCIDRsChanged {
		s.logServiceCIDRs(r.State.ServiceCIDRs)
	}
	if r.Changed == 0 && !r.ServiceCIDRsChanged && !periodic && s.state != nil {
		return // net change: none
	}
	s.state = r.State
	// Handed over before apply returns: the agent may report the state
	// programmed before apply returns.
	s.handOver(s.state, r.Triggers, queued)
	apply(s.state)
	if !s.synced.Swap(true) {
		s.log.Info("first sync done", "services", s.state.Services.Len())
	}
	s.log.Debug("synced", "changed", r.Changed, "periodic", periodic,
		"frontends", s.state.Services.Len(), "took", time.Since(start))
}
