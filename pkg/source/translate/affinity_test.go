package translate

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// TestSessionAffinity: sessionAffinity ClientIP gives every frontend of
// every port of the Service its timeout (kube-proxy's affinity covers the
// ClusterIP, NodePort, ExternalIP and LoadBalancer IP of each Service
// port), 10800 s when the config is absent (the API server's default);
// None and the empty value give none. The Service is
// externalTrafficPolicy Local: its north-south frontends have two scopes,
// and the one timeout holds for both.
func TestSessionAffinity(t *testing.T) {
	opts := Options{Node: Node{Name: "node-a", Addresses: []netip.Addr{netip.MustParseAddr("192.168.1.1")}}}
	newSvc := func(affinity corev1.ServiceAffinity, cfg *corev1.SessionAffinityConfig) *corev1.Service {
		http := sport("http", 80, corev1.ProtocolTCP)
		http.NodePort = 30080
		s := service("aff", []string{"10.96.0.1"}, http, sport("dns", 53, corev1.ProtocolUDP))
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		s.Spec.ExternalIPs = []string{"192.168.99.1"}
		s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.51.100.1"}}
		s.Spec.SessionAffinity = affinity
		s.Spec.SessionAffinityConfig = cfg
		return s
	}
	timeout := func(ts *int32) *corev1.SessionAffinityConfig {
		return &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ts}}
	}
	eps := []*discoveryv1.EndpointSlice{slice("aff-1", "aff",
		[]discoveryv1.EndpointPort{eport("http", 8080, corev1.ProtocolTCP), eport("dns", 53, corev1.ProtocolUDP)},
		ep{addr: "10.1.0.1", node: "node-a"}, ep{addr: "10.2.0.1", node: "node-b"})}

	// Every frontend: the ClusterIP of both ports, and the NodePort,
	// ExternalIP and LoadBalancer IP of the http port and the last two of
	// the dns port (which has no nodePort).
	const frontends = 7
	for _, c := range []struct {
		name     string
		affinity corev1.ServiceAffinity
		cfg      *corev1.SessionAffinityConfig
		want     time.Duration
	}{
		{"ClientIP with a timeout", corev1.ServiceAffinityClientIP, timeout(ptr[int32](2)), 2 * time.Second},
		{"ClientIP, the longest timeout", corev1.ServiceAffinityClientIP, timeout(ptr[int32](86400)), 24 * time.Hour},
		{"ClientIP without a config: the API default", corev1.ServiceAffinityClientIP, nil, 10800 * time.Second},
		{"ClientIP, config without clientIP", corev1.ServiceAffinityClientIP, &corev1.SessionAffinityConfig{}, 10800 * time.Second},
		{"ClientIP, clientIP without timeoutSeconds", corev1.ServiceAffinityClientIP, timeout(nil), 10800 * time.Second},
		{"None", corev1.ServiceAffinityNone, nil, 0},
		{"empty (not defaulted)", "", nil, 0},
		{"None with a config (the API refuses it): no affinity", corev1.ServiceAffinityNone, timeout(ptr[int32](60)), 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr, err := ServiceToModel(newSvc(c.affinity, c.cfg), eps, opts)
			if err != nil {
				t.Fatal(err)
			}
			if len(tr.Services) != frontends {
				t.Fatalf("%d frontends, want %d:\n%s", len(tr.Services), frontends, renderNS(tr.Services))
			}
			var bad []string
			twoScopes := 0
			for _, s := range tr.Services {
				if s.AffinityTimeout != c.want {
					bad = append(bad, fmt.Sprintf("%s %s: %v", s.Name, s.Frontend, s.AffinityTimeout))
				}
				// externalTrafficPolicy Local: one timeout for both
				// scopes (the internal clients' too).
				if s.TwoScopes {
					twoScopes++
				}
			}
			if twoScopes != frontends-2 {
				t.Errorf("%d frontends with two scopes, want the %d north-south ones", twoScopes, frontends-2)
			}
			if len(bad) > 0 {
				t.Errorf("want affinity timeout %v everywhere, got:\n%s", c.want, strings.Join(bad, "\n"))
			}
		})
	}

	// Values the API server refuses: the Service is refused, naming
	// the field, as other bad input is.
	for _, c := range []struct {
		name     string
		affinity corev1.ServiceAffinity
		cfg      *corev1.SessionAffinityConfig
		want     string
	}{
		{"zero timeout", corev1.ServiceAffinityClientIP, timeout(ptr[int32](0)),
			`service "default/aff": sessionAffinityConfig.clientIP.timeoutSeconds 0: want 1 to 86400`},
		{"negative timeout", corev1.ServiceAffinityClientIP, timeout(ptr[int32](-5)),
			`service "default/aff": sessionAffinityConfig.clientIP.timeoutSeconds -5: want 1 to 86400`},
		{"over a day", corev1.ServiceAffinityClientIP, timeout(ptr[int32](86401)),
			`service "default/aff": sessionAffinityConfig.clientIP.timeoutSeconds 86401: want 1 to 86400`},
		{"unknown type", "Cookie", nil,
			`service "default/aff": unknown sessionAffinity "Cookie": want ClientIP or None`},
	} {
		t.Run("refused/"+c.name, func(t *testing.T) {
			svc := newSvc(c.affinity, c.cfg)
			if err := ValidateService(svc); fmt.Sprint(err) != c.want {
				t.Errorf("ValidateService = %v, want %q", err, c.want)
			}
			if tr, err := ServiceToModel(svc, eps, opts); err == nil {
				t.Errorf("ServiceToModel accepted it: %s", renderNS(tr.Services))
			}
		})
	}
}
