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
// note) for as long as the cause lasts. A cause is forgotten, and would be
// reported again, when it goes away: the reconciler's and the tracker's
// when a later report no longer has it, translation's when the Service's
// spec changes (its generation) or it is deleted. Repeats from the same
// agent within the recorder's window become a series (events.k8s.io/v1),
// not new objects.

import (
	"cmp"
	"context"
	"fmt"
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

type eventKey struct {
	svc          types.NamespacedName
	reason, note string
}

// pendingEvent is an event to emit, once.
type pendingEvent struct {
	eventKey
	origin origin
}

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
	s.emit(e.eventKey)
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

// emit sends one Warning event about Service k.svc. A Service the cache
// does not have (deleted since) gets none: an event needs its UID to show
// up on it.
func (s *Source) emit(k eventKey) {
	if s.recorder == nil || s.services == nil {
		return
	}
	obj, ok, err := s.services.GetByKey(k.svc.String())
	svc, isSvc := obj.(*cachedService)
	if err != nil || !ok || !isSvc {
		return
	}
	ref := &corev1.ObjectReference{Kind: "Service", APIVersion: "v1", Namespace: svc.Namespace, Name: svc.Name,
		UID: svc.uid, ResourceVersion: svc.ResourceVersion}
	s.recorder.Eventf(ref, nil, corev1.EventTypeWarning, k.reason, eventAction, "%s", k.note)
	s.log.Debug("event", "service", k.svc, "reason", k.reason, "note", k.note)
}

// reportSync emits the events of what a sync found. newState says r.State
// is new, so r.Conflicts lists every conflict there is.
func (s *Source) reportSync(r tracker.Result, newState bool) {
	s.evMu.Lock()
	defer s.evMu.Unlock()
	for _, e := range r.Errors {
		s.noteCause(pendingEvent{eventKey{e.Service, ReasonInvalid,
			fmt.Sprintf("Not served by this node's proxy (Sluice): %v. Fix the Service's spec.", e.Err)}, fromTranslation}, nil)
	}
	for _, w := range r.Warnings {
		s.noteCause(pendingEvent{eventKey{w.Service, ReasonNotServedAsAsked,
			fmt.Sprintf("Served in part by this node's proxy (Sluice): %s.", w.Message)}, fromTranslation}, nil)
	}
	if !newState {
		return
	}
	seen := map[eventKey]bool{}
	for _, c := range r.Conflicts {
		svc := types.NamespacedName{Namespace: c.Loser.Namespace, Name: c.Loser.Name}
		s.noteCause(pendingEvent{eventKey{svc, ReasonFrontendConflict,
			fmt.Sprintf("Port %s (%s) not served by this node's proxy (Sluice): Service %s asks for the same address, port and protocol and keeps it. Change the address or port of one of them.",
				portOf(c.Loser), c.Frontend, c.Winner)}, fromConflicts}, seen)
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
// failure, so causes that went away are forgotten here.
func (s *Source) SetFailures(failures []*reconciler.FrontendError) {
	s.evMu.Lock()
	defer s.evMu.Unlock()
	seen := map[eventKey]bool{}
	for _, f := range failures {
		if f.Service == (model.ServicePortName{}) {
			continue // a frontend nobody asks for: no Service to tell
		}
		svc := types.NamespacedName{Namespace: f.Service.Namespace, Name: f.Service.Name}
		var reason, hint string
		switch f.Reason() {
		case "capacity":
			reason, hint = ReasonDatapathFull, "Raise the agents' --max-* flags (or remove Services you no longer need); the agent retries when something changes."
		case "invalid":
			reason, hint = ReasonNotRepresentable, "Change the Service or its endpoints."
		default:
			reason, hint = ReasonProgrammingFailed, "The agent retries; see its logs if this persists."
		}
		s.noteCause(pendingEvent{eventKey{svc, reason,
			fmt.Sprintf("Port %s (%s) not programmed by this node's proxy (Sluice): %v. %s", portOf(f.Service), f.Frontend, f.Err, hint)},
			fromDatapath}, seen)
	}
	s.forget(fromDatapath, seen)
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
