package translate

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-lb/sluice/pkg/model"
)

func ptr[T any](v T) *T { return &v }

func service(name string, ips []string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec:       corev1.ServiceSpec{ClusterIPs: ips, Ports: ports},
	}
}

func sport(name string, port int32, proto corev1.Protocol) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Port: port, Protocol: proto}
}

type ep struct {
	addr                      string
	ready, serving, terminate *bool
	node                      string
}

// slice returns an EndpointSlice of Service svc; its addressType is
// IPv6 if its first endpoint's address is.
func slice(name, svc string, ports []discoveryv1.EndpointPort, eps ...ep) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       ports,
	}
	for _, e := range eps {
		x := discoveryv1.Endpoint{Addresses: []string{e.addr}, Conditions: discoveryv1.EndpointConditions{Ready: e.ready, Serving: e.serving, Terminating: e.terminate}}
		if e.node != "" {
			x.NodeName = ptr(e.node)
		}
		es.Endpoints = append(es.Endpoints, x)
	}
	if len(eps) > 0 && strings.Contains(eps[0].addr, ":") && !strings.Contains(eps[0].addr, ".") {
		es.AddressType = discoveryv1.AddressTypeIPv6
	}
	return es
}

func eport(name string, port int32, proto corev1.Protocol) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: ptr(name), Port: ptr(port), Protocol: ptr(proto)}
}

// render prints services, translated from eps, compactly: "frontend
// name -> b1 b2@node", with the node of the endpoint listing each backend
// was taken from (endpointsFor's choice among an endpoint's listings; the
// model does not keep it).
func render(svcs []*model.Service, eps []*discoveryv1.EndpointSlice) string {
	var sb strings.Builder
	for _, s := range svcs {
		nodes := nodesOf(s, eps)
		fmt.Fprintf(&sb, "%s %s ->", s.Frontend, s.Name)
		for _, b := range s.Backends {
			fmt.Fprintf(&sb, " %s", b.L4Addr)
			if b.Terminating {
				sb.WriteString("(term)")
			}
			if n := nodes[b.L4Addr]; n != "" {
				fmt.Fprintf(&sb, "@%s", n)
			}
		}
		sb.WriteString("\n")
	}
	return sb.String()
}

// nodesOf returns the node of each endpoint of s's port in the slices of
// its Service and family among eps, from the listing endpointsFor
// chooses, by backend.
func nodesOf(s *model.Service, eps []*discoveryv1.EndpointSlice) map[model.L4Addr]string {
	var read []*Slice
	for _, es := range eps {
		if nn, ok := ServiceNameOfSlice(es); ok && nn.Namespace == s.Name.Namespace && nn.Name == s.Name.Name &&
			es.AddressType == addressTypeOf(s.Frontend.Addr) {
			read = append(read, SliceOf(es))
		}
	}
	nodes := map[model.L4Addr]string{}
	for _, e := range endpointsFor(nil, s.Name.Port, corev1.Protocol(s.Frontend.Proto.String()), s.Frontend.Proto, read, "") {
		nodes[e.b.L4Addr] = e.node
	}
	return nodes
}

func TestServiceToModel(t *testing.T) {
	web := service("web", []string{"10.96.0.10"}, sport("http", 80, corev1.ProtocolTCP), sport("dns", 53, corev1.ProtocolUDP))
	tests := []struct {
		name   string
		svc    *corev1.Service
		slices []*discoveryv1.EndpointSlice
		want   string
		skip   string
	}{
		{
			name: "ports matched by name, merged and deduplicated across slices",
			svc:  web,
			slices: []*discoveryv1.EndpointSlice{
				slice("web-a", "web", []discoveryv1.EndpointPort{eport("http", 8080, corev1.ProtocolTCP), eport("dns", 5353, corev1.ProtocolUDP)},
					ep{addr: "10.0.0.2", node: "n1"}, ep{addr: "10.0.0.1", ready: ptr(true)}),
				slice("web-b", "web", []discoveryv1.EndpointPort{eport("http", 8080, corev1.ProtocolTCP)},
					ep{addr: "10.0.0.2"}, ep{addr: "10.0.0.3", ready: ptr(false)}),
				slice("other", "other", []discoveryv1.EndpointPort{eport("http", 8080, corev1.ProtocolTCP)}, ep{addr: "10.9.9.9"}),
			},
			want: "10.96.0.10:53/UDP default/web:dns -> 10.0.0.1:5353/UDP 10.0.0.2:5353/UDP@n1\n" +
				"10.96.0.10:80/TCP default/web:http -> 10.0.0.1:8080/TCP 10.0.0.2:8080/TCP\n", // web-b's listing, the last
		},
		{
			name: "IPv6: ports matched by name, merged and deduplicated across slices",
			svc:  service("web", []string{"2001:db8::10"}, sport("http", 80, corev1.ProtocolTCP), sport("dns", 53, corev1.ProtocolUDP)),
			slices: []*discoveryv1.EndpointSlice{
				slice("web-a", "web", []discoveryv1.EndpointPort{eport("http", 8080, corev1.ProtocolTCP), eport("dns", 5353, corev1.ProtocolUDP)},
					ep{addr: "2001:db8:1::2", node: "n1"}, ep{addr: "2001:db8:1:0::1", ready: ptr(true)}),
				slice("web-b", "web", []discoveryv1.EndpointPort{eport("http", 8080, corev1.ProtocolTCP)},
					ep{addr: "2001:db8:1::2"}, ep{addr: "2001:db8:1::3", ready: ptr(false)}),
				slice("other", "other", []discoveryv1.EndpointPort{eport("http", 8080, corev1.ProtocolTCP)}, ep{addr: "2001:db8:9::9"}),
			},
			want: "[2001:db8::10]:53/UDP default/web:dns -> [2001:db8:1::1]:5353/UDP [2001:db8:1::2]:5353/UDP@n1\n" +
				"[2001:db8::10]:80/TCP default/web:http -> [2001:db8:1::1]:8080/TCP [2001:db8:1::2]:8080/TCP\n", // web-b's listing, the last
		},
		{
			name: "an endpoint listed thrice: the last listing not terminating wins (kube-proxy's, slices in name order), with its node",
			svc:  service("r", []string{"10.96.0.16"}, sport("", 80, "")),
			slices: []*discoveryv1.EndpointSlice{
				slice("r-a", "r", []discoveryv1.EndpointPort{eport("", 8080, corev1.ProtocolTCP)},
					ep{addr: "10.0.0.9", ready: ptr(false), node: "old"}, ep{addr: "10.0.0.1", ready: ptr(false)}),
				slice("r-b", "r", []discoveryv1.EndpointPort{eport("", 8080, corev1.ProtocolTCP)},
					ep{addr: "10.0.0.9", node: "new"}, ep{addr: "10.0.0.9", node: "newer"}),
			},
			want: "10.96.0.16:80/TCP default/r -> 10.0.0.9:8080/TCP@newer\n",
		},
		{
			name: "terminating serving endpoints used only when none is ready",
			svc:  service("t", []string{"10.96.0.11"}, sport("", 80, "")),
			slices: []*discoveryv1.EndpointSlice{
				slice("t-a", "t", []discoveryv1.EndpointPort{eport("", 8080, corev1.ProtocolTCP)},
					ep{addr: "10.0.0.1", ready: ptr(false), serving: ptr(true), terminate: ptr(true)},
					ep{addr: "10.0.0.2", ready: ptr(false), serving: ptr(false), terminate: ptr(true)},
					ep{addr: "10.0.0.3", ready: ptr(false)},
					// serving unset counts as serving, as kube-proxy reads it
					ep{addr: "10.0.0.4", ready: ptr(false), terminate: ptr(true)}),
			},
			want: "10.96.0.11:80/TCP default/t -> 10.0.0.1:8080/TCP(term) 10.0.0.4:8080/TCP(term)\n",
		},
		{
			name: "IPv6: terminating serving endpoints used only when none is ready",
			svc:  service("t", []string{"2001:db8::11"}, sport("", 80, "")),
			slices: []*discoveryv1.EndpointSlice{
				slice("t-a", "t", []discoveryv1.EndpointPort{eport("", 8080, corev1.ProtocolTCP)},
					ep{addr: "2001:db8:1::1", ready: ptr(false), serving: ptr(true), terminate: ptr(true)},
					ep{addr: "2001:db8:1::2", ready: ptr(false), serving: ptr(false), terminate: ptr(true)},
					ep{addr: "2001:db8:1::3", ready: ptr(false)}),
			},
			want: "[2001:db8::11]:80/TCP default/t -> [2001:db8:1::1]:8080/TCP(term)\n",
		},
		{
			name: "no endpoints: service exists with no backends",
			svc:  service("e", []string{"10.96.0.12"}, sport("", 80, "")),
			want: "10.96.0.12:80/TCP default/e ->\n",
		},
		{
			name: "dual stack: each ClusterIP balances over the slices of its family",
			svc: func() *corev1.Service {
				s := service("d", []string{"2001:db8::13", "10.96.0.13"}, sport("", 80, ""))
				s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol, corev1.IPv4Protocol}
				s.Spec.IPFamilyPolicy = ptr(corev1.IPFamilyPolicyPreferDualStack)
				return s
			}(),
			slices: dualSlices("d"),
			want:   "10.96.0.13:80/TCP default/d -> 10.0.0.5:80/TCP\n[2001:db8::13]:80/TCP default/d -> [2001:db8:1::5]:80/TCP\n",
		},
		{
			name:   "IPv4 single stack: IPv6 slices ignored",
			svc:    service("d", []string{"10.96.0.13"}, sport("", 80, "")),
			slices: dualSlices("d"),
			want:   "10.96.0.13:80/TCP default/d -> 10.0.0.5:80/TCP\n",
		},
		{
			name: "IPv6 single stack: IPv4 slices ignored",
			svc: func() *corev1.Service {
				s := service("d", []string{"2001:db8::13"}, sport("", 80, ""))
				s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol}
				s.Spec.IPFamilyPolicy = ptr(corev1.IPFamilyPolicySingleStack)
				return s
			}(),
			slices: dualSlices("d"),
			want:   "[2001:db8::13]:80/TCP default/d -> [2001:db8:1::5]:80/TCP\n",
		},
		{
			name:   "an IPv4-mapped ClusterIP is IPv4, as is an IPv4-mapped endpoint of an IPv4 slice",
			svc:    service("m", []string{"::ffff:10.96.0.17"}, sport("", 80, "")),
			slices: append(dualSlices("m"), slice("m4", "m", []discoveryv1.EndpointPort{eport("", 80, corev1.ProtocolTCP)}, ep{addr: "::ffff:10.0.0.7"})),
			want:   "10.96.0.17:80/TCP default/m -> 10.0.0.5:80/TCP 10.0.0.7:80/TCP\n",
		},
		{name: "headless", svc: service("h", []string{"None"}, sport("", 80, "")), skip: SkipHeadless},
		{name: "external name", svc: func() *corev1.Service {
			s := service("x", nil)
			s.Spec.Type = corev1.ServiceTypeExternalName
			return s
		}(), skip: SkipExternalName},
		{name: "other proxy", svc: func() *corev1.Service {
			s := service("o", []string{"10.96.0.14"}, sport("", 80, ""))
			s.Labels = map[string]string{LabelServiceProxyName: "other"}
			return s
		}(), skip: "service.kubernetes.io/service-proxy-name=other"},
		{name: "our proxy name", svc: func() *corev1.Service {
			s := service("o", []string{"10.96.0.14"}, sport("", 80, ""))
			s.Labels = map[string]string{LabelServiceProxyName: "sluice"}
			return s
		}(), want: "10.96.0.14:80/TCP default/o ->\n"},
		{name: "clusterIP fallback", svc: func() *corev1.Service {
			s := service("c", nil, sport("", 80, ""))
			s.Spec.ClusterIP = "10.96.0.15"
			return s
		}(), want: "10.96.0.15:80/TCP default/c ->\n"},
		{name: "clusterIP fallback, IPv6", svc: func() *corev1.Service {
			s := service("c", nil, sport("", 80, ""))
			s.Spec.ClusterIP = "2001:db8::15"
			return s
		}(), want: "[2001:db8::15]:80/TCP default/c ->\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := ServiceToModel(tc.svc, tc.slices, Options{})
			got, skip := tr.Services, tr.Skipped
			if err != nil {
				t.Fatal(err)
			}
			if skip != tc.skip {
				t.Fatalf("skipped = %q, want %q", skip, tc.skip)
			}
			if r := render(got, tc.slices); r != tc.want {
				t.Errorf("got\n%s\nwant\n%s", r, tc.want)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	svcTests := []struct {
		name string
		svc  *corev1.Service
		want string
	}{
		{"ok", service("a", []string{"10.96.0.1"}, sport("http", 80, "TCP")), ""},
		{"port out of range", service("a", []string{"10.96.0.1"}, sport("http", 70000, "TCP")), `service "default/a": port "http": port 70000 out of range`},
		{"zero port", service("a", []string{"10.96.0.1"}, sport("", 0, "TCP")), `service "default/a": ports[0]: port 0 out of range`},
		{"sctp is valid, and skipped by ServiceToModel", service("a", []string{"10.96.0.1"}, sport("s", 80, "SCTP")), ""},
		{"sloppy addresses", func() *corev1.Service {
			s := service("a", []string{"172.30.0.041"}, sport("", 80, "TCP"))
			s.Spec.ExternalIPs = []string{"192.168.099.022"}
			return s
		}(), ""},
		{"unknown protocol", service("a", []string{"10.96.0.1"}, sport("s", 80, "ICMP")), `service "default/a": port "s": unknown protocol "ICMP"`},
		{"bad ip", service("a", []string{"10.96.0.300"}, sport("", 80, "")), `service "default/a": invalid clusterIPs entry "10.96.0.300"`},
		{"no name", service("", []string{"10.96.0.1"}), `service "default/": metadata.name is empty`},
		{"unnamed multi", service("a", []string{"10.96.0.1"}, sport("", 80, ""), sport("b", 81, "")), `service "default/a": ports[0]: name is required when a Service has several ports`},
		{"dual stack", service("a", []string{"2001:db8::1", "10.96.0.1"}, sport("", 80, "")), ""},
		{"two ClusterIPs of one family", service("a", []string{"10.96.0.1", "::ffff:10.96.0.2"}, sport("", 80, "")), `service "default/a": clusterIPs ["10.96.0.1" "::ffff:10.96.0.2"]: more than one IPv4 address`},
		{"duplicate port, the API server's refusal", service("a", []string{"10.96.0.1"}, sport("x", 80, "TCP"), sport("y", 80, "")),
			`service "default/a": port "y": duplicate port 80/TCP: port "x" has it too`},
		{"duplicate nodePort, the API server's refusal", nodePorts(30080, "TCP", 30080, ""),
			`service "default/a": port "p1": duplicate nodePort 30080/TCP: port "p0" has it too`},
		{"duplicate nodePort among many ports", nodePorts(30080, "TCP", 30081, "TCP", 30082, "TCP", 30083, "TCP", 30084, "TCP", 30085, "TCP", 30086, "TCP", 30087, "TCP", 30088, "TCP", 30089, "TCP", 30090, "TCP", 30091, "TCP", 30092, "TCP", 30093, "TCP", 30094, "TCP", 30095, "TCP", 30096, "TCP", 30083, "TCP"),
			`service "default/a": port "p17": duplicate nodePort 30083/TCP: port "p3" has it too`},
		{"one nodePort for TCP and UDP", nodePorts(30080, "TCP", 30080, "UDP"), ""},
		{"ipFamilies not those of clusterIPs", func() *corev1.Service {
			s := service("a", []string{"10.96.0.1", "2001:db8::1"}, sport("", 80, ""))
			s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol, corev1.IPv4Protocol}
			return s
		}(), `service "default/a": ipFamilies[0] is IPv6, but clusterIPs[0] "10.96.0.1" is IPv4`},
	}
	for _, tc := range svcTests {
		t.Run("service/"+tc.name, func(t *testing.T) {
			err := ValidateService(tc.svc)
			if got := fmt.Sprint(err); (err == nil && tc.want != "") || (err != nil && got != tc.want) {
				t.Errorf("ValidateService = %v, want %q", err, tc.want)
			}
		})
	}
	good := []discoveryv1.EndpointPort{eport("http", 8080, "TCP")}
	esTests := []struct {
		name string
		es   *discoveryv1.EndpointSlice
		want string
	}{
		{"ok", slice("s", "a", good, ep{addr: "10.0.0.1"}), ""},
		{"bad ip", slice("s", "a", good, ep{addr: "10.0.0.256"}), `endpointslice "default/s": endpoints[0]: invalid IPv4 address "10.0.0.256"`},
		{"v6 in v4 slice", slice("s", "a", good, ep{addr: "10.0.0.1"}, ep{addr: "2001:db8::1"}), `endpointslice "default/s": endpoints[1]: invalid IPv4 address "2001:db8::1"`},
		{"ok IPv6", slice("s", "a", good, ep{addr: "2001:db8::1"}), ""},
		{"bad IPv6", slice("s", "a", good, ep{addr: "2001:db8::1"}, ep{addr: "2001:db8::g"}), `endpointslice "default/s": endpoints[1]: invalid IPv6 address "2001:db8::g"`},
		{"v4 in v6 slice", slice("s", "a", good, ep{addr: "2001:db8::1"}, ep{addr: "10.0.0.1"}), `endpointslice "default/s": endpoints[1]: invalid IPv6 address "10.0.0.1"`},
		{"IPv4-mapped in v6 slice", slice("s", "a", good, ep{addr: "2001:db8::1"}, ep{addr: "::ffff:10.0.0.1"}), `endpointslice "default/s": endpoints[1]: invalid IPv6 address "::ffff:10.0.0.1"`},
		{"port", slice("s", "a", []discoveryv1.EndpointPort{eport("http", 70000, "TCP")}), `endpointslice "default/s": port "http": port 70000 out of range`},
		{"proto", slice("s", "a", []discoveryv1.EndpointPort{eport("http", 80, "FOO")}), `endpointslice "default/s": port "http": unknown protocol "FOO"`},
		{"no name", slice("", "a", good), `endpointslice "default/": metadata.name is empty`},
	}
	for _, tc := range esTests {
		t.Run("slice/"+tc.name, func(t *testing.T) {
			err := ValidateEndpointSlice(tc.es)
			if got := fmt.Sprint(err); (err == nil && tc.want != "") || (err != nil && got != tc.want) {
				t.Errorf("ValidateEndpointSlice = %v, want %q", err, tc.want)
			}
		})
	}
	// ServiceToModel reports validation errors.
	if _, err := ServiceToModel(service("a", []string{"10.96.0.1"}, sport("s", 80, "ICMP")), nil, Options{}); err == nil {
		t.Error("ServiceToModel accepted protocol ICMP")
	}
}

// dualSlices returns an IPv6 and an IPv4 EndpointSlice of Service svc,
// port 80, one endpoint each.
func dualSlices(svc string) []*discoveryv1.EndpointSlice {
	p := []discoveryv1.EndpointPort{eport("", 80, corev1.ProtocolTCP)}
	return []*discoveryv1.EndpointSlice{slice(svc+"6", svc, p, ep{addr: "2001:db8:1::5"}), slice(svc+"4", svc, p, ep{addr: "10.0.0.5"})}
}

func TestServiceNameOfSlice(t *testing.T) {
	nn, ok := ServiceNameOfSlice(slice("s", "web", nil))
	if !ok || nn.String() != "default/web" {
		t.Errorf("got %v %v", nn, ok)
	}
	es := slice("s", "web", nil)
	es.Labels = nil
	if _, ok := ServiceNameOfSlice(es); ok {
		t.Error("unlabelled slice has a service")
	}
	_ = netip.Addr{}
}

// nodePorts is a NodePort Service "a" with a port "p<i>" (port 80+i) for
// each nodePort and protocol of np.
func nodePorts(np ...any) *corev1.Service {
	s := service("a", []string{"10.96.0.1"})
	s.Spec.Type = corev1.ServiceTypeNodePort
	for i := 0; i < len(np); i += 2 {
		p := sport(fmt.Sprintf("p%d", i/2), int32(80+i/2), corev1.Protocol(np[i+1].(string)))
		p.NodePort = int32(np[i].(int))
		s.Spec.Ports = append(s.Spec.Ports, p)
	}
	return s
}
