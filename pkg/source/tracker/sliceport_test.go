package tracker

// A Service one of whose EndpointSlices has a port numbered 0 (which the
// API server accepts: discovery/v1 does not validate slice ports). The
// translation used to fail on it, so a new Service got no frontends and a
// served one kept its last good translation: later changes of its other
// slices were not applied. kube-proxy ignores the port and serves the
// rest; so does Sluice now, with a warning naming the slice.

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-lb/sluice/pkg/source/translate"
)

func TestTrackerSlicePortZero(t *testing.T) {
	tr := New(translate.Options{})
	key := types.NamespacedName{Namespace: "default", Name: "p"}
	svc := service("p", "10.96.0.20", 80)
	svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: "b", Port: 81, Protocol: corev1.ProtocolTCP})
	tr.SetService(key, svc)
	p1 := slice("p", "p-1", 8080, "10.0.0.1")
	p2 := slice("p", "p-2", 0, "10.0.0.2")
	p2.Ports[0].Name = new("b")
	tr.SetSlice(nameOf(p1), p1)
	tr.SetSlice(nameOf(p2), p2)
	r := tr.Sync()
	if len(r.Errors) != 0 {
		t.Fatalf("errors %v", r.Errors)
	}
	if len(r.Warnings) != 1 || r.Warnings[0].Service != key || !strings.Contains(r.Warnings[0].Message, `endpointslice "default/p-2": port "b": port 0`) {
		t.Errorf("warnings %v, want one naming slice p-2's port b", r.Warnings)
	}
	want := "10.96.0.20:80/TCP default/p:http -> 10.0.0.1:8080/TCP\n10.96.0.20:81/TCP default/p:b ->"
	if got := render(r.State); got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}

	// A change of the other slice is applied.
	p1 = slice("p", "p-1", 8080, "10.0.0.1", "10.0.0.3")
	p1.ResourceVersion = "2"
	tr.SetSlice(nameOf(p1), p1)
	r = tr.Sync()
	want = "10.96.0.20:80/TCP default/p:http -> 10.0.0.1:8080/TCP 10.0.0.3:8080/TCP\n10.96.0.20:81/TCP default/p:b ->"
	if got := render(r.State); len(r.Errors) != 0 || got != want {
		t.Errorf("after p-1 changed: errors %v, got\n%s\nwant\n%s", r.Errors, got, want)
	}
}
