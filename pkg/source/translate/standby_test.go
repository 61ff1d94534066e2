package translate

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// A UDP frontend's Standby is what the Service port serves but the
// frontend does not use: the serving and terminating endpoint while
// others are ready, the other nodes' endpoints of a Local policy. Not
// serving endpoints are not in it, nor anything of a TCP port.
func TestStandby(t *testing.T) {
	opts := Options{Node: Node{Name: "node-a", Addresses: []netip.Addr{netip.MustParseAddr("192.168.1.1")}}}
	eps := func(proto corev1.Protocol) []*discoveryv1.EndpointSlice {
		return []*discoveryv1.EndpointSlice{slice("dns-1", "dns", []discoveryv1.EndpointPort{eport("dns", 5353, proto)},
			ep{addr: "10.1.0.1", node: "node-a"},
			ep{addr: "10.2.0.1", node: "node-b"},
			ep{addr: "10.1.0.2", node: "node-a", ready: ptr(false), serving: ptr(true), terminate: ptr(true)},
			ep{addr: "10.2.0.2", node: "node-b", ready: ptr(false), serving: ptr(false), terminate: ptr(true)},
		)}
	}
	render := func(proto corev1.Protocol, local, internalLocal bool) string {
		p := sport("dns", 53, proto)
		p.NodePort = 30053
		s := service("dns", []string{"10.96.0.10"}, p)
		s.Spec.Type = corev1.ServiceTypeNodePort
		if local {
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		}
		if internalLocal {
			s.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal)
		}
		tr, err := ServiceToModel(s, eps(proto), opts)
		if err != nil {
			t.Fatal(err)
		}
		var sb strings.Builder
		for _, m := range tr.Services {
			fmt.Fprintf(&sb, "%s standby", m.Frontend)
			for _, a := range m.Standby {
				fmt.Fprintf(&sb, " %s", a.Addr)
			}
			sb.WriteString("\n")
		}
		return sb.String()
	}
	for _, c := range []struct {
		name                 string
		proto                corev1.Protocol
		local, internalLocal bool
		want                 string
	}{
		{"Cluster", corev1.ProtocolUDP, false, false, `
10.96.0.10:53/UDP standby 10.1.0.2
192.168.1.1:30053/UDP standby 10.1.0.2
`},
		// The NodePort's internal scope uses node-b's endpoint.
		{"ExternalLocal", corev1.ProtocolUDP, true, false, `
10.96.0.10:53/UDP standby 10.1.0.2
192.168.1.1:30053/UDP standby 10.1.0.2
`},
		{"InternalLocal", corev1.ProtocolUDP, false, true, `
10.96.0.10:53/UDP standby 10.1.0.2 10.2.0.1
192.168.1.1:30053/UDP standby 10.1.0.2
`},
		{"TCP", corev1.ProtocolTCP, true, true, `
10.96.0.10:53/TCP standby
192.168.1.1:30053/TCP standby
`},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := render(c.proto, c.local, c.internalLocal); got != c.want[1:] {
				t.Errorf("got\n%swant\n%s", got, c.want[1:])
			}
		})
	}
}
