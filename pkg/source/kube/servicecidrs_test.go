package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/model"
)

func serviceCIDR(name string, cidrs ...string) *networkingv1.ServiceCIDR {
	return &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: cidrs}}
}

// cidrsOf returns st's service CIDRs as a string, "unset" if it has none.
func cidrsOf(st *model.State) string {
	if st == nil || !st.HasServiceCIDRs {
		return "unset"
	}
	return fmt.Sprint(st.ServiceCIDRs)
}

func prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

// The states carry the union of every ServiceCIDR object's spec.cidrs and
// the flag's, following the objects as they come and go; an object being
// deleted still counts, and a CIDR that does not parse is logged with its
// object's name and skipped, the object's other CIDRs kept.
func TestServiceCIDRsFollowTheAPI(t *testing.T) {
	client := fake.NewClientset(serviceCIDR("kubernetes", "10.96.0.0/16", "fd00:10:96::/112"))
	var logs testutil.Buffer
	rec := &recorder{}
	run(t, Config{Client: client, ServiceCIDRs: prefixes("10.100.0.0/16", "10.96.0.0/16"),
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}, rec)
	want := func(what, cidrs string) {
		t.Helper()
		waitFor(t, what, 5*time.Second, func() bool { return cidrsOf(rec.last()) == cidrs })
	}
	// The flag's 10.96.0.0/16 is the object's too: once.
	want("the first state's CIDRs", "[10.96.0.0/16 10.100.0.0/16 fd00:10:96::/112]")

	ctx := context.Background()
	extra := serviceCIDR("extra", "10.200.0.0/24", "not-a-cidr")
	now := metav1.Now()
	extra.DeletionTimestamp = &now // being deleted: still counts, as in kube-proxy
	extra.Finalizers = []string{"networking.k8s.io/service-cidr-finalizer"}
	if _, err := client.NetworkingV1().ServiceCIDRs().Create(ctx, extra, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	want("a new ServiceCIDR's CIDRs", "[10.96.0.0/16 10.100.0.0/16 10.200.0.0/24 fd00:10:96::/112]")
	if l := logs.String(); !strings.Contains(l, "servicecidr=extra cidr=not-a-cidr") {
		t.Errorf("the unparsable CIDR is not logged with its object's name:\n%s", l)
	}
	if l := logs.String(); !strings.Contains(l, "added=[10.200.0.0/24]") {
		t.Errorf("the change of the set is not logged:\n%s", l)
	}

	if err := client.NetworkingV1().ServiceCIDRs().Delete(ctx, "extra", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	want("a deleted ServiceCIDR's CIDRs gone", "[10.96.0.0/16 10.100.0.0/16 fd00:10:96::/112]")
	if err := client.NetworkingV1().ServiceCIDRs().Delete(ctx, "kubernetes", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// The flag's stay.
	want("the last ServiceCIDR deleted", "[10.96.0.0/16 10.100.0.0/16]")
	if l := logs.String(); !strings.Contains(l, "removed=[fd00:10:96::/112]") {
		t.Errorf("the removal is not logged:\n%s", l)
	}
}

// A change of the ServiceCIDRs alone makes a state patched from the last
// one, with no frontend changed: the reconciler looks at none of them.
func TestServiceCIDRChangeAloneIsAPatch(t *testing.T) {
	client := fake.NewClientset(service("web", "10.96.0.10", 80), slice("web", "web-1", 8080, "10.0.0.1"))
	rec := &recorder{}
	run(t, Config{Client: client}, rec)
	waitFor(t, "first sync", 5*time.Second, func() bool { return rec.count() == 1 })
	first := rec.last()
	if got := cidrsOf(first); got != "[]" {
		t.Fatalf("first state's CIDRs = %s, want none (set)", got)
	}
	if _, err := client.NetworkingV1().ServiceCIDRs().Create(context.Background(), serviceCIDR("a", "10.96.0.0/12"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the CIDR", 5*time.Second, func() bool { return cidrsOf(rec.last()) == "[10.96.0.0/12]" })
	st := rec.last()
	if st.BaseGen != first.Gen || len(st.Changed) != 0 || st.Services.Len() != 1 {
		t.Errorf("state BaseGen %d (first Gen %d), Changed %v, %d frontends; want a patch of the first with no frontend changed",
			st.BaseGen, first.Gen, st.Changed, st.Services.Len())
	}
}

// An API server that does not serve ServiceCIDRs (404: before 1.33, or
// networking.k8s.io/v1 servicecidrs disabled), or refuses the list (403),
// leaves the flag's CIDRs, said once in the log; the states still carry
// them.
func TestServiceCIDRsNotServed(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		log  string
	}{
		{"404", apierrors.NewNotFound(schema.GroupResource{Group: "networking.k8s.io", Resource: "servicecidrs"}, ""), "does not serve"},
		{"403", apierrors.NewForbidden(schema.GroupResource{Group: "networking.k8s.io", Resource: "servicecidrs"}, "", nil), "forbidden"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(serviceCIDR("kubernetes", "10.96.0.0/16"))
			client.PrependReactor("list", "servicecidrs", func(k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, tc.err
			})
			var logs testutil.Buffer
			rec := &recorder{}
			run(t, Config{Client: client, ServiceCIDRs: prefixes("10.100.0.0/16"), Logger: slog.New(slog.NewTextHandler(&logs, nil))}, rec)
			waitFor(t, "first sync", 5*time.Second, func() bool { return rec.count() == 1 })
			if got := cidrsOf(rec.last()); got != "[10.100.0.0/16]" {
				t.Errorf("CIDRs = %s, want the flag's alone", got)
			}
			l := logs.String()
			if n := strings.Count(l, "--service-cidr's alone"); n != 1 || !strings.Contains(l, tc.log) {
				t.Errorf("want one log line saying the flag alone is used (%q), got %d:\n%s", tc.log, n, l)
			}
			if slices.ContainsFunc(client.Actions(), func(a k8stesting.Action) bool {
				return a.GetResource().Resource == "servicecidrs" && a.GetVerb() == "watch"
			}) {
				t.Error("ServiceCIDRs watched though the list was refused")
			}
		})
	}
}

// An API server that did not serve the ServiceCIDRs at start (404, 403)
// is asked again: once it serves them, they are followed without a
// restart. A first list failing otherwise is retried, said at Warn every
// 30 tries with the error.
func TestServiceCIDRsServedLater(t *testing.T) {
	reprobe, retry := reprobeServiceCIDRs, retryServiceCIDRs
	reprobeServiceCIDRs, retryServiceCIDRs = 10*time.Millisecond, time.Millisecond
	t.Cleanup(func() { reprobeServiceCIDRs, retryServiceCIDRs = reprobe, retry })
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"404", apierrors.NewNotFound(schema.GroupResource{Group: "networking.k8s.io", Resource: "servicecidrs"}, "")},
		{"403", apierrors.NewForbidden(schema.GroupResource{Group: "networking.k8s.io", Resource: "servicecidrs"}, "", nil)},
		{"500", apierrors.NewInternalError(errors.New("etcd unavailable"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(serviceCIDR("kubernetes", "10.96.0.0/16"))
			var mu sync.Mutex
			refused := 0
			client.PrependReactor("list", "servicecidrs", func(k8stesting.Action) (bool, runtime.Object, error) {
				mu.Lock()
				defer mu.Unlock()
				if refused < 31 {
					refused++
					return true, nil, tc.err
				}
				return false, nil, nil
			})
			var logs testutil.Buffer
			rec := &recorder{}
			run(t, Config{Client: client, ServiceCIDRs: prefixes("10.100.0.0/16"), Logger: slog.New(slog.NewTextHandler(&logs, nil))}, rec)
			waitFor(t, "the ServiceCIDR's CIDRs", 10*time.Second, func() bool { return cidrsOf(rec.last()) == "[10.96.0.0/16 10.100.0.0/16]" })
			if tc.name == "500" {
				if n := strings.Count(logs.String(), "level=WARN msg=\"listing networking.k8s.io/v1 ServiceCIDRs failed"); n != 1 ||
					!strings.Contains(logs.String(), "tries=30") || !strings.Contains(logs.String(), "etcd unavailable") {
					t.Errorf("31 failed lists: %d warnings, want one at the 30th with the error:\n%s", n, logs.String())
				}
			}
		})
	}
}
