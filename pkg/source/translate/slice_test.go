package translate

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// oldSliceEndpoints is how a Slice read its endpoints before they were
// kept packed (SliceEndpoints): an array of SliceEndpoint, each address
// given by the validation or parsed after it. The reference the packed
// form is held against.
func oldSliceEndpoints(es *discoveryv1.EndpointSlice) []SliceEndpoint {
	var out []SliceEndpoint
	if n := len(es.Endpoints); n > 0 {
		out = make([]SliceEndpoint, n)
	}
	given := 0
	_ = validateEndpointSlice(es, func(i int, ip netip.Addr) {
		out[i].Addr = ip
		given = i + 1
	})
	for i := range es.Endpoints {
		e := &es.Endpoints[i]
		o := &out[i]
		if i >= given && len(e.Addresses) > 0 {
			o.Addr, _ = parseIPSloppy(e.Addresses[0])
		}
		o.NodeName, o.Hints = e.NodeName, e.Hints
		c := &e.Conditions
		o.Ready, o.Serving, o.Terminating = ptrOr(c.Ready, true), ptrOr(c.Serving, true), ptrOr(c.Terminating, false)
	}
	return out
}

// randomEndpointSlice is a slice of up to 40 endpoints: of every
// addressType, with addresses of both families, IPv4-mapped, zoned, with
// leading zeros, none or unparsable, each condition unknown, true or
// false, node names or none, hints of zones and nodes or none.
func randomEndpointSlice(r *rand.Rand) *discoveryv1.EndpointSlice {
	pick := func(s ...string) string { return s[r.IntN(len(s))] }
	boolPtr := func() *bool { return []*bool{nil, new(true), new(false)}[r.IntN(3)] }
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6, discoveryv1.AddressTypeFQDN}[r.IntN(3)],
		Ports:       []discoveryv1.EndpointPort{{Name: new("http"), Port: new(int32(8080))}},
	}
	// Most slices hold one family only, as the API's do, and no hints;
	// some mix, some have hints.
	mix, hints := r.IntN(4) == 0, r.IntN(4) == 0
	v6 := es.AddressType == discoveryv1.AddressTypeIPv6
	for i := range r.IntN(41) {
		addr := fmt.Sprintf("10.%d.%d.%d", r.IntN(3), i, r.IntN(256))
		if v6 {
			addr = fmt.Sprintf("2001:db8:%x::%x", r.IntN(3), r.IntN(1<<16))
		}
		if mix && r.IntN(3) == 0 {
			addr = pick(addr, "10.0.0.1", "2001:db8::1", "::ffff:10.0.0.4", "10.180.00.001", "fe80::1%eth0", "0.0.0.0", "::",
				"255.255.255.255", "", "x", "web.example.")
		}
		e := discoveryv1.Endpoint{
			Addresses:  []string{addr},
			Conditions: discoveryv1.EndpointConditions{Ready: boolPtr(), Serving: boolPtr(), Terminating: boolPtr()},
		}
		switch r.IntN(12) {
		case 0:
			e.Addresses = nil
		case 1:
			e.Addresses = append(e.Addresses, "10.9.9.9")
		}
		if r.IntN(4) != 0 {
			e.NodeName = new(fmt.Sprintf("node-%d", r.IntN(5)))
		}
		if hints && r.IntN(3) == 0 {
			e.Hints = &discoveryv1.EndpointHints{}
			if r.IntN(2) == 0 {
				e.Hints.ForZones = []discoveryv1.ForZone{{Name: pick("zone-a", "zone-b")}}
			}
			if r.IntN(2) == 0 {
				e.Hints.ForNodes = []discoveryv1.ForNode{{Name: pick("node-0", "node-1")}}
			}
		}
		es.Endpoints = append(es.Endpoints, e)
	}
	return es
}

// A slice's endpoints, kept packed, read as they did when a Slice kept
// them as SliceEndpoints: every field of every endpoint, over random
// slices of both families (and mixed, zoned, IPv4-mapped, unparsable),
// every condition, node names and hints; made from the object, from the
// SliceEndpoints themselves, and read into the arrays of another slice
// (the tracker's reuse), the packed forms are the same.
func TestSliceEndpointsAsBefore(t *testing.T) {
	r := rand.New(rand.NewPCG(14, 31))
	prev := dirtySlice()
	var wide, v4 int
	for n := range 4000 {
		es := randomEndpointSlice(r)
		want := oldSliceEndpoints(es)
		s := MakeSlice(es)
		if got := s.Endpoints.Len(); got != len(want) {
			t.Fatalf("slice %d: %d endpoints, want %d", n, got, len(want))
		}
		for i := range want {
			if got := s.Endpoints.At(i); got != want[i] {
				t.Fatalf("slice %d, endpoint %d (%q): read %+v, want %+v", n, i, es.Endpoints[i].Addresses, got, want[i])
			}
		}
		if again := MakeSliceEndpoints(want); !reflect.DeepEqual(again, s.Endpoints) {
			t.Fatalf("slice %d: MakeSliceEndpoints of its endpoints is %+v, MakeSlice's %+v", n, again, s.Endpoints)
		}
		// Read into the arrays of the slice read before (of another
		// family, with hints or not): the same as made anew.
		ReadSlice(&prev, es)
		if !reflect.DeepEqual(prev, s) {
			t.Fatalf("slice %d: read into used arrays %+v, made %+v", n, prev.Endpoints, s.Endpoints)
		}
		if s.Endpoints.wide != nil {
			wide++
		} else if s.Endpoints.Len() > 0 {
			v4++
		}
	}
	// Both forms were tried often.
	if wide < 1000 || v4 < 1000 {
		t.Errorf("%d slices kept wide, %d packed only: the random slices miss one form", wide, v4)
	}
}

// Share replaces the node names and hints it is given, none other, and
// leaves the rest as it was.
func TestSliceEndpointsShare(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 4))
	shared := map[string]*string{}
	sharedHints := &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "shared"}}}
	for n := range 500 {
		es := randomEndpointSlice(r)
		want := oldSliceEndpoints(es)
		s := MakeSlice(es)
		s.Endpoints.Share(func(p *string) *string {
			if q, ok := shared[*p]; ok {
				return q
			}
			shared[*p] = p
			return p
		}, func(*discoveryv1.EndpointHints) *discoveryv1.EndpointHints { return sharedHints })
		for i, w := range want {
			got := s.Endpoints.At(i)
			if (w.NodeName == nil) != (got.NodeName == nil) || w.NodeName != nil && (*got.NodeName != *w.NodeName || got.NodeName != shared[*w.NodeName]) {
				t.Fatalf("slice %d, endpoint %d: node %v, want the shared %v", n, i, got.NodeName, w.NodeName)
			}
			if (w.Hints == nil) != (got.Hints == nil) || w.Hints != nil && got.Hints != sharedHints {
				t.Fatalf("slice %d, endpoint %d: hints %v, want the shared ones for %v", n, i, got.Hints, w.Hints)
			}
			got.NodeName, got.Hints, w.NodeName, w.Hints = nil, nil, nil, nil
			if got != w {
				t.Fatalf("slice %d, endpoint %d: shared, %+v, want %+v", n, i, got, w)
			}
		}
	}
}
