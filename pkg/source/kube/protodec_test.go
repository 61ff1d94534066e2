package kube

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/sluice-lb/sluice/internal/testutil"
)

// pick returns one of vs at random.
func pick[T any](r *rand.Rand, vs ...T) T { return vs[r.IntN(len(vs))] }

// maybe returns a pointer to one of vs, or nil, at random.
func maybe[T any](r *rand.Rand, vs ...T) *T {
	if r.IntN(len(vs)+1) == 0 {
		return nil
	}
	return new(pick(r, vs...))
}

// randomSlice returns an EndpointSlice with every field the API has set
// at random, mostly as an API server serves them (so that the fast
// decoder takes most of them), sometimes not (so that it declines some).
func randomSlice(r *rand.Rand) *discoveryv1.EndpointSlice {
	i := r.IntN(1000)
	es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{
		Name:              pick(r, fmt.Sprintf("svc-%d-abc", i), "", "x"),
		GenerateName:      pick(r, "", "svc-"),
		Namespace:         pick(r, "default", "ns-1", "", fmt.Sprintf("ns-%d", i)),
		UID:               types.UID(pick(r, "", "5e1c0000-0000-4000-8000-000000000001")),
		ResourceVersion:   pick(r, "", "1", fmt.Sprint(r.Int64())),
		Generation:        r.Int64N(5),
		CreationTimestamp: metav1.NewTime(time.Unix(r.Int64N(1<<31), 0)),
		Finalizers:        pick(r, nil, []string{"f"}),
	}}
	if r.IntN(4) == 0 {
		es.DeletionTimestamp = new(metav1.NewTime(time.Unix(r.Int64N(1<<31), 0)))
		es.DeletionGracePeriodSeconds = maybe(r, int64(0), 30)
	}
	if r.IntN(5) > 0 {
		es.Labels = map[string]string{}
		if r.IntN(4) > 0 {
			es.Labels[discoveryv1.LabelServiceName] = pick(r, "", "svc", fmt.Sprintf("svc-%d", i))
		}
		es.Labels[discoveryv1.LabelManagedBy] = "endpointslice-controller.k8s.io"
		if r.IntN(2) == 0 {
			es.Labels["app"] = "x"
		}
		if r.IntN(6) == 0 {
			es.Labels[corev1.IsHeadlessService] = pick(r, "", "x")
		}
	}
	if r.IntN(5) > 0 {
		es.Annotations = map[string]string{}
		for range r.IntN(4) {
			es.Annotations[pick(r, corev1.EndpointsLastChangeTriggerTime, corev1.LastAppliedConfigAnnotation, metav1.InitialEventsAnnotationKey, "a", "b/c")] = pick(r, "", "2026-01-01T00:00:00Z", "{}")
		}
	}
	if r.IntN(2) == 0 {
		es.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: "svc", UID: "u", Controller: new(true)}}
	}
	if r.IntN(2) == 0 {
		es.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate,
			APIVersion: "discovery.k8s.io/v1", Time: new(metav1.NewTime(time.Unix(1, 0))), FieldsType: "FieldsV1",
			FieldsV1: metav1.NewFieldsV1(`{"f:addressType":{},"f:endpoints":{}}`)}}
	}
	es.AddressType = pick(r, discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6, discoveryv1.AddressTypeFQDN, "bogus", "")
	addr := func() string {
		if r.IntN(20) == 0 {
			return pick(r, "", "nope", "10.0.0.1", "fd00::1", "::ffff:10.0.0.2", "010.000.000.003", "a.example.com")
		}
		if es.AddressType == discoveryv1.AddressTypeIPv6 {
			return fmt.Sprintf("fd00::%x", r.IntN(1<<16))
		}
		return fmt.Sprintf("10.%d.%d.%d", r.IntN(256), r.IntN(256), r.IntN(256))
	}
	for range r.IntN(6) {
		var e discoveryv1.Endpoint
		n := r.IntN(4)
		if r.IntN(3) > 0 {
			n = max(n, 1)
		}
		for range n {
			e.Addresses = append(e.Addresses, addr())
		}
		e.Conditions = discoveryv1.EndpointConditions{Ready: maybe(r, true, false), Serving: maybe(r, true, false), Terminating: maybe(r, true, false)}
		e.Hostname = maybe(r, "h", "")
		if r.IntN(2) == 0 {
			e.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: "p", UID: "u"}
		}
		if r.IntN(5) == 0 {
			e.DeprecatedTopology = map[string]string{"topology.kubernetes.io/zone": "z"}
		}
		e.NodeName = maybe(r, "node-1", "node-2", fmt.Sprintf("node-%d", r.IntN(100)), "")
		e.Zone = maybe(r, "zone-a", "zone-b")
		if r.IntN(4) == 0 {
			e.Hints = &discoveryv1.EndpointHints{}
			for range r.IntN(3) {
				e.Hints.ForZones = append(e.Hints.ForZones, discoveryv1.ForZone{Name: pick(r, "zone-a", "zone-b", "")})
			}
			for range r.IntN(3) {
				e.Hints.ForNodes = append(e.Hints.ForNodes, discoveryv1.ForNode{Name: pick(r, "node-1", "")})
			}
		}
		es.Endpoints = append(es.Endpoints, e)
	}
	for range r.IntN(4) {
		es.Ports = append(es.Ports, discoveryv1.EndpointPort{
			Name:        maybe(r, "", "http", "https", fmt.Sprintf("p%d", r.IntN(3))),
			Protocol:    maybe(r, corev1.ProtocolTCP, corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP, "weird", ""),
			Port:        maybe(r, int32(80), int32(8080), r.Int32N(70000), int32(0), int32(-1)),
			AppProtocol: maybe(r, "http", "kubernetes.io/h2c"),
		})
	}
	return es
}

// slimStandard is what the cache keeps of data, decoded as before:
// EndpointSlice.Unmarshal, then slimSlice; with the trigger time the
// slimmer kept aside. ok false: the standard decoder fails.
func slimStandard(data []byte) (c *cachedSlice, trigger string, ok bool) {
	var es discoveryv1.EndpointSlice
	if err := es.Unmarshal(data); err != nil {
		return nil, "", false
	}
	sl := newSlimmer()
	c = sl.slimSlice(&es)
	return c, sl.takeTrigger(c), true
}

// randomStandard returns a random slice (randomSlice), its protobuf, and
// what slimSlice makes of the standard decoder's object (and its trigger
// time); the i-th slice of a test.
func randomStandard(t *testing.T, r *rand.Rand, i int) (*discoveryv1.EndpointSlice, []byte, *cachedSlice, string) {
	t.Helper()
	es := randomSlice(r)
	data, err := es.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	want, wantTrigger, ok := slimStandard(data)
	if !ok {
		t.Fatalf("slice %d: the standard decoder fails", i)
	}
	return es, data, want, wantTrigger
}

// sameCached fails t unless the two slices cached are the same (their
// errors compared by text).
func sameCached(t testing.TB, what string, got *cachedSlice, gotTrigger string, want *cachedSlice, wantTrigger string) {
	t.Helper()
	g, w := *got, *want
	ge, we := fmt.Sprint(g.Invalid), fmt.Sprint(w.Invalid)
	g.Invalid, w.Invalid = nil, nil
	if ge != we || gotTrigger != wantTrigger || !reflect.DeepEqual(g, w) {
		t.Fatalf("%s: fast decoder\n%+v (invalid: %s, trigger %q)\nstandard decoder\n%+v (invalid: %s, trigger %q)", what, g, ge, gotTrigger, w, we, wantTrigger)
	}
}

// TestSliceDecoderAgrees: for random EndpointSlices marshalled by the
// API's Marshal, and encoded as an API server serves them (the protobuf
// envelope), what the fast decoder makes is what slimSlice makes of the
// standard decoder's object, or it declines; it declines only some.
func TestSliceDecoderAgrees(t *testing.T) {
	r := rand.New(rand.NewPCG(14, 62))
	enc := scheme.Codecs.EncoderForVersion(protobuf.NewSerializer(scheme.Scheme, scheme.Scheme), discoveryv1.SchemeGroupVersion)
	const n = 5000
	taken := 0
	for i := range n {
		es, data, want, wantTrigger := randomStandard(t, r, i)
		sl := newSlimmer()
		got, ok := newSliceDecoder(sl).decode(data)
		if !ok {
			continue
		}
		taken++
		sameCached(t, fmt.Sprintf("slice %d (%+v)", i, es), got, sl.takeTrigger(got), want, wantTrigger)
		if len(sl.triggers) != 0 {
			t.Fatalf("slice %d: triggers left: %v", i, sl.triggers)
		}
		var buf bytes.Buffer
		if err := enc.Encode(es, &buf); err != nil {
			t.Fatal(err)
		}
		sl = newSlimmer()
		got, ok = newSliceDecoder(sl).decodeEnvelope(buf.Bytes())
		if !ok {
			t.Fatalf("slice %d: the envelope declined", i)
		}
		sameCached(t, fmt.Sprintf("slice %d in its envelope", i), got, sl.takeTrigger(got), want, wantTrigger)
	}
	// The generator makes about half of them IPv4 or IPv6 slices of
	// valid addresses.
	if taken < n/4 || taken == n {
		t.Fatalf("the fast decoder took %d slices of %d", taken, n)
	}
	t.Logf("the fast decoder took %d slices of %d", taken, n)
}

// TestSliceDecoderShares: one decoder shares its slimmer's strings and
// port arrays as slimSlice does, and reuses its scratch from one slice
// to the next without one slice's values showing in another.
func TestSliceDecoderShares(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	sl := newSlimmer()
	d := newSliceDecoder(sl)
	var prev *cachedSlice
	var prevWant *cachedSlice
	for i := range 2000 {
		es := randomSlice(r)
		data, err := es.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		got, ok := d.decode(data)
		if !ok {
			continue
		}
		want, wantTrigger, _ := slimStandard(data)
		sameCached(t, fmt.Sprintf("slice %d", i), got, sl.takeTrigger(got), want, wantTrigger)
		if prev != nil {
			// The slice before is unchanged by this one's decoding.
			sameCached(t, fmt.Sprintf("slice before %d", i), prev, "", prevWant, "")
		}
		prev, prevWant = got, want
		for j := range got.Endpoints.Len() {
			if p := got.Endpoints.At(j).NodeName; p != nil && sl.strings[*p] != p {
				t.Fatalf("slice %d: node name %q not shared", i, *p)
			}
		}
	}
}

// TestSliceDecoderDeclines: what the fast decoder does not read as the
// standard decoder would, it declines.
func TestSliceDecoderDeclines(t *testing.T) {
	valid := func() *discoveryv1.EndpointSlice {
		es := slice("svc", "svc-1", 80, "10.0.0.1")
		return es
	}
	for _, tc := range []struct {
		what string
		data func() []byte
	}{
		{"an FQDN slice", func() []byte {
			es := valid()
			es.AddressType = discoveryv1.AddressTypeFQDN
			return must(es.Marshal())
		}},
		{"an IPv6 address in an IPv4 slice", func() []byte {
			es := valid()
			es.Endpoints[0].Addresses = []string{"fd00::1"}
			return must(es.Marshal())
		}},
		{"an endpoint without addresses", func() []byte {
			es := valid()
			es.Endpoints[0].Addresses = nil
			return must(es.Marshal())
		}},
		{"metadata given twice", func() []byte {
			es := valid()
			m := must(es.ObjectMeta.Marshal())
			return append(must(es.Marshal()), appendField(nil, 1, m)...)
		}},
		{"truncated", func() []byte {
			b := must(valid().Marshal())
			return b[:len(b)-1]
		}},
		{"no addressType", func() []byte {
			es := valid()
			es.AddressType = ""
			return must(es.Marshal())
		}},
	} {
		data := tc.data()
		if _, ok := newSliceDecoder(newSlimmer()).decode(data); ok {
			t.Errorf("%s: taken", tc.what)
		}
	}
	if _, ok := newSliceDecoder(newSlimmer()).decode(must(valid().Marshal())); !ok {
		t.Errorf("a valid slice: declined")
	}
	// Another kind in its envelope.
	var buf bytes.Buffer
	enc := scheme.Codecs.EncoderForVersion(protobuf.NewSerializer(scheme.Scheme, scheme.Scheme), corev1.SchemeGroupVersion)
	if err := enc.Encode(service("svc", "10.96.0.1", 80), &buf); err != nil {
		t.Fatal(err)
	}
	if _, ok := newSliceDecoder(newSlimmer()).decodeEnvelope(buf.Bytes()); ok {
		t.Errorf("a Service in its envelope: taken")
	}
	if _, ok := newSliceDecoder(newSlimmer()).decodeEnvelope(must(valid().Marshal())); ok {
		t.Errorf("a slice without its envelope: taken")
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

// appendField appends to b the length-delimited field num of value v.
func appendField(b []byte, num int, v []byte) []byte {
	b = append(b, byte(num<<3|2))
	for x := uint64(len(v)); ; x >>= 7 {
		if x < 0x80 {
			b = append(b, byte(x))
			break
		}
		b = append(b, byte(x)|0x80)
	}
	return append(b, v...)
}

// FuzzSliceDecoder: whatever the bytes, the fast decoder does not panic,
// and what it takes the standard decoder decodes to the same cached
// slice. Where the standard decoder fails, the fast one may take the
// bytes: it does not look inside the fields it skips (managedFields,
// owner references, timestamps...), which an API server never sends
// malformed.
func FuzzSliceDecoder(f *testing.F) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 40 {
		f.Add(must(randomSlice(r).Marshal()))
	}
	_, eps := benchObjects(1, true)
	f.Add(must(eps[0].Marshal()))
	f.Fuzz(func(t *testing.T, data []byte) {
		sl := newSlimmer()
		got, ok := newSliceDecoder(sl).decode(data)
		if !ok {
			return
		}
		want, wantTrigger, ok := slimStandard(data)
		if !ok {
			return
		}
		sameCached(t, "fuzzed", got, sl.takeTrigger(got), want, wantTrigger)
	})
}

// BenchmarkSliceDecode is the decoding of one EndpointSlice of
// BenchmarkFirstState's (10 endpoints, served as an API server serves
// them), from its protobuf to what the informer's cache keeps of it:
// standard, EndpointSlice.Unmarshal then the transform (slimSlice), as
// the informer does it today; fast, sliceDecoder. Each op takes the
// trigger time the slimmer kept aside, as the event handler does.
// cpu-ns/op is the process's CPU time an op (testutil.CPUTime: the
// collector's work counts), steadier than ns/op on a loaded machine.
func BenchmarkSliceDecode(b *testing.B) {
	const n = 30000
	_, eps := benchObjects(n, true)
	raw := make([][]byte, n)
	for i := range eps {
		raw[i] = must(eps[i].Marshal())
	}
	b.Run("standard", func(b *testing.B) {
		sl := newSlimmer()
		b.ReportAllocs()
		defer cpuPerOp(b)()
		i := 0
		for b.Loop() {
			var es discoveryv1.EndpointSlice
			if err := es.Unmarshal(raw[i%n]); err != nil {
				b.Fatal(err)
			}
			sl.takeTrigger(sl.slimSlice(&es))
			i++
		}
	})
	b.Run("fast", func(b *testing.B) {
		sl := newSlimmer()
		d := newSliceDecoder(sl)
		b.ReportAllocs()
		defer cpuPerOp(b)()
		i := 0
		for b.Loop() {
			c, ok := d.decode(raw[i%n])
			if !ok {
				b.Fatal("declined")
			}
			sl.takeTrigger(c)
			i++
		}
	})
}

// cpuPerOp starts counting the process's CPU time; the func it returns
// reports it as cpu-ns/op.
func cpuPerOp(b *testing.B) func() {
	t0 := testutil.CPUTime(b)
	return func() {
		b.ReportMetric(float64((testutil.CPUTime(b)-t0).Nanoseconds())/float64(b.N), "cpu-ns/op")
	}
}
