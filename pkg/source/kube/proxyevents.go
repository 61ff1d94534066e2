package kube

// The Events kube-proxy records about itself (v1.36), which Sluice records
// the same way, with its own reporting controller ("sluice", as its other
// events): what a cluster's tooling and its operators look for when a
// node's proxy starts or fails to serve a port.
//
//   - Normal Starting on this node's Node, action StartKubeProxy, once the
//     proxy runs (kube-proxy's birthCry, after its informers start; here
//     once the caches synced, so the event names the Node's UID and
//     kubectl describe node shows it).
//   - Warning FailedToStartServiceHealthcheck on a Service, action Listen,
//     when its healthCheckNodePort cannot be bound (kube-proxy's
//     ServiceHealthServer.SyncServices). kube-proxy emits it at every sync
//     that retries the port; the event recorder folds the repeats into a
//     series, but each is still a goroutine and a pass through the
//     correlator. Here the health check server reports a port once per
//     failure: again only after it was bound, or the port was dropped, in
//     between (pkg/health, NodePortServer.OnBindFailure).
//   - Warning FailedToStartProxierHealthcheck and FailedToStartMetricServer
//     on the Node, action StartKubeProxy, when the health (/healthz,
//     /livez) or metrics server cannot serve (kube-proxy emits them when
//     bindAddressHardFail makes such a failure fatal, as it always is for
//     Sluice). The agent is exiting then: the event is written at once,
//     not queued behind the broadcaster, which may be stopped already, or
//     not started (a port taken fails the start before the source runs).
//
// The notes are kube-proxy's: its Starting event has none; the others
// carry the error.

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-lb/sluice/pkg/model"
)

// The reasons and actions of kube-proxy's own events.
const (
	ReasonStarting                        = "Starting"
	ReasonFailedToStartServiceHealthcheck = "FailedToStartServiceHealthcheck"
	ReasonFailedToStartProxierHealthcheck = "FailedToStartProxierHealthcheck"
	ReasonFailedToStartMetricServer       = "FailedToStartMetricServer"

	actionStart  = "StartKubeProxy"
	actionListen = "Listen"
)

// reportStarting records that the proxy started (Run, once the caches
// synced).
func (s *Source) reportStarting() {
	if s.recorder == nil {
		return
	}
	s.recorder.Eventf(s.nodeRef(), nil, corev1.EventTypeNormal, ReasonStarting, actionStart, "")
}

// HealthCheckFailed records that the healthCheckNodePort port of Service
// svc could not be bound (pkg/health's NodePortServer.OnBindFailure, once
// per failure). A Service the cache does not have (deleted since) gets no
// event, as the source's other events.
func (s *Source) HealthCheckFailed(svcPort model.ServicePortName, port uint16, err error) {
	if s.recorder == nil || s.services == nil {
		return
	}
	svc := types.NamespacedName{Namespace: svcPort.Namespace, Name: svcPort.Name}
	obj, ok, gerr := s.services.GetByKey(svc.String())
	cs, isSvc := obj.(*cachedService)
	if gerr != nil || !ok || !isSvc {
		return
	}
	ref := &corev1.ObjectReference{Kind: "Service", APIVersion: "v1", Namespace: cs.Namespace, Name: cs.Name,
		UID: cs.uid, ResourceVersion: cs.ResourceVersion}
	// kube-proxy's note, word for word.
	s.recorder.Eventf(ref, nil, corev1.EventTypeWarning, ReasonFailedToStartServiceHealthcheck, actionListen,
		"node %s failed to start healthcheck %q on port %d: %v", s.cfg.Options.Node.Name, svc.String(), port, err)
}

// maxNote is the longest note the API server accepts (events.k8s.io/v1).
const maxNote = 1024

// ReportServerFailure records, on this node's Node, that the health
// server (health: FailedToStartProxierHealthcheck) or the metrics server
// (FailedToStartMetricServer) failed with err, fatally: it writes the
// event itself, within ctx, and returns whether the API server took it. It
// works whether Run runs, ran or never did.
func (s *Source) ReportServerFailure(ctx context.Context, health bool, err error) error {
	reason := ReasonFailedToStartMetricServer
	if health {
		reason = ReasonFailedToStartProxierHealthcheck
	}
	note := err.Error()
	if len(note) > maxNote {
		note = strings.ToValidUTF8(note[:maxNote], "") // not a split rune, which JSON would grow past the limit
	}
	host, _ := os.Hostname()
	now := time.Now()
	ev := &eventsv1.Event{
		// The name and the other fields as client-go's recorder makes them.
		ObjectMeta:          metav1.ObjectMeta{Name: fmt.Sprintf("%v.%x", s.cfg.Options.Node.Name, now.UnixNano()), Namespace: metav1.NamespaceDefault},
		EventTime:           metav1.NewMicroTime(now),
		ReportingController: eventController,
		ReportingInstance:   eventController + "-" + host,
		Action:              actionStart,
		Reason:              reason,
		Regarding:           *s.nodeRef(),
		Note:                note,
		Type:                corev1.EventTypeWarning,
	}
	if _, cerr := s.cfg.Client.EventsV1().Events(ev.Namespace).Create(ctx, ev, metav1.CreateOptions{}); cerr != nil {
		return fmt.Errorf("record %s: %w", reason, cerr)
	}
	return nil
}
