package health

import (
	"log/slog"
	"net"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// TestNodePortServerWithoutNodePorts: a LoadBalancer Service with
// externalTrafficPolicy Local and allocateLoadBalancerNodePorts false has
// no NodePort frontend, and its ingress may give it no other (a hostname,
// as AWS's; an ipMode Proxy IP; none published yet). kube-proxy serves its
// healthCheckNodePort all the same (every Service port with a ClusterIP of
// the family carries it, serviceport.go), and so must Sluice: 200 with
// the count of ready local endpoints, per family, then 503 with 0 once
// only a terminating one is left here. The state is the translation of
// the objects, as the agent's source makes it.
func TestNodePortServerWithoutNodePorts(t *testing.T) {
	hc := freePort(t)
	s := NewNodePortServer([]string{""}, nil, slog.New(slog.DiscardHandler)) // all addresses, both families
	t.Cleanup(s.Close)
	proxy := corev1.LoadBalancerIPModeProxy
	no := false
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: corev1.ServiceSpec{
			Type:                          corev1.ServiceTypeLoadBalancer,
			ClusterIP:                     "10.96.0.10",
			ClusterIPs:                    []string{"10.96.0.10", "fd00:96::10"},
			Ports:                         []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}},
			ExternalTrafficPolicy:         corev1.ServiceExternalTrafficPolicyLocal,
			HealthCheckNodePort:           int32(hc),
			AllocateLoadBalancerNodePorts: &no,
		},
	}
	// This node is node-a.
	type ep struct {
		addr, node  string
		ready, term bool
	}
	slices := func(eps ...ep) []*discoveryv1.EndpointSlice {
		port, name, tcp := int32(8080), "http", corev1.ProtocolTCP
		var out []*discoveryv1.EndpointSlice
		for _, fam := range []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6} {
			es := &discoveryv1.EndpointSlice{
				ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "web-" + string(fam), Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
				AddressType: fam,
				Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port, Protocol: &tcp}},
			}
			for _, e := range eps {
				if v6 := len(e.addr) > 0 && e.addr[0] == 'f'; v6 != (fam == discoveryv1.AddressTypeIPv6) {
					continue
				}
				ready, serving, term := e.ready, e.ready || e.term, e.term
				es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{e.addr}, NodeName: &e.node,
					Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &term}})
			}
			out = append(out, es)
		}
		return out
	}
	opts := translate.Options{Node: translate.Node{Name: "node-a"}} // no NodePort address either
	sync := func(eps []*discoveryv1.EndpointSlice) {
		t.Helper()
		tr, err := translate.ServiceToModel(svc, eps, opts)
		if err != nil || tr.Skipped != "" {
			t.Fatalf("ServiceToModel: %v %q", err, tr.Skipped)
		}
		st := model.NewState()
		for _, sv := range tr.Services {
			st.Services.Set(sv.Frontend, sv)
		}
		if err := s.Sync(st); err != nil {
			t.Fatal(err)
		}
	}
	ask := func(what string, want map[string]int) {
		t.Helper()
		for host, n := range want {
			code := 200
			if n == 0 {
				code = 503
			}
			got, body := getAt(t, host, hc)
			if got != code || body.LocalEndpoints != n || body.Service.Namespace != "default" || body.Service.Name != "web" {
				t.Errorf("%s, on %s: %d %+v, want %d with %d local endpoints", what, host, got, body, code, n)
			}
		}
	}

	for _, ing := range []struct {
		what string
		ing  []corev1.LoadBalancerIngress
	}{
		{"hostname ingress", []corev1.LoadBalancerIngress{{Hostname: "web.elb.example"}}},
		{"ipMode Proxy ingress", []corev1.LoadBalancerIngress{{IP: "198.51.100.4", IPMode: &proxy}, {IP: "2001:db8:aaaa::4", IPMode: &proxy}}},
		{"no ingress yet", nil},
	} {
		svc.Status.LoadBalancer.Ingress = ing.ing
		// Two ready local endpoints of each family (one of them a
		// dual-stack pod, which counts once in each), a third local
		// one ready in IPv4 only, one elsewhere, one terminating here.
		sync(slices(
			ep{"10.1.0.1", "node-a", true, false}, ep{"fd00:1::1", "node-a", true, false},
			ep{"10.1.0.2", "node-a", true, false}, ep{"fd00:1::2", "node-a", true, false},
			ep{"10.1.0.3", "node-a", true, false}, ep{"fd00:1::3", "node-a", false, true},
			ep{"10.2.0.1", "node-b", true, false}, ep{"fd00:2::1", "node-b", true, false},
		))
		ask(ing.what+", with local endpoints", map[string]int{"127.0.0.1": 3, "[::1]": 2})

		// Only a terminating endpoint here: it serves, but the health
		// check must make the load balancer drain the node.
		sync(slices(
			ep{"10.1.0.1", "node-a", false, true}, ep{"fd00:1::1", "node-a", false, true},
			ep{"10.2.0.1", "node-b", true, false}, ep{"fd00:2::1", "node-b", true, false},
		))
		ask(ing.what+", with only terminating local endpoints", map[string]int{"127.0.0.1": 0, "[::1]": 0})
	}

	// Under externalTrafficPolicy Cluster no frontend carries the health
	// check port (kube-proxy's NeedsHealthCheck): it closes.
	svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
	sync(slices(ep{"10.1.0.1", "node-a", true, false}, ep{"fd00:1::1", "node-a", true, false}))
	for _, host := range []string{"127.0.0.1", "::1"} {
		if c, err := net.Dial("tcp", net.JoinHostPort(host, strconv.Itoa(int(hc)))); err == nil {
			_ = c.Close()
			t.Errorf("health check port %d answers on %s under externalTrafficPolicy Cluster, want closed", hc, host)
		}
	}
}
