package datapath

import (
	"testing"

	"github.com/sluice-lb/sluice/pkg/model"
)

// TestLiveChangeUDPAddressClaimed: a UDP Service's LoadBalancer IP
// removed, then given to another Service, each in its own sync, with a
// flow established through the LoadBalancer IP and one through the
// ClusterIP. kube-proxy: the removal cleans nothing (cleanup.go:96-112
// keys the frontends the Service ports have now), so both flows keep
// their entries; once the address is the other Service's, with serving
// endpoints, CleanStaleEntries deletes the entries at it whose reply
// source is not one of them (cleanup.go:96-104, 133-136): the old flow's
// next datagram is a new flow, to the other Service's backend, never the
// first Service's. Sluice's retired master keeps the flow between the
// two syncs; the claim flushes the old backend (by address: the
// ClusterIP's flow is re-balanced too, to the same backend, its
// Service's only one). Without the flush on claim
// (pkg/reconciler/udpretired.go, claimUDPFlows) the old flow's datagram
// went on to the first Service's backend under the other Service's
// master.
func TestLiveChangeUDPAddressClaimed(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		a := twinOf(v6)
		cip := l4(a("10.96.24.1"), 53, model.UDP)
		lb := l4(a("192.168.1.224"), 53, model.UDP)
		be1, be2 := l4(a("10.1.24.1"), 5353, model.UDP), l4(a("10.1.24.2"), 5353, model.UDP)
		name := model.ServicePortName{Namespace: "test", Name: "dns", Port: "dns"}
		cipS, lbS := clusterIP(cip, be1), clusterIP(lb, be1)
		cipS.Name, lbS.Name, lbS.Kind = name, name, model.LoadBalancer
		other := clusterIP(lb, be2)
		other.Kind = model.LoadBalancer
		client := a("10.0.24.3")
		b := newLiveBench(t)
		b.apply(t, cipS, lbS)
		viaLB, viaCIP := flow{client, 45600, lb}, flow{client, 45601, cip}
		b.open(t, viaLB, be1)
		b.open(t, viaCIP, be1)

		b.apply(t, cipS)
		t.Run("removed", func(t *testing.T) {
			b.follows(t, viaLB, be1)
			b.follows(t, viaCIP, be1)
			b.startsNone(t, flow{client, 45602, lb})
		})

		b.apply(t, cipS, other)
		t.Run("claimed by another Service", func(t *testing.T) {
			if _, ok := ctLookup(t, b.d.Maps(), viaLB.fwdKey()); ok {
				t.Errorf("flow to the first Service's backend %s at the claimed address: its conntrack entry kept", be1)
			}
			b.startsTo(t, viaLB, be2)
			b.startsTo(t, viaCIP, be1)
		})
	})
}
