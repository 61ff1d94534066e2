package manifest

import (
	"math/rand/v2"
	"net/netip"
	"reflect"
	"strconv"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// endpointRead is what packEndpoints keeps of one endpoint read at the
// start of js, and where the read ended; declined if the decoder declined
// (or found it unpackable).
type endpointRead struct {
	declined                    bool
	addr                        netip.Addr
	ready, serving, terminating bool
	rest                        discoveryv1.Endpoint // every member but the addresses and conditions
	end                         int
}

// readEndpoint reads the endpoint at the start of js as packEndpoints does
// (fast: compactEndpoint first) or as it did before (object alone); took
// says compactEndpoint read it.
func readEndpoint(js string, fast bool) (r endpointRead, took bool) {
	d := &fastDecoder{b: []byte(js)}
	e, p := &discoveryv1.Endpoint{}, &packing{}
	member := func(key []byte) uint { return d.endpointMember(e, key, discoveryv1.AddressTypeIPv4, p) }
	defer func() {
		if x := recover(); x != nil {
			if x != errDecline && x != errNoPack { //nolint:errorlint // our own sentinels
				panic(x)
			}
			r = endpointRead{declined: true}
		}
	}()
	if fast {
		took = d.compactEndpoint(discoveryv1.AddressTypeIPv4, p, member)
		if !took && (d.i != 0 || *p != (packing{}) || !reflect.DeepEqual(*e, discoveryv1.Endpoint{})) {
			panic("compactEndpoint declined " + js + " after reading to " + strconv.Itoa(d.i))
		}
	}
	if !took {
		d.object(member)
	}
	if !p.addrs {
		panic(errNoPack)
	}
	r.addr, r.end = p.addr, d.i
	r.ready, r.serving, r.terminating = p.conds[0], p.conds[1], p.conds[2]
	if !p.compact {
		r.ready, r.serving, r.terminating = translate.EndpointConditions(&e.Conditions)
	}
	r.rest = *e
	r.rest.Conditions = discoveryv1.EndpointConditions{}
	return r, took
}

// randCompactEndpoint writes an endpoint as encoding/json writes one
// (compact says so), or one just off that form.
func randCompactEndpoint(r *rand.Rand) (js string, compact bool) {
	compact = true
	field := func() string { return strconv.Itoa(r.IntN(256)) }
	addr := field() + "." + field() + "." + field() + "." + field()
	if r.IntN(3) == 0 {
		compact = false
		addr = pick(r, "256.1.1.1", "1.2.3.255x", "01.2.3.4", "1.2.3.04", "1.2.3", "1.2.3.4.5", "1..2.3",
			"1234.1.1.1", "1.2.3.4 ", " 1.2.3.4", "::ffff:1.2.3.4", "fd00::1", "", "1.2.3.4\",\"5.6.7.8",
			"1.2.3.\\u0034", "-1.2.3.4", "1.2.3.999", "300.0.0.0")
	}
	if r.IntN(8) == 0 {
		addr = pick(r, "0.0.0.0", "255.255.255.255", "10.0.0.1", "1.10.100.200")
	}
	b := func() string { return pick(r, "true", "false") }
	conds := `{"ready":` + b() + `,"serving":` + b() + `,"terminating":` + b() + `}`
	if r.IntN(4) == 0 {
		compact = false
		conds = pick(r, `{"ready":true}`, `{"ready":true,"serving":true}`, `{ "ready":true,"serving":true,"terminating":false}`,
			`{"serving":true,"ready":true,"terminating":false}`, `null`, `{}`, `{"ready":True,"serving":true,"terminating":false}`,
			`{"ready":true,"serving":true,"terminating":false,"x":1}`, `{"ready":true,"serving":true,"terminating":falsey}`,
			`{"ready":null,"serving":true,"terminating":false}`, `{"ready":true,"serving":true,"terminating":false `)
	}
	tail := pick(r, `}`, `}`, `,"nodeName":"n1"}`, `,"nodeName":"n2","zone":"z"}`, `,"hostname":"h","nodeName":"n3"}`,
		`,"hints":{"forZones":[{"name":"z"}]}}`, `,"conditions":{}}`, `,"addresses":["1.1.1.1"]}`, ` }`, `,}`, `}x`,
		`,"nodeName":null}`, `,"targetRef":{"kind":"Pod","name":"p"},"nodeName":"n"}`, `,"nodeName":"n","nodeName":"m"}`, `]`)
	if tail == ` }` || tail == `,}` || tail == `]` {
		compact = false
	}
	head := pick(r, `{"addresses":["`, `{"addresses":["`, `{"addresses":["`, `{ "addresses":["`, `{"addresses": ["`, `{"addresses":[ "`)
	if head != `{"addresses":["` {
		compact = false
	}
	mid := pick(r, `"],"conditions":`, `"],"conditions":`, `"],"conditions":`, `" ],"conditions":`, `"], "conditions":`, `"],"Conditions":`)
	if mid != `"],"conditions":` {
		compact = false
	}
	return head + addr + mid + conds + tail, compact
}

// An endpoint that compactEndpoint reads is read as object and
// endpointMember read it (the same address, conditions, other members,
// end, and the same declines), and one it does not read, it leaves
// unread; it reads the form encoding/json writes.
func TestCompactEndpointAsObject(t *testing.T) {
	r := rand.New(rand.NewPCG(60, 14))
	took, compacts := 0, 0
	for i := range 30000 {
		js, compact := randCompactEndpoint(r)
		if i < 5 {
			js, compact = `{"addresses":["10.1.2.3"],"conditions":{"ready":true,"serving":true,"terminating":false}}`, true
		}
		fast, tookIt := readEndpoint(js, true)
		slow, _ := readEndpoint(js, false)
		if !reflect.DeepEqual(fast, slow) {
			t.Fatalf("%s\ncompactEndpoint: %+v\nobject: %+v", js, fast, slow)
		}
		if compact && !fast.declined { // a declined one unwinds before took is set
			compacts++
			if !tookIt {
				t.Fatalf("compactEndpoint did not read %s", js)
			}
		}
		if tookIt {
			took++
		}
	}
	t.Logf("%d of 30000 endpoints read by compactEndpoint (%d in its form by construction)", took, compacts)

	// In slices, through the loader: packed as before.
	for range 300 {
		eps := ""
		for k := range 1 + r.IntN(4) {
			js, _ := randCompactEndpoint(r)
			if k > 0 {
				eps += ","
			}
			eps += js
		}
		checkPacked(t, packedSlice(`"IPv4"`, `"endpoints":[`+eps+`],`))
	}
}

func TestDottedQuad(t *testing.T) {
	for _, c := range []string{"0.0.0.0", "255.255.255.255", "10.0.0.1", "256.0.0.0", "1.2.3.04", "00.1.2.3",
		"1.2.3", "1.2.3.4.5", "1.2.3.4", "1..2.3", "1234.1.1.1", "1.2.3.a", "", "1.2.3.1000", "99.199.249.250"} {
		a, end, ok := dottedQuad([]byte(c+`"`), 0)
		want, err := netip.ParseAddr(c)
		wantOK := err == nil && want.Is4()
		if ok != wantOK || ok && (netip.AddrFrom4(a) != want || end != len(c)) {
			t.Errorf("dottedQuad(%q) = %v, %d, %v; netip: %v, %v", c, a, end, ok, want, err)
		}
	}
}
