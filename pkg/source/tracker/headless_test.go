package tracker

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// A slice that gains the service.kubernetes.io/headless label leaves its
// Service, as from kube-proxy's informer (which lists only slices without
// it) it is deleted; losing the label, it comes back. Both the object and
// its compact form (the sources' SetCompactSlice) are filed alike.
func TestTrackerSliceLabelledHeadless(t *testing.T) {
	for _, compact := range []bool{false, true} {
		tr := New(translate.Options{})
		svc := service("a", "10.96.0.1", 80)
		tr.SetService(nameOf(svc), svc)
		set := func(es *discoveryv1.EndpointSlice) {
			if compact {
				tr.SetCompactSlice(nameOf(es), translate.SliceOf(es), "")
			} else {
				tr.SetSlice(nameOf(es), es)
			}
		}
		es := slice("a", "a-1", 8080, "10.0.0.1")
		set(es)
		if got, want := render(tr.Sync().State), "10.96.0.1:80/TCP default/a:http -> 10.0.0.1:8080/TCP"; got != want {
			t.Fatalf("compact %v: got %s, want %s", compact, got, want)
		}
		es = es.DeepCopy()
		es.ResourceVersion = "2"
		es.Labels[corev1.IsHeadlessService] = ""
		set(es)
		if got, want := render(tr.Sync().State), "10.96.0.1:80/TCP default/a:http ->"; got != want {
			t.Errorf("compact %v, labelled headless: got %s, want %s", compact, got, want)
		}
		es = es.DeepCopy()
		es.ResourceVersion = "3"
		delete(es.Labels, corev1.IsHeadlessService)
		set(es)
		if got, want := render(tr.Sync().State), "10.96.0.1:80/TCP default/a:http -> 10.0.0.1:8080/TCP"; got != want {
			t.Errorf("compact %v, label removed: got %s, want %s", compact, got, want)
		}
	}
}
