package kube

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/sluice-lb/sluice/internal/testutil"
)

// A headless Service (clusterIP None) and its EndpointSlice (labelled
// service.kubernetes.io/headless) never reach the source: the API server
// filters them out of its lists and watches (pkg/source/kube,
// selectors.go), as it does for kube-proxy. The source's counts of the
// Service and slice events it handled (kube-proxy's *_changes_total) and
// of the slices its client decoded (at least: see below) grow by the ordinary Service and slice
// created after them only; each watch delivers in order, so the headless
// ones would have been counted by the time the ordinary one is
// programmed. A slice that gains the headless label leaves the selection
// (the watch says deleted: its endpoints go), and comes back when it loses
// it: a watch with the source's selector sees exactly that.
func TestHeadlessNotListed(t *testing.T) {
	c, dp, p := startSyncedProxy(t)
	counts := func() (svcs, slices float64, decoded int64) {
		out, err := testutil.Samples(strings.NewReader(testutil.Scrape(t, p.metrics.Handler())), nil)
		if err != nil {
			t.Fatal(err)
		}
		fast, standard := p.src.SliceDecodes()
		return out["kubeproxy_sync_proxy_rules_service_changes_total"], out["kubeproxy_sync_proxy_rules_endpoint_changes_total"], fast + standard
	}
	ns := "headless"
	createNamespace(t, c, ns)
	svcs0, slices0, decoded0 := counts()

	createService(t, c, ns, "db", func(s *corev1.Service) { s.Spec.ClusterIP = corev1.ClusterIPNone }, svcPort("pg", 5432, "5432"))
	db := makeSlice(ns, "db", "db-a", slicePorts{"pg": 5432}, ready("10.1.1.1"))
	db.Labels[corev1.IsHeadlessService] = ""
	createSlice(t, c, db)
	web := createService(t, c, ns, "web", nil, svcPort("http", 80, "8080"))
	createSlice(t, c, makeSlice(ns, "web", "web-a", slicePorts{"http": 8080}, ready("10.1.1.2")))
	wantProgrammed(t, dp, map[string][]string{fe(web, 80): {be("10.1.1.2", 8080)}})

	// The slices decoded are at least the ordinary one; not exactly it:
	// a fresh API server's watch may end and the reflector list again,
	// decoding the ordinary slice twice (seen once in a CI run: 2 decodes,
	// 1 change), which a headless slice decoded would look like. That the
	// API server filters is shown below, by a watch with the source's
	// selector.
	svcs, nSlices, decoded := counts()
	if svcs-svcs0 != 1 || nSlices-slices0 != 1 || decoded-decoded0 < 1 {
		t.Errorf("the source handled %v Services and %v slices, decoded %d slices, since the headless ones were created; want 1 each (the ordinary ones; at least 1 decoded)",
			svcs-svcs0, nSlices-slices0, decoded-decoded0)
	}

	// What the source's slice watch sees of the label's changes: a
	// watch with its selector, from now.
	l, err := c.DiscoveryV1().EndpointSlices(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := c.DiscoveryV1().EndpointSlices(ns).Watch(context.Background(), metav1.ListOptions{
		LabelSelector: "!" + corev1.IsHeadlessService, ResourceVersion: l.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	label := func(value string) {
		t.Helper()
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%s}}}`, corev1.IsHeadlessService, value)
		if _, err := c.DiscoveryV1().EndpointSlices(ns).Patch(context.Background(), "web-a", types.MergePatchType,
			[]byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	label(`""`)
	wantProgrammed(t, dp, map[string][]string{fe(web, 80): {}})
	label("null")
	wantProgrammed(t, dp, map[string][]string{fe(web, 80): {be("10.1.1.2", 8080)}})
	// Both changes were made: their events are queued (the bound
	// only keeps a missing one from hanging the test).
	var seen []watch.EventType
	bound := time.After(30 * time.Second)
	for len(seen) < 2 {
		select {
		case e := <-w.ResultChan():
			if es, ok := e.Object.(*discoveryv1.EndpointSlice); ok && es.Name == "web-a" {
				seen = append(seen, e.Type)
			}
		case <-bound:
			t.Fatalf("the selected watch saw %v of the label's coming and going, want [DELETED ADDED]", seen)
		}
	}
	if !slices.Equal(seen, []watch.EventType{watch.Deleted, watch.Added}) {
		t.Errorf("the selected watch saw %v of the label's coming and going, want [DELETED ADDED]", seen)
	}
}
