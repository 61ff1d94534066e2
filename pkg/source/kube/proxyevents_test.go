package kube

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/model"
)

// eventsBy returns the events.k8s.io Events of reason the client holds
// (for a cluster-scoped object, in default, where client-go's recorder
// puts them), once there is at least one.
func eventsBy(t *testing.T, c kubernetes.Interface, ns, reason string) []eventsv1.Event {
	t.Helper()
	var out []eventsv1.Event
	testutil.Eventually(t, "a "+reason+" event", 10*time.Second, func() error {
		l, err := c.EventsV1().Events(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return err
		}
		out = out[:0]
		for _, e := range l.Items {
			if e.Reason == reason {
				out = append(out, e)
			}
		}
		if len(out) == 0 {
			return fmt.Errorf("none among %d events", len(l.Items))
		}
		return nil
	})
	return out
}

// checkEvent checks what kube-proxy's recorder would have written, but for
// the reporting controller, Sluice's own.
func checkEvent(t *testing.T, e eventsv1.Event, typ, action, kind, name, uid, note string) {
	t.Helper()
	if e.Type != typ || e.Action != action || e.ReportingController != eventController ||
		e.Regarding.Kind != kind || e.Regarding.Name != name || string(e.Regarding.UID) != uid || e.Note != note {
		t.Errorf("event %s: %s %s by %s on %s %s (UID %s), note %q; want %s %s by %s on %s %s (UID %s), note %q",
			e.Reason, e.Type, e.Action, e.ReportingController, e.Regarding.Kind, e.Regarding.Name, e.Regarding.UID, e.Note,
			typ, action, eventController, kind, name, uid, note)
	}
}

// The proxy's start is recorded on its Node, as kube-proxy's (Normal
// Starting, action StartKubeProxy, no note), once; a health check port
// that cannot be bound, on its Service (Warning
// FailedToStartServiceHealthcheck, action Listen, kube-proxy's note).
func TestProxyEvents(t *testing.T) {
	svc := service("web", "10.96.0.10", 80)
	svc.UID = "web-uid"
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: "node-uid"}}, svc)
	rec := &recorder{}
	src := run(t, Config{Client: client, MinSyncPeriod: 10 * time.Millisecond}, rec)
	testutil.EventuallyTrue(t, "the first state", 10*time.Second, func() bool { return rec.count() > 0 })

	evs := eventsBy(t, client, metav1.NamespaceDefault, ReasonStarting)
	if len(evs) != 1 {
		t.Errorf("%d Starting events, want 1", len(evs))
	}
	checkEvent(t, evs[0], corev1.EventTypeNormal, "StartKubeProxy", "Node", node, "node-uid", "")

	err := errors.New("listen tcp :30111: bind: address already in use")
	src.HealthCheckFailed(model.ServicePortName{Namespace: "default", Name: "web"}, 30111, err)
	evs = eventsBy(t, client, "default", ReasonFailedToStartServiceHealthcheck)
	checkEvent(t, evs[0], corev1.EventTypeWarning, "Listen", "Service", "web", "web-uid",
		`node node-a failed to start healthcheck "default/web" on port 30111: listen tcp :30111: bind: address already in use`)
}

// A health or metrics server that fails is recorded on the Node at once
// (FailedToStartProxierHealthcheck, FailedToStartMetricServer, action
// StartKubeProxy, the error for a note), whether the source ever ran:
// a port taken fails the agent's start before it does.
func TestServerFailureEvents(t *testing.T) {
	client := fake.NewClientset()
	src := newSource(t, Config{Client: client})
	for _, c := range []struct {
		health bool
		reason string
	}{{true, ReasonFailedToStartProxierHealthcheck}, {false, ReasonFailedToStartMetricServer}} {
		err := fmt.Errorf("%s listener: listen tcp 0.0.0.0:10256: bind: address already in use", c.reason)
		if rerr := src.ReportServerFailure(t.Context(), c.health, err); rerr != nil {
			t.Fatal(rerr)
		}
		evs := eventsBy(t, client, metav1.NamespaceDefault, c.reason)
		// No UID known: the node's name, as the source's other
		// events on the Node before its informer saw it.
		checkEvent(t, evs[0], corev1.EventTypeWarning, "StartKubeProxy", "Node", node, node, err.Error())
	}
}
