package translate

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/model"
)

// FuzzServiceToModel translates a Service and EndpointSlices built from
// the fuzzer's bytes. Whatever the objects hold, the translation must not
// panic, must agree with ValidateService and ValidateEndpointSlice, must
// leave its inputs alone, must depend on no part of the node outside its
// NodeFacts, and every model.Service it returns must be one the reconciler
// can program as it is (checkService).
func FuzzServiceToModel(f *testing.F) {
	// Seeds: nothing (every choice the first: a valid ClusterIP Service
	// with no ports), and runs of bytes that pick valid values early in
	// each pool, so the fuzzer starts from translations that produce
	// frontends and backends.
	f.Add([]byte{})
	f.Add([]byte{0, 0, 0, 1, 1, 0, 1, 1, 0, 2, 0, 1, 4, 1, 0, 1, 0, 1, 0, 0, 0, 2, 1, 1, 1, 4, 1, 1, 3, 1, 1, 2, 1, 3, 0, 1, 1})
	f.Add([]byte{0, 0, 0, 3, 1, 0, 1, 1, 2, 2, 1, 1, 5, 1, 1, 2, 1, 3, 1, 2, 1, 2, 2, 1, 0, 0, 0, 0, 4, 1, 1, 1, 4, 3, 2, 1, 2, 1, 1, 1, 1, 1, 1})
	f.Add([]byte("\x00\x00\x00\x02\x02\x00\x01\x02\x02\x01\x02\x03\x01\x01\x02\x02\x02\x01\x01\x02\x00\x01\x03\x02\x01\x01\x04\x01\x02\x03\x01\x01\x02\x02\x02"))
	f.Fuzz(func(t *testing.T, data []byte) {
		svc, eps, opts := fuzzInput(testutil.NewChoices(data))
		svc0 := svc.DeepCopy()
		var eps0 []*discoveryv1.EndpointSlice
		for _, es := range eps {
			eps0 = append(eps0, es.DeepCopy())
		}

		tr, err := ServiceToModel(svc, eps, opts)
		checkReads(t, svc, eps)

		if !reflect.DeepEqual(svc, svc0) || !reflect.DeepEqual(eps, eps0) {
			t.Fatal("ServiceToModel changed its input objects")
		}
		tr2, err2 := ServiceToModel(svc, eps, opts)
		if !reflect.DeepEqual(tr, tr2) || (err == nil) != (err2 == nil) {
			t.Fatalf("translating twice gave different results:\n%+v, %v\n%+v, %v", tr, err, tr2, err2)
		}
		if err != nil {
			if len(tr.Services) > 0 || tr.Skipped != "" {
				t.Fatalf("an error (%v) with a result: %+v", err, tr)
			}
			// An error is a validation error of the Service or of
			// one of its slices of the families it has ClusterIPs
			// of, nothing else.
			if ValidateService(svc) == nil && !slices.ContainsFunc(eps, func(es *discoveryv1.EndpointSlice) bool {
				nn, ok := ServiceNameOfSlice(es)
				return ok && nn.Namespace == svc.Namespace && nn.Name == svc.Name &&
					slices.ContainsFunc(clusterIPs(svc), func(a netip.Addr) bool { return addressTypeOf(a) == es.AddressType }) &&
					ValidateEndpointSlice(es) != nil
			}) {
				t.Fatalf("error %v, but the Service and its slices validate", err)
			}
			return
		}
		if tr.Skipped != "" {
			if len(tr.Services) > 0 {
				t.Fatalf("skipped (%s) with %d services", tr.Skipped, len(tr.Services))
			}
			return
		}
		if err := ValidateService(svc); err != nil {
			t.Fatalf("translated a Service that does not validate: %v", err)
		}
		for i, s := range tr.Services {
			checkService(t, svc, eps, opts.Node, s)
			if i > 0 && s.Frontend.Less(tr.Services[i-1].Frontend) {
				t.Fatalf("services not sorted by frontend: %s after %s", s.Frontend, tr.Services[i-1].Frontend)
			}
		}

		// NodeFacts: change every part of the node the translation
		// did not read; translating again must give the same result.
		other := opts
		other.Node.Labels = map[string]string{"topology.kubernetes.io/zone": "elsewhere"}
		if tr.NodeFacts&NodeName == 0 {
			other.Node.Name = "some-other-node"
		}
		if tr.NodeFacts&NodeAddresses == 0 {
			other.Node.Addresses = []netip.Addr{netip.MustParseAddr("198.51.100.7"), netip.MustParseAddr("2001:db8::7")}
			other.Node.IPs = other.Node.Addresses
		}
		tr3, err := ServiceToModel(svc, eps, other)
		if err != nil || !reflect.DeepEqual(tr, tr3) {
			t.Fatalf("NodeFacts %03b, yet a node differing only elsewhere changes the result:\n%+v\n%+v, %v", tr.NodeFacts, tr, tr3, err)
		}
	})
}

// checkService fails t unless s is a frontend the reconciler can program
// as it is, and one that svc, its slices eps and node account for.
func checkService(t *testing.T, svc *corev1.Service, eps []*discoveryv1.EndpointSlice, node Node, s *model.Service) {
	t.Helper()
	fe := s.Frontend
	if s.Name.Namespace != svc.Namespace || s.Name.Name != svc.Name ||
		!slices.ContainsFunc(svc.Spec.Ports, func(sp corev1.ServicePort) bool { return sp.Name == s.Name.Port }) {
		t.Fatalf("%s: name %s is not a port of Service %s/%s", fe, s.Name, svc.Namespace, svc.Name)
	}
	if !fe.Addr.IsValid() || fe.Addr.Is4In6() || fe.Addr.Zone() != "" || fe.Port == 0 || (fe.Proto != model.TCP && fe.Proto != model.UDP) {
		t.Fatalf("invalid frontend %s", fe)
	}
	// Of a family the Service has a ClusterIP of.
	if !slices.ContainsFunc(clusterIPs(svc), func(a netip.Addr) bool { return a.Is6() == fe.Addr.Is6() }) {
		t.Fatalf("%s: a frontend of a family Service ClusterIPs %q do not have", fe, svc.Spec.ClusterIPs)
	}
	// The frontend is an address the Service or the node has.
	var from []string
	switch s.Kind {
	case model.ClusterIP:
		from = append([]string{svc.Spec.ClusterIP}, svc.Spec.ClusterIPs...)
	case model.NodePort:
		for _, a := range node.Addresses {
			from = append(from, a.Unmap().String())
		}
	case model.ExternalIP:
		from = svc.Spec.ExternalIPs
	case model.LoadBalancer:
		for _, ing := range svc.Status.LoadBalancer.Ingress {
			from = append(from, ing.IP)
		}
	default:
		t.Fatalf("%s: unknown kind %d", fe, s.Kind)
	}
	if !slices.ContainsFunc(from, func(a string) bool {
		ip, err := netip.ParseAddr(a)
		return err == nil && ip.Unmap() == fe.Addr
	}) {
		t.Fatalf("%s (kind %d): address not among %q", fe, s.Kind, from)
	}

	// Backends: sorted, no duplicates, of the frontend's protocol, on
	// valid addresses and ports, each listed by a slice of the Service;
	// terminating ones only in place of ready ones, never beside them.
	nodes := nodesOf(s, eps)
	for i, b := range s.Backends {
		if !b.Addr.IsValid() || b.Addr.Is4In6() || b.Addr.Is6() != fe.Addr.Is6() || b.Port == 0 || b.Proto != fe.Proto {
			t.Fatalf("%s: invalid backend %s", fe, b.L4Addr)
		}
		if i > 0 && !s.Backends[i-1].L4Addr.Less(b.L4Addr) {
			t.Fatalf("%s: backends not sorted and unique: %s then %s", fe, s.Backends[i-1].L4Addr, b.L4Addr)
		}
		if b.Terminating != s.Backends[0].Terminating {
			t.Fatalf("%s: ready and terminating backends mixed", fe)
		}
		if !listed(svc, eps, b) {
			t.Fatalf("%s: backend %s is listed by no slice of the Service", fe, b.L4Addr)
		}
		if n := nodes[b.L4Addr]; s.ExternalLocal && (n == "" || n != node.Name) {
			t.Fatalf("%s: externalTrafficPolicy Local, but backend %s is on node %q, not %q", fe, b.L4Addr, n, node.Name)
		}
	}

	// North-south settings belong to north-south frontends only, but
	// for the health check port, which a ClusterIP frontend carries too
	// (kube-proxy serves it whether or not the Service has north-south
	// frontends): only the health server reads it.
	if s.Kind == model.ClusterIP && (s.ExternalLocal || s.TwoScopes || len(s.SourceRanges) > 0) {
		t.Fatalf("%s: a ClusterIP frontend with north-south settings: %+v", fe, s)
	}
	if s.HealthCheckNodePort != 0 && s.Kind != model.ClusterIP && !s.ExternalLocal {
		t.Fatalf("%s: health check port %d without externalTrafficPolicy Local", fe, s.HealthCheckNodePort)
	}
	if s.HealthCheckNodePort != 0 && (svc.Spec.Type != corev1.ServiceTypeLoadBalancer ||
		svc.Spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyLocal ||
		int32(s.HealthCheckNodePort) != svc.Spec.HealthCheckNodePort) {
		t.Fatalf("%s: health check port %d, but the Service is type %q, externalTrafficPolicy %q, healthCheckNodePort %d",
			fe, s.HealthCheckNodePort, svc.Spec.Type, svc.Spec.ExternalTrafficPolicy, svc.Spec.HealthCheckNodePort)
	}
	if len(s.SourceRanges) > 0 && s.Kind != model.LoadBalancer {
		t.Fatalf("%s: source ranges on a kind %d frontend", fe, s.Kind)
	}
	for i, p := range s.SourceRanges {
		if p.Addr().Is6() != fe.Addr.Is6() || p.Addr().Is4In6() || p != p.Masked() || p.Bits() == 0 {
			t.Fatalf("%s: source range %s is not a masked, non-zero prefix of the frontend's family", fe, p)
		}
		if i > 0 && s.SourceRanges[i-1] == p {
			t.Fatalf("%s: source range %s twice", fe, p)
		}
	}
}

// listed reports whether an EndpointSlice of svc of b's family lists b's address
// first in an endpoint, with b's port. Addresses are compared as
// kube-proxy reads them (sloppily: "::ffff:10.0.0.4" and "10.0.0.04" are
// 10.0.0.4).
func listed(svc *corev1.Service, eps []*discoveryv1.EndpointSlice, b model.Backend) bool {
	for _, es := range eps {
		if nn, ok := ServiceNameOfSlice(es); !ok || nn.Namespace != svc.Namespace || nn.Name != svc.Name {
			continue
		}
		if es.AddressType != addressTypeOf(b.Addr) {
			continue
		}
		hasPort := slices.ContainsFunc(es.Ports, func(p discoveryv1.EndpointPort) bool {
			return p.Port != nil && *p.Port == int32(b.Port)
		})
		if hasPort && slices.ContainsFunc(es.Endpoints, func(e discoveryv1.Endpoint) bool {
			if len(e.Addresses) == 0 {
				return false
			}
			ip, ok := parseIPSloppy(e.Addresses[0])
			return ok && ip == b.Addr
		}) {
			return true
		}
	}
	return false
}

// The pools fuzzInput picks from: a valid value most of the time (the
// first, the zero choice, always), else one at or past the edge of its
// range; valid values collide (a cluster IP that is also an external IP,
// a node address that is also a frontend), so that the fuzzer reaches
// every branch of the translation and the validation, and translations
// with frontends and backends, quickly.
var (
	fuzzSvcIPs      = pool{[]string{"10.96.0.1", "10.96.0.2", "192.0.2.10", "10.0.0.1", "2001:db8::1"}, []string{"0.0.0.0", "fd00::1", "::ffff:10.96.0.3", corev1.ClusterIPNone, "", "10.0.0.256", "fe80::1%eth0"}}
	fuzzSvcIPs6     = pool{[]string{"2001:db8::1", "2001:db8::2", "2001:db8:0:0:0:0:0:a"}, []string{"10.96.0.2", "::", "::ffff:10.96.0.3"}} // a dual-stack Service's second ClusterIP
	fuzzBackendIPs  = pool{[]string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.96.0.1"}, []string{"fd00::2", "::ffff:10.0.0.4", "", "x"}}
	fuzzBackendIPs6 = pool{[]string{"2001:db8:1::1", "2001:db8:1::2", "2001:db8::1"}, []string{"10.0.0.1", "::ffff:10.0.0.4", "", "fe80::1%eth0"}}
	fuzzPortNames   = []string{"http", "dns", "metrics"}
	fuzzPorts       = pool32{[]int32{80, 53, 8080}, []int32{1, 65535, 0, 65536, -1}} // valid[i] is Service port i's
	fuzzNodePorts   = pool32{[]int32{0, 30080, 30081}, []int32{65536, -1}}
	fuzzProtocols   = []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP, "", corev1.ProtocolSCTP, "tcp"}
	fuzzNodes       = []string{"node-a", "node-b", ""}
	fuzzRanges      = pool{[]string{"10.0.0.0/8", "192.0.2.1/24", "10.1.2.3/32", "0.0.0.0/0", "2001:db8::/64", "::/0"}, []string{"fd00::/8", "::ffff:10.0.0.0/104", "bogus"}}
	fuzzNodeIPs     = []string{"192.0.2.10", "192.0.2.11", "10.96.0.1", "::ffff:192.0.2.12", "::1", "2001:db8::100"}
)

type pool struct{ valid, bad []string }

type pool32 struct{ valid, bad []int32 }

// fromPool returns one of valid, or one time in sixteen one of bad: most
// inputs stay valid enough to be translated, and each still goes wrong
// somewhere often.
func fromPool[T any](c *testutil.Choices, valid, bad []T) T {
	if c.IntN(16) == 15 {
		return testutil.Pick(c, bad...)
	}
	return testutil.Pick(c, valid...)
}

// fuzzInput builds a Service, the EndpointSlices of a cluster and the
// translation's options from c.
func fuzzInput(c *testutil.Choices) (*corev1.Service, []*discoveryv1.EndpointSlice, Options) {
	pick := func(p pool) string { return fromPool(c, p.valid, p.bad) }
	port := func(p pool32) int32 { return fromPool(c, p.valid, p.bad) }
	picks := func(p pool, max int) []string {
		var out []string
		for range c.IntN(max + 1) {
			out = append(out, pick(p))
		}
		return out
	}
	protocol := func() corev1.Protocol { return fromPool(c, fuzzProtocols[:3], fuzzProtocols[3:]) }
	boolPtr := func() *bool { return testutil.Pick(c, nil, ptr(true), ptr(false)) }

	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{
		Namespace: fromPool(c, []string{"default", "other"}, []string{""}),
		Name:      fromPool(c, []string{"web", "db"}, []string{""}),
	}}
	switch c.IntN(16) {
	case 14:
		svc.Labels = map[string]string{LabelServiceProxyName: testutil.Pick(c, DefaultProxyName, "other")}
	case 15:
		svc.Labels = map[string]string{corev1.IsHeadlessService: ""}
	}
	svc.Spec.Type = fromPool(c, []corev1.ServiceType{corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer, ""},
		[]corev1.ServiceType{corev1.ServiceTypeExternalName, "Bogus"})
	svc.Spec.ClusterIPs = []string{pick(fuzzSvcIPs)}
	if c.IntN(4) == 3 {
		svc.Spec.ClusterIPs = append(svc.Spec.ClusterIPs, pick(fuzzSvcIPs6))
	}
	switch c.IntN(16) {
	case 14:
		svc.Spec.ClusterIPs = nil
		svc.Spec.ClusterIP = pick(fuzzSvcIPs)
	case 15:
		svc.Spec.ClusterIP = pick(fuzzSvcIPs)
	default:
		svc.Spec.ClusterIP = svc.Spec.ClusterIPs[0]
	}
	// Ports: named in turn (a name missing or repeated now and then),
	// with the slices' ports named from the same list.
	portName := func(i int) string { return fromPool(c, fuzzPortNames[i%3:i%3+1], []string{"", "http"}) }
	for i := range 1 + c.IntN(3) {
		sp := corev1.ServicePort{
			Name:     portName(i),
			Protocol: protocol(),
			Port:     fromPool(c, fuzzPorts.valid[i:i+1], fuzzPorts.bad),
			NodePort: port(fuzzNodePorts),
		}
		switch c.IntN(3) {
		case 1:
			sp.TargetPort = intstr.FromInt32(port(fuzzPorts))
		case 2:
			sp.TargetPort = intstr.FromString(testutil.Pick(c, fuzzPortNames...))
		}
		svc.Spec.Ports = append(svc.Spec.Ports, sp)
	}
	svc.Spec.ExternalIPs = picks(fuzzSvcIPs, 2)
	svc.Spec.ExternalTrafficPolicy = testutil.Pick(c, "", corev1.ServiceExternalTrafficPolicyCluster, corev1.ServiceExternalTrafficPolicyLocal)
	svc.Spec.HealthCheckNodePort = port(fuzzNodePorts)
	svc.Spec.LoadBalancerSourceRanges = picks(fuzzRanges, 2)
	for _, ip := range picks(fuzzSvcIPs, 2) {
		svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip})
	}

	var eps []*discoveryv1.EndpointSlice
	for range c.IntN(4) {
		es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{
			Namespace: fromPool(c, []string{svc.Namespace}, []string{"other", ""}),
			Name:      fromPool(c, []string{"web-1", "web-2"}, []string{""}),
		}}
		switch c.IntN(8) {
		case 5:
			es.Labels = map[string]string{discoveryv1.LabelServiceName: testutil.Pick(c, "web", "db", "")}
		case 6: // no label: the slice of no Service
		default:
			es.Labels = map[string]string{discoveryv1.LabelServiceName: svc.Name}
		}
		es.AddressType = fromPool(c, []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6},
			[]discoveryv1.AddressType{discoveryv1.AddressTypeFQDN, "Bogus"})
		addrs := fuzzBackendIPs
		if es.AddressType == discoveryv1.AddressTypeIPv6 {
			addrs = fuzzBackendIPs6
		}
		for i := range c.IntN(4) {
			var p discoveryv1.EndpointPort
			if c.IntN(8) != 7 {
				p.Name = ptr(portName(i))
			}
			if c.IntN(4) != 3 {
				p.Protocol = ptr(protocol())
			}
			if c.IntN(8) != 7 {
				p.Port = ptr(port(fuzzPorts))
			}
			es.Ports = append(es.Ports, p)
		}
		for range c.IntN(5) {
			e := discoveryv1.Endpoint{
				Addresses:  []string{pick(addrs)},
				Conditions: discoveryv1.EndpointConditions{Ready: boolPtr(), Serving: boolPtr(), Terminating: boolPtr()},
			}
			switch c.IntN(16) {
			case 14:
				e.Addresses = nil
			case 15:
				e.Addresses = append(e.Addresses, pick(addrs))
			}
			if c.IntN(4) != 3 {
				e.NodeName = ptr(testutil.Pick(c, fuzzNodes...))
			}
			es.Endpoints = append(es.Endpoints, e)
		}
		eps = append(eps, es)
	}

	opts := Options{ProxyName: fromPool(c, []string{"", DefaultProxyName}, []string{"other"}), Node: Node{Name: testutil.Pick(c, fuzzNodes...)}}
	for range c.IntN(3) {
		opts.Node.Addresses = append(opts.Node.Addresses, netip.MustParseAddr(testutil.Pick(c, fuzzNodeIPs...)))
	}
	if c.Bool() {
		opts.Node.IPs = PrimaryIPs(opts.Node.Addresses)
	}
	if c.Bool() {
		opts.Node.Labels = map[string]string{"topology.kubernetes.io/zone": "here"}
	}
	return svc, eps, opts
}

// checkReads fails t unless reading svc and eps into arrays that held
// other objects' (the tracker's reuse: ReadService, ReadSlice) gives what
// MakeService and MakeSlice make.
func checkReads(t *testing.T, svc *corev1.Service, eps []*discoveryv1.EndpointSlice) {
	t.Helper()
	want := MakeService(svc)
	got := dirtyService()
	ReadService(&got, svc)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ReadService into used arrays:\n%+v\nMakeService:\n%+v", got, want)
	}
	for _, es := range eps {
		want := MakeSlice(es)
		got := dirtySlice()
		ReadSlice(&got, es)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("ReadSlice into used arrays:\n%+v\nMakeSlice:\n%+v", got, want)
		}
	}
}

// dirtyService is a Service read from another one, with room in its
// arrays for more than the fuzzer's Services have.
func dirtyService() Service {
	svc := service("old", []string{"10.0.0.9", "fd00::9"}, sport("a", 1, corev1.ProtocolUDP), sport("b", 2, ""),
		sport("c", 3, ""), sport("d", 4, ""), sport("e", 5, ""))
	svc.Spec.Type = corev1.ServiceTypeLoadBalancer
	svc.Spec.ExternalIPs = []string{"192.0.2.9"}
	svc.Spec.ClusterIP = "10.0.0.9"
	svc.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	s := MakeService(svc)
	if s.Invalid != nil || len(s.Ports) != 5 || len(s.ClusterIPs) != 2 {
		panic(fmt.Sprintf("dirtyService: %v", s.Invalid))
	}
	return s
}

// dirtySlice is dirtyService's for a slice: 12 endpoints, every field
// set, 4 ports.
func dirtySlice() Slice {
	var eps []ep
	for i := range 12 {
		eps = append(eps, ep{addr: fmt.Sprintf("10.9.9.%d", i+1), node: "n", ready: ptr(true)})
	}
	es := slice("old", "old", []discoveryv1.EndpointPort{eport("a", 1, ""), eport("b", 2, ""), eport("c", 3, ""), eport("d", 4, "")}, eps...)
	for i := range es.Endpoints {
		es.Endpoints[i].Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "z"}}}
		es.Endpoints[i].Conditions.Terminating = ptr(true)
	}
	return MakeSlice(es)
}

// The reads the tracker makes of objects into reused arrays make what
// MakeService and MakeSlice make, for the fuzzer's inputs from random
// bytes (FuzzServiceToModel checks each input it tries alike).
func TestReadsAsMake(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for range 3000 {
		data := make([]byte, 20+rng.IntN(200))
		for i := range data {
			data[i] = byte(rng.IntN(256))
		}
		svc, eps, _ := fuzzInput(testutil.NewChoices(data))
		checkReads(t, svc, eps)
	}
}
