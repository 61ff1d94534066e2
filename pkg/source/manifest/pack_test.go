package manifest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// loadedAs is what the loader makes of js, one object, as decodeItems
// does, with a decoder that packs endpoints (packEndpoints) or not: the
// object's compact form, its warning and its error. packed says the
// decoder packed its endpoints.
func loadedAs(t *testing.T, js []byte, pack bool) (o *object, w, err string, packed bool) {
	t.Helper()
	l := newLoader(translate.Options{})
	var fr fileResult
	d := fastDecoder{reuse: true, pack: pack}
	tm, pre, derr := d.decodeItem(js)
	if derr != nil {
		return nil, "", "decode: " + derr.Error(), false
	}
	o, w, e := l.decodeObject(&fr, unitSum{}, "f.json", 1, 0, tm, js, pre)
	if e != nil {
		err = e.Error()
	}
	return o, w, err, pre.packed
}

// checkPacked loads js with and without packing endpoints: the outcome
// must be the same (the compact form, every field, warnings and errors).
// It reports whether the endpoints were packed.
func checkPacked(t *testing.T, js []byte) bool {
	t.Helper()
	po, pw, perr, packed := loadedAs(t, js, true)
	o, w, err, was := loadedAs(t, js, false)
	if was {
		t.Fatalf("packed without pack")
	}
	if pw != w || perr != err {
		t.Fatalf("packed: %q, %q; not: %q, %q\ninput:\n%s", pw, perr, w, err, js)
	}
	if (po == nil) != (o == nil) {
		t.Fatalf("packed: object %v, not: %v\ninput:\n%s", po, o, js)
	}
	if o == nil {
		return packed
	}
	if o.key != po.key || o.hasOwner != po.hasOwner || (o.svc == nil) != (po.svc == nil) {
		t.Fatalf("packed: %+v, not: %+v\ninput:\n%s", po, o, js)
	}
	if !reflect.DeepEqual(po.svc, o.svc) {
		t.Fatalf("packed: %+v, not: %+v\ninput:\n%s", po.svc, o.svc, js)
	}
	if got, want := sliceString(po.slice), sliceString(o.slice); got != want {
		t.Fatalf("packed:\n%s\nnot:\n%s\ninput:\n%s", got, want, js)
	}
	// Not only what At reads: the same form (packed, or wide), every
	// field but the error (compared above, as a message).
	if po.slice != nil {
		a, b := *po.slice, *o.slice
		a.Invalid, b.Invalid = nil, nil
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("packed:\n%+v\nnot:\n%+v\ninput:\n%s", a, b, js)
		}
	}
	return packed
}

// sliceString renders everything a translation reads of s (nil: "").
func sliceString(s *translate.Slice) string {
	if s == nil {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%q %q %q %q %q %+v invalid=%v\n", s.Namespace, s.Name, s.ResourceVersion, s.Service, s.AddressType, s.Ports, s.Invalid)
	for i := range s.Endpoints.Len() {
		e := s.Endpoints.At(i)
		node := "<nil>"
		if e.NodeName != nil {
			node = fmt.Sprintf("%q", *e.NodeName)
		}
		hints := "<nil>"
		if e.Hints != nil {
			hints = fmt.Sprintf("%+v", *e.Hints)
		}
		fmt.Fprintf(&b, "  %v node=%s hints=%s %v %v %v\n", e.Addr, node, hints, e.Ready, e.Serving, e.Terminating)
	}
	return b.String()
}

// packedSlice is an EndpointSlice as encoding/json writes it (addressType
// first), with the given address type and endpoints.
func packedSlice(addressType, endpoints string) []byte {
	return []byte(`{"addressType":` + addressType + `,"apiVersion":"discovery.k8s.io/v1",` + endpoints +
		`"kind":"EndpointSlice","metadata":{"labels":{"kubernetes.io/service-name":"svc"},"name":"svc-x","namespace":"ns"},` +
		`"ports":[{"name":"http","port":8080,"protocol":"TCP"}]}`)
}

// The endpoints a decoder packs (packEndpoints) make the same Slice as
// the API's endpoints do, and a slice it does not pack (or an object it
// declines) loads as before, errors and all: for the slices the tests of
// the fast decoder generate, rewritten in every way they are, and for
// endpoints written to fall on each side of what is packed.
func TestPackedEndpointsMatch(t *testing.T) {
	ep := func(members string) string { return `"endpoints":[` + members + `],` }
	cond := `"conditions":{"ready":true,"serving":true,"terminating":false}`
	cases := []struct {
		js     []byte
		packed bool
	}{
		{packedSlice(`"IPv4"`, ep(`{"addresses":["10.0.0.1"],`+cond+`}`)), true},
		{packedSlice(`"IPv4"`, ep(`{"addresses":["10.0.0.1","10.0.0.2"],"conditions":{"ready":false},"nodeName":"n1"},{"addresses":["10.0.0.3"]}`)), true},
		{packedSlice(`"IPv4"`, ep(``)), true},
		{packedSlice(`"IPv4"`, `"endpoints":null,`), false},
		{packedSlice(`"IPv4"`, ep(`{"addresses":["010.000.000.001"]}`)), true},  // leading zeros: decimal, as kube-proxy
		{packedSlice(`"IPv4"`, ep(`{"addresses":["::ffff:10.0.0.1"]}`)), true},  // IPv4-mapped: IPv4
		{packedSlice(`"IPv6"`, ep(`{"addresses":["::ffff:10.0.0.1"]}`)), false}, // not valid in an IPv6 slice
		{packedSlice(`"IPv6"`, ep(`{"addresses":["fd00::1"],"nodeName":"n"}`)), true},
		{packedSlice(`"IPv4"`, ep(`{"addresses":["fd00::1"]}`)), false},                           // invalid: the error names it
		{packedSlice(`"IPv4"`, ep(`{"addresses":["10.0.0.1","x"]}`)), false},                      // a later address invalid
		{packedSlice(`"IPv4"`, ep(`{"addresses":[]}`)), false},                                    // no addresses
		{packedSlice(`"IPv4"`, ep(`{"addresses":null}`)), false},                                  // no addresses
		{packedSlice(`"IPv4"`, ep(`{"nodeName":"n"}`)), false},                                    // no addresses
		{packedSlice(`"IPv4"`, ep(`{"addresses":["10.0.0.\u0031"]}`)), false},                     // escaped: read as before
		{packedSlice(`"IPv4"`, ep(`{"addresses":["10.0.0.1"],"addresses":["10.0.0.2"]}`)), false}, // twice: declined
		{packedSlice(`"IPv4"`, ep(`{"addresses":[10]}`)), false},                                  // declined
		{packedSlice(`"IPv4"`, ep(`{"addresses":["10.0.0.1"],"Addresses":["10.0.0.2"]}`)), false},
		{packedSlice(`"IPv4"`, ep(`{"addresses":["10.0.0.1"],"conditions":{"ready":"yes"}}`)), false},
		{packedSlice(`"IPv4"`, ep(`{"addresses":["10.0.0.1"],"hostname":"h","zone":"z","targetRef":{"kind":"Pod","name":"p","uid":"u"},`+
			`"deprecatedTopology":{"a":"b"},"unknown":[1,{"x":null}],"hints":{"forZones":[{"name":"z"}]}}`)), true},
		{packedSlice(`"IPv4"`, ep(`{"addresses":["10.0.0.1"],"deprecatedTopology":{"a":1}}`)), false}, // encoding/json refuses
		{packedSlice(`"IPv4"`, ep(`{"addresses":["10.0.0.1"]},null`)), false},
		{packedSlice(`"FQDN"`, ep(`{"addresses":["a.example"]}`)), false},
		{packedSlice(`"IPv5"`, ep(`{"addresses":["10.0.0.1"]}`)), false},
		{packedSlice(`"IPv4"`, ep(`{"addresses":["10.0.0.1"]}`)+`"ports":[{"port":0}],`), false}, // ports (declined: twice)
		// Invalid otherwise, endpoints valid: packed, the error the same.
		{[]byte(`{"addressType":"IPv4","apiVersion":"discovery.k8s.io/v1",` + ep(`{"addresses":["10.0.0.1"]}`) +
			`"kind":"EndpointSlice","metadata":{"name":"x"},"ports":[{"port":70000}]}`), true},
		{[]byte(`{"addressType":"IPv4","apiVersion":"discovery.k8s.io/v1",` + ep(`{"addresses":["10.0.0.1"]}`) +
			`"kind":"EndpointSlice","metadata":{"name":"x","labels":{"kubernetes.io/service-name":""}}}`), true},
		// addressType after the endpoints: not packed.
		{[]byte(`{"apiVersion":"discovery.k8s.io/v1",` + ep(`{"addresses":["10.0.0.1"]}`) +
			`"addressType":"IPv4","kind":"EndpointSlice","metadata":{"name":"x"}}`), false},
		// A Service whose guess was a slice (an addressType key).
		{[]byte(`{"addressType":"IPv4","apiVersion":"v1",` + ep(`{"addresses":["10.0.0.1"]}`) +
			`"kind":"Service","metadata":{"name":"x"},"spec":{"clusterIP":"10.96.0.1","ports":[{"port":80}]}}`), false},
	}
	for i, c := range cases {
		if got := checkPacked(t, c.js); got != c.packed {
			t.Errorf("case %d: packed %v, want %v:\n%s", i, got, c.packed, c.js)
		}
	}

	r := rand.New(rand.NewPCG(5, 6))
	packed, all := 0, 0
	for i := range 3000 {
		js := randObjectJSON(r, 2*i+1) // slices
		if i%2 == 0 {
			js = randPackableSlice(r, i)
		}
		for _, in := range [][]byte{js, rewrite(r, js, false), rewrite(r, js, true)} {
			all++
			if checkPacked(t, in) {
				packed++
			}
		}
	}
	t.Logf("%d of %d slices packed", packed, all)
	if packed < all/10 {
		t.Errorf("%d of %d slices packed: want more", packed, all)
	}
}

// randPackableSlice is randSlice with, most of the time, an address type
// of IPv4 or IPv6 and endpoints with addresses of that type (written
// in kube-proxy's sloppy forms too), a few of them wrong.
func randPackableSlice(r *rand.Rand, i int) []byte {
	es := randSlice(r, i)
	if r.IntN(4) > 0 {
		v6 := r.IntN(3) == 0
		es.AddressType = discoveryv1.AddressTypeIPv4
		if v6 {
			es.AddressType = discoveryv1.AddressTypeIPv6
		}
		for j := range es.Endpoints {
			e := &es.Endpoints[j]
			e.Addresses = nil
			for k := range 1 + r.IntN(2) {
				a := pick(r, fmt.Sprintf("10.%d.0.%d", j, k+1), fmt.Sprintf("010.%d.000.%03d", j, k+1), fmt.Sprintf("::ffff:10.0.%d.%d", j, k))
				if v6 {
					a = pick(r, fmt.Sprintf("fd00::%x:%x", j, k), fmt.Sprintf("FD00:0::%x", j+16*k))
				}
				if r.IntN(40) == 0 {
					a = pick(r, "", "x", "10.0.0.256", "fd00::1%eth0", "fe80::1", "1.2.3.4")
				}
				e.Addresses = append(e.Addresses, a)
			}
			if r.IntN(60) == 0 {
				e.Addresses = pick(r, []string{}, nil)
			}
		}
	}
	js, err := json.Marshal(es)
	if err != nil {
		panic(err)
	}
	return js
}

// FuzzPackedEndpoints: on any bytes, a decoder that packs endpoints loads
// what one that does not loads.
func FuzzPackedEndpoints(f *testing.F) {
	r := rand.New(rand.NewPCG(7, 8))
	for i := range 20 {
		f.Add(randObjectJSON(r, 2*i+1))
	}
	f.Add(packedSlice(`"IPv4"`, `"endpoints":[{"addresses":["10.0.0.1"],"conditions":{"ready":true,"serving":true,"terminating":false},"nodeName":"n"}],`))
	f.Add(packedSlice(`"IPv4"`, `"endpoints":[{"addresses":["10.0.0.1"],"conditions":{"ready":true,"serving":true,"terminating":false}},`+
		`{"addresses":["10.0.0.2"],"conditions":{"ready":false,"serving":true,"terminating":true}}],`)) // compactEndpoint's form
	f.Add(packedSlice(`"IPv6"`, `"endpoints":[{"addresses":["fd00::1"],"hints":{"forNodes":[{"name":"n"}]}}],`))
	f.Fuzz(func(t *testing.T, js []byte) { checkPacked(t, js) })
}

// TestPackedSlicesKeptApart: the loader's decoder packs the endpoints of
// every slice into the same array (fastDecoder.packed), as it decodes
// every object into the same room: what it keeps of each slice holds
// nothing of it. A List of packable slices, each kept slice compared,
// once all are decoded, with what a translation reads of its bytes as
// encoding/json decodes them.
func TestPackedSlicesKeptApart(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	const n = 2000
	var items [][]byte
	byName := map[string][]byte{}
	for i := range n {
		js := randPackableSlice(r, i)
		items = append(items, js)
		var tm typeMeta
		mustUnmarshal(t, string(js), &tm)
		byName[tm.Metadata.Name] = js
	}
	list := append(append([]byte(`{"apiVersion":"v1","kind":"List","items":[`), bytes.Join(items, []byte(","))...), "]}"...)
	l := newLoader(translate.Options{})
	fr := l.parseFile("f.json", list)
	kept, packed := 0, 0
	for _, o := range fr.objs {
		var es discoveryv1.EndpointSlice
		mustUnmarshal(t, string(byName[o.key.Name]), &es)
		es.Namespace, es.ResourceVersion = o.key.Namespace, ""
		if want := translate.SliceOf(&es); !reflect.DeepEqual(o.slice, want) {
			t.Fatalf("%s kept as\n%s\nwant\n%s", o.key, sliceString(o.slice), sliceString(want))
		}
		kept++
		if _, _, _, p := loadedAs(t, byName[o.key.Name], true); p {
			packed++
		}
	}
	t.Logf("%d slices kept of %d, %d of them packed", kept, n, packed)
	if packed < n/4 {
		t.Errorf("%d slices packed: want more", packed)
	}
}
