package kube

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// TestNodeAddressesFollowed: the NodePort addresses the caller gives
// (SetNodeAddresses: the node's interfaces changed) reach the states, from
// before Run too, and stay when the Node object's labels change (which
// once put back the addresses of the start); an address gone takes its
// NodePort frontends with it.
func TestNodeAddressesFollowed(t *testing.T) {
	a := netip.MustParseAddr
	svc := service("web", "10.96.0.10", 80)
	svc.Spec.Type = corev1.ServiceTypeNodePort
	svc.Spec.Ports[0].NodePort = 30080
	zone := func(z string) map[string]string { return map[string]string{corev1.LabelTopologyZone: z} }
	client := fake.NewClientset(svc, slice("web", "web-1", 8080, "10.0.0.1"),
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Labels: zone("zone-a")}})
	src, err := New(Config{Client: client, SyncPeriod: time.Hour,
		Options: translate.Options{Node: translate.Node{Name: node, Addresses: []netip.Addr{a("192.168.1.1")}}}})
	if err != nil {
		t.Fatal(err)
	}
	src.SetNodeAddresses([]netip.Addr{a("192.168.1.1"), a("192.168.7.12")})
	rec := &recorder{}
	testutil.RunUntilCleanup(t, "Run", func(ctx context.Context) error { return src.Run(ctx, rec.apply) })
	nodePorts := func() string {
		var on []string
		for _, addr := range []string{"192.168.1.1", "192.168.7.12"} {
			if _, ok := backendsOf(rec.last(), addr, 30080); ok {
				on = append(on, addr)
			}
		}
		return fmt.Sprint(on)
	}
	waitFor(t, "NodePorts on both addresses", 5*time.Second, func() bool { return nodePorts() == "[192.168.1.1 192.168.7.12]" })

	n, err := client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Labels = zone("zone-b")
	if _, err := client.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the new zone", 5*time.Second, func() bool { return src.tracker.Node().Labels[corev1.LabelTopologyZone] == "zone-b" })
	if got := src.tracker.Node().Addresses; !slices.Equal(got, []netip.Addr{a("192.168.1.1"), a("192.168.7.12")}) {
		t.Fatalf("the Node's labels changed the NodePort addresses to %v", got)
	}

	src.SetNodeAddresses([]netip.Addr{a("192.168.7.12")})
	waitFor(t, "the NodePort of the address gone removed", 5*time.Second, func() bool { return nodePorts() == "[192.168.7.12]" })
}
