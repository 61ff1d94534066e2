package translate

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/test/flows"
)

// TestCategorizeEndpoints runs kube-proxy's TestCategorizeEndpoints table
// (test/flows/kubeproxy/categorize-endpoints.yaml) through the
// translation: the endpoints each policy gets must be kube-proxy's, and
// the frontends ServiceToModel makes must use them as the policies say
// (ClusterIP: internalTrafficPolicy's; NodePort: externalTrafficPolicy's,
// with the Cluster set for internal clients when it is Local), rejecting
// or dropping as hasAnyEndpoints says.
func TestCategorizeEndpoints(t *testing.T) {
	corpus, err := flows.Load("../../../test/flows")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	// Each case runs in both families: kube-proxy's IPv6 proxier
	// categorizes its slices by the same rules.
	for _, tr := range corpus.Translations {
		for _, v6 := range []bool{false, true} {
			t.Run(tr.Name+"/"+familyName(v6), func(t *testing.T) {
				if tr.Skip != "" {
					t.Skip(tr.Skip)
				}
				n++
				var svc *corev1.Service
				var eps []*discoveryv1.EndpointSlice
				for _, o := range tr.Objects {
					if o.Service != nil {
						svc = o.Service
					} else {
						eps = append(eps, o.Slice)
					}
				}
				expect := tr.Expect
				if v6 {
					svc, eps, expect = toIPv6(svc, eps, expect)
				}
				node := Node{Name: tr.Node.Name, Labels: map[string]string{}}
				if tr.Node.Zone != "" {
					node.Labels[corev1.LabelTopologyZone] = tr.Node.Zone
				}
				if len(svc.Spec.Ports) != 1 {
					t.Fatalf("want one port, the corpus has %d", len(svc.Spec.Ports))
				}
				read, cs := SlicesOf(eps), ServiceOf(svc)
				sp := cs.Ports[0]
				x := externalOf(cs, read, node, v6)
				pol := policyOf(cs, sp, x)
				cat := categorize(endpointsFor(nil, sp.Name, corev1.ProtocolTCP, model.TCP, read, node.Name), pol, node.Name, tr.Node.Zone)

				// kube-proxy's test compares contents; nil and empty are
				// the same to it.
				all := slices.Concat(cat.cluster, cat.local)
				slices.SortFunc(all, func(a, b model.Backend) int { return a.L4Addr.Compare(b.L4Addr) })
				all = slices.CompactFunc(all, func(a, b model.Backend) bool { return a.L4Addr == b.L4Addr })
				for _, c := range []struct {
					what string
					got  []model.Backend
					want []netip.AddrPort
				}{{"cluster", cat.cluster, expect.Cluster}, {"local", cat.local, expect.Local}, {"all", all, expect.All}} {
					if g, w := addrPorts(c.got), sortedAddrPorts(c.want); !slices.Equal(g, w) {
						t.Errorf("%s endpoints = %v, want %v", c.what, g, w)
					}
				}
				if cat.hasAny != expect.HasAnyEndpoints {
					t.Errorf("hasAnyEndpoints = %v, want %v", cat.hasAny, expect.HasAnyEndpoints)
				}

				// The frontends use the categories as the policies say.
				node.Addresses = []netip.Addr{netip.MustParseAddr("192.168.0.2"), netip.MustParseAddr("2001:db8:100::2")}
				res, err := ServiceToModel(svc, eps, Options{Node: node})
				if err != nil || res.Skipped != "" {
					t.Fatalf("ServiceToModel: %v %q", err, res.Skipped)
				}
				if len(res.Services) == 0 {
					t.Fatal("no frontend")
				}
				for _, s := range res.Services {
					if s.Frontend.Addr.Is6() != v6 {
						t.Errorf("%s: a frontend of the other family", s.Frontend)
					}
					want, internal := expect.Cluster, []netip.AddrPort(nil)
					switch {
					case s.Kind == model.ClusterIP && pol.internalLocal:
						want = expect.Local
					case s.Kind != model.ClusterIP && pol.externalLocal:
						want, internal = expect.Local, expect.Cluster
						if !s.TwoScopes || !slices.Equal(addrPorts(s.InternalBackends), sortedAddrPorts(internal)) {
							t.Errorf("%s: internal scope %v (two scopes %v), want %v", s.Frontend, addrPorts(s.InternalBackends), s.TwoScopes, internal)
						}
					}
					if g := addrPorts(s.Backends); !slices.Equal(g, sortedAddrPorts(want)) {
						t.Errorf("%s: backends %v, want %v", s.Frontend, g, want)
					}
					if wantDrop := len(want) == 0 && expect.HasAnyEndpoints; s.DropWhenEmpty != wantDrop {
						t.Errorf("%s: drop when empty = %v, want %v", s.Frontend, s.DropWhenEmpty, wantDrop)
					}
				}
			})
		}
	}
	if n == 0 {
		t.Fatal("no translation case ran")
	}
}

// toIPv6 returns copies of svc and its slices eps in IPv6, and expect to
// match: every IPv4 address a.b.c.d becomes 2001:db8::a.b.c.d, each slice
// IPv6.
func toIPv6(svc *corev1.Service, eps []*discoveryv1.EndpointSlice, expect flows.TranslationExpect) (*corev1.Service, []*discoveryv1.EndpointSlice, flows.TranslationExpect) {
	six := func(a netip.Addr) netip.Addr {
		b := netip.MustParseAddr("2001:db8::").As16()
		v4 := a.As4()
		copy(b[12:], v4[:])
		return netip.AddrFrom16(b)
	}
	sixStr := func(s string) string {
		if a, ok := parseIPSloppy(s); ok && a.Is4() {
			return six(a).String()
		}
		return s
	}
	sixPorts := func(l []netip.AddrPort) []netip.AddrPort {
		if l == nil {
			return nil
		}
		out := []netip.AddrPort{}
		for _, ap := range l {
			out = append(out, netip.AddrPortFrom(six(ap.Addr()), ap.Port()))
		}
		return out
	}
	svc = svc.DeepCopy()
	svc.Spec.ClusterIP = sixStr(svc.Spec.ClusterIP)
	for i := range svc.Spec.ClusterIPs {
		svc.Spec.ClusterIPs[i] = sixStr(svc.Spec.ClusterIPs[i])
	}
	svc.Spec.IPFamilies = nil
	var out []*discoveryv1.EndpointSlice
	for _, es := range eps {
		es = es.DeepCopy()
		es.AddressType = discoveryv1.AddressTypeIPv6
		for i := range es.Endpoints {
			for j, a := range es.Endpoints[i].Addresses {
				es.Endpoints[i].Addresses[j] = sixStr(a)
			}
		}
		out = append(out, es)
	}
	return svc, out, flows.TranslationExpect{Cluster: sixPorts(expect.Cluster), Local: sixPorts(expect.Local),
		All: sixPorts(expect.All), HasAnyEndpoints: expect.HasAnyEndpoints}
}

func addrPorts(bs []model.Backend) []netip.AddrPort {
	out := []netip.AddrPort{}
	for _, b := range bs {
		out = append(out, netip.AddrPortFrom(b.Addr, b.Port))
	}
	return out
}

func sortedAddrPorts(l []netip.AddrPort) []netip.AddrPort {
	out := append([]netip.AddrPort{}, l...)
	slices.SortFunc(out, netip.AddrPort.Compare)
	return out
}

// trafficCase is a Service (ClusterIP 10.96.0.1, or what mod makes of it
// (ipv6, dualStack); one TCP port 80 -> 8080, NodePort 30080 when its type
// has one) with endpoints (in an EndpointSlice per family), translated on
// node-a (zone-a, NodePorts on 192.168.1.1 and 2001:db8:100::1), rendered
// by renderNS.
type trafficCase struct {
	name string
	mod  func(*corev1.Service)
	eps  []ep
	// hints per endpoint address: zones and nodes.
	zones, nodes map[string][]string
	want         string
}

func runTrafficCases(t *testing.T, cases []trafficCase) {
	t.Helper()
	addrs := []netip.Addr{netip.MustParseAddr("192.168.1.1"), netip.MustParseAddr("2001:db8:100::1")}
	node := Node{Name: "node-a", IPs: addrs, Addresses: addrs,
		Labels: map[string]string{corev1.LabelTopologyZone: "zone-a"}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := sport("http", 80, corev1.ProtocolTCP)
			p.NodePort = 30080
			svc := service("web", []string{"10.96.0.1"}, p)
			if c.mod != nil {
				c.mod(svc)
			}
			if svc.Spec.Type != corev1.ServiceTypeNodePort && svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
				svc.Spec.Ports[0].NodePort = 0
			}
			var eps4, eps6 []ep
			for _, e := range c.eps {
				if strings.Contains(e.addr, "::") {
					eps6 = append(eps6, e)
				} else {
					eps4 = append(eps4, e)
				}
			}
			var slices []*discoveryv1.EndpointSlice
			for _, eps := range [][]ep{eps4, eps6} {
				if len(eps) == 0 {
					continue
				}
				es := slice("web-"+strconv.Itoa(len(slices)), "web", []discoveryv1.EndpointPort{eport("http", 8080, corev1.ProtocolTCP)}, eps...)
				for i := range es.Endpoints {
					e := &es.Endpoints[i]
					a := e.Addresses[0]
					if c.zones[a] != nil || c.nodes[a] != nil {
						e.Hints = &discoveryv1.EndpointHints{}
						for _, z := range c.zones[a] {
							e.Hints.ForZones = append(e.Hints.ForZones, discoveryv1.ForZone{Name: z})
						}
						for _, n := range c.nodes[a] {
							e.Hints.ForNodes = append(e.Hints.ForNodes, discoveryv1.ForNode{Name: n})
						}
					}
				}
				slices = append(slices, es)
			}
			tr, err := ServiceToModel(svc, slices, Options{Node: node})
			if err != nil || tr.Skipped != "" {
				t.Fatalf("ServiceToModel: %v %q", err, tr.Skipped)
			}
			got := renderNS(tr.Services)
			for _, w := range tr.Warnings {
				got += "warning: " + w + "\n"
			}
			if w := strings.TrimPrefix(c.want, "\n"); got != w {
				t.Fatalf("got\n%s\nwant\n%s", got, w)
			}
		})
	}
}

func itp(p corev1.ServiceInternalTrafficPolicy) func(*corev1.Service) {
	return func(s *corev1.Service) { s.Spec.InternalTrafficPolicy = &p }
}

func nodePort(etp corev1.ServiceExternalTrafficPolicy) func(*corev1.Service) {
	return func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.ExternalTrafficPolicy = etp
	}
}

// ipv6 makes the Service IPv6 single stack, dualStack dual stack (IPv4
// first, as the API server's PreferDualStack on an IPv4 cluster does).
func ipv6(s *corev1.Service) {
	s.Spec.ClusterIPs = []string{"2001:db8::1"}
	s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol}
}

func dualStack(s *corev1.Service) {
	s.Spec.ClusterIPs = []string{"10.96.0.1", "2001:db8::1"}
	s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	s.Spec.IPFamilyPolicy = ptr(corev1.IPFamilyPolicyPreferDualStack)
}

func both(fs ...func(*corev1.Service)) func(*corev1.Service) {
	return func(s *corev1.Service) {
		for _, f := range fs {
			f(s)
		}
	}
}

var (
	here      = ep{addr: "10.1.0.1", node: "node-a"}
	here2     = ep{addr: "10.1.0.2", node: "node-a"}
	there     = ep{addr: "10.2.0.1", node: "node-b"}
	termHere  = ep{addr: "10.1.0.9", node: "node-a", ready: ptr(false), serving: ptr(true), terminate: ptr(true)}
	termThere = ep{addr: "10.2.0.9", node: "node-b", ready: ptr(false), serving: ptr(true), terminate: ptr(true)}
	// Neither ready nor serving: never used, and no reason to drop
	// rather than reject.
	deadThere = ep{addr: "10.2.0.8", node: "node-b", ready: ptr(false), serving: ptr(false), terminate: ptr(true)}

	// Their IPv6 twins: the same node and conditions.
	here6      = here.at("2001:db8:1::1")
	here62     = here2.at("2001:db8:1::2")
	there6     = there.at("2001:db8:2::1")
	termHere6  = termHere.at("2001:db8:1::9")
	termThere6 = termThere.at("2001:db8:2::9")
	deadThere6 = deadThere.at("2001:db8:2::8")
)

// at is e at address a instead.
func (e ep) at(a string) ep {
	e.addr = a
	return e
}

// The traffic policies (issue 9 points 1, 2 and 5): which endpoints each
// frontend and each kind of client get, and whether an empty set rejects
// or drops, as kube-proxy's nftables proxier decides.
func TestTrafficPolicies(t *testing.T) {
	local, cluster := corev1.ServiceExternalTrafficPolicyLocal, corev1.ServiceExternalTrafficPolicyCluster
	// Zone hints that send this node (in zone-a, see runTrafficCases) to
	// the endpoint elsewhere and the other zone to this node's.
	crossZones := map[string][]string{"10.1.0.1": {"zone-b"}, "10.2.0.1": {"zone-a"}}
	runTrafficCases(t, []trafficCase{
		{name: "internalTrafficPolicy Local keeps ClusterIP traffic on this node's endpoints",
			mod: itp(corev1.ServiceInternalTrafficPolicyLocal), eps: []ep{here, there}, want: `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1
`},
		{name: "IPv6: internalTrafficPolicy Local keeps ClusterIP traffic on this node's endpoints",
			mod: both(ipv6, itp(corev1.ServiceInternalTrafficPolicyLocal)), eps: []ep{here6, there6, here, there}, want: `
ClusterIP [2001:db8::1]:80/TCP -> 2001:db8:1::1
`},
		{name: "dual stack: each family's endpoints are categorized apart: a local one in IPv4 only drops IPv6",
			mod: both(dualStack, itp(corev1.ServiceInternalTrafficPolicyLocal)), eps: []ep{here, there6}, want: `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1
ClusterIP [2001:db8::1]:80/TCP drop ->
`},
		{name: "dual stack: endpoints in one family only: the other rejects",
			mod: dualStack, eps: []ep{here6, there6}, want: `
ClusterIP 10.96.0.1:80/TCP ->
ClusterIP [2001:db8::1]:80/TCP -> 2001:db8:1::1 2001:db8:2::1
`},
		{name: "internalTrafficPolicy Local without a local endpoint drops",
			mod: itp(corev1.ServiceInternalTrafficPolicyLocal), eps: []ep{there}, want: `
ClusterIP 10.96.0.1:80/TCP drop ->
`},
		{name: "internalTrafficPolicy Local without endpoints anywhere rejects",
			mod: itp(corev1.ServiceInternalTrafficPolicyLocal), eps: []ep{deadThere}, want: `
ClusterIP 10.96.0.1:80/TCP ->
`},
		{name: "internalTrafficPolicy does not apply to NodePorts",
			mod: both(nodePort(cluster), itp(corev1.ServiceInternalTrafficPolicyLocal)), eps: []ep{here, there}, want: `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1
NodePort 192.168.1.1:30080/TCP -> 10.1.0.1 10.2.0.1
`},
		{name: "externalTrafficPolicy Local: local endpoints for external clients, all for internal ones",
			mod: nodePort(local), eps: []ep{here, there}, want: `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1 10.2.0.1
NodePort 192.168.1.1:30080/TCP local -> 10.1.0.1 | internal -> 10.1.0.1 10.2.0.1
`},
		{name: "IPv6: externalTrafficPolicy Local, NodePorts on the node's IPv6 addresses",
			mod: both(ipv6, nodePort(local)), eps: []ep{here6, there6}, want: `
ClusterIP [2001:db8::1]:80/TCP -> 2001:db8:1::1 2001:db8:2::1
NodePort [2001:db8:100::1]:30080/TCP local -> 2001:db8:1::1 | internal -> 2001:db8:1::1 2001:db8:2::1
`},
		{name: "dual stack: externalTrafficPolicy Local with a local endpoint in one family only",
			mod: both(dualStack, nodePort(local)), eps: []ep{here, there6}, want: `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1
NodePort 192.168.1.1:30080/TCP local -> 10.1.0.1 | internal -> 10.1.0.1
ClusterIP [2001:db8::1]:80/TCP -> 2001:db8:2::1
NodePort [2001:db8:100::1]:30080/TCP local drop -> | internal -> 2001:db8:2::1
`},
		{name: "externalTrafficPolicy Local with endpoints only elsewhere drops external clients",
			mod: nodePort(local), eps: []ep{there}, want: `
ClusterIP 10.96.0.1:80/TCP -> 10.2.0.1
NodePort 192.168.1.1:30080/TCP local drop -> | internal -> 10.2.0.1
`},
		{name: "externalTrafficPolicy Local without endpoints anywhere rejects everyone",
			mod: nodePort(local), eps: []ep{deadThere}, want: `
ClusterIP 10.96.0.1:80/TCP ->
NodePort 192.168.1.1:30080/TCP local -> | internal ->
`},
		{name: "both policies Local",
			mod: both(nodePort(local), itp(corev1.ServiceInternalTrafficPolicyLocal)), eps: []ep{here, there}, want: `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1
NodePort 192.168.1.1:30080/TCP local -> 10.1.0.1 | internal -> 10.1.0.1 10.2.0.1
`},
		{name: "externalTrafficPolicy Local on a ClusterIP Service with externalIPs",
			mod: func(s *corev1.Service) {
				s.Spec.ExternalIPs = []string{"203.0.113.7"}
				s.Spec.ExternalTrafficPolicy = local
			}, eps: []ep{here, there}, want: `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1 10.2.0.1
ExternalIP 203.0.113.7:80/TCP local -> 10.1.0.1 | internal -> 10.1.0.1 10.2.0.1
`},
		{name: "dual stack: externalIPs of each family on that family's frontends",
			mod: both(dualStack, func(s *corev1.Service) {
				s.Spec.ExternalIPs = []string{"2001:db8:aaaa::7", "203.0.113.7"}
				s.Spec.ExternalTrafficPolicy = local
			}), eps: []ep{here, there, here6, there6}, want: `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1 10.2.0.1
ExternalIP 203.0.113.7:80/TCP local -> 10.1.0.1 | internal -> 10.1.0.1 10.2.0.1
ClusterIP [2001:db8::1]:80/TCP -> 2001:db8:1::1 2001:db8:2::1
ExternalIP [2001:db8:aaaa::7]:80/TCP local -> 2001:db8:1::1 | internal -> 2001:db8:1::1 2001:db8:2::1
`},
		{name: "IPv4 single stack: IPv6 externalIPs are not served (kube-proxy's IPv6 proxier has no such Service)",
			mod: func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"2001:db8:aaaa::7"} }, eps: []ep{here, here6}, want: `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1
`},
		{name: "externalTrafficPolicy Local is ignored without external access",
			mod: func(s *corev1.Service) { s.Spec.ExternalTrafficPolicy = local }, eps: []ep{here, there}, want: `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1 10.2.0.1
`},
		// Terminating endpoints (KEP-1669), per policy, independently.
		{name: "no ready endpoint: serving and terminating ones, Cluster",
			mod: nodePort(cluster), eps: []ep{termHere, termThere, deadThere}, want: `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.9(term) 10.2.0.9(term)
NodePort 192.168.1.1:30080/TCP -> 10.1.0.9(term) 10.2.0.9(term)
`},
		{name: "ready elsewhere, terminating here: the policies fall back independently",
			mod: both(nodePort(local), itp(corev1.ServiceInternalTrafficPolicyLocal)), eps: []ep{termHere, there}, want: `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.9(term)
NodePort 192.168.1.1:30080/TCP local -> 10.1.0.9(term) | internal -> 10.2.0.1
`},
		{name: "IPv6: no ready endpoint: serving and terminating ones, Cluster",
			mod: both(ipv6, nodePort(cluster)), eps: []ep{termHere6, termThere6, deadThere6}, want: `
ClusterIP [2001:db8::1]:80/TCP -> 2001:db8:1::9(term) 2001:db8:2::9(term)
NodePort [2001:db8:100::1]:30080/TCP -> 2001:db8:1::9(term) 2001:db8:2::9(term)
`},
		{name: "a ready local endpoint wins over terminating ones",
			mod: nodePort(local), eps: []ep{termHere, here}, want: `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1
NodePort 192.168.1.1:30080/TCP local -> 10.1.0.1 | internal -> 10.1.0.1
`},
		{name: "only a terminating endpoint elsewhere: Local drops, not rejects",
			mod: nodePort(local), eps: []ep{termThere}, want: `
ClusterIP 10.96.0.1:80/TCP -> 10.2.0.9(term)
NodePort 192.168.1.1:30080/TCP local drop -> | internal -> 10.2.0.9(term)
`},
		// Topology (issue 9 point 4): hints, only when every ready
		// endpoint has them and one is for this node or zone; never for
		// the Local policies.
		{name: "zone hints for this zone",
			mod: nodePort(cluster), eps: []ep{here, there, {addr: "10.2.0.2", node: "node-b"}},
			zones: map[string][]string{"10.1.0.1": {"zone-b"}, "10.2.0.1": {"zone-a"}, "10.2.0.2": {"zone-c"}}, want: `
ClusterIP 10.96.0.1:80/TCP -> 10.2.0.1
NodePort 192.168.1.1:30080/TCP -> 10.2.0.1
`},
		{name: "IPv6: zone hints for this zone",
			mod: both(ipv6, nodePort(cluster)), eps: []ep{here6, there6},
			zones: map[string][]string{"2001:db8:1::1": {"zone-b"}, "2001:db8:2::1": {"zone-a"}}, want: `
ClusterIP [2001:db8::1]:80/TCP -> 2001:db8:2::1
NodePort [2001:db8:100::1]:30080/TCP -> 2001:db8:2::1
`},
		{name: "zone hints missing on one ready endpoint: ignored",
			mod: nodePort(cluster), eps: []ep{here, there}, zones: map[string][]string{"10.2.0.1": {"zone-a"}}, want: `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1 10.2.0.1
NodePort 192.168.1.1:30080/TCP -> 10.1.0.1 10.2.0.1
`},
		{name: "zone hints for other zones only: ignored",
			mod: nodePort(cluster), eps: []ep{here, there}, zones: map[string][]string{"10.1.0.1": {"zone-b"}, "10.2.0.1": {"zone-c"}}, want: `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1 10.2.0.1
NodePort 192.168.1.1:30080/TCP -> 10.1.0.1 10.2.0.1
`},
		{name: "node hints (PreferSameNode) win over zone hints",
			mod: nodePort(cluster), eps: []ep{here, there}, zones: crossZones, nodes: map[string][]string{"10.1.0.1": {"node-a"}, "10.2.0.1": {"node-b"}}, want: `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1
NodePort 192.168.1.1:30080/TCP -> 10.1.0.1
`},
		{name: "node hints for other nodes: zone hints decide",
			mod: nodePort(cluster), eps: []ep{here, there}, zones: crossZones, nodes: map[string][]string{"10.1.0.1": {"node-b"}, "10.2.0.1": {"node-b"}}, want: `
ClusterIP 10.96.0.1:80/TCP -> 10.2.0.1
NodePort 192.168.1.1:30080/TCP -> 10.2.0.1
`},
		{name: "Local ignores hints; the short-circuit set follows them",
			mod: nodePort(local), eps: []ep{here, there}, zones: crossZones, want: `
ClusterIP 10.96.0.1:80/TCP -> 10.2.0.1
NodePort 192.168.1.1:30080/TCP local -> 10.1.0.1 | internal -> 10.2.0.1
`},
		{name: "hints of terminating endpoints: ignored (no ready endpoint)",
			mod: nodePort(cluster), eps: []ep{termHere, termThere},
			zones: map[string][]string{"10.1.0.9": {"zone-b"}, "10.2.0.9": {"zone-a"}}, want: `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.9(term) 10.2.0.9(term)
NodePort 192.168.1.1:30080/TCP -> 10.1.0.9(term) 10.2.0.9(term)
`},
	})
}

func lb(mod func(*corev1.Service)) func(*corev1.Service) {
	return func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.51.100.4"}}
		if mod != nil {
			mod(s)
		}
	}
}

// The frontends a Service answers on (issue 9 point 8): LoadBalancer
// ingress IPs by ipMode, and the health check's count of ready local
// endpoints.
func TestFrontendsServed(t *testing.T) {
	proxy, vip := corev1.LoadBalancerIPModeProxy, corev1.LoadBalancerIPModeVIP
	runTrafficCases(t, []trafficCase{
		{name: "ipMode Proxy: no frontend for the ingress IP; VIP and unset get one",
			mod: lb(func(s *corev1.Service) {
				s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{
					{IP: "198.51.100.4", IPMode: &proxy}, {IP: "198.51.100.5", IPMode: &vip}, {IP: "198.51.100.6"}}
			}), eps: []ep{here}, want: `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1
NodePort 192.168.1.1:30080/TCP -> 10.1.0.1
LoadBalancer 198.51.100.5:80/TCP -> 10.1.0.1
LoadBalancer 198.51.100.6:80/TCP -> 10.1.0.1
`},
		{name: "dual stack: LoadBalancer ingress IPs of each family on that family's frontends",
			mod: both(dualStack, lb(func(s *corev1.Service) {
				s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{
					{IP: "2001:db8:aaaa::4", IPMode: &proxy}, {IP: "2001:db8:aaaa::5"}, {IP: "198.51.100.5"}}
			})), eps: []ep{here, here6}, want: `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1
NodePort 192.168.1.1:30080/TCP -> 10.1.0.1
LoadBalancer 198.51.100.5:80/TCP -> 10.1.0.1
ClusterIP [2001:db8::1]:80/TCP -> 2001:db8:1::1
NodePort [2001:db8:100::1]:30080/TCP -> 2001:db8:1::1
LoadBalancer [2001:db8:aaaa::5]:80/TCP -> 2001:db8:1::1
`},
		{name: "dual stack: health check counts each family's ready local endpoints",
			mod: both(dualStack, lb(func(s *corev1.Service) {
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
				s.Spec.HealthCheckNodePort = 32000
			})), eps: []ep{here, here6, here62, termHere6}, want: `
ClusterIP 10.96.0.1:80/TCP hc=32000 ready=[10.1.0.1] -> 10.1.0.1
NodePort 192.168.1.1:30080/TCP local hc=32000 ready=[10.1.0.1] -> 10.1.0.1 | internal -> 10.1.0.1
LoadBalancer 198.51.100.4:80/TCP local hc=32000 ready=[10.1.0.1] -> 10.1.0.1 | internal -> 10.1.0.1
ClusterIP [2001:db8::1]:80/TCP hc=32000 ready=[2001:db8:1::1 2001:db8:1::2] -> 2001:db8:1::1 2001:db8:1::2
NodePort [2001:db8:100::1]:30080/TCP local hc=32000 ready=[2001:db8:1::1 2001:db8:1::2] -> 2001:db8:1::1 2001:db8:1::2 | internal -> 2001:db8:1::1 2001:db8:1::2
`},
		{name: "health check counts ready local endpoints only",
			mod: lb(func(s *corev1.Service) {
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
				s.Spec.HealthCheckNodePort = 32000
			}), eps: []ep{here, here2, termHere, there}, want: `
ClusterIP 10.96.0.1:80/TCP hc=32000 ready=[10.1.0.1 10.1.0.2] -> 10.1.0.1 10.1.0.2 10.2.0.1
NodePort 192.168.1.1:30080/TCP local hc=32000 ready=[10.1.0.1 10.1.0.2] -> 10.1.0.1 10.1.0.2 | internal -> 10.1.0.1 10.1.0.2 10.2.0.1
LoadBalancer 198.51.100.4:80/TCP local hc=32000 ready=[10.1.0.1 10.1.0.2] -> 10.1.0.1 10.1.0.2 | internal -> 10.1.0.1 10.1.0.2 10.2.0.1
`},
		{name: "health check with only terminating local endpoints counts none, while they serve",
			mod: lb(func(s *corev1.Service) {
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
				s.Spec.HealthCheckNodePort = 32000
			}), eps: []ep{termHere, there}, want: `
ClusterIP 10.96.0.1:80/TCP hc=32000 -> 10.2.0.1
NodePort 192.168.1.1:30080/TCP local hc=32000 -> 10.1.0.9(term) | internal -> 10.2.0.1
LoadBalancer 198.51.100.4:80/TCP local hc=32000 -> 10.1.0.9(term) | internal -> 10.2.0.1
`},
		// kube-proxy serves the health check port of a LoadBalancer
		// Service with externalTrafficPolicy Local whatever frontends it
		// has (serviceport.go: every port with a ClusterIP of the
		// family): without NodePorts (allocateLoadBalancerNodePorts
		// false) and without a VIP-mode ingress IP, the ClusterIP
		// frontend carries it, its traffic still not Local.
		{name: "health check without NodePorts or ingress IPs: on the ClusterIP frontend, its backends the Cluster ones",
			mod: lb(func(s *corev1.Service) {
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
				s.Spec.HealthCheckNodePort = 32000
				s.Spec.AllocateLoadBalancerNodePorts = ptr(false)
				s.Spec.Ports[0].NodePort = 0
				s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{Hostname: "lb.example"}}
			}), eps: []ep{here, here2, termHere, there}, want: `
ClusterIP 10.96.0.1:80/TCP hc=32000 ready=[10.1.0.1 10.1.0.2] -> 10.1.0.1 10.1.0.2 10.2.0.1
`},
		{name: "dual stack: health check without NodePorts, Proxy-mode ingress: on each family's ClusterIP frontend, counting that family",
			mod: both(dualStack, lb(func(s *corev1.Service) {
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
				s.Spec.HealthCheckNodePort = 32000
				s.Spec.AllocateLoadBalancerNodePorts = ptr(false)
				s.Spec.Ports[0].NodePort = 0
				s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.51.100.4", IPMode: &proxy}, {IP: "2001:db8:aaaa::4", IPMode: &proxy}}
			})), eps: []ep{here, there, here6, here62, termHere6}, want: `
ClusterIP 10.96.0.1:80/TCP hc=32000 ready=[10.1.0.1] -> 10.1.0.1 10.2.0.1
ClusterIP [2001:db8::1]:80/TCP hc=32000 ready=[2001:db8:1::1 2001:db8:1::2] -> 2001:db8:1::1 2001:db8:1::2
`},
		{name: "health check without NodePorts, no ingress yet, no local endpoint: on the ClusterIP frontend, counting none",
			mod: lb(func(s *corev1.Service) {
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
				s.Spec.HealthCheckNodePort = 32000
				s.Spec.AllocateLoadBalancerNodePorts = ptr(false)
				s.Spec.Ports[0].NodePort = 0
				s.Status.LoadBalancer.Ingress = nil
			}), eps: []ep{termHere, there}, want: `
ClusterIP 10.96.0.1:80/TCP hc=32000 -> 10.2.0.1
`},
	})
}

// Bad input the kube-proxy way (issue 9 point 9).
func TestBadInput(t *testing.T) {
	ranges := func(rs ...string) func(*corev1.Service) {
		return lb(func(s *corev1.Service) { s.Spec.LoadBalancerSourceRanges = rs })
	}
	runTrafficCases(t, []trafficCase{
		{name: "source ranges are trimmed of whitespace",
			mod: ranges(" 203.0.113.0/25", "10.0.0.0/8 "), eps: []ep{here}, want: `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1
NodePort 192.168.1.1:30080/TCP -> 10.1.0.1
LoadBalancer 198.51.100.4:80/TCP ranges=[10.0.0.0/8 203.0.113.0/25] -> 10.1.0.1
`},
		{name: "a source range that does not parse is ignored and reported",
			mod: ranges("bogus", "203.0.113.0/25"), eps: []ep{here}, want: `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1
NodePort 192.168.1.1:30080/TCP -> 10.1.0.1
LoadBalancer 198.51.100.4:80/TCP ranges=[203.0.113.0/25] -> 10.1.0.1
warning: loadBalancerSourceRanges entry "bogus" is not a CIDR; ignored
`},
		{name: "no source range parses: the LoadBalancer IP is closed, the NodePort is not",
			mod: ranges("bogus", "203.0.113.0/33"), eps: []ep{here}, want: `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1
NodePort 192.168.1.1:30080/TCP -> 10.1.0.1
LoadBalancer 198.51.100.4:80/TCP drop ->
warning: loadBalancerSourceRanges entry "bogus" is not a CIDR; ignored
warning: loadBalancerSourceRanges entry "203.0.113.0/33" is not a CIDR; ignored
warning: loadBalancerSourceRanges ["bogus" "203.0.113.0/33"] hold no IPv4 range: the IPv4 LoadBalancer IPs are closed to every source
`},
		{name: "closed applies to both scopes of an externalTrafficPolicy Local Service",
			mod: lb(func(s *corev1.Service) {
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
				s.Spec.LoadBalancerSourceRanges = []string{"2001:db8::/64"}
			}), eps: []ep{here, there}, want: `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1 10.2.0.1
NodePort 192.168.1.1:30080/TCP local -> 10.1.0.1 | internal -> 10.1.0.1 10.2.0.1
LoadBalancer 198.51.100.4:80/TCP local drop ->
warning: loadBalancerSourceRanges ["2001:db8::/64"] hold no IPv4 range: the IPv4 LoadBalancer IPs are closed to every source
`},
		{name: "dual stack: each family's source ranges apply to its own LoadBalancer IPs; a bad entry is reported once",
			mod: both(dualStack, lb(func(s *corev1.Service) {
				s.Spec.LoadBalancerSourceRanges = []string{"2001:db8:f00::/48", "bogus", "203.0.113.0/25"}
				s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: "2001:db8:aaaa::4"})
			})), eps: []ep{here, here6}, want: `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1
NodePort 192.168.1.1:30080/TCP -> 10.1.0.1
LoadBalancer 198.51.100.4:80/TCP ranges=[203.0.113.0/25] -> 10.1.0.1
ClusterIP [2001:db8::1]:80/TCP -> 2001:db8:1::1
NodePort [2001:db8:100::1]:30080/TCP -> 2001:db8:1::1
LoadBalancer [2001:db8:aaaa::4]:80/TCP ranges=[2001:db8:f00::/48] -> 2001:db8:1::1
warning: loadBalancerSourceRanges entry "bogus" is not a CIDR; ignored
`},
		{name: "dual stack: 0.0.0.0/0 opens the IPv4 LoadBalancer IPs only; no IPv6 range closes the IPv6 ones",
			mod: both(dualStack, lb(func(s *corev1.Service) {
				s.Spec.LoadBalancerSourceRanges = []string{"0.0.0.0/0"}
				s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: "2001:db8:aaaa::4"})
			})), eps: []ep{here, here6}, want: `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1
NodePort 192.168.1.1:30080/TCP -> 10.1.0.1
LoadBalancer 198.51.100.4:80/TCP -> 10.1.0.1
ClusterIP [2001:db8::1]:80/TCP -> 2001:db8:1::1
NodePort [2001:db8:100::1]:30080/TCP -> 2001:db8:1::1
LoadBalancer [2001:db8:aaaa::4]:80/TCP drop ->
warning: loadBalancerSourceRanges ["0.0.0.0/0"] hold no IPv6 range: the IPv6 LoadBalancer IPs are closed to every source
`},
		{name: "0.0.0.0/0 allows every source: no check",
			mod: ranges("10.0.0.0/8", "0.0.0.0/0"), eps: []ep{here}, want: `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1
NodePort 192.168.1.1:30080/TCP -> 10.1.0.1
LoadBalancer 198.51.100.4:80/TCP -> 10.1.0.1
`},
		{name: "a range holding the node's address admits the LoadBalancer IPs too",
			mod: ranges("192.168.1.0/24"), eps: []ep{here}, want: `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1
NodePort 192.168.1.1:30080/TCP -> 10.1.0.1
LoadBalancer 198.51.100.4:80/TCP ranges=[192.168.1.0/24 198.51.100.4/32] -> 10.1.0.1
`},
		{name: "IPv6: a range holding the node's IPv6 address admits the LoadBalancer IPs too; ::/0 beside it allows all",
			mod: both(ipv6, lb(func(s *corev1.Service) {
				s.Spec.LoadBalancerSourceRanges = []string{"2001:db8:100::/64", "10.0.0.0/8"}
				s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "2001:db8:aaaa::4"}, {IP: "198.51.100.4"}}
			})), eps: []ep{here6}, want: `
ClusterIP [2001:db8::1]:80/TCP -> 2001:db8:1::1
NodePort [2001:db8:100::1]:30080/TCP -> 2001:db8:1::1
LoadBalancer [2001:db8:aaaa::4]:80/TCP ranges=[2001:db8:100::/64 2001:db8:aaaa::4/128] -> 2001:db8:1::1
`},
		{name: "IPv6: ::/0 allows every source: no check",
			mod: both(ipv6, lb(func(s *corev1.Service) {
				s.Spec.LoadBalancerSourceRanges = []string{"2001:db8:100::/64", "::/0"}
				s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "2001:db8:aaaa::4"}}
			})), eps: []ep{here6}, want: `
ClusterIP [2001:db8::1]:80/TCP -> 2001:db8:1::1
NodePort [2001:db8:100::1]:30080/TCP -> 2001:db8:1::1
LoadBalancer [2001:db8:aaaa::4]:80/TCP -> 2001:db8:1::1
`},
		{name: "addresses with leading zeros are decimal, as kube-proxy reads them",
			mod: func(s *corev1.Service) {
				s.Spec.Type = corev1.ServiceTypeLoadBalancer
				s.Spec.ClusterIPs = []string{"10.096.000.001"}
				s.Spec.ExternalIPs = []string{"203.000.113.007"}
				s.Spec.LoadBalancerSourceRanges = []string{"203.000.113.000/025"}
				s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.051.100.004"}}
			}, eps: []ep{{addr: "10.001.00.001", node: "node-a"}}, want: `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1
NodePort 192.168.1.1:30080/TCP -> 10.1.0.1
LoadBalancer 198.51.100.4:80/TCP ranges=[203.0.113.0/25] -> 10.1.0.1
ExternalIP 203.0.113.7:80/TCP -> 10.1.0.1
`},
	})
}

// An SCTP port is skipped with a warning that names it; the Service's other
// ports are served.
func TestSCTPPortSkipped(t *testing.T) {
	svc := service("web", []string{"10.96.0.1"}, sport("http", 80, corev1.ProtocolTCP), sport("sig", 3868, corev1.ProtocolSCTP), sport("dns", 53, corev1.ProtocolUDP))
	es := slice("web-1", "web", []discoveryv1.EndpointPort{eport("http", 8080, corev1.ProtocolTCP), eport("sig", 3868, corev1.ProtocolSCTP), eport("dns", 5353, corev1.ProtocolUDP)}, here)
	tr, err := ServiceToModel(svc, []*discoveryv1.EndpointSlice{es}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := "10.96.0.1:53/UDP default/web:dns -> 10.1.0.1:5353/UDP@node-a\n10.96.0.1:80/TCP default/web:http -> 10.1.0.1:8080/TCP@node-a\n"
	if got := render(tr.Services, []*discoveryv1.EndpointSlice{es}); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	if w := []string{`port "sig": protocol SCTP is not supported; the port is not served`}; !slices.Equal(tr.Warnings, w) {
		t.Errorf("warnings %q, want %q", tr.Warnings, w)
	}

	only := service("sig", []string{"10.96.0.2"}, sport("", 3868, corev1.ProtocolSCTP))
	tr, err = ServiceToModel(only, nil, Options{})
	if err != nil || len(tr.Services) != 0 || len(tr.Warnings) != 1 || !strings.Contains(tr.Warnings[0], "ports[0]") {
		t.Errorf("SCTP-only Service: %v, frontends %d, warnings %q", err, len(tr.Services), tr.Warnings)
	}
}

// What a translation reads of the node, for the policies and topology.
func TestNodeFactsOfPolicies(t *testing.T) {
	node := Node{Name: "node-a", Labels: map[string]string{corev1.LabelTopologyZone: "zone-a"}}
	for _, c := range []struct {
		name  string
		mod   func(*corev1.Service)
		zones map[string][]string
		want  NodeFacts
	}{
		{"plain ClusterIP", nil, nil, 0},
		{"internalTrafficPolicy Local", itp(corev1.ServiceInternalTrafficPolicyLocal), nil, NodeName},
		{"zone hints", nil, map[string][]string{"10.1.0.1": {"zone-a"}, "10.2.0.1": {"zone-b"}}, NodeName | NodeLabels},
		{"LoadBalancer with source ranges", lb(func(s *corev1.Service) { s.Spec.LoadBalancerSourceRanges = []string{"10.0.0.0/8"} }), nil, NodeAddresses},
	} {
		t.Run(c.name, func(t *testing.T) {
			svc := service("web", []string{"10.96.0.1"}, sport("http", 80, corev1.ProtocolTCP))
			if c.mod != nil {
				c.mod(svc)
			}
			es := slice("web-1", "web", []discoveryv1.EndpointPort{eport("http", 8080, corev1.ProtocolTCP)}, here, there)
			for i := range es.Endpoints {
				if z := c.zones[es.Endpoints[i].Addresses[0]]; z != nil {
					es.Endpoints[i].Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: z[0]}}}
				}
			}
			tr, err := ServiceToModel(svc, []*discoveryv1.EndpointSlice{es}, Options{Node: node})
			if err != nil {
				t.Fatal(err)
			}
			if tr.NodeFacts != c.want {
				t.Errorf("NodeFacts = %b, want %b", tr.NodeFacts, c.want)
			}
			// Changing what was not read changes nothing.
			other := node
			other.Labels = map[string]string{corev1.LabelTopologyZone: "zone-b"}
			if c.want&NodeLabels == 0 {
				again, err := ServiceToModel(svc, []*discoveryv1.EndpointSlice{es}, Options{Node: other})
				if err != nil || renderNS(again.Services) != renderNS(tr.Services) {
					t.Errorf("a zone change changed a translation that did not read it: %v", err)
				}
			}
		})
	}
	_ = fmt.Sprint
}
