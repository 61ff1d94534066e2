package kube

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/client-go/kubernetes"
)

// Most tests of this package run once per IP family (issue 10), as
// subtests IPv4 and IPv6 over the test's one apiserver: the same steps and
// assertions, with single-stack Services of that family, EndpointSlices of
// its addressType and addresses of its own. The subtests share the
// apiserver, so each puts its objects in namespaces of its own
// (family.namespace); what one family leaves behind is still there while
// the other runs, which the assertions (the frontends they name) allow.

// family is one IP family's objects and addresses.
type family struct {
	name        string // the subtest's: IPv4, IPv6
	ipFamily    corev1.IPFamily
	addressType discoveryv1.AddressType
	// pod is the printf format of an endpoint address, host h of
	// subnet n: 10.0.n.h, 2001:db8:n::h.
	pod string
	// external is the printf format of an address outside every range
	// of the cluster, for externalIPs: TEST-NET-1 (RFC 5737), or the
	// documentation prefix's first /48 (RFC 3849).
	external string
}

var families = []family{
	{name: "IPv4", ipFamily: corev1.IPv4Protocol, addressType: discoveryv1.AddressTypeIPv4,
		pod: "10.0.%d.%d", external: "192.0.2.%d"},
	{name: "IPv6", ipFamily: corev1.IPv6Protocol, addressType: discoveryv1.AddressTypeIPv6,
		pod: "2001:db8:%d::%d", external: "2001:db8::%d"},
}

// forFamilies runs f as a subtest per family, IPv4 first.
func forFamilies(t *testing.T, f func(t *testing.T, fam family)) {
	t.Helper()
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) { f(t, fam) })
	}
}

// addr is endpoint address h of subnet n.
func (f family) addr(n, h int) string { return fmt.Sprintf(f.pod, n, h) }

// externalIP is the external address h.
func (f family) externalIP(h int) string { return fmt.Sprintf(f.external, h) }

// namespace creates the family's namespace for base (base-ipv4,
// base-ipv6) and returns its name.
func (f family) namespace(t *testing.T, c kubernetes.Interface, base string) string {
	t.Helper()
	ns := base + "-" + strings.ToLower(f.name)
	createNamespace(t, c, ns)
	return ns
}

// service is createService for a SingleStack Service of the family;
// mutate runs after, and may replace the spec (an ExternalName Service).
func (f family) service(t *testing.T, c kubernetes.Interface, ns, name string, mutate func(*corev1.Service), ports ...corev1.ServicePort) *corev1.Service {
	t.Helper()
	return createService(t, c, ns, name, func(s *corev1.Service) {
		s.Spec.IPFamilyPolicy = new(corev1.IPFamilyPolicySingleStack)
		s.Spec.IPFamilies = []corev1.IPFamily{f.ipFamily}
		if mutate != nil {
			mutate(s)
		}
	}, ports...)
}

// slice is makeSlice for an EndpointSlice of the family's addressType.
func (f family) slice(ns, svc, name string, ports slicePorts, eps ...ep) *discoveryv1.EndpointSlice {
	es := makeSlice(ns, svc, name, ports, eps...)
	es.AddressType = f.addressType
	return es
}
