package translate

// The local endpoints a healthCheckNodePort counts. kube-proxy
// (endpointschangetracker.go, getLocalReadyEndpointIPs) counts the
// addresses of the ready local endpoints of its endpoints map: the
// slices' ports that have a number (not nil, not 0; endpointslicecache.go
// endpointInfoByServicePort), one listing per address and port (the one
// addEndpoints keeps). Sluice counted every ready local listing of any
// slice with a port, numbered or not.

import (
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

func TestHealthCheckLocalCount(t *testing.T) {
	tcp := corev1.ProtocolTCP
	svc := service("h", []string{"10.96.0.40"}, sport("a", 80, tcp))
	svc.Spec.Type = corev1.ServiceTypeLoadBalancer
	svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	svc.Spec.HealthCheckNodePort = 30500
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.51.100.4"}}
	noNumber := discoveryv1.EndpointPort{Name: ptr("a"), Protocol: ptr(tcp)}
	on := func(addr string, ready, terminating bool) ep {
		return ep{addr: addr, node: "n1", ready: ptr(ready), serving: ptr(ready), terminate: ptr(terminating)}
	}
	cases := []struct {
		name   string
		slices []*discoveryv1.EndpointSlice
		want   []string
	}{
		{
			name: "a slice whose port has no number is not counted",
			slices: []*discoveryv1.EndpointSlice{
				slice("h-1", "h", []discoveryv1.EndpointPort{eport("a", 8080, tcp)}, on("10.0.0.1", true, false)),
				slice("h-2", "h", []discoveryv1.EndpointPort{noNumber}, on("10.0.0.2", true, false)),
			},
			want: []string{"10.0.0.1"},
		},
		{
			name: "a slice whose port is 0 is not counted",
			slices: []*discoveryv1.EndpointSlice{
				slice("h-1", "h", []discoveryv1.EndpointPort{eport("a", 8080, tcp)}, on("10.0.0.1", true, false)),
				slice("h-2", "h", []discoveryv1.EndpointPort{eport("a", 0, tcp)}, on("10.0.0.2", true, false)),
			},
			want: []string{"10.0.0.1"},
		},
		{
			// kube-proxy keeps the non-terminating listing of
			// 10.0.0.2:8080, which is not ready.
			name: "a ready terminating listing beside a non-terminating one that is not ready is not counted",
			slices: []*discoveryv1.EndpointSlice{
				slice("h-1", "h", []discoveryv1.EndpointPort{eport("a", 8080, tcp)}, on("10.0.0.1", true, false), on("10.0.0.2", true, true)),
				slice("h-2", "h", []discoveryv1.EndpointPort{eport("a", 8080, tcp)}, on("10.0.0.2", false, false)),
			},
			want: []string{"10.0.0.1"},
		},
		{
			// Listed on another port (another number, or a port the
			// Service does not have) it is another endpoint of
			// kube-proxy's map, and it counts; an address counts once.
			name: "ready on another port counts, once",
			slices: []*discoveryv1.EndpointSlice{
				slice("h-1", "h", []discoveryv1.EndpointPort{eport("a", 8080, tcp)}, on("10.0.0.1", true, false), on("10.0.0.2", true, true)),
				slice("h-2", "h", []discoveryv1.EndpointPort{eport("a", 8080, tcp)}, on("10.0.0.2", false, false)),
				slice("h-3", "h", []discoveryv1.EndpointPort{eport("other", 9090, tcp)}, on("10.0.0.2", true, false), on("10.0.0.1", true, false)),
			},
			want: []string{"10.0.0.1", "10.0.0.2"},
		},
	}
	opts := Options{Node: Node{Name: "n1", Addresses: []netip.Addr{netip.MustParseAddr("192.168.1.1")}}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := ServiceToModel(svc, tc.slices, opts)
			if err != nil {
				t.Fatal(err)
			}
			var want []netip.Addr
			for _, a := range tc.want {
				want = append(want, netip.MustParseAddr(a))
			}
			n := 0
			for _, s := range tr.Services {
				if s.HealthCheckNodePort == 0 {
					continue
				}
				n++
				if !slices.Equal(s.LocalReady, want) {
					t.Errorf("%s: LocalReady %v, want %v", s.Frontend, s.LocalReady, want)
				}
			}
			if n == 0 {
				t.Fatalf("no frontend has the health check port:\n%s", renderNS(tr.Services))
			}
		})
	}
}
