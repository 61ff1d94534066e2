package kube

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Dual stack (issue 10), against a real apiserver with an IPv4 and an IPv6
// service range: a PreferDualStack Service gets a ClusterIP of each family,
// and the source makes a frontend of each, balancing over the
// EndpointSlices of its own addressType; a SingleStack IPv6 Service gets
// only its IPv6 frontend, its IPv4 slice left alone. What the source emits
// is read from the state the agent applies, and what the reconciler made
// of it back from the datapath.
func TestDualStackServices(t *testing.T) {
	env := startEnv(t)
	c := env.Client
	dp := newFake()
	p := startProxy(t, env.AgentConfig, dp, proxyOpts{minSync: 100 * time.Millisecond})

	dual := createService(t, c, "default", "dual", func(s *corev1.Service) {
		s.Spec.IPFamilyPolicy = new(corev1.IPFamilyPolicyPreferDualStack)
	}, svcPort("http", 80, "http"))
	single6 := createService(t, c, "default", "single6", func(s *corev1.Service) {
		s.Spec.IPFamilyPolicy = new(corev1.IPFamilyPolicySingleStack)
		s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol}
	}, svcPort("http", 80, "http"))
	if fams := dual.Spec.IPFamilies; !slices.Equal(fams, []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}) || len(dual.Spec.ClusterIPs) != 2 {
		t.Fatalf("PreferDualStack Service: ipFamilies %v, clusterIPs %v; want one of each family, IPv4 first", fams, dual.Spec.ClusterIPs)
	}
	if ips := single6.Spec.ClusterIPs; len(ips) != 1 || !netip.MustParseAddr(ips[0]).Is6() {
		t.Fatalf("SingleStack IPv6 Service: clusterIPs %v", ips)
	}

	slice6 := func(svc, name string, eps ...ep) *discoveryv1.EndpointSlice {
		es := makeSlice("default", svc, name, slicePorts{"http": 8080}, eps...)
		es.AddressType = discoveryv1.AddressTypeIPv6
		return es
	}
	createSlice(t, c, makeSlice("default", "dual", "dual-4", slicePorts{"http": 8080}, ready("10.0.4.1"), ready("10.0.4.2")))
	createSlice(t, c, slice6("dual", "dual-6", ready("2001:db8:4::1"), notReady("2001:db8:4::9")))
	createSlice(t, c, makeSlice("default", "single6", "single6-4", slicePorts{"http": 8080}, ready("10.0.5.1")))
	createSlice(t, c, slice6("single6", "single6-6", ready("2001:db8:5::1"), ready("2001:db8:5::2")))

	v4, v6 := dual.Spec.ClusterIPs[0], dual.Spec.ClusterIPs[1]
	want := map[string][]string{
		feOf(v4, 80):                     {be("10.0.4.1", 8080), be("10.0.4.2", 8080)},
		feOf(v6, 80):                     {be("2001:db8:4::1", 8080)},
		feOf(single6.Spec.ClusterIP, 80): {be("2001:db8:5::1", 8080), be("2001:db8:5::2", 8080)},
	}
	wantView(t, "the source's state", func() map[string][]string { return emitted(p) }, want)
	// Nothing else: no IPv4 frontend for the IPv6 single-stack Service.
	n := map[string]int{}
	for _, svc := range p.last.Load().Services.All() {
		n[svc.Name.Namespace+"/"+svc.Name.Name]++
	}
	if n["default/dual"] != 2 || n["default/single6"] != 1 {
		t.Errorf("frontends per Service %v, want 2 for default/dual, 1 for default/single6:\n%s", n, dumpView(emitted(p)))
	}
	wantProgrammed(t, dp, want)

	// An IPv6 endpoint change reaches the IPv6 frontend only.
	updateSlice(t, c, "default", "dual-6", ready("2001:db8:4::1"), ready("2001:db8:4::9"))
	want[feOf(v6, 80)] = []string{be("2001:db8:4::1", 8080), be("2001:db8:4::9", 8080)}
	wantView(t, "the source's state after an IPv6 slice change", func() map[string][]string { return emitted(p) }, want)
	wantProgrammed(t, dp, want)
	checkFake(t, dp)
}
