package agentproc

import (
	"fmt"
	"strconv"
	"strings"
)

// Service describes a ClusterIP Service and the EndpointSlices that back
// it, one per IP family, for writing as a manifest.
type Service struct {
	Namespace, Name string
	// ClusterIP is the primary ClusterIP; ClusterIP6, if set, a second one
	// of the other family: the Service is then PreferDualStack, with
	// clusterIPs [ClusterIP, ClusterIP6].
	ClusterIP, ClusterIP6 string
	Ports                 []Port
	// Endpoints are the ready endpoint addresses, of either family: each
	// family's go into an EndpointSlice of its addressType. Empty: the
	// slices list none and the service refuses connections.
	Endpoints []string
}

// Port is one Service port and the endpoint port it maps to.
type Port struct {
	Name     string
	Protocol string // TCP or UDP
	Port     int
	// TargetPort goes into the Service as written: a number or a name
	// (a named container port). The EndpointSlice carries the resolved
	// number, EndpointPort, under the Service port's name, as the
	// EndpointSlice controller writes it.
	TargetPort   string
	EndpointPort int
}

// TCP is a TCP Service port to target, a numbered endpoint port.
func TCP(name string, port, target int) Port {
	return Port{Name: name, Protocol: "TCP", Port: port, TargetPort: strconv.Itoa(target), EndpointPort: target}
}

// UDP is a UDP Service port to target, a numbered endpoint port.
func UDP(name string, port, target int) Port {
	return Port{Name: name, Protocol: "UDP", Port: port, TargetPort: strconv.Itoa(target), EndpointPort: target}
}

// Named is p with its targetPort naming the container port (p's own name)
// instead of giving its number.
func (p Port) Named() Port {
	p.TargetPort = p.Name
	return p
}

// Services renders each Service and its EndpointSlice, in order, as the
// documents of a manifest.
func Services(svcs ...Service) []string {
	docs := make([]string, 0, len(svcs))
	for _, s := range svcs {
		docs = append(docs, s.YAML())
	}
	return docs
}

// YAML renders the Service and its EndpointSlices as YAML documents: the
// slice of the primary family first (named <name>-1, as it always was),
// then, for a dual-stack Service, the other family's (<name>-2).
func (s Service) YAML() string {
	ns := s.Namespace
	if ns == "" {
		ns = "default"
	}
	ips, families, policy := []string{s.ClusterIP}, []string{family(s.ClusterIP)}, "SingleStack"
	if s.ClusterIP6 != "" {
		ips, families, policy = append(ips, s.ClusterIP6), append(families, family(s.ClusterIP6)), "PreferDualStack"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: v1\nkind: Service\nmetadata:\n  name: %s\n  namespace: %s\nspec:\n  type: ClusterIP\n  clusterIP: %s\n  clusterIPs: [%s]\n  ipFamilyPolicy: %s\n  ipFamilies: [%s]\n  ports:\n",
		s.Name, ns, s.ClusterIP, strings.Join(ips, ", "), policy, strings.Join(families, ", "))
	for _, p := range s.Ports {
		fmt.Fprintf(&b, "  - name: %s\n    protocol: %s\n    port: %d\n    targetPort: %s\n", p.Name, p.Protocol, p.Port, p.TargetPort)
	}
	for i, fam := range families {
		fmt.Fprintf(&b, "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: %s-%d\n  namespace: %s\n  labels:\n    kubernetes.io/service-name: %s\naddressType: %s\nports:\n",
			s.Name, i+1, ns, s.Name, fam)
		for _, p := range s.Ports {
			fmt.Fprintf(&b, "- name: %s\n  protocol: %s\n  port: %d\n", p.Name, p.Protocol, p.EndpointPort)
		}
		var eps []string
		for _, e := range s.Endpoints {
			if family(e) == fam {
				eps = append(eps, e)
			}
		}
		if len(eps) == 0 {
			b.WriteString("endpoints: []\n")
			continue
		}
		b.WriteString("endpoints:\n")
		for _, e := range eps {
			fmt.Fprintf(&b, "- addresses: [%q]\n  conditions: {ready: true, serving: true, terminating: false}\n", e)
		}
	}
	return b.String()
}

// family is the Kubernetes IP family (and EndpointSlice addressType) of
// the address ip: IPv6 if it has a colon.
func family(ip string) string {
	if strings.Contains(ip, ":") {
		return "IPv6"
	}
	return "IPv4"
}

// Manifest joins YAML documents into one multi-document file.
func Manifest(docs ...string) string {
	return strings.Join(docs, "---\n")
}
