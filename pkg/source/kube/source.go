// Package kube is the Kubernetes source: it watches Services, EndpointSlices
// (discovery.k8s.io/v1) and this node's Node object with shared informers and
// feeds the same desired-state path as the manifest source.
//
// The flow is kube-proxy's: informer events go to a change tracker that folds
// a burst of updates into net changes per Service; a bounded-frequency runner
// coalesces syncs between MinSyncPeriod and SyncPeriod and retries failures
// with backoff; each sync translates only the dirty Services (through
// pkg/source/translate, like the manifest source) and hands the whole desired state to
// the caller, whose reconciler writes only the differences.
//
// Nothing is handed over until the Service, EndpointSlice and Node caches
// have synced: an agent that restarts while the API server is slow keeps the
// services its pinned maps hold rather than programming an empty world.
package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/sluice-lb/sluice/pkg/metrics"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// TranslateFunc turns one Service and its EndpointSlices into model services
// (pkg/translate.ServiceToModel with this node's options bound). skipped says why
// a Service produced nothing, when it deliberately did (ExternalName, another
// proxy's service, headless).
type TranslateFunc func(node *corev1.Node, svc *corev1.Service, slices []*discoveryv1.EndpointSlice) (svcs []*model.Service, skipped string, err error)

// Config configures a Source.
type Config struct {
	Client   kubernetes.Interface
	NodeName string
	// Translate translates one Service; see TranslateFunc.
	Translate TranslateFunc
	// MinSyncPeriod is the shortest time between two syncs: changes that
	// arrive faster are folded into one sync. SyncPeriod is the longest: a
	// full sync runs at least that often, repairing any drift of the maps.
	MinSyncPeriod, SyncPeriod time.Duration
	// ResyncPeriod is the informers' resync period (0: none).
	ResyncPeriod time.Duration
	// Metrics, if set, records sync durations, errors, programming latency
	// and the programmed counts.
	Metrics *metrics.Metrics
	Logger  *slog.Logger
}

// Source is the Kubernetes source. Create it with New; Run it once.
type Source struct {
	cfg     Config
	log     *slog.Logger
	tracker *tracker
	runner  *runner
	synced  atomic.Bool // the caches synced and the first sync succeeded

	// Owned by the sync goroutine: the last state built, and whether
	// handing it over failed (a retry must hand it over again).
	state  *model.State
	failed bool

	// handed lists the states handed over whose programming has not been
	// reported yet, oldest first, with the trigger times of the changes
	// each one brought. When the agent reports a state programmed, it and
	// every older state are done: a newer state holds all older changes.
	handedMu sync.Mutex
	handed   []handedState
}

type handedState struct {
	state    *model.State
	triggers []time.Time
}

// maxHanded bounds handed when nobody reports programmed states.
const maxHanded = 64

// New returns a Source. It does not talk to the API server until Run.
func New(cfg Config) (*Source, error) {
	if cfg.Client == nil {
		return nil, errors.New("kube source: no client")
	}
	if cfg.Translate == nil {
		return nil, errors.New("kube source: no translate function")
	}
	if cfg.NodeName == "" {
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
	s := &Source{cfg: cfg, log: cfg.Logger.With("source", "kube"), tracker: newTracker()}
	if cfg.Metrics != nil {
		cfg.Metrics.OnProgrammed(s.programmed)
	}
	return s, nil
}

// handOver records that st, carrying the changes of triggers, was handed
// to the caller.
func (s *Source) handOver(st *model.State, triggers []time.Time) {
	s.handedMu.Lock()
	defer s.handedMu.Unlock()
	if n := len(s.handed); n > 0 && s.handed[n-1].state == st {
		s.handed[n-1].triggers = append(s.handed[n-1].triggers, triggers...)
		return
	}
	s.handed = append(s.handed, handedState{st, triggers})
	if len(s.handed) > maxHanded {
		s.handed = s.handed[len(s.handed)-maxHanded:]
	}
}

// programmed is called (through metrics.OnProgrammed) when st reached the
// maps: the changes of st and of every state handed before it are live.
func (s *Source) programmed(st *model.State) {
	now := time.Now()
	s.handedMu.Lock()
	i := len(s.handed) - 1
	for ; i >= 0 && s.handed[i].state != st; i-- {
	}
	if i < 0 {
		s.handedMu.Unlock()
		return // not ours, or already reported
	}
	var triggers []time.Time
	for _, h := range s.handed[:i+1] {
		triggers = append(triggers, h.triggers...)
	}
	// Keep st itself (with no triggers left) so a re-apply of it is
	// recognised and costs nothing.
	s.handed = append([]handedState{{state: st}}, s.handed[i+1:]...)
	s.handedMu.Unlock()
	s.cfg.Metrics.ObserveProgrammed(now, triggers)
}

// Synced reports whether the caches have synced and the first sync has
// been applied: the readiness of a node proxy.
func (s *Source) Synced() bool { return s.synced.Load() }

// Run satisfies the agent's Source interface: apply is called with every
// new desired state and must not block; the agent applies it, retries
// failures, and records sync metrics (its Observer). The network
// programming latency is recorded when the agent reports the state
// programmed (metrics.Metrics.SetProgrammed).
func (s *Source) Run(ctx context.Context, apply func(*model.State)) error {
	return s.run(ctx, func(st *model.State) error { apply(st); return nil }, false)
}

// RunSync watches the API until ctx is done, calling sync with the desired
// state after every folded change and at least every SyncPeriod. A sync that
// fails is retried with backoff. It returns nil when ctx is done, or an error
// if the informers could not be set up.
//
// With Config.Metrics set, RunSync records what the agent's Observer would:
// sync durations and errors, and the programmed state.
func (s *Source) RunSync(ctx context.Context, sync func(*model.State) error) error {
	return s.run(ctx, sync, true)
}

func (s *Source) run(ctx context.Context, sync func(*model.State) error, observe bool) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	factory := informers.NewSharedInformerFactoryWithOptions(s.cfg.Client, s.cfg.ResyncPeriod)
	nodeFactory := informers.NewSharedInformerFactoryWithOptions(s.cfg.Client, s.cfg.ResyncPeriod,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", s.cfg.NodeName).String()
		}))
	// Shutdown waits for the informer goroutines; it runs after cancel.
	defer nodeFactory.Shutdown()
	defer factory.Shutdown()
	defer cancel()

	s.runner = newRunner(func(periodic bool) error { return s.syncOnce(sync, periodic, observe) },
		s.cfg.MinSyncPeriod, s.cfg.SyncPeriod)

	svcReg, err := factory.Core().V1().Services().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.onService(obj, false) },
		UpdateFunc: func(_, obj any) { s.onService(obj, false) },
		DeleteFunc: func(obj any) { s.onService(obj, true) },
	})
	if err != nil {
		return fmt.Errorf("watch services: %w", err)
	}
	sliceReg, err := factory.Discovery().V1().EndpointSlices().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.onSlice(nil, obj, false) },
		UpdateFunc: func(old, obj any) { s.onSlice(old, obj, false) },
		DeleteFunc: func(obj any) { s.onSlice(nil, obj, true) },
	})
	if err != nil {
		return fmt.Errorf("watch endpointslices: %w", err)
	}
	nodeReg, err := nodeFactory.Core().V1().Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.onNode(obj, false) },
		UpdateFunc: func(_, obj any) { s.onNode(obj, false) },
		DeleteFunc: func(obj any) { s.onNode(obj, true) },
	})
	if err != nil {
		return fmt.Errorf("watch node %s: %w", s.cfg.NodeName, err)
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
	s.log.Info("caches synced", "after", time.Since(start).Round(time.Millisecond))
	s.runner.Request()
	s.runner.Loop(ctx)
	return nil
}

func (s *Source) request(changed bool) {
	if changed && s.runner != nil {
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

func (s *Source) onService(obj any, deleted bool) {
	svc, ok := objectOf(obj).(*corev1.Service)
	if !ok {
		return
	}
	key := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	if deleted {
		svc = nil
	}
	s.request(s.tracker.setService(key, svc))
}

func (s *Source) onSlice(oldObj, obj any, deleted bool) {
	slice, ok := objectOf(obj).(*discoveryv1.EndpointSlice)
	if !ok {
		return
	}
	changed := false
	// A slice relabelled to another Service leaves its old one.
	if old, ok := oldObj.(*discoveryv1.EndpointSlice); ok {
		if oldKey, ok := translate.ServiceNameOfSlice(old); ok {
			if newKey, _ := translate.ServiceNameOfSlice(slice); newKey != oldKey {
				changed = s.tracker.setSlice(oldKey, old.Name, nil)
			}
		}
	}
	if key, ok := translate.ServiceNameOfSlice(slice); ok {
		if deleted {
			slice = nil
		}
		changed = s.tracker.setSlice(key, objectName(obj), slice) || changed
	}
	s.request(changed)
}

func objectName(obj any) string {
	if o, ok := objectOf(obj).(metav1.Object); ok {
		return o.GetName()
	}
	return ""
}

func (s *Source) onNode(obj any, deleted bool) {
	node, ok := objectOf(obj).(*corev1.Node)
	if !ok || node.Name != s.cfg.NodeName {
		return
	}
	if deleted {
		node = nil
	}
	s.request(s.tracker.setNode(node))
}

// syncOnce translates what changed and hands the state to sync. periodic
// says no change is pending: the state is handed over anyway, so the
// reconciler re-checks the maps against it.
func (s *Source) syncOnce(sync func(*model.State) error, periodic, observe bool) error {
	start := time.Now()
	pc := s.tracker.take()
	changed := 0
	for key, svc := range pc.services {
		var out []*model.Service
		if svc != nil {
			var skipped string
			var err error
			out, skipped, err = s.cfg.Translate(pc.node, svc, pc.slices[key])
			if err != nil {
				// A malformed Service must not stop the others: it
				// keeps its last good translation until it is fixed.
				s.log.Warn("service not translated", "service", key, "err", err)
				continue
			}
			if skipped != "" {
				s.log.Debug("service skipped", "service", key, "reason", skipped)
			}
		}
		if reflect.DeepEqual(out, s.tracker.translated[key]) {
			continue
		}
		changed++
		if len(out) == 0 {
			delete(s.tracker.translated, key)
		} else {
			s.tracker.translated[key] = out
		}
	}
	triggers := pc.triggers
	if changed == 0 && !periodic && !s.failed && s.state != nil {
		return nil // net change: none
	}
	if changed > 0 || s.state == nil {
		var conflicts []string
		s.state, conflicts = s.tracker.state()
		for _, c := range conflicts {
			s.log.Warn("frontend claimed twice", "conflict", c)
		}
	}
	m := s.cfg.Metrics
	if !observe {
		m = nil // the caller records syncs
	}
	// Handed over before sync returns: the agent may report the state
	// programmed before apply returns. After a failed RunSync sync, the
	// triggers wait in handed for a later state to be programmed.
	s.handOver(s.state, triggers)
	err := sync(s.state)
	if m != nil {
		m.ObserveSync(time.Since(start), err)
	}
	s.failed = err != nil
	if err != nil {
		s.log.Error("sync failed; retrying", "err", err)
		return err
	}
	if m != nil {
		m.SetProgrammed(s.state)
	}
	if !s.synced.Swap(true) {
		s.log.Info("first sync done", "services", len(s.state.Services))
	}
	s.log.Debug("synced", "changed", changed, "periodic", periodic,
		"frontends", len(s.state.Services), "took", time.Since(start))
	return nil
}
