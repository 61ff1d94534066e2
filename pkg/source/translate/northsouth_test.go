package translate

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/sluice-lb/sluice/pkg/model"
)

func renderNS(svcs []*model.Service) string {
	kinds := map[model.FrontendKind]string{model.ClusterIP: "ClusterIP", model.NodePort: "NodePort", model.ExternalIP: "ExternalIP", model.LoadBalancer: "LoadBalancer"}
	var sb strings.Builder
	for _, s := range svcs {
		fmt.Fprintf(&sb, "%s %s", kinds[s.Kind], s.Frontend)
		if s.ExternalLocal {
			sb.WriteString(" local")
		}
		if s.HealthCheckNodePort != 0 {
			fmt.Fprintf(&sb, " hc=%d", s.HealthCheckNodePort)
		}
		if len(s.SourceRanges) > 0 {
			fmt.Fprintf(&sb, " ranges=%v", s.SourceRanges)
		}
		if len(s.LocalReady) > 0 {
			fmt.Fprintf(&sb, " ready=%v", s.LocalReady)
		}
		if s.DropWhenEmpty {
			sb.WriteString(" drop")
		}
		sb.WriteString(" ->")
		for _, b := range s.Backends {
			fmt.Fprintf(&sb, " %s", b.Addr)
			if b.Terminating {
				sb.WriteString("(term)")
			}
		}
		if s.TwoScopes {
			sb.WriteString(" | internal ->")
			for _, b := range s.InternalBackends {
				fmt.Fprintf(&sb, " %s", b.Addr)
				if b.Terminating {
					sb.WriteString("(term)")
				}
			}
		}
		sb.WriteString("\n")
	}
	return sb.String()
}

func TestNorthSouthFrontends(t *testing.T) {
	// NodePorts on two IPv4 addresses and an IPv6 one; slices of both
	// families: an IPv4 Service uses the IPv4 ones only (and the rows
	// that make it dual stack or IPv6 the others).
	opts := Options{Node: Node{Name: "node-a", Addresses: []netip.Addr{netip.MustParseAddr("192.168.1.1"), netip.MustParseAddr("192.168.2.1"), netip.MustParseAddr("2001:db8:100::1")}}}
	p := sport("http", 80, corev1.ProtocolTCP)
	p.NodePort = 30080
	eports := []discoveryv1.EndpointPort{eport("http", 8080, corev1.ProtocolTCP)}
	eps := []*discoveryv1.EndpointSlice{slice("web-1", "web", eports,
		ep{addr: "10.1.0.1", node: "node-a"},
		ep{addr: "10.2.0.1", node: "node-b"},
		ep{addr: "10.1.0.2", node: "node-a", ready: ptr(false), serving: ptr(true), terminate: ptr(true)},
	), slice("web-6", "web", eports,
		ep{addr: "2001:db8:1::1", node: "node-a"},
		ep{addr: "2001:db8:2::1", node: "node-b"},
	)}
	dual := func(mod func(*corev1.Service)) func(*corev1.Service) {
		return func(s *corev1.Service) { mod(s); dualStack(s) }
	}

	for _, c := range []struct {
		name string
		mod  func(*corev1.Service)
		opts Options
		want string
	}{
		{"NodePort cluster", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort }, opts, `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1 10.2.0.1
NodePort 192.168.1.1:30080/TCP -> 10.1.0.1 10.2.0.1
NodePort 192.168.2.1:30080/TCP -> 10.1.0.1 10.2.0.1
`},
		{"NodePort local", nodePort(corev1.ServiceExternalTrafficPolicyLocal), opts, `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1 10.2.0.1
NodePort 192.168.1.1:30080/TCP local -> 10.1.0.1 | internal -> 10.1.0.1 10.2.0.1
NodePort 192.168.2.1:30080/TCP local -> 10.1.0.1 | internal -> 10.1.0.1 10.2.0.1
`},
		{"NodePort local on a node without endpoints", nodePort(corev1.ServiceExternalTrafficPolicyLocal), Options{Node: Node{Name: "node-c", Addresses: opts.Node.Addresses[:1]}}, `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1 10.2.0.1
NodePort 192.168.1.1:30080/TCP local drop -> | internal -> 10.1.0.1 10.2.0.1
`},
		{"dual stack NodePort cluster: NodePorts on each family's addresses", dual(func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort }), opts, `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1 10.2.0.1
NodePort 192.168.1.1:30080/TCP -> 10.1.0.1 10.2.0.1
NodePort 192.168.2.1:30080/TCP -> 10.1.0.1 10.2.0.1
ClusterIP [2001:db8::1]:80/TCP -> 2001:db8:1::1 2001:db8:2::1
NodePort [2001:db8:100::1]:30080/TCP -> 2001:db8:1::1 2001:db8:2::1
`},
		{"IPv6 NodePort local", both(nodePort(corev1.ServiceExternalTrafficPolicyLocal), ipv6), opts, `
ClusterIP [2001:db8::1]:80/TCP -> 2001:db8:1::1 2001:db8:2::1
NodePort [2001:db8:100::1]:30080/TCP local -> 2001:db8:1::1 | internal -> 2001:db8:1::1 2001:db8:2::1
`},
		{"dual stack NodePort on a node with IPv4 addresses only: IPv6 has no NodePort", dual(func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort }),
			Options{Node: Node{Name: "node-a", Addresses: opts.Node.Addresses[:1]}}, `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1 10.2.0.1
NodePort 192.168.1.1:30080/TCP -> 10.1.0.1 10.2.0.1
ClusterIP [2001:db8::1]:80/TCP -> 2001:db8:1::1 2001:db8:2::1
`},
		{"no node IPs, no NodePort", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort }, Options{Node: Node{Name: "node-a"}}, `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1 10.2.0.1
`},
		{"ClusterIP with externalIPs", func(s *corev1.Service) {
			s.Spec.ExternalIPs = []string{"203.0.113.7", "2001:db8::1"}
		}, opts, `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1 10.2.0.1
ExternalIP 203.0.113.7:80/TCP -> 10.1.0.1 10.2.0.1
`},
		{"dual stack ClusterIP with externalIPs", dual(func(s *corev1.Service) {
			s.Spec.ExternalIPs = []string{"203.0.113.7", "2001:db8:aaaa::1", "::ffff:203.0.113.8"}
		}), opts, `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1 10.2.0.1
ExternalIP 203.0.113.7:80/TCP -> 10.1.0.1 10.2.0.1
ExternalIP 203.0.113.8:80/TCP -> 10.1.0.1 10.2.0.1
ClusterIP [2001:db8::1]:80/TCP -> 2001:db8:1::1 2001:db8:2::1
ExternalIP [2001:db8:aaaa::1]:80/TCP -> 2001:db8:1::1 2001:db8:2::1
`},
		{"LoadBalancer local with ranges and health check", func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeLoadBalancer
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			s.Spec.HealthCheckNodePort = 32000
			s.Spec.LoadBalancerSourceRanges = []string{"198.51.100.0/24", "10.0.0.0/8", "10.0.0.0/8", "bogus"}
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.51.100.10"}, {Hostname: "lb.example"}}
		}, Options{Node: Node{Name: "node-a", Addresses: opts.Node.Addresses[:1]}}, `
ClusterIP 10.96.0.1:80/TCP hc=32000 ready=[10.1.0.1] -> 10.1.0.1 10.2.0.1
NodePort 192.168.1.1:30080/TCP local hc=32000 ready=[10.1.0.1] -> 10.1.0.1 | internal -> 10.1.0.1 10.2.0.1
LoadBalancer 198.51.100.10:80/TCP local hc=32000 ranges=[10.0.0.0/8 198.51.100.0/24] ready=[10.1.0.1] -> 10.1.0.1 | internal -> 10.1.0.1 10.2.0.1
`},
		{"dual stack LoadBalancer local with ranges and health check", dual(func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeLoadBalancer
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			s.Spec.HealthCheckNodePort = 32000
			s.Spec.LoadBalancerSourceRanges = []string{"198.51.100.0/24", "2001:db8:aaaa::/64"}
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "2001:db8:aaaa::10"}, {IP: "198.51.100.10"}}
		}), Options{Node: Node{Name: "node-a", Addresses: []netip.Addr{opts.Node.Addresses[0], opts.Node.Addresses[2]}}}, `
ClusterIP 10.96.0.1:80/TCP hc=32000 ready=[10.1.0.1] -> 10.1.0.1 10.2.0.1
NodePort 192.168.1.1:30080/TCP local hc=32000 ready=[10.1.0.1] -> 10.1.0.1 | internal -> 10.1.0.1 10.2.0.1
LoadBalancer 198.51.100.10:80/TCP local hc=32000 ranges=[198.51.100.0/24] ready=[10.1.0.1] -> 10.1.0.1 | internal -> 10.1.0.1 10.2.0.1
ClusterIP [2001:db8::1]:80/TCP hc=32000 ready=[2001:db8:1::1] -> 2001:db8:1::1 2001:db8:2::1
NodePort [2001:db8:100::1]:30080/TCP local hc=32000 ready=[2001:db8:1::1] -> 2001:db8:1::1 | internal -> 2001:db8:1::1 2001:db8:2::1
LoadBalancer [2001:db8:aaaa::10]:80/TCP local hc=32000 ranges=[2001:db8:aaaa::/64] ready=[2001:db8:1::1] -> 2001:db8:1::1 | internal -> 2001:db8:1::1 2001:db8:2::1
`},
		{"LoadBalancer open to all", func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeLoadBalancer
			s.Spec.LoadBalancerSourceRanges = []string{"10.0.0.0/8", "0.0.0.0/0"}
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.51.100.10"}}
		}, Options{Node: Node{Name: "node-a"}}, `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1 10.2.0.1
LoadBalancer 198.51.100.10:80/TCP -> 10.1.0.1 10.2.0.1
`},
	} {
		t.Run(c.name, func(t *testing.T) {
			svc := service("web", []string{"10.96.0.1"}, p)
			c.mod(svc)
			tr, err := ServiceToModel(svc, eps, c.opts)
			got, skipped := tr.Services, tr.Skipped
			if err != nil || skipped != "" {
				t.Fatalf("ServiceToModel: %v %q", err, skipped)
			}
			if g, w := renderNS(got), strings.TrimPrefix(c.want, "\n"); g != w {
				t.Fatalf("got\n%s\nwant\n%s", g, w)
			}
		})
	}
}

// Local endpoints fall back to serving-and-terminating ones on this node,
// even when other nodes have ready endpoints (kube-proxy's rule for Local).
func TestNorthSouthLocalTerminatingFallback(t *testing.T) {
	p := sport("http", 80, corev1.ProtocolTCP)
	p.NodePort = 30080
	svc := service("web", []string{"10.96.0.1"}, p)
	svc.Spec.Type = corev1.ServiceTypeNodePort
	svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	eps := []*discoveryv1.EndpointSlice{slice("web-1", "web", []discoveryv1.EndpointPort{eport("http", 8080, corev1.ProtocolTCP)},
		ep{addr: "10.2.0.1", node: "node-b"},
		ep{addr: "10.1.0.2", node: "node-a", ready: ptr(false), serving: ptr(true), terminate: ptr(true)},
	)}
	tr, err := ServiceToModel(svc, eps, Options{Node: Node{Name: "node-a", Addresses: []netip.Addr{netip.MustParseAddr("192.168.1.1")}}})
	got := tr.Services
	if err != nil {
		t.Fatal(err)
	}
	want := "ClusterIP 10.96.0.1:80/TCP -> 10.2.0.1\nNodePort 192.168.1.1:30080/TCP local -> 10.1.0.2(term) | internal -> 10.2.0.1\n"
	if g := renderNS(got); g != want {
		t.Fatalf("got\n%s\nwant\n%s", g, want)
	}
}

func TestNodeIPs(t *testing.T) {
	node := &corev1.Node{Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
		{Type: corev1.NodeHostName, Address: "node-a"},
		{Type: corev1.NodeExternalIP, Address: "203.0.113.5"},
		{Type: corev1.NodeInternalIP, Address: "192.168.1.1"},
		{Type: corev1.NodeInternalIP, Address: "2001:db8::1"},
		{Type: corev1.NodeExternalIP, Address: "::ffff:192.168.1.1"},
		{Type: corev1.NodeExternalIP, Address: "2001:db8:0::2"},
		{Type: corev1.NodeExternalIP, Address: "bogus"},
	}}}
	got := NodeIPs(node)
	want := "[192.168.1.1 2001:db8::1 203.0.113.5 2001:db8::2]"
	if fmt.Sprint(got) != want {
		t.Fatalf("NodeIPs = %v, want %v", got, want)
	}
	// The first of each family is the node's primary address of it.
	if p, want := PrimaryIPs(got), "[192.168.1.1 2001:db8::1]"; fmt.Sprint(p) != want {
		t.Fatalf("PrimaryIPs = %v, want %v", p, want)
	}
	if p, want := PrimaryIPs(got[1:]), "[2001:db8::1 203.0.113.5]"; fmt.Sprint(p) != want {
		t.Fatalf("PrimaryIPs = %v, want %v", p, want)
	}
	if NodeIPs(nil) != nil {
		t.Fatal("NodeIPs(nil) != nil")
	}
}

// NodeFacts name what a translation read of the node: a change of any
// other part gives the same result, which is what lets the tracker skip
// the Service when only that part changes.
func TestNodeFacts(t *testing.T) {
	p := sport("http", 80, corev1.ProtocolTCP)
	p.NodePort = 30080
	eps := []*discoveryv1.EndpointSlice{slice("web-1", "web", []discoveryv1.EndpointPort{eport("http", 8080, corev1.ProtocolTCP)},
		ep{addr: "10.1.0.1", node: "node-a"}, ep{addr: "10.2.0.1", node: "node-b"})}
	node := Node{Name: "node-a", Addresses: []netip.Addr{netip.MustParseAddr("192.168.1.1"), netip.MustParseAddr("2001:db8:1::1")},
		Labels: map[string]string{corev1.LabelTopologyZone: "zone-a"}}
	others := map[NodeFacts]Node{
		NodeName:      {Name: "node-b", Addresses: node.Addresses, Labels: node.Labels},
		NodeAddresses: {Name: node.Name, Addresses: []netip.Addr{netip.MustParseAddr("192.168.9.9"), netip.MustParseAddr("2001:db8:9::9")}, Labels: node.Labels},
		NodeLabels:    {Name: node.Name, Addresses: node.Addresses, Labels: map[string]string{corev1.LabelTopologyZone: "zone-b"}},
	}
	for _, c := range []struct {
		name string
		mod  func(*corev1.Service)
		want NodeFacts
	}{
		{"ClusterIP", func(*corev1.Service) {}, 0},
		{"ClusterIP with externalIPs", func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"203.0.113.7"} }, 0},
		{"NodePort", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort }, NodeAddresses},
		{"dual stack NodePort", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort; dualStack(s) }, NodeAddresses},
		{"IPv6 ClusterIP with externalIPs", func(s *corev1.Service) { ipv6(s); s.Spec.ExternalIPs = []string{"2001:db8:aaaa::7"} }, 0},
		{"NodePort local", func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeNodePort
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		}, NodeAddresses | NodeName},
		{"ExternalName", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeExternalName }, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			svc := service("web", []string{"10.96.0.1"}, p)
			c.mod(svc)
			tr, err := ServiceToModel(svc, eps, Options{Node: node})
			if err != nil {
				t.Fatal(err)
			}
			if tr.NodeFacts != c.want {
				t.Fatalf("NodeFacts = %b, want %b", tr.NodeFacts, c.want)
			}
			for part, other := range others {
				if d := node.Diff(other); d != part {
					t.Fatalf("Diff = %b, want %b", d, part)
				}
				again, err := ServiceToModel(svc, eps, Options{Node: other})
				if err != nil {
					t.Fatal(err)
				}
				if same := renderNS(again.Services) == renderNS(tr.Services); same == (part&tr.NodeFacts != 0) {
					t.Errorf("node %s changed: same result = %v, but NodeFacts %b", map[NodeFacts]string{NodeName: "name", NodeAddresses: "addresses", NodeLabels: "labels"}[part], same, tr.NodeFacts)
				}
			}
		})
	}
}
