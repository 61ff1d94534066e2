package kube

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// randomService returns a Service with every field the API has set at
// random, mostly as an API server serves them, sometimes not (invalid
// addresses, ports, policies...), so that the cached forms compared
// cover the translation's errors too.
func randomService(r *rand.Rand) *corev1.Service {
	i := r.IntN(1000)
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{
		Name:              pick(r, fmt.Sprintf("svc-%d", i), "x", "x", ""),
		GenerateName:      pick(r, "", "svc-"),
		Namespace:         pick(r, "default", "ns-1", "", fmt.Sprintf("ns-%d", i)),
		UID:               types.UID(pick(r, "", "5e1c0000-0000-4000-8000-000000000001", fmt.Sprint(r.Int64()))),
		ResourceVersion:   pick(r, "", "1", fmt.Sprint(r.Int64())),
		Generation:        pick(r, 0, 1, r.Int64(), -1),
		CreationTimestamp: metav1.NewTime(time.Unix(pick(r, 0, r.Int64N(1<<31), -r.Int64N(1<<34)), 0)),
		Finalizers:        pick(r, nil, []string{"f"}),
	}}
	if r.IntN(4) == 0 {
		svc.DeletionTimestamp = new(metav1.NewTime(time.Unix(r.Int64N(1<<31), 0)))
	}
	if r.IntN(4) > 0 {
		svc.Labels = map[string]string{"app": pick(r, "a", "")}
		if r.IntN(3) == 0 {
			svc.Labels[translate.LabelServiceProxyName] = pick(r, "", "sluice", "other")
		}
		if r.IntN(5) == 0 {
			svc.Labels[corev1.IsHeadlessService] = pick(r, "", "x")
		}
	}
	if r.IntN(2) == 0 {
		svc.Annotations = map[string]string{corev1.LastAppliedConfigAnnotation: "{}", "a": "b"}
	}
	if r.IntN(2) == 0 {
		svc.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationUpdate,
			APIVersion: "v1", Time: new(metav1.NewTime(time.Unix(1, 0))), FieldsType: "FieldsV1",
			FieldsV1: metav1.NewFieldsV1(`{"f:spec":{"f:ports":{}}}`)}}
	}
	if r.IntN(3) == 0 {
		svc.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "X", Name: "x", UID: "u"}}
	}
	sp := &svc.Spec
	// odd says whether to give a field a value the API refuses, now
	// and then (so that most Services stay valid).
	odd := func() bool { return r.IntN(15) == 0 }
	sp.Type = pick(r, corev1.ServiceTypeClusterIP, corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer, corev1.ServiceTypeExternalName, "")
	if odd() {
		sp.Type = "Weird"
	}
	ip := func(v6 bool) string {
		switch {
		case odd():
			return pick(r, "", "nope", corev1.ClusterIPNone, "010.0.0.1", "::ffff:10.0.0.2")
		case v6:
			return fmt.Sprintf("fd00::%x", r.IntN(1<<16))
		}
		return fmt.Sprintf("10.96.%d.%d", r.IntN(256), r.IntN(256))
	}
	switch r.IntN(5) {
	case 0: // none
	case 1:
		sp.ClusterIP = ip(false)
	case 2: // dual-stack
		sp.ClusterIPs = []string{ip(false), ip(true)}
		sp.ClusterIP = pick(r, sp.ClusterIPs[0], sp.ClusterIPs[0], "")
		sp.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, pick(r, corev1.IPv6Protocol, corev1.IPv6Protocol, "IPv5")}
	default:
		v6 := r.IntN(4) == 0
		sp.ClusterIPs = []string{ip(v6)}
		sp.ClusterIP = sp.ClusterIPs[0]
		sp.IPFamilies = []corev1.IPFamily{pick(r, corev1.IPv4Protocol, corev1.IPv6Protocol)}
	}
	sp.IPFamilyPolicy = maybe(r, corev1.IPFamilyPolicySingleStack, corev1.IPFamilyPolicyPreferDualStack)
	for j := range r.IntN(4) {
		p := corev1.ServicePort{
			Name:        fmt.Sprintf("p%d", j),
			Protocol:    pick(r, corev1.ProtocolTCP, corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP, ""),
			Port:        pick(r, 80+int32(j), 1000*int32(j)+1+r.Int32N(999)),
			AppProtocol: maybe(r, "http"),
		}
		if odd() {
			p.Name = pick(r, "", "http", "p0")
		}
		if odd() {
			p.Protocol = "weird"
		}
		if odd() {
			p.Port = pick[int32](r, 0, -1, 70000, 80)
		}
		switch r.IntN(3) {
		case 0:
			p.TargetPort = intstr.FromInt32(pick[int32](r, 8080, 0, 9376))
			if odd() {
				p.TargetPort.IntVal = pick[int32](r, 70000, -3)
			}
		case 1:
			p.TargetPort = intstr.FromString(pick(r, "http", ""))
		}
		if sp.Type == corev1.ServiceTypeNodePort || sp.Type == corev1.ServiceTypeLoadBalancer || r.IntN(8) == 0 {
			p.NodePort = pick(r, 30000+r.Int32N(2768), 0)
			if odd() {
				p.NodePort = pick[int32](r, 70000, -1)
			}
		}
		sp.Ports = append(sp.Ports, p)
	}
	if r.IntN(2) == 0 {
		sp.Selector = map[string]string{"app": "x"}
	}
	for range pick(r, 0, 0, 0, 1, 2) {
		sp.ExternalIPs = append(sp.ExternalIPs, pick(r, "192.0.2.1", "2001:db8::1", "192.0.2.7"))
		if odd() {
			sp.ExternalIPs[0] = "bad"
		}
	}
	sp.SessionAffinity = pick(r, corev1.ServiceAffinityNone, corev1.ServiceAffinityNone, corev1.ServiceAffinityClientIP, "")
	if odd() {
		sp.SessionAffinity = "Sticky"
	}
	if r.IntN(3) == 0 {
		sp.SessionAffinityConfig = &corev1.SessionAffinityConfig{}
		if r.IntN(4) > 0 {
			sp.SessionAffinityConfig.ClientIP = &corev1.ClientIPConfig{TimeoutSeconds: maybe(r, int32(10800), int32(1), 1+r.Int32N(86400))}
			if odd() {
				sp.SessionAffinityConfig.ClientIP.TimeoutSeconds = new(pick(r, int32(0), int32(100000), r.Int32()))
			}
		}
	}
	sp.ExternalTrafficPolicy = pick(r, "", corev1.ServiceExternalTrafficPolicyCluster, corev1.ServiceExternalTrafficPolicyLocal, "Global")
	sp.InternalTrafficPolicy = maybe(r, corev1.ServiceInternalTrafficPolicyCluster, corev1.ServiceInternalTrafficPolicyLocal, "Other")
	sp.HealthCheckNodePort = pick[int32](r, 0, 0, 0, 31000, -5)
	sp.PublishNotReadyAddresses = r.IntN(5) == 0
	if sp.Type == corev1.ServiceTypeLoadBalancer || r.IntN(10) == 0 {
		sp.LoadBalancerSourceRanges = pick(r, nil, []string{"10.0.0.0/8"}, []string{"192.0.2.0/24", "bad"})
		for range r.IntN(3) {
			svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{
				IP: pick(r, "203.0.113.1", "", "2001:db8::2", "bad"), Hostname: pick(r, "", "lb.example.com"),
				IPMode: maybe(r, corev1.LoadBalancerIPModeVIP, corev1.LoadBalancerIPModeProxy, "Other")})
		}
	}
	if r.IntN(4) == 0 {
		svc.Status.Conditions = []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "R", LastTransitionTime: metav1.NewTime(time.Unix(5, 0))}}
	}
	return svc
}

// slimStandardService is what the cache keeps of data, decoded as
// before: Service.Unmarshal, then slimService. ok false: the standard
// decoder fails.
func slimStandardService(data []byte) (*cachedService, bool) {
	var svc corev1.Service
	if err := svc.Unmarshal(data); err != nil {
		return nil, false
	}
	return newSlimmer().slimService(&svc), true
}

// sameCachedService fails t unless the two Services cached are the same
// (their errors compared by text).
func sameCachedService(t testing.TB, what string, got, want *cachedService) {
	t.Helper()
	g, w := *got, *want
	ge, we := fmt.Sprint(g.Invalid), fmt.Sprint(w.Invalid)
	g.Invalid, w.Invalid = nil, nil
	if ge != we || !reflect.DeepEqual(g, w) {
		t.Fatalf("%s: fast decoder\n%+v (invalid: %s)\nstandard decoder\n%+v (invalid: %s)", what, g, ge, w, we)
	}
}

// TestServiceDecoderAgrees: for random Services marshalled by the API's
// Marshal, and encoded as an API server serves them (the protobuf
// envelope), what the fast decoder makes is what slimService makes of the
// standard decoder's object, or it declines (only those without a name).
func TestServiceDecoderAgrees(t *testing.T) {
	r := rand.New(rand.NewPCG(14, 63))
	enc := scheme.Codecs.EncoderForVersion(protobuf.NewSerializer(scheme.Scheme, scheme.Scheme), corev1.SchemeGroupVersion)
	const n = 5000
	taken, invalid := 0, 0
	for i := range n {
		svc := randomService(r)
		data := must(svc.Marshal())
		want, ok := slimStandardService(data)
		if !ok {
			t.Fatalf("service %d: the standard decoder fails", i)
		}
		got, ok := newServiceDecoder(newSlimmer()).decode(data)
		if !ok {
			if svc.Name != "" {
				t.Fatalf("service %d (%+v): declined", i, svc)
			}
			continue
		}
		taken++
		if want.Invalid != nil {
			invalid++
		}
		sameCachedService(t, fmt.Sprintf("service %d (%+v)", i, svc), got, want)
		var buf bytes.Buffer
		if err := enc.Encode(svc, &buf); err != nil {
			t.Fatal(err)
		}
		got, ok = newServiceDecoder(newSlimmer()).decodeEnvelope(buf.Bytes())
		if !ok {
			t.Fatalf("service %d: the envelope declined", i)
		}
		sameCachedService(t, fmt.Sprintf("service %d in its envelope", i), got, want)
	}
	if taken < n/2 || invalid < n/10 || taken-invalid < n/10 {
		t.Fatalf("the fast decoder took %d Services of %d, %d of them invalid: want more of each", taken, n, invalid)
	}
	t.Logf("the fast decoder took %d Services of %d, %d of them invalid", taken, n, invalid)
}

// TestServiceDecoderShares: one decoder shares its slimmer's strings and
// port arrays as slimService does, and reuses its scratch from one
// Service to the next without one Service's values showing in another.
func TestServiceDecoderShares(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	sl := newSlimmer()
	d := newServiceDecoder(sl)
	var prev, prevWant *cachedService
	shared := 0
	for i := range 2000 {
		data := must(randomService(r).Marshal())
		got, ok := d.decode(data)
		if !ok {
			continue
		}
		want, _ := slimStandardService(data)
		sameCachedService(t, fmt.Sprintf("service %d", i), got, want)
		if prev != nil {
			sameCachedService(t, fmt.Sprintf("service before %d", i), prev, prevWant)
		}
		prev, prevWant = got, want
		if p, ok := sl.strings[got.Namespace]; got.Namespace != "" && (!ok || *p != got.Namespace) {
			t.Fatalf("service %d: namespace %q not shared", i, got.Namespace)
		}
		if got.ProxyName != nil && sl.strings[*got.ProxyName] != got.ProxyName {
			t.Fatalf("service %d: proxy name %q not shared", i, *got.ProxyName)
		}
		if len(got.Ports) == 1 {
			if s := sl.servicePorts[portsKey[translate.ServicePort]{n: 1, p: [2]translate.ServicePort{got.Ports[0]}}]; &s[0] != &got.Ports[0] {
				t.Fatalf("service %d: ports %v not shared", i, got.Ports)
			}
			shared++
		}
	}
	if shared == 0 {
		t.Fatal("no Service of one port")
	}
}

// TestServiceDecoderDeclines: what the fast decoder does not read as the
// standard decoder would, it declines.
func TestServiceDecoderDeclines(t *testing.T) {
	valid := func() *corev1.Service {
		svc := service("svc", "10.96.0.1", 80)
		svc.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		svc.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: new(int32(30))}}
		svc.Spec.Ports[0].TargetPort = intstr.FromInt32(8080)
		return svc
	}
	// field returns the bytes of field num of the message b.
	field := func(b []byte, num int) []byte {
		var out []byte
		eachField(b, func(n protowire.Number, _ protowire.Type, v []byte) bool {
			if int(n) == num {
				out = v
			}
			return true
		})
		return out
	}
	for _, tc := range []struct {
		what string
		data func() []byte
	}{
		{"no name (a bookmark)", func() []byte {
			svc := valid()
			svc.Name = ""
			return must(svc.Marshal())
		}},
		{"metadata given twice", func() []byte {
			svc := valid()
			return append(must(svc.Marshal()), appendField(nil, 1, must(svc.ObjectMeta.Marshal()))...)
		}},
		{"spec given twice", func() []byte {
			svc := valid()
			return append(must(svc.Marshal()), appendField(nil, 2, must(svc.Spec.Marshal()))...)
		}},
		{"status given twice", func() []byte {
			svc := valid()
			return append(must(svc.Marshal()), appendField(nil, 3, nil)...)
		}},
		{"sessionAffinityConfig given twice", func() []byte {
			svc := valid()
			spec := must(svc.Spec.Marshal())
			spec = appendField(spec, 14, field(spec, 14))
			return appendField(appendField(nil, 1, must(svc.ObjectMeta.Marshal())), 2, spec)
		}},
		{"a targetPort given twice", func() []byte {
			svc := valid()
			port := must(svc.Spec.Ports[0].Marshal())
			port = appendField(port, 4, field(port, 4))
			svc.Spec.Ports = nil
			spec := appendField(must(svc.Spec.Marshal()), 1, port)
			return appendField(appendField(nil, 1, must(svc.ObjectMeta.Marshal())), 2, spec)
		}},
		{"a name of the wrong wire type", func() []byte {
			svc := valid()
			svc.Name = ""
			meta := append(must(svc.ObjectMeta.Marshal()), 1<<3, 7) // name (field 1), a varint (wire type 0)
			return appendField(nil, 1, meta)
		}},
		{"a port of the wrong wire type", func() []byte {
			svc := valid()
			port := must(svc.Spec.Ports[0].Marshal())
			port = append(port, 3<<3|2, 0) // port, length-delimited
			svc.Spec.Ports = nil
			spec := appendField(must(svc.Spec.Marshal()), 1, port)
			return appendField(appendField(nil, 1, must(svc.ObjectMeta.Marshal())), 2, spec)
		}},
		{"a malformed timestamp", func() []byte {
			svc := valid()
			meta := appendField(must(svc.ObjectMeta.Marshal()), 8, []byte{1 << 3, 0x80})
			return appendField(nil, 1, meta)
		}},
		{"truncated", func() []byte {
			b := must(valid().Marshal())
			return b[:len(b)-1]
		}},
	} {
		data := tc.data()
		if _, ok := newServiceDecoder(newSlimmer()).decode(data); ok {
			t.Errorf("%s: taken", tc.what)
		}
	}
	if _, ok := newServiceDecoder(newSlimmer()).decode(must(valid().Marshal())); !ok {
		t.Errorf("a valid Service: declined")
	}
	// Another kind in its envelope; a Service without its envelope.
	var buf bytes.Buffer
	enc := scheme.Codecs.EncoderForVersion(protobuf.NewSerializer(scheme.Scheme, scheme.Scheme), corev1.SchemeGroupVersion)
	if err := enc.Encode(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "svc", Namespace: "default"}}, &buf); err != nil {
		t.Fatal(err)
	}
	if _, ok := newServiceDecoder(newSlimmer()).decodeEnvelope(buf.Bytes()); ok {
		t.Errorf("a Node in its envelope: taken")
	}
	if _, ok := newServiceDecoder(newSlimmer()).decodeEnvelope(must(valid().Marshal())); ok {
		t.Errorf("a Service without its envelope: taken")
	}
}

// FuzzServiceDecoder: whatever the bytes, the fast decoder does not
// panic, and what it takes the standard decoder decodes to the same
// cached Service (where the standard decoder fails, the fast one may
// take the bytes, as FuzzSliceDecoder says).
func FuzzServiceDecoder(f *testing.F) {
	r := rand.New(rand.NewPCG(7, 8))
	for range 40 {
		f.Add(must(randomService(r).Marshal()))
	}
	svcs, _ := benchObjects(1, true)
	f.Add(must(svcs[0].Marshal()))
	f.Fuzz(func(t *testing.T, data []byte) {
		got, ok := newServiceDecoder(newSlimmer()).decode(data)
		if !ok {
			return
		}
		want, ok := slimStandardService(data)
		if !ok {
			return
		}
		sameCachedService(t, "fuzzed", got, want)
	})
}

// BenchmarkServiceDecode is the decoding of one Service of
// BenchmarkFirstState's (served as an API server serves them), from its
// protobuf to what the informer's cache keeps of it: standard,
// Service.Unmarshal then the transform (slimService); fast,
// serviceDecoder. cpu-ns/op as BenchmarkSliceDecode's.
func BenchmarkServiceDecode(b *testing.B) {
	const n = 30000
	svcs, _ := benchObjects(n, true)
	raw := make([][]byte, n)
	for i := range svcs {
		raw[i] = must(svcs[i].Marshal())
	}
	b.Run("standard", func(b *testing.B) {
		sl := newSlimmer()
		b.ReportAllocs()
		defer cpuPerOp(b)()
		i := 0
		for b.Loop() {
			var svc corev1.Service
			if err := svc.Unmarshal(raw[i%n]); err != nil {
				b.Fatal(err)
			}
			sl.slimService(&svc)
			i++
		}
	})
	b.Run("fast", func(b *testing.B) {
		d := newServiceDecoder(newSlimmer())
		b.ReportAllocs()
		defer cpuPerOp(b)()
		i := 0
		for b.Loop() {
			if _, ok := d.decode(raw[i%n]); !ok {
				b.Fatal("declined")
			}
			i++
		}
	})
}
