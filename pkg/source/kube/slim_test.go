package kube

import (
	"fmt"
	"net/netip"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// A Service and its slices translate the same after the informers' transform
// as before it, whatever of what a translation reads they use: traffic
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
		slimSvc := svc.DeepCopy()
		var slimEps []*discoveryv1.EndpointSlice
		sl := newSlimmer()
		if _, err := sl.slim(slimSvc); err != nil {
			t.Fatal(err)
		}
		for _, es := range eps {
			c := es.DeepCopy()
			if _, err := sl.slim(c); err != nil {
				t.Fatal(err)
			}
			slimEps = append(slimEps, c)
		}
		for _, n := range nodes {
			opts := translate.Options{Node: n}
			want, werr := translate.ServiceToModel(svc, eps, opts)
			got, gerr := translate.ServiceToModel(slimSvc, slimEps, opts)
			if fmt.Sprint(werr) != fmt.Sprint(gerr) || !reflect.DeepEqual(got, want) {
				t.Errorf("%s on %s: slimmed translates to\n%+v (%v)\nwant\n%+v (%v)", v.name, n.Name, got, gerr, want, werr)
			}
		}
		for i := range eps {
			wn, wok := translate.ServiceNameOfSlice(eps[i])
			gn, gok := translate.ServiceNameOfSlice(slimEps[i])
			if wn != gn || wok != gok {
				t.Errorf("%s: slimmed slice %d belongs to %v %v, want %v %v", v.name, i, gn, gok, wn, wok)
			}
			// The tracker's trigger time (kept aside, once) and the
			// resync check; the slice's other annotations.
			want := eps[i].Annotations[corev1.EndpointsLastChangeTriggerTime]
			if got, again := sl.takeTrigger(slimEps[i]), sl.takeTrigger(slimEps[i]); got != want || again != "" {
				t.Errorf("%s: slice %d's trigger time taken %q then %q, want %q then none", v.name, i, got, again, want)
			}
			if slimEps[i].ResourceVersion != eps[i].ResourceVersion || slimEps[i].Annotations["example.com/note"] != "kept" {
				t.Errorf("%s: slimmed slice %d lost its resourceVersion or annotations: %+v", v.name, i, slimEps[i].ObjectMeta)
			}
		}
		// What events.go reads of a Service.
		if slimSvc.UID != svc.UID || slimSvc.ResourceVersion != svc.ResourceVersion || slimSvc.Generation != svc.Generation ||
			!slimSvc.CreationTimestamp.Equal(&svc.CreationTimestamp) {
			t.Errorf("%s: slimmed Service lost its identity", v.name)
		}
	}
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
