package kube

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-lb/sluice/pkg/model"
)

// kube-proxy's events about itself, as the agent records them with its
// own identity (its RBAC) on a real API server, which validates them: the
// start on the Node, a health check port not bound on its Service, a
// server failure on the Node.
func TestProxyEventsAccepted(t *testing.T) {
	env := startEnv(t)
	c := env.Client
	src, _ := startEventsAgent(t, env, newFake())
	waitSynced(t, src)
	one := func(ns, selector string) eventsv1.Event {
		t.Helper()
		var got eventsv1.Event
		eventually(t, "an event "+selector, 30*time.Second, func() error {
			l, err := c.EventsV1().Events(ns).List(context.Background(), metav1.ListOptions{FieldSelector: selector + ",reportingController=sluice"})
			if err != nil {
				return err
			}
			if len(l.Items) != 1 {
				return fmt.Errorf("%d events", len(l.Items))
			}
			got = l.Items[0]
			return nil
		})
		return got
	}
	if e := one("default", "regarding.kind=Node,regarding.name="+nodeName+",reason=Starting"); e.Type != corev1.EventTypeNormal || e.Action != "StartKubeProxy" {
		t.Errorf("Starting: %s %s", e.Type, e.Action)
	}

	const ns = "proxyevents"
	createNamespace(t, c, ns)
	createService(t, c, ns, "lb", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	}, svcPort("http", 80, "8080"))
	var e eventsv1.Event
	eventually(t, "the Service in the source's cache", 30*time.Second, func() error {
		src.HealthCheckFailed(model.ServicePortName{Namespace: ns, Name: "lb"}, 30111, syscall.EADDRINUSE)
		l, err := c.EventsV1().Events(ns).List(context.Background(), metav1.ListOptions{FieldSelector: "reason=FailedToStartServiceHealthcheck"})
		if err != nil || len(l.Items) == 0 {
			return fmt.Errorf("no event (%v)", err)
		}
		e = l.Items[0]
		return nil
	})
	if want := fmt.Sprintf("node %s failed to start healthcheck %q on port 30111: address already in use", nodeName, ns+"/lb"); e.Note != want || e.Action != "Listen" || e.Regarding.Name != "lb" {
		t.Errorf("FailedToStartServiceHealthcheck: note %q action %s on %s; want note %q", e.Note, e.Action, e.Regarding.Name, want)
	}

	if err := src.ReportServerFailure(t.Context(), true, fmt.Errorf("health listener: %w", syscall.EADDRINUSE)); err != nil {
		t.Fatal(err)
	}
	if e := one("default", "regarding.kind=Node,reason=FailedToStartProxierHealthcheck"); e.Note != "health listener: address already in use" {
		t.Errorf("FailedToStartProxierHealthcheck: note %q", e.Note)
	}
}
