package kube

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	"github.com/sluice-lb/sluice/internal/testutil"
)

// The Services and EndpointSlices are listed and watched without the
// headless ones, as kube-proxy's informers list them: the Services with
// the field selector spec.clusterIP!=None, the slices with the label
// selector !service.kubernetes.io/headless, whichever client reads them
// (client-go's, or the source's own REST client of Config.REST). The fake
// clientset does not apply selectors: what it shows is that every list
// and watch asks for them (test/kube's TestHeadlessNotListed has the API
// server apply them).
func TestInformersSelectHeadlessOut(t *testing.T) {
	client := fake.NewClientset(service("web", "10.96.0.10", 80), slice("web", "web-1", 8080, "10.0.0.1"))
	rec := &recorder{}
	run(t, Config{Client: client}, rec)
	testutil.EventuallyTrue(t, "the first state", 10*time.Second, func() bool { return rec.count() > 0 })
	seen := map[string]int{}
	for _, a := range client.Actions() {
		var labels, fields string
		switch a := a.(type) {
		case k8stesting.ListAction:
			labels, fields = a.GetListRestrictions().Labels.String(), a.GetListRestrictions().Fields.String()
		case k8stesting.WatchAction:
			labels, fields = a.GetWatchRestrictions().Labels.String(), a.GetWatchRestrictions().Fields.String()
		default:
			continue
		}
		res := a.GetResource().Resource
		want := map[string][2]string{
			"services":       {"", "spec.clusterIP!=None"},
			"endpointslices": {"!service.kubernetes.io/headless", ""},
		}
		w, ok := want[res]
		if !ok {
			continue
		}
		seen[res+" "+a.GetVerb()]++
		if labels != w[0] || fields != w[1] {
			t.Errorf("%s %s: label selector %q, field selector %q; want %q, %q", a.GetVerb(), res, labels, fields, w[0], w[1])
		}
	}
	for _, k := range []string{"services list", "services watch", "endpointslices list", "endpointslices watch"} {
		if seen[k] == 0 {
			t.Errorf("no %s seen (%v)", k, seen)
		}
	}
}

// The source's own EndpointSlice client puts the label selector in the
// query of its lists and watches.
func TestSliceClientSelectsHeadlessOut(t *testing.T) {
	var mu sync.Mutex
	var queries []url.Values
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/apis/discovery.k8s.io/v1/endpointslices" {
			http.NotFound(w, r)
			return
		}
		q := r.URL.Query()
		mu.Lock()
		queries = append(queries, q)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if q.Get("watch") != "true" {
			_, _ = fmt.Fprint(w, `{"kind":"EndpointSliceList","apiVersion":"discovery.k8s.io/v1","metadata":{"resourceVersion":"1"},"items":[]}`)
			return
		}
		if q.Get("sendInitialEvents") == "true" {
			// No streamed list here: the reflector lists instead.
			http.Error(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"BadRequest","code":400}`, http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-r.Context().Done() // a watch with nothing to tell
	}))
	t.Cleanup(srv.Close)
	rc, err := newSliceClient(&rest.Config{Host: srv.URL}, newSlimmer(), &sliceDecodes{})
	if err != nil {
		t.Fatal(err)
	}
	inf := newSliceInformer(rc, 0, selectSlices)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go inf.Run(ctx.Done())
	testutil.EventuallyTrue(t, "a list and a watch", 10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		var list, watch bool
		for _, q := range queries {
			if q.Get("watch") == "true" {
				watch = true
			} else {
				list = true
			}
		}
		return list && watch
	})
	cancel()
	mu.Lock()
	defer mu.Unlock()
	for _, q := range queries {
		if got := q.Get("labelSelector"); got != "!service.kubernetes.io/headless" {
			t.Errorf("request %v: labelSelector %q", q, got)
		}
	}
}
