package translate

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/sluice-lb/sluice/pkg/model"
)

// An address that one Service names twice at one port and protocol (an
// externalIP that is also a LoadBalancer ingress IP, an externalIP listed
// twice, a node address whose NodePort is a port of the Service) is one
// frontend, the one kube-proxy's nftables proxier serves: its
// firewall-check map, keyed by LoadBalancer IP, protocol and port, drops
// sources outside loadBalancerSourceRanges before any DNAT, whether the
// address is an ExternalIP too or not; its service-IPs map (ClusterIPs,
// ExternalIPs, LoadBalancer IPs; an ExternalIP's entry written after a
// ClusterIP's) is looked up before its NodePorts map. Before, both
// frontends were listed, the tracker's rule for two Services picked one
// (the ExternalIP, without the ranges: open to every source) and reported
// the Service as losing a conflict to itself.
func TestOneFrontendPerAddress(t *testing.T) {
	p := sport("http", 80, corev1.ProtocolTCP)
	eps := []*discoveryv1.EndpointSlice{slice("lb-1", "lb", []discoveryv1.EndpointPort{eport("http", 8080, corev1.ProtocolTCP)}, here)}
	node := Node{Name: "node-a", IPs: []netip.Addr{netip.MustParseAddr("192.168.1.1")}, Addresses: []netip.Addr{netip.MustParseAddr("192.168.1.1")}}
	lbExt := func(mod func(*corev1.Service)) func(*corev1.Service) {
		return func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeLoadBalancer
			s.Spec.ExternalIPs = []string{"198.51.100.4"}
			s.Spec.LoadBalancerSourceRanges = []string{"203.0.113.0/24"}
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.51.100.4"}}
			if mod != nil {
				mod(s)
			}
		}
	}
	for _, c := range []struct {
		name string
		mod  func(*corev1.Service)
		want string
	}{
		{"externalIP and LoadBalancer IP: the LoadBalancer's, with its ranges", lbExt(nil), `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1
LoadBalancer 198.51.100.4:80/TCP ranges=[203.0.113.0/24] -> 10.1.0.1
`},
		{"externalIP first and listed twice, ingress twice", lbExt(func(s *corev1.Service) {
			s.Spec.ExternalIPs = []string{"198.51.100.4", "198.51.100.5", "198.51.100.4"}
			s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: "198.51.100.4"})
		}), `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1
LoadBalancer 198.51.100.4:80/TCP ranges=[203.0.113.0/24] -> 10.1.0.1
ExternalIP 198.51.100.5:80/TCP -> 10.1.0.1
`},
		{"externalTrafficPolicy Local: the LoadBalancer's", lbExt(func(s *corev1.Service) {
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		}), `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1
LoadBalancer 198.51.100.4:80/TCP local ranges=[203.0.113.0/24] -> 10.1.0.1 | internal -> 10.1.0.1
`},
		// A range holding the node's address also admits the
		// LoadBalancer IP itself, as for any LoadBalancer IP.
		{"range holding the node", lbExt(func(s *corev1.Service) {
			s.Spec.LoadBalancerSourceRanges = []string{"192.168.0.0/16"}
		}), `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1
LoadBalancer 198.51.100.4:80/TCP ranges=[192.168.0.0/16 198.51.100.4/32] -> 10.1.0.1
`},
		// Sluice closes a LoadBalancer IP whose ranges hold none of its
		// family (a deliberate deviation): being an externalIP too
		// does not open it.
		{"ranges of the other family only: closed, not open", lbExt(func(s *corev1.Service) {
			s.Spec.LoadBalancerSourceRanges = []string{"2001:db8::/64"}
		}), `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1
LoadBalancer 198.51.100.4:80/TCP drop ->
`},
		// ipMode Proxy: kube-proxy programs no LoadBalancer IP
		// (LoadBalancerVIPs holds VIP-mode IPs only), so no firewall
		// element either; the address is served as the externalIP it
		// also is, open to every source, as kube-proxy's service-IPs
		// map serves it.
		{"ipMode Proxy: the externalIP's, without ranges", lbExt(func(s *corev1.Service) {
			s.Status.LoadBalancer.Ingress[0].IPMode = ptr(corev1.LoadBalancerIPModeProxy)
		}), `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1
ExternalIP 198.51.100.4:80/TCP -> 10.1.0.1
`},
		// An externalIP that is a node address, at a port that is the
		// Service's NodePort: the externalIP's. kube-proxy looks the
		// service-IPs map up first, but writes an externalIP's element
		// there only when its port has endpoints: here port "alt" has
		// none, so kube-proxy DNATs 192.168.1.1:30080 to port "http"'s
		// endpoints by its NodePorts map, where Sluice rejects (a
		// deviation, in the README's kube-proxy behaviour table). With
		// endpoints for "alt", both serve the externalIP's.
		{"externalIP at a NodePort of the same address", func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeNodePort
			s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "alt", Port: 30080, Protocol: corev1.ProtocolTCP})
			s.Spec.Ports[0].NodePort = 30080
			s.Spec.ExternalIPs = []string{"192.168.1.1"}
		}, `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1
ClusterIP 10.96.0.1:30080/TCP ->
ExternalIP 192.168.1.1:80/TCP -> 10.1.0.1
ExternalIP 192.168.1.1:30080/TCP ->
`},
	} {
		t.Run(c.name, func(t *testing.T) {
			svc := service("lb", []string{"10.96.0.1"}, p)
			c.mod(svc)
			tr, err := ServiceToModel(svc, eps, Options{Node: node})
			if err != nil || tr.Skipped != "" {
				t.Fatalf("ServiceToModel: %v %q", err, tr.Skipped)
			}
			if g, w := renderNS(tr.Services), strings.TrimPrefix(c.want, "\n"); g != w {
				t.Fatalf("got\n%s\nwant\n%s", g, w)
			}
		})
	}
}

// Two ports of one kind at one frontend (two ports sharing a nodePort and
// protocol, which ValidateService refuses as the API server does): the
// first port by name is kept, whatever the order of the ports.
func TestOneFrontendTieBreak(t *testing.T) {
	eps := []*discoveryv1.EndpointSlice{slice("a-1", "a", []discoveryv1.EndpointPort{eport("p0", 8080, corev1.ProtocolTCP), eport("p1", 8081, corev1.ProtocolTCP)}, here)}
	node := Node{Name: "node-a", IPs: []netip.Addr{netip.MustParseAddr("192.168.1.1")}, Addresses: []netip.Addr{netip.MustParseAddr("192.168.1.1")}}
	for _, reverse := range []bool{false, true} {
		svc := nodePorts(30080, "TCP", 30080, "TCP")
		if reverse {
			slices.Reverse(svc.Spec.Ports)
		}
		if ValidateService(svc) == nil {
			t.Fatal("ValidateService took two ports sharing a nodePort")
		}
		// Made valid, then given the shared nodePort back: what a
		// Translation does with it all the same.
		svc.Spec.Ports[1].NodePort = 30081
		s := MakeService(svc)
		s.Ports[1].NodePort = 30080
		tr, err := Translate(&s, SlicesOf(eps), Options{Node: node})
		if err != nil {
			t.Fatal(err)
		}
		want := `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1
ClusterIP 10.96.0.1:81/TCP -> 10.1.0.1
NodePort 192.168.1.1:30080/TCP -> 10.1.0.1
`
		if g, w := renderNS(tr.Services), strings.TrimPrefix(want, "\n"); g != w {
			t.Fatalf("reverse %v: got\n%s\nwant\n%s", reverse, g, w)
		}
		for _, f := range tr.Services {
			if f.Kind == model.NodePort && (f.Name.Port != "p0" || f.Backends[0].Port != 8080) {
				t.Errorf("reverse %v: the NodePort is port %q's (to %v), want p0's", reverse, f.Name.Port, f.Backends)
			}
		}
	}
}
