package kube

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-lb/sluice/pkg/datapath"
	"github.com/sluice-lb/sluice/test/kube/kubeenv"
)

// TestServiceCIDRsFollowTheAPI: the real agent, started without
// --service-cidr, learns the service CIDRs from the apiserver's
// networking.k8s.io/v1 ServiceCIDR objects, as kube-proxy does. The
// apiserver (v1.36.3) makes the default "kubernetes" ServiceCIDR from its
// --service-cluster-ip-range: its ranges are in the pinned
// sluice_node_cidrs once the agent is ready. A second ServiceCIDR is added
// at run time: a client's connection to an address of it that no Service
// holds is dropped (tc_service_cidr_drop counts it) from then on, and not
// before. Deleted while a finalizer holds it (deletionTimestamp set, as
// while its addresses are still allocated) it still counts; gone, it is
// removed and the drop stops. (No kube-controller-manager runs here: its
// ServiceCIDR controller is what adds networking.k8s.io/service-cidr-
// finalizer, so without the test's own finalizer a ServiceCIDR is deleted
// at once.)
func TestServiceCIDRsFollowTheAPI(t *testing.T) {
	e := setupTrafficAgent(t, false, nil)
	ctx := context.Background()
	c := e.kube.Client
	pinned := func() ([]string, error) {
		p, err := datapath.OpenPinned(e.bpffs)
		if err != nil {
			return nil, err
		}
		defer p.Close()
		cidrs, err := p.NodeCIDRs()
		if err != nil {
			return nil, err
		}
		var out []string
		for _, nc := range cidrs {
			if s, ok := strings.CutPrefix(nc.String(), "service "); ok {
				out = append(out, s)
			}
		}
		slices.Sort(out)
		return out, nil
	}
	want := func(what string, cidrs ...string) {
		t.Helper()
		slices.Sort(cidrs)
		eventually(t, what, 30*time.Second, func() error {
			got, err := pinned()
			if err == nil && !slices.Equal(got, cidrs) {
				err = fmt.Errorf("pinned service CIDRs %v, want %v", got, cidrs)
			}
			return err
		})
	}
	if _, err := c.NetworkingV1().ServiceCIDRs().Get(ctx, "kubernetes", metav1.GetOptions{}); err != nil {
		t.Fatalf("the apiserver's default ServiceCIDR: %v", err)
	}
	want("the default ServiceCIDR's ranges", kubeenv.ServiceCIDR, kubeenv.ServiceCIDR6)

	const extra = "10.97.0.0/24"
	if err := e.lb.Client.AddRoute(netip.MustParsePrefix(extra), e.lb.NodeAddr); err != nil {
		t.Fatal(err)
	}
	drops := func() uint64 {
		t.Helper()
		n, err := e.agent.Counter(ctx, "tc_service_cidr_drop")
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	// A connection to 10.97.0.5:80, which no Service holds: it fails
	// whatever happens to it; the counter says whether it was dropped.
	dropped := func() bool {
		t.Helper()
		before := drops()
		if _, err := e.get("10.97.0.5:80", 500*time.Millisecond); err == nil {
			t.Fatal("10.97.0.5:80 answered")
		}
		return drops() > before
	}
	if dropped() {
		t.Fatal("10.97.0.5 dropped before any ServiceCIDR held it")
	}

	sc := &networkingv1.ServiceCIDR{
		ObjectMeta: metav1.ObjectMeta{Name: "extra", Finalizers: []string{"sluice.test/hold"}},
		Spec:       networkingv1.ServiceCIDRSpec{CIDRs: []string{extra}},
	}
	if _, err := c.NetworkingV1().ServiceCIDRs().Create(ctx, sc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	want("the second ServiceCIDR's range added", kubeenv.ServiceCIDR, kubeenv.ServiceCIDR6, extra)
	if !dropped() {
		t.Error("an unallocated address of the new ServiceCIDR not dropped")
	}
	if !strings.Contains(e.agent.Log.String(), "added=["+extra+"]") {
		t.Errorf("the change of the service CIDRs not logged:\n%s", e.agent.Log.String())
	}

	// Being deleted: still a service CIDR, as in kube-proxy.
	if err := c.NetworkingV1().ServiceCIDRs().Delete(ctx, "extra", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the deletionTimestamp", 10*time.Second, func() error {
		got, err := c.NetworkingV1().ServiceCIDRs().Get(ctx, "extra", metav1.GetOptions{})
		if err == nil && got.DeletionTimestamp == nil {
			err = fmt.Errorf("no deletionTimestamp")
		}
		return err
	})
	// Another change the agent programs after it, so that the range is
	// seen still there once the deletion's state is programmed.
	marker := createService(t, c, "default", "marker", nil, svcPort("http", 80, "http"))
	eventually(t, "the marker Service programmed", 30*time.Second, func() error {
		dump, err := e.agent.Services(ctx)
		if err == nil && !strings.Contains(dump, marker.Spec.ClusterIP+":80") {
			err = fmt.Errorf("marker %s not programmed:\n%s", marker.Spec.ClusterIP, dump)
		}
		return err
	})
	if got, err := pinned(); err != nil || !slices.Contains(got, extra) {
		t.Errorf("a ServiceCIDR being deleted left the service CIDRs: %v (%v)", got, err)
	}

	patch := []byte(`{"metadata":{"finalizers":null}}`)
	if _, err := c.NetworkingV1().ServiceCIDRs().Patch(ctx, "extra", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the ServiceCIDR gone", 10*time.Second, func() error {
		_, err := c.NetworkingV1().ServiceCIDRs().Get(ctx, "extra", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there: %v", err)
	})
	want("the deleted ServiceCIDR's range removed", kubeenv.ServiceCIDR, kubeenv.ServiceCIDR6)
	if dropped() {
		t.Error("an address of the deleted ServiceCIDR still dropped")
	}
}
