package translate

import (
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// TestNoExternalIPs: with kube-proxy's feature gate
// AllowServiceExternalIPs off (Options.NoExternalIPs), spec.externalIPs
// get no frontends, and nothing else changes: ClusterIP, NodePort and
// LoadBalancer frontends (an ingress IP that is also an externalIP
// included) are as with the gate on, since kube-proxy gates only
// ExternalIPs() (pkg/proxy/serviceport.go); so are the traffic
// policies' answers (with internalTrafficPolicy Local and endpoints on
// other nodes only, the ClusterIP drops, gate on or off).
func TestNoExternalIPs(t *testing.T) {
	node := Node{Name: "node-a", Addresses: []netip.Addr{netip.MustParseAddr("192.168.1.1"), netip.MustParseAddr("2001:db8:100::1")}}
	p := sport("http", 80, corev1.ProtocolTCP)
	p.NodePort = 30080
	eports := []discoveryv1.EndpointPort{eport("http", 8080, corev1.ProtocolTCP)}
	eps := []*discoveryv1.EndpointSlice{
		slice("web-1", "web", eports, ep{addr: "10.1.0.1", node: "node-a"}, ep{addr: "10.2.0.1", node: "node-b"}),
		slice("web-6", "web", eports, ep{addr: "2001:db8:1::1", node: "node-a"}),
	}
	remote := []*discoveryv1.EndpointSlice{slice("web-1", "web", eports, ep{addr: "10.2.0.1", node: "node-b"})}

	for _, c := range []struct {
		name      string
		mod       func(*corev1.Service)
		eps       []*discoveryv1.EndpointSlice
		on, off   string // the frontends with the gate on and off
		unchanged bool   // off is on without its ExternalIP lines
	}{
		{name: "ClusterIP with externalIPs", mod: func(s *corev1.Service) {
			s.Spec.ExternalIPs = []string{"203.0.113.7", "203.0.113.8"}
		}, eps: eps, on: `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1 10.2.0.1
ExternalIP 203.0.113.7:80/TCP -> 10.1.0.1 10.2.0.1
ExternalIP 203.0.113.8:80/TCP -> 10.1.0.1 10.2.0.1
`, off: `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1 10.2.0.1
`},
		// The ingress IP that is also an externalIP is one frontend, the
		// LoadBalancer one (claimRank), gate on or off.
		{name: "dual stack LoadBalancer, one ingress IP also an externalIP", mod: func(s *corev1.Service) {
			dualStack(s)
			s.Spec.Type = corev1.ServiceTypeLoadBalancer
			s.Spec.ExternalIPs = []string{"203.0.113.7", "198.51.100.10", "2001:db8:aaaa::7"}
			s.Spec.LoadBalancerSourceRanges = []string{"198.51.100.0/24"}
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.51.100.10"}, {IP: "2001:db8:aaaa::10"}}
		}, eps: eps, on: `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1 10.2.0.1
NodePort 192.168.1.1:30080/TCP -> 10.1.0.1 10.2.0.1
LoadBalancer 198.51.100.10:80/TCP ranges=[198.51.100.0/24] -> 10.1.0.1 10.2.0.1
ExternalIP 203.0.113.7:80/TCP -> 10.1.0.1 10.2.0.1
ClusterIP [2001:db8::1]:80/TCP -> 2001:db8:1::1
NodePort [2001:db8:100::1]:30080/TCP -> 2001:db8:1::1
ExternalIP [2001:db8:aaaa::7]:80/TCP -> 2001:db8:1::1
LoadBalancer [2001:db8:aaaa::10]:80/TCP drop ->
`, unchanged: true},
		{name: "externalTrafficPolicy Local", mod: func(s *corev1.Service) {
			s.Spec.ExternalIPs = []string{"203.0.113.7"}
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		}, eps: eps, on: `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1 10.2.0.1
ExternalIP 203.0.113.7:80/TCP local -> 10.1.0.1 | internal -> 10.1.0.1 10.2.0.1
`, unchanged: true},
		{name: "internalTrafficPolicy Local, no endpoint here: the ClusterIP drops", mod: func(s *corev1.Service) {
			s.Spec.ExternalIPs = []string{"203.0.113.7"}
			s.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal)
		}, eps: remote, on: `
ClusterIP 10.96.0.1:80/TCP drop ->
ExternalIP 203.0.113.7:80/TCP -> 10.2.0.1
`, unchanged: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			off := c.off
			if c.unchanged {
				var keep []string
				for _, l := range strings.SplitAfter(c.on, "\n") {
					if !strings.HasPrefix(l, "ExternalIP ") {
						keep = append(keep, l)
					}
				}
				off = strings.Join(keep, "")
			}
			for _, g := range []struct {
				noExternalIPs bool
				want          string
			}{{false, c.on}, {true, off}} {
				svc := service("web", []string{"10.96.0.1"}, p)
				c.mod(svc)
				tr, err := ServiceToModel(svc, c.eps, Options{Node: node, NoExternalIPs: g.noExternalIPs})
				if err != nil || tr.Skipped != "" {
					t.Fatalf("NoExternalIPs %v: ServiceToModel: %v %q", g.noExternalIPs, err, tr.Skipped)
				}
				if got, want := renderNS(tr.Services), strings.TrimPrefix(g.want, "\n"); got != want {
					t.Errorf("NoExternalIPs %v: got\n%s\nwant\n%s", g.noExternalIPs, got, want)
				}
			}
		})
	}
}
