package kube

// Kubernetes Events on the Services this node cannot serve as asked, so that
// whoever owns a Service sees why (kubectl describe service, kubectl events)
// without reading the agents' logs.
//
// Three places find such Services: translation (a Service that cannot be
// translated, or a part of one that is not served: an SCTP port, a
// loadBalancerSourceRanges entry that does not parse), the change tracker
// (two Services claiming one frontend: the loser is not served), and the
// reconciler (a frontend that does not fit in the maps, or cannot be
// represented in them), which the agent reports to its FailureObservers.
//
// Every agent of the cluster finds the same failures, so events are
// deduplicated hard: one event per Service and distinct cause (reason and
// note; for the reconciler's, reason alone: one event names the Service's
// ports that failed for it, so numbers in the error that change from one
// apply to the next report nothing new) for as long as the cause lasts. A
// cause is forgotten, and would be reported again, when it goes away: the
// reconciler's and the tracker's when a later report no longer has it,
// translation's when the Service's spec changes (its generation) or it is
// deleted. Repeats from the same agent within the recorder's window become
// a series (events.k8s.io/v1), not new objects.
//
// The reconciler's causes are bounded too: maps that are full leave out
// every Service that comes after them, thousands at once at scale, and an
// event each would queue thousands of requests behind the client's rate
// limit (a goroutine and two copies of the event each, in client-go's
// broadcaster) from every node. At most maxServiceEvents Services carry a
// reconciler's cause of one reason; past that, one event on this node's
// Node object says how many Services are left out and what to raise, as
// kube-proxy reports what concerns the node on its Node. Every Service
// left out stays in the agent's log, its metric
// (sluice_service_unprogrammed_frontends) and sluicectl status.

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
	"github.com/sluice-lb/sluice/pkg/source/tracker"
)

// The reasons of the events, for kubectl events --for and for automation.
const (
	// ReasonInvalid: the Service could not be translated at all.
	ReasonInvalid = "InvalidService"
	// ReasonNotServedAsAsked: part of the Service is not served (a
	// port's protocol, source ranges that do not parse).
	ReasonNotServedAsAsked = "NotServedAsAsked"
	// ReasonFrontendConflict: another Service holds the address, port
	// and protocol this one asks for.
	ReasonFrontendConflict = "FrontendConflict"
	// ReasonDatapathFull: the node's maps have no room for the frontend.
	ReasonDatapathFull = "DatapathFull"
	// ReasonNotRepresentable: the datapath cannot hold the frontend
	// however much room it has.
	ReasonNotRepresentable = "NotRepresentable"
	// ReasonProgrammingFailed: writing the frontend failed; the agent
	// retries it.
	ReasonProgrammingFailed = "ProgrammingFailed"

	eventAction = "Program"
	// eventController is the events' reportingController; the
	// recorder makes the instance "sluice-<host name>".
	eventController = "sluice"
)

// origin says which report a cause came from, hence when it is forgotten.
type origin int

const (
	fromTranslation origin = iota
	fromConflicts
	fromDatapath
)

// eventKey names a cause: of a Service, or (onNode) of this node. note
// tells causes of one reason apart; the event's text is note unless
// pendingEvent.message says otherwise.
type eventKey struct {
	svc          types.NamespacedName
	onNode       bool
	reason, note string
}

// pendingEvent is an event to emit, once.
type pendingEvent struct {
	eventKey
	origin origin
	// message is the event's note, if not eventKey.note (which then
	// only identifies the cause).
	message string
}

// maxServiceEvents is how many Services at most carry a cause of one
// reason found by the reconciler (DatapathFull and the others); the rest
// are counted in one event on the Node (SetFailures).
const maxServiceEvents = 32

// noteCause records that svc has a cause to report and, the first time,
// emits it. Callers hold evMu.
func (s *Source) noteCause(e pendingEvent, seen map[eventKey]bool) {
	if seen != nil {
		seen[e.eventKey] = true
	}
	if _, ok := s.emitted[e.eventKey]; ok {
		return
	}
	s.emitted[e.eventKey] = e.origin
	s.emit(e.eventKey, cmp.Or(e.message, e.note))
}

// forget drops the causes of origin o not in seen, so they are reported
// again if they come back.
func (s *Source) forget(o origin, seen map[eventKey]bool) {
	for k, ko := range s.emitted {
		if ko == o && !seen[k] {
			delete(s.emitted, k)
		}
	}
}

// emit sends one Warning event with note about Service k.svc, or about
// this node's Node (k.onNode). A Service the cache does not have (deleted
// since) gets none: an event needs its UID to show up on it.
func (s *Source) emit(k eventKey, note string) {
	if s.recorder == nil {
		return
	}
	if k.onNode {
		s.recorder.Eventf(s.nodeRef(), nil, corev1.EventTypeWarning, k.reason, eventAction, "%s", note)
		s.log.Debug("event", "node", s.cfg.Options.Node.Name, "reason", k.reason, "note", note)
		return
	}
	if s.services == nil {
		return
	}
	obj, ok, err := s.services.GetByKey(k.svc.String())
	svc, isSvc := obj.(*cachedService)
	if err != nil || !ok || !isSvc {
		return
	}
	ref := &corev1.ObjectReference{Kind: "Service", APIVersion: "v1", Namespace: svc.Namespace, Name: svc.Name,
		UID: svc.uid, ResourceVersion: svc.ResourceVersion}
	s.recorder.Eventf(ref, nil, corev1.EventTypeWarning, k.reason, eventAction, "%s", note)
	s.log.Debug("event", "service", k.svc, "reason", k.reason, "note", note)
}

// nodeRef is this node's Node, for the events about the node: with its
// UID once the Node's informer saw it, else with the node's name for a UID,
// as kube-proxy refers to its Node.
func (s *Source) nodeRef() *corev1.ObjectReference {
	name := s.cfg.Options.Node.Name
	uid := types.UID(name)
	if u, ok := s.nodeUID.Load().(types.UID); ok && u != "" {
		uid = u
	}
	return &corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: name, UID: uid}
}

// reportSync emits the events of what a sync found. newState says r.State
// is new, so r.Conflicts lists every conflict there is.
func (s *Source) reportSync(r tracker.Result, newState bool) {
	s.evMu.Lock()
	defer s.evMu.Unlock()
	for _, e := range r.Errors {
		s.noteCause(pendingEvent{eventKey: eventKey{svc: e.Service, reason: ReasonInvalid,
			note: fmt.Sprintf("Not served by this node's proxy (Sluice): %v. Fix the Service's spec.", e.Err)}, origin: fromTranslation}, nil)
	}
	for _, w := range r.Warnings {
		s.noteCause(pendingEvent{eventKey: eventKey{svc: w.Service, reason: ReasonNotServedAsAsked,
			note: fmt.Sprintf("Served in part by this node's proxy (Sluice): %s.", w.Message)}, origin: fromTranslation}, nil)
	}
	if !newState {
		return
	}
	seen := map[eventKey]bool{}
	for _, c := range r.Conflicts {
		svc := types.NamespacedName{Namespace: c.Loser.Namespace, Name: c.Loser.Name}
		s.noteCause(pendingEvent{eventKey: eventKey{svc: svc, reason: ReasonFrontendConflict,
			note: fmt.Sprintf("Port %s (%s) not served by this node's proxy (Sluice): Service %s asks for the same address, port and protocol and keeps it. Change the address or port of one of them.",
				portOf(c.Loser), c.Frontend, c.Winner)}, origin: fromConflicts}, seen)
	}
	s.forget(fromConflicts, seen)
}

// portOf names a Service port for a note.
func portOf(n model.ServicePortName) string {
	return cmp.Or(n.Port, "(unnamed)")
}

// followService forgets the causes of a Service that was deleted, and the
// translation causes of one whose spec changed (its generation differs
// from old's, the version the cache held before: nil for a Service seen
// for the first time, which has no causes yet), so that they are reported
// again if they remain.
func (s *Source) followService(old, svc *cachedService, deleted bool) {
	key := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	if deleted {
		s.forgetService(key, true)
	} else if old != nil && old.Generation != svc.Generation {
		s.forgetService(key, false)
	}
}

// forgetService drops the translation causes of a Service whose spec
// changed (or that was deleted: all of its causes).
func (s *Source) forgetService(svc types.NamespacedName, all bool) {
	s.evMu.Lock()
	defer s.evMu.Unlock()
	for k, o := range s.emitted {
		if k.svc == svc && (all || o == fromTranslation) {
			delete(s.emitted, k)
		}
	}
}

// ObserveSync satisfies agent.Observer; the source needs only the failures.
func (s *Source) ObserveSync(time.Duration, error) {}

// SetProgrammed satisfies agent.Observer; the source needs only the
// failures.
func (s *Source) SetProgrammed(*model.State) {}

// SetFailures emits an event on each Service with a frontend the agent could
// not program (agent.FailureObserver): after every apply, with every
// failure, so causes that went away are forgotten here. A Service gets one
// event per reason, naming its ports that failed for it. Past
// maxServiceEvents Services of one reason, the rest get none: one event on
// the Node counts them (and is forgotten, as theirs are, once none is
// left out).
func (s *Source) SetFailures(failures []*reconciler.FrontendError) {
	s.evMu.Lock()
	defer s.evMu.Unlock()
	// The failures come sorted by Service: one cause per Service and
	// reason, with its ports in order.
	type cause struct {
		key   eventKey
		first *reconciler.FrontendError
		ports int
	}
	var causes []cause
	seen := map[eventKey]bool{}
	for _, f := range failures {
		if f.Service == (model.ServicePortName{}) {
			continue // a frontend nobody asks for: no Service to tell
		}
		svc := types.NamespacedName{Namespace: f.Service.Namespace, Name: f.Service.Name}
		k := eventKey{svc: svc, reason: datapathReason(f), note: "datapath"}
		if n := len(causes); n > 0 && causes[n-1].key == k {
			causes[n-1].ports++
			continue
		}
		causes = append(causes, cause{key: k, first: f, ports: 1})
		seen[k] = true
	}
	// Under the bound count the Services with an event that still have
	// their cause: those whose cause went away make room.
	leftOut := map[string][]cause{}
	live := map[string]int{}
	for k, o := range s.emitted {
		if o == fromDatapath && !k.onNode && seen[k] {
			live[k.reason]++
		}
	}
	for _, c := range causes {
		if _, ok := s.emitted[c.key]; ok {
			continue
		}
		if live[c.key.reason] >= maxServiceEvents {
			leftOut[c.key.reason] = append(leftOut[c.key.reason], c)
			continue
		}
		live[c.key.reason]++
		s.noteCause(pendingEvent{eventKey: c.key, origin: fromDatapath, message: serviceNote(c.first, c.ports)}, nil)
	}
	for _, reason := range slices.Sorted(maps.Keys(leftOut)) {
		out := leftOut[reason]
		k := eventKey{onNode: true, reason: reason, note: "left out"}
		seen[k] = true
		if _, ok := s.emitted[k]; ok {
			continue
		}
		f := out[0].first
		note := fmt.Sprintf("%d Services not programmed by this node's proxy (Sluice) for this reason have no event of their own (%d have one); the first left out: %s: %v. %s They are all in the agent's log, its metric sluice_service_unprogrammed_frontends and sluicectl status.",
			len(out), live[reason], f.Service, f.Err, datapathHint(f))
		s.log.Warn("services not programmed, without an event each", "reason", reason, "services", len(out),
			"with_events", live[reason], "first", f.Service.String(), "err", f.Err)
		s.noteCause(pendingEvent{eventKey: k, origin: fromDatapath, message: note}, nil)
	}
	s.forget(fromDatapath, seen)
}

// datapathCause is the reason of the event about f and what to do about
// it.
func datapathCause(f *reconciler.FrontendError) (reason, hint string) {
	switch f.Reason() {
	case "capacity":
		return ReasonDatapathFull, "Raise the agents' --max-* flags (or remove Services you no longer need); the agent retries when something changes."
	case "invalid":
		return ReasonNotRepresentable, "Change the Service or its endpoints."
	}
	return ReasonProgrammingFailed, "The agent retries; see its logs if this persists."
}

// datapathReason is the reason of the event about f.
func datapathReason(f *reconciler.FrontendError) string {
	reason, _ := datapathCause(f)
	return reason
}

// datapathHint says what to do about f.
func datapathHint(f *reconciler.FrontendError) string {
	_, hint := datapathCause(f)
	return hint
}

// serviceNote is the note of the event on the Service of first, whose
// ports (ports of them) failed for first's reason.
func serviceNote(first *reconciler.FrontendError, ports int) string {
	more := ""
	if ports > 1 {
		more = fmt.Sprintf(" (and %d more of its ports for the same reason)", ports-1)
	}
	return fmt.Sprintf("Port %s (%s)%s not programmed by this node's proxy (Sluice): %v. %s",
		portOf(first.Service), first.Frontend, more, first.Err, datapathHint(first))
}

// newEventRecorder starts a broadcaster sending events.k8s.io/v1 Events
// through the client until ctx is done; stop waits for it to finish.
func (s *Source) newEventRecorder(ctx context.Context) (rec events.EventRecorder, stop func(), err error) {
	b := events.NewBroadcaster(&events.EventSinkImpl{Interface: s.cfg.Client.EventsV1()})
	if err := b.StartRecordingToSinkWithContext(ctx); err != nil {
		return nil, nil, fmt.Errorf("start recording events: %w", err)
	}
	return b.NewRecorder(scheme.Scheme, eventController), b.Shutdown, nil
}
