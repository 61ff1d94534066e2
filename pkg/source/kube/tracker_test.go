package kube

import (
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

func TestTrackerFoldsToNetChanges(t *testing.T) {
	tr := newTracker()
	web := types.NamespacedName{Namespace: "default", Name: "web"}
	svc := service("web", "10.96.0.10", 80)
	svc.ResourceVersion = "1"
	if !tr.setService(web, svc) {
		t.Fatal("a new Service is not a change")
	}
	// An informer resync delivers the same object again: no change.
	if tr.setService(web, svc.DeepCopy()) {
		t.Error("a resync (same resourceVersion) marked the Service dirty")
	}
	// A status-only update (new resourceVersion, same spec): no change.
	st := svc.DeepCopy()
	st.ResourceVersion = "2"
	st.Status.LoadBalancer.Ingress = nil
	tr.take()
	if tr.setService(web, st) {
		t.Error("a status-only update marked the Service dirty")
	}
	if pc := tr.take(); len(pc.services) != 0 {
		t.Errorf("take after a no-op update = %v", pc.services)
	}

	// Ten slice updates and a Service created and deleted in between fold
	// into one pending entry each, with the latest slice.
	flash := types.NamespacedName{Namespace: "default", Name: "flash"}
	es := slice("web", "web-1", 8080, "10.0.0.1")
	for i := range 10 {
		es = es.DeepCopy()
		es.ResourceVersion = string(rune('a' + i))
		tr.setSlice(web, es.Name, es)
	}
	tr.setService(flash, service("flash", "10.96.0.99", 80))
	tr.setService(flash, nil)
	pc := tr.take()
	if len(pc.services) != 2 || len(pc.slices[web]) != 1 || pc.slices[web][0].ResourceVersion != "j" {
		t.Fatalf("pending = %d services, slices %v; want web (latest slice) and flash", len(pc.services), pc.slices[web])
	}
	if pc.services[flash] != nil {
		t.Error("the created-then-deleted Service is pending as present")
	}
	// Deleting an unknown slice or Service is no change.
	if tr.setSlice(web, "nope", nil) || tr.setService(types.NamespacedName{Name: "nope"}, nil) {
		t.Error("deleting unknown objects marked something dirty")
	}
}
