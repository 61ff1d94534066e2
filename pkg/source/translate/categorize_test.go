package translate

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-lb/sluice/pkg/model"
)

// sortedCandidateSlice is a slice of up to 12 endpoints shaped to be, more
// often than not, what categorizeSorted takes (IPv4 addresses in
// increasing order, one port of the name, no hints), and otherwise just
// off it: an address repeated or out of order, an IPv6 or unparsable
// one, none, hints, the port listed twice or not at all.
func sortedCandidateSlice(r *rand.Rand) *discoveryv1.EndpointSlice {
	boolPtr := func() *bool { return []*bool{nil, new(true), new(false)}[r.IntN(3)] }
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	for range 1 + r.IntN(2) {
		p := discoveryv1.EndpointPort{Name: new([]string{"http", "dns", ""}[r.IntN(3)]), Port: new(int32(8080 + r.IntN(2)))}
		switch r.IntN(8) {
		case 0:
			p.Name = nil
		case 1:
			p.Port = nil
		case 2:
			p.Protocol = new(corev1.ProtocolUDP)
		case 3:
			p.Protocol = new(corev1.ProtocolTCP)
		}
		es.Ports = append(es.Ports, p)
	}
	off := r.IntN(3) == 0 // some endpoint breaks the shape
	a := uint32(10<<24 | r.IntN(1<<16))
	for i := range r.IntN(13) {
		a += uint32(1 + r.IntN(300))
		addr := fmt.Sprintf("%d.%d.%d.%d", a>>24, a>>16&0xff, a>>8&0xff, a&0xff)
		if off && r.IntN(4) == 0 {
			addr = []string{"10.0.0.1", "255.255.255.255", "2001:db8::1", "::ffff:10.0.0.4", "10.180.00.001", "x", ""}[r.IntN(7)]
			if i > 0 && len(es.Endpoints[i-1].Addresses) > 0 && r.IntN(2) == 0 {
				addr = es.Endpoints[i-1].Addresses[0] // listed twice
			}
		}
		e := discoveryv1.Endpoint{
			Addresses:  []string{addr},
			Conditions: discoveryv1.EndpointConditions{Ready: boolPtr(), Serving: boolPtr(), Terminating: boolPtr()},
		}
		if off && r.IntN(6) == 0 {
			e.Addresses = nil
		}
		if r.IntN(4) != 0 {
			e.NodeName = new(fmt.Sprintf("node-%d", r.IntN(3)))
		}
		if off && r.IntN(6) == 0 {
			e.Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "zone-a"}}}
			if r.IntN(2) == 0 {
				e.Hints.ForNodes = []discoveryv1.ForNode{{Name: "node-0"}}
			}
		}
		es.Endpoints = append(es.Endpoints, e)
	}
	return es
}

// sortedCandidateSlices is a Service's slices for the random tests of
// the one-slice fast paths: one (most often), none or two of
// sortedCandidateSlice's.
func sortedCandidateSlices(r *rand.Rand) []*Slice {
	var objs []*discoveryv1.EndpointSlice
	for range []int{1, 1, 1, 1, 0, 2}[r.IntN(6)] {
		objs = append(objs, sortedCandidateSlice(r))
	}
	return SlicesOf(objs)
}

// categorizeSorted, where it takes a port's endpoints, makes exactly what
// the long way (endpointsFor, then categorize) makes: the same backends
// for each policy (nil and empty told apart, as reflect.DeepEqual in the
// tracker tells them), the same hasAny, and no hints read; over random
// slices of its shape and just off it, every combination of the traffic
// policies and nodes named or not.
func TestCategorizeSortedAsCategorize(t *testing.T) {
	r := rand.New(rand.NewPCG(54, 14))
	var took, left, served, local int
	for n := range 20000 {
		eps := sortedCandidateSlices(r)
		for _, es := range eps {
			if es.Invalid != nil {
				// A translation fails before it categorizes.
				es.Invalid = nil
			}
		}
		pol := portPolicy{internalLocal: r.IntN(2) == 0, externalLocal: r.IntN(2) == 0, accessible: r.IntN(2) == 0}
		node := []string{"", "node-0", "node-1"}[r.IntN(3)]
		// Mostly the port of the first slice's first port.
		name := []string{"http", "dns", ""}[r.IntN(3)]
		kproto := []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP}[r.IntN(2)]
		if len(eps) > 0 && r.IntN(4) != 0 {
			name, kproto = eps[0].Ports[0].Name, eps[0].Ports[0].Protocol
		}
		proto := model.TCP
		if kproto == corev1.ProtocolUDP {
			proto = model.UDP
		}
		got, ok := categorizeSorted(eps, name, kproto, proto, pol, node)
		long := endpointsFor(nil, name, kproto, proto, eps, node)
		want := categorize(long, pol, node, "zone-a")
		if !ok {
			left++
			continue
		}
		took++
		if len(got.cluster) > 0 {
			served++
		}
		if len(got.local) > 0 {
			local++
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("case %d (%+v, node %q, port %q/%s): categorizeSorted made\n%+v\ncategorize\n%+v\nof %+v", n, pol, node, name, kproto, got, want, eps)
		}
		if byName, byZone := hintsRead(long); byName || byZone {
			t.Fatalf("case %d: categorizeSorted took endpoints with hints", n)
		}
	}
	// Both ways were taken often, with backends for each policy.
	if took < 5000 || left < 5000 || served < 2000 || local < 500 {
		t.Errorf("categorizeSorted took %d ports (%d with Cluster backends, %d with Local ones), left %d: the random slices miss a shape",
			took, served, local, left)
	}
}

// localReadySorted, where it takes a Service's slices, counts what
// localReadyAll (endpointsFor on each served port) counts: the same
// addresses, nil and empty told apart; over the random slices above,
// nodes named or not.
func TestLocalReadySortedAsAll(t *testing.T) {
	r := rand.New(rand.NewPCG(54, 8))
	var took, left, counted int
	for n := range 20000 {
		eps := sortedCandidateSlices(r)
		for _, es := range eps {
			es.Invalid = nil // as in TestCategorizeSortedAsCategorize
		}
		node := []string{"", "node-0", "node-1"}[r.IntN(3)]
		want := localReadyAll(eps, node)
		if node == "" {
			if got := localReady(eps, node); got != nil {
				t.Fatalf("case %d: no node, yet counted %v", n, got)
			}
			continue
		}
		got, ok := localReadySorted(eps, node)
		if !ok {
			left++
			continue
		}
		took++
		if len(got) > 0 {
			counted++
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("case %d (node %q): localReadySorted counted %v, localReadyAll %v, of %+v", n, node, got, want, eps)
		}
	}
	if took < 5000 || left < 2000 || counted < 1000 {
		t.Errorf("localReadySorted took %d Services (%d counting some), left %d: the random slices miss a shape", took, counted, left)
	}
}
