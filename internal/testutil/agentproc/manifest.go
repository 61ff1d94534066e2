package agentproc

import (
	"fmt"
	"strconv"
	"strings"
)

// Service describes a ClusterIP Service and the one EndpointSlice that
// backs it, for writing as a manifest.
type Service struct {
	Namespace, Name string
	ClusterIP       string
	Ports           []Port
	// Endpoints are the ready endpoint addresses. Empty: the slice lists
	// none and the service refuses connections.
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

// YAML renders the Service and its EndpointSlice as two YAML documents.
func (s Service) YAML() string {
	ns := s.Namespace
	if ns == "" {
		ns = "default"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: v1\nkind: Service\nmetadata:\n  name: %s\n  namespace: %s\nspec:\n  type: ClusterIP\n  clusterIP: %s\n  clusterIPs: [%s]\n  ports:\n",
		s.Name, ns, s.ClusterIP, s.ClusterIP)
	for _, p := range s.Ports {
		fmt.Fprintf(&b, "  - name: %s\n    protocol: %s\n    port: %d\n    targetPort: %s\n", p.Name, p.Protocol, p.Port, p.TargetPort)
	}
	fmt.Fprintf(&b, "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: %s-1\n  namespace: %s\n  labels:\n    kubernetes.io/service-name: %s\naddressType: IPv4\nports:\n",
		s.Name, ns, s.Name)
	for _, p := range s.Ports {
		fmt.Fprintf(&b, "- name: %s\n  protocol: %s\n  port: %d\n", p.Name, p.Protocol, p.EndpointPort)
	}
	if len(s.Endpoints) == 0 {
		b.WriteString("endpoints: []\n")
	} else {
		b.WriteString("endpoints:\n")
		for _, e := range s.Endpoints {
			fmt.Fprintf(&b, "- addresses: [%q]\n  conditions: {ready: true, serving: true, terminating: false}\n", e)
		}
	}
	return b.String()
}

// Manifest joins YAML documents into one multi-document file.
func Manifest(docs ...string) string {
	return strings.Join(docs, "---\n")
}
