package kube

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// A Service and its slices translate the same as the informers' transform
// caches them (the Service slimmed, each slice as what a translation reads
// of it) as whole, whatever of what a translation reads they use: traffic
// policies, topology hints, terminating endpoints, both families, the
// north-south frontends, the labels that skip a Service, and for nodes
// that match an endpoint's node name and zone or not.
func TestSlimmedTranslatesTheSame(t *testing.T) {
	type variant struct {
		name string
		svc  func(*corev1.Service)
	}
	variants := []variant{
		{"cluster", func(*corev1.Service) {}},
		{"local", func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeLoadBalancer
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			s.Spec.InternalTrafficPolicy = new(corev1.ServiceInternalTrafficPolicyLocal)
		}},
		{"topology", func(s *corev1.Service) {
			s.Annotations[corev1.AnnotationTopologyMode] = "Auto"
			s.Spec.TrafficDistribution = new(corev1.ServiceTrafficDistributionPreferSameZone)
		}},
		{"affinity", func(s *corev1.Service) {
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: new(int32(60))}}
		}},
		{"other-proxy", func(s *corev1.Service) { s.Labels[translate.LabelServiceProxyName] = "other" }},
		{"own-proxy", func(s *corev1.Service) { s.Labels[translate.LabelServiceProxyName] = translate.DefaultProxyName }},
		{"headless-label", func(s *corev1.Service) { s.Labels[corev1.IsHeadlessService] = "" }},
	}
	nodes := []translate.Node{
		{Name: "node-a", Labels: map[string]string{corev1.LabelTopologyZone: "zone-a"},
			Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1")}},
		{Name: "node-b", Labels: map[string]string{corev1.LabelTopologyZone: "zone-b"}},
		{Name: "node-c"},
	}
	for _, v := range variants {
		svc, eps := fullObjects()
		v.svc(svc)
		sl := newSlimmer()
		slimSvc, cached := slimmed(t, sl, svc, eps)
		for _, n := range nodes {
			compareTranslations(t, v.name, svc, eps, slimSvc, cached, translate.Options{Node: n})
		}
		for i := range eps {
			// The tracker's trigger time (kept aside, once) and the
			// resync check; the slice's other annotations dropped
			// (keptAnnotations).
			want := eps[i].Annotations[corev1.EndpointsLastChangeTriggerTime]
			if got, again := sl.takeTrigger(cached[i]), sl.takeTrigger(cached[i]); got != want || again != "" {
				t.Errorf("%s: slice %d's trigger time taken %q then %q, want %q then none", v.name, i, got, again, want)
			}
			if cached[i].GetResourceVersion() != eps[i].ResourceVersion || cached[i].GetAnnotations() != nil {
				t.Errorf("%s: cached slice %d lost its resourceVersion or kept annotations: %+v", v.name, i, cached[i])
			}
		}
		// What events.go and the informer's store read of a Service.
		if slimSvc.GetUID() != svc.UID || slimSvc.GetResourceVersion() != svc.ResourceVersion || slimSvc.GetGeneration() != svc.Generation ||
			!slimSvc.Created.Equal(svc.CreationTimestamp.Time) || slimSvc.GetName() != svc.Name || slimSvc.GetNamespace() != svc.Namespace {
			t.Errorf("%s: slimmed Service lost its identity", v.name)
		}
	}
}

// The same over Services and slices drawn at random from what a
// translation reads: both families and dual-stack, every Service type,
// named and unnamed ports of every protocol, external and LoadBalancer
// IPs, source ranges, both traffic policies, affinity, the labels that
// skip a Service, headless, and slices of every addressType, of this
// Service, another or none, with ports missing a name, protocol or
// number, endpoints listed twice, several addresses, addresses written
// with leading zeros or not parsing, every condition unknown, true or
// false, node names and hints.
func TestSlimmedTranslatesTheSameRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(14, 2))
	nodes := []translate.Node{
		{Name: "node-a", Labels: map[string]string{corev1.LabelTopologyZone: "zone-a"},
			IPs:       []netip.Addr{netip.MustParseAddr("203.0.113.9"), netip.MustParseAddr("2001:db8::9")},
			Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1")}},
		{Name: "node-b", Labels: map[string]string{corev1.LabelTopologyZone: "zone-b"}},
	}
	for i := range 3000 {
		svc, eps := randomObjects(r)
		slimSvc, cached := slimmed(t, newSlimmer(), svc, eps)
		for _, n := range nodes {
			compareTranslations(t, fmt.Sprintf("case %d", i), svc, eps, slimSvc, cached, translate.Options{Node: n})
		}
	}
}

// slimmed returns what the informers' transform sl caches of svc and eps,
// which it leaves as they are.
func slimmed(t *testing.T, sl *slimmer, svc *corev1.Service, eps []*discoveryv1.EndpointSlice) (*cachedService, []*cachedSlice) {
	t.Helper()
	o, err := sl.slim(svc.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	var cached []*cachedSlice
	for _, es := range eps {
		c, err := sl.slim(es.DeepCopy())
		if err != nil {
			t.Fatal(err)
		}
		cached = append(cached, c.(*cachedSlice))
	}
	return o.(*cachedService), cached
}

// compareTranslations checks that the cached objects translate as the
// whole ones do, and belong to the same Services.
func compareTranslations(t *testing.T, name string, svc *corev1.Service, eps []*discoveryv1.EndpointSlice,
	slimSvc *cachedService, cached []*cachedSlice, opts translate.Options) {
	t.Helper()
	read := make([]*translate.Slice, len(cached))
	for i, c := range cached {
		read[i] = &c.Slice
	}
	want, werr := translate.ServiceToModel(svc, eps, opts)
	got, gerr := translate.Translate(&slimSvc.Service, read, opts)
	if fmt.Sprint(werr) != fmt.Sprint(gerr) || !reflect.DeepEqual(got, want) {
		t.Errorf("%s on %s: cached translates to\n%+v (%v)\nwant\n%+v (%v)", name, opts.Node.Name, got, gerr, want, werr)
	}
	for i := range eps {
		wn, wok := translate.ServiceNameOfSlice(eps[i])
		gn, gok := read[i].ServiceName()
		if wn != gn || wok != gok {
			t.Errorf("%s: cached slice %d belongs to %v %v, want %v %v", name, i, gn, gok, wn, wok)
		}
	}
}

// randomObjects draws a Service default/web and its slices from r (see
// TestSlimmedTranslatesTheSameRandom).
func randomObjects(r *rand.Rand) (*corev1.Service, []*discoveryv1.EndpointSlice) {
	pick := func(n int) int { return r.IntN(n) }
	some := func(pool []string, most int) []string {
		var out []string
		for range pick(most + 1) {
			out = append(out, pool[pick(len(pool))])
		}
		return out
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", ResourceVersion: "3",
		Labels: map[string]string{"app": "web"}, Annotations: map[string]string{}}}
	sp := &svc.Spec
	sp.Type = []corev1.ServiceType{"", corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort, corev1.ServiceTypeNodePort,
		corev1.ServiceTypeLoadBalancer, corev1.ServiceTypeLoadBalancer, corev1.ServiceTypeLoadBalancer,
		corev1.ServiceTypeExternalName}[pick(8)]
	switch pick(12) {
	case 0:
		sp.ClusterIPs = []string{"10.96.0.10"}
	case 1:
		sp.ClusterIPs = []string{"fd00::10"}
	case 2, 3, 8, 9, 10:
		sp.ClusterIPs = []string{"10.96.0.10", "fd00::10"}
	case 4:
		sp.ClusterIPs = []string{"fd00::10", "10.96.0.10"}
	case 5:
		sp.ClusterIPs = []string{corev1.ClusterIPNone}
	case 6:
		sp.ClusterIP = "10.96.0.10" // as a manifest may give it
	}
	if len(sp.ClusterIPs) > 0 {
		sp.ClusterIP = sp.ClusterIPs[0]
	}
	portNames := []string{"http", "dns", "metrics"}
	nports := 1 + pick(3)
	for i := range nports {
		p := corev1.ServicePort{Name: portNames[i], Port: int32(80 + i), Protocol: []corev1.Protocol{"", corev1.ProtocolTCP,
			corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolUDP, corev1.ProtocolSCTP}[pick(6)]}
		if nports == 1 && pick(2) == 0 {
			p.Name = ""
		}
		if pick(3) > 0 {
			p.NodePort = int32(30080 + i)
		}
		sp.Ports = append(sp.Ports, p)
	}
	sp.ExternalIPs = some([]string{"198.51.100.7", "2001:db8::7", "198.51.100.17"}, 2)
	for _, ip := range some([]string{"198.51.100.8", "2001:db8::8", "198.51.100.18"}, 2) {
		ing := corev1.LoadBalancerIngress{IP: ip}
		if pick(4) == 0 {
			ing.IPMode = new(corev1.LoadBalancerIPModeProxy)
		}
		svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, ing)
	}
	sp.LoadBalancerSourceRanges = some([]string{"203.0.113.0/24", "0.0.0.0/0", "not-a-cidr", "2001:db8::/32", " 10.0.0.0/8"}, 2)
	sp.ExternalTrafficPolicy = []corev1.ServiceExternalTrafficPolicy{"", corev1.ServiceExternalTrafficPolicyCluster,
		corev1.ServiceExternalTrafficPolicyLocal}[pick(3)]
	sp.InternalTrafficPolicy = []*corev1.ServiceInternalTrafficPolicy{nil, new(corev1.ServiceInternalTrafficPolicyCluster),
		new(corev1.ServiceInternalTrafficPolicyLocal)}[pick(3)]
	sp.HealthCheckNodePort = []int32{0, 32000}[pick(2)]
	switch pick(4) {
	case 0:
		sp.SessionAffinity = corev1.ServiceAffinityClientIP
	case 1:
		sp.SessionAffinity = corev1.ServiceAffinityClientIP
		sp.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: new(int32(60))}}
	}
	switch pick(20) {
	case 0:
		svc.Labels[translate.LabelServiceProxyName] = "other"
	case 1:
		svc.Labels[translate.LabelServiceProxyName] = translate.DefaultProxyName
	case 2:
		svc.Labels[corev1.IsHeadlessService] = ""
	}
	if pick(4) == 0 {
		svc.Annotations[corev1.AnnotationTopologyMode] = "Auto"
	}

	var eps []*discoveryv1.EndpointSlice
	addrs := map[discoveryv1.AddressType][]string{
		discoveryv1.AddressTypeIPv4: {"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.04", "10.0.0.5"},
		discoveryv1.AddressTypeIPv6: {"fd01::1", "fd01::2", "fd01::3", "fd01::0:4", "fd01::5"},
		discoveryv1.AddressTypeFQDN: {"a.example", "b.example"},
	}
	conds := []*bool{nil, new(true), new(false), new(true)}
	nslices := 1 + pick(4)
	if pick(10) == 0 {
		nslices = 0
	}
	for i := range nslices {
		at := []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6,
			discoveryv1.AddressTypeIPv6, discoveryv1.AddressTypeFQDN}[pick(5)]
		es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("web-%d", i),
			ResourceVersion: "5", Labels: map[string]string{discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"},
			Annotations: map[string]string{corev1.EndpointsLastChangeTriggerTime: "2026-01-01T00:00:00Z"}}, AddressType: at}
		switch pick(10) {
		case 0: // none
		case 1:
			es.Labels[discoveryv1.LabelServiceName] = "other"
		case 2:
			es.Labels[discoveryv1.LabelServiceName] = ""
		default:
			es.Labels[discoveryv1.LabelServiceName] = "web"
		}
		// Mostly the Service's ports, as the EndpointSlice controller
		// writes them.
		for j, svp := range sp.Ports {
			p := discoveryv1.EndpointPort{Name: new(svp.Name), Port: new(int32(8080 + j)), Protocol: new(cmp.Or(svp.Protocol, corev1.ProtocolTCP))}
			switch pick(20) {
			case 0:
				p.Name = nil
			case 1:
				p.Name = new("other")
			case 2:
				p.Port = nil
			case 3:
				p.Protocol = nil
			case 4:
				p.Protocol = new(corev1.ProtocolUDP)
			case 5:
				continue
			}
			es.Ports = append(es.Ports, p)
		}
		for range pick(7) {
			e := discoveryv1.Endpoint{Addresses: some(addrs[at], 2),
				Conditions: discoveryv1.EndpointConditions{Ready: conds[pick(4)], Serving: conds[pick(4)], Terminating: conds[pick(3)]}}
			switch {
			case len(e.Addresses) == 0 && pick(50) > 0:
				e.Addresses = addrs[at][:1]
			case pick(100) == 0:
				e.Addresses = append(e.Addresses, "not-an-address")
			}
			if n := pick(3); n > 0 {
				e.NodeName = new(fmt.Sprintf("node-%c", 'a'+n-1))
				e.Zone = new(fmt.Sprintf("zone-%c", 'a'+n-1))
			}
			if pick(3) == 0 {
				e.Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: []string{"zone-a", "zone-b"}[pick(2)]}}}
				if pick(2) == 0 {
					e.Hints.ForNodes = []discoveryv1.ForNode{{Name: []string{"node-a", "node-b"}[pick(2)]}}
				}
			}
			es.Endpoints = append(es.Endpoints, e)
		}
		eps = append(eps, es)
	}
	return svc, eps
}

// fullObjects is a dual-stack LoadBalancer Service with everything an API
// server's carries, and one slice per family whose endpoints are ready,
// serving-terminating and not serving, on several nodes and zones, with
// hints.
func fullObjects() (*corev1.Service, []*discoveryv1.EndpointSlice) {
	meta := func(name string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name), ResourceVersion: "7", Generation: 2,
			CreationTimestamp: metav1.Unix(1e9, 0),
			Labels:            map[string]string{"app.kubernetes.io/name": "web"},
			Annotations:       map[string]string{"example.com/note": "kept", corev1.LastAppliedConfigAnnotation: "{}"},
			ManagedFields:     []metav1.ManagedFieldsEntry{{Manager: "kubectl"}},
			OwnerReferences:   []metav1.OwnerReference{{Kind: "Service", Name: "web"}}}
	}
	svc := &corev1.Service{ObjectMeta: meta("web"), Spec: corev1.ServiceSpec{
		Type:       corev1.ServiceTypeLoadBalancer,
		Selector:   map[string]string{"app.kubernetes.io/name": "web"},
		ClusterIP:  "10.96.0.10",
		ClusterIPs: []string{"10.96.0.10", "fd00::10"},
		IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}, IPFamilyPolicy: new(corev1.IPFamilyPolicyRequireDualStack),
		Ports: []corev1.ServicePort{
			{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, NodePort: 30080},
			{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, NodePort: 30053},
		},
		ExternalIPs:              []string{"198.51.100.7"},
		LoadBalancerSourceRanges: []string{"203.0.113.0/24"},
		HealthCheckNodePort:      32000,
	}, Status: corev1.ServiceStatus{
		LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: "198.51.100.8"}, {IP: "2001:db8::8"}}},
		Conditions:   []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue}},
	}}
	var eps []*discoveryv1.EndpointSlice
	for f, addrs := range [][]string{{"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"}, {"fd01::1", "fd01::2", "fd01::3", "fd01::4"}} {
		es := &discoveryv1.EndpointSlice{ObjectMeta: meta(fmt.Sprintf("web-%d", f)),
			AddressType: []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6}[f],
			Ports: []discoveryv1.EndpointPort{{Name: new("http"), Port: new(int32(8080)), Protocol: new(corev1.ProtocolTCP)},
				{Name: new("dns"), Port: new(int32(5353)), Protocol: new(corev1.ProtocolUDP)}}}
		es.Labels[discoveryv1.LabelServiceName] = "web"
		es.Labels[discoveryv1.LabelManagedBy] = "endpointslice-controller.k8s.io"
		es.Annotations[corev1.EndpointsLastChangeTriggerTime] = "2026-01-01T00:00:00Z"
		conds := []discoveryv1.EndpointConditions{
			{Ready: new(true), Serving: new(true), Terminating: new(false)},
			{Ready: new(false), Serving: new(true), Terminating: new(true)},
			{Ready: new(false), Serving: new(false), Terminating: new(true)},
			{},
		}
		for i, a := range addrs {
			node, zone := []string{"node-a", "node-b", "node-a", "node-b"}[i], []string{"zone-a", "zone-b", "zone-a", "zone-b"}[i]
			es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{a}, Conditions: conds[i],
				Hostname: new(fmt.Sprintf("web-%d", i)), NodeName: new(node), Zone: new(zone),
				TargetRef:          &corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: fmt.Sprintf("web-%d", i)},
				DeprecatedTopology: map[string]string{corev1.LabelHostname: node},
				Hints: &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: zone}},
					ForNodes: []discoveryv1.ForNode{{Name: node}}}})
		}
		eps = append(eps, es)
	}
	return svc, eps
}

// One transform over many objects shares their port arrays, and what it
// caches of each is still what a translation reads of it: port lists of
// one or two that are the same share an array; lists that differ in a
// name, protocol, number or nodePort do not.
func TestSlimSharesPortArrays(t *testing.T) {
	r := rand.New(rand.NewPCG(14, 31))
	sl := newSlimmer()
	seen := map[any]bool{}
	var sharedSvc, sharedSlice int
	for i := range 3000 {
		svc, eps := randomObjects(r)
		slimSvc, cached := slimmed(t, sl, svc, eps)
		if want := translate.MakeService(svc); !reflect.DeepEqual(slimSvc.Service, want) {
			t.Fatalf("case %d: cached Service\n%+v\nwant\n%+v", i, slimSvc.Service, want)
		}
		if len(slimSvc.Ports) > 0 {
			if a := &slimSvc.Ports[0]; seen[a] {
				sharedSvc++
			} else {
				seen[a] = true
			}
		}
		for j, c := range cached {
			if want := translate.MakeSlice(eps[j]); !reflect.DeepEqual(c.Slice, want) {
				t.Fatalf("case %d: cached slice %d\n%+v\nwant\n%+v", i, j, c.Slice, want)
			}
			if len(c.Ports) > 0 {
				if a := &c.Ports[0]; seen[a] {
					sharedSlice++
				} else {
					seen[a] = true
				}
			}
		}
	}
	if sharedSvc < 300 || sharedSlice < 1000 {
		t.Errorf("%d Services' and %d slices' port arrays shared: the objects miss the case", sharedSvc, sharedSlice)
	}
}
