package translate

// The cost of translating one Service, as a first sync pays it for each:
// a LoadBalancer Service of 10 endpoints in one slice, the shape nearly
// every Service has, with externalTrafficPolicy Cluster and Local (the
// Local one with a healthCheckNodePort, whose count localReady makes).

import (
	"fmt"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

func BenchmarkTranslateLoadBalancer(b *testing.B) {
	tcp := corev1.ProtocolTCP
	var eps []ep
	for i := range 10 {
		eps = append(eps, ep{addr: fmt.Sprintf("10.1.0.%d", i+1), node: []string{"node-a", "node-b"}[i%2]})
	}
	es := slice("lb-1", "lb", []discoveryv1.EndpointPort{eport("http", 8080, tcp)}, eps...)
	node := Node{Name: "node-a", IPs: []netip.Addr{netip.MustParseAddr("192.168.1.1")}, Addresses: []netip.Addr{netip.MustParseAddr("192.168.1.1")}}
	for _, policy := range []corev1.ServiceExternalTrafficPolicy{corev1.ServiceExternalTrafficPolicyCluster, corev1.ServiceExternalTrafficPolicyLocal} {
		b.Run(string(policy), func(b *testing.B) {
			svc := service("lb", []string{"10.96.0.1"}, sport("http", 80, tcp))
			svc.Spec.Type = corev1.ServiceTypeLoadBalancer
			svc.Spec.Ports[0].NodePort = 30080
			svc.Spec.ExternalTrafficPolicy = policy
			if policy == corev1.ServiceExternalTrafficPolicyLocal {
				svc.Spec.HealthCheckNodePort = 30500
			}
			svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.51.100.4"}}
			s, sl := ServiceOf(svc), SlicesOf([]*discoveryv1.EndpointSlice{es})
			opts := Options{Node: node}
			if tr, err := Translate(s, sl, opts); err != nil || len(tr.Services) != 3 {
				b.Fatalf("Translate: %v, %d frontends", err, len(tr.Services))
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Translate(s, sl, opts); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
