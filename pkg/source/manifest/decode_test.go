package manifest

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/bits"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// checkFastDecode decodes js with the fast decoder and with encoding/json
// as decodeItem did before it: if the fast decoder does not decline, both
// must succeed and give the same type meta and the same object, every
// field (DeepEqual tells nil from empty). It reports whether the fast
// decoder decoded js.
func checkFastDecode(t *testing.T, js []byte) bool {
	t.Helper()
	var d fastDecoder
	tm, svc, slice, ok := d.decodeTyped(js)
	if !ok {
		return false
	}
	var want typeMeta
	if err := json.Unmarshal(js, &want); err != nil {
		t.Fatalf("fast decoder took what encoding/json refuses (%v):\n%s", err, js)
	}
	if !reflect.DeepEqual(tm, want) {
		t.Fatalf("type meta %+v, encoding/json %+v:\n%s", tm, want, js)
	}
	var got, obj any
	if svc != nil {
		got, obj = svc, &corev1.Service{}
	} else {
		got, obj = slice, &discoveryv1.EndpointSlice{}
	}
	if err := json.Unmarshal(js, obj); err != nil {
		t.Fatalf("fast decoder took what encoding/json refuses (%v):\n%s", err, js)
	}
	if !reflect.DeepEqual(got, obj) {
		t.Fatalf("fast decoder:\n%#v\nencoding/json:\n%#v\ninput:\n%s", got, obj, js)
	}
	return true
}

// randService returns a Service with every field translate and validate
// read, and others, set or not at random.
func randService(r *rand.Rand, i int) *corev1.Service {
	s := &corev1.Service{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"}}
	s.Name, s.Namespace = "svc-"+strconv.Itoa(i), pick(r, "", "default", "ns-é", "a\"b")
	s.Labels = randLabels(r, corev1.IsHeadlessService, "service.kubernetes.io/service-proxy-name")
	if r.IntN(2) == 0 {
		s.Annotations = map[string]string{"kubectl.kubernetes.io/last-applied-configuration": `{"a":"b\n"}`}
	}
	if r.IntN(3) == 0 {
		s.ResourceVersion, s.UID, s.Generation = "12345", "0c7f-11", 3
		s.CreationTimestamp = metav1.Unix(1700000000, 0)
	}
	sp := &s.Spec
	sp.Type = corev1.ServiceType(pick(r, "", "ClusterIP", "NodePort", "LoadBalancer", "ExternalName"))
	ips := pick(r, nil, []string{"10.96.0.1"}, []string{"10.96.0.2", "fd00::2"}, []string{"None"}, []string{})
	sp.ClusterIPs = ips
	if len(ips) > 0 && r.IntN(2) == 0 {
		sp.ClusterIP = ips[0]
	}
	for range r.IntN(4) {
		p := corev1.ServicePort{Name: pick(r, "", "http", "dns"), Protocol: corev1.Protocol(pick(r, "", "TCP", "UDP", "SCTP")),
			Port: int32(r.IntN(70000)), NodePort: int32(r.IntN(3) * 30000)}
		switch r.IntN(3) {
		case 1:
			p.TargetPort = intstr.FromInt32(int32(r.IntN(70000)))
		case 2:
			p.TargetPort = intstr.FromString(pick(r, "http", "metrics", ""))
		}
		if r.IntN(3) == 0 {
			p.AppProtocol = ptr(pick(r, "http", "kubernetes.io/h2c"))
		}
		sp.Ports = append(sp.Ports, p)
	}
	if r.IntN(2) == 0 {
		sp.ExternalIPs = pick(r, []string{}, []string{"192.0.2.1", "2001:db8::1"})
	}
	sp.SessionAffinity = corev1.ServiceAffinity(pick(r, "", "None", "ClientIP"))
	switch r.IntN(4) {
	case 1:
		sp.SessionAffinityConfig = &corev1.SessionAffinityConfig{}
	case 2:
		sp.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{}}
	case 3:
		sp.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr(int32(r.IntN(90000)))}}
	}
	sp.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicy(pick(r, "", "Cluster", "Local"))
	if r.IntN(2) == 0 {
		sp.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicy(pick(r, "Cluster", "Local")))
	}
	if r.IntN(2) == 0 {
		sp.IPFamilies = pick(r, []corev1.IPFamily{corev1.IPv4Protocol}, []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol})
		sp.IPFamilyPolicy = ptr(corev1.IPFamilyPolicy(pick(r, "SingleStack", "PreferDualStack")))
	}
	sp.HealthCheckNodePort = int32(r.IntN(2) * 31000)
	if r.IntN(2) == 0 {
		sp.LoadBalancerSourceRanges = []string{"10.0.0.0/8", " 192.168.0.0/16 "}
		sp.LoadBalancerClass = ptr("lb")
		sp.AllocateLoadBalancerNodePorts = ptr(r.IntN(2) == 0)
	}
	if r.IntN(2) == 0 {
		sp.Selector = map[string]string{"app": "x"}
		sp.PublishNotReadyAddresses = true
		sp.TrafficDistribution = ptr("PreferClose")
	}
	if r.IntN(2) == 0 {
		ing := corev1.LoadBalancerIngress{IP: "192.0.2.10", Hostname: pick(r, "", "lb.example")}
		if r.IntN(2) == 0 {
			ing.IPMode = ptr(corev1.LoadBalancerIPMode(pick(r, "VIP", "Proxy")))
			ing.Ports = []corev1.PortStatus{{Port: 80, Protocol: "TCP"}}
		}
		s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{ing, {IP: "2001:db8::10"}}
		s.Status.Conditions = pick(r, nil, []metav1.Condition{{Type: "Ready", Status: "True", LastTransitionTime: metav1.Unix(1700000000, 0)}})
	}
	return s
}

// randSlice returns an EndpointSlice with every field translate and
// validate read, and others, set or not at random.
func randSlice(r *rand.Rand, i int) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"}}
	es.Name, es.Namespace = "svc-"+strconv.Itoa(i)+"-x", pick(r, "", "default")
	es.Labels = randLabels(r, discoveryv1.LabelServiceName, "endpointslice.kubernetes.io/managed-by")
	if r.IntN(2) == 0 {
		es.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: "2026-01-01T00:00:00Z"}
		es.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: "svc", UID: "u"}}
	}
	es.AddressType = discoveryv1.AddressType(pick(r, "IPv4", "IPv6", "FQDN", ""))
	for j := range r.IntN(5) {
		e := discoveryv1.Endpoint{Addresses: pick(r, []string{"10.0.0." + strconv.Itoa(j)}, []string{"fd00::" + strconv.Itoa(j)}, []string{}, nil)}
		c := &e.Conditions
		c.Ready, c.Serving, c.Terminating = randBool(r), randBool(r), randBool(r)
		if r.IntN(2) == 0 {
			e.Hostname = ptr("host-" + strconv.Itoa(j))
		}
		if r.IntN(2) == 0 {
			e.NodeName = ptr(pick(r, "node-1", "", "nöde"))
		}
		if r.IntN(2) == 0 {
			e.Zone = ptr("zone-a")
		}
		switch r.IntN(4) {
		case 1:
			e.Hints = &discoveryv1.EndpointHints{}
		case 2:
			e.Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "zone-a"}, {Name: "zone-b"}}}
		case 3:
			e.Hints = &discoveryv1.EndpointHints{ForNodes: []discoveryv1.ForNode{{Name: "node-1"}}, ForZones: []discoveryv1.ForZone{}}
		}
		if r.IntN(3) == 0 {
			e.TargetRef = &corev1.ObjectReference{Kind: "Pod", Name: "p", Namespace: "ns", UID: "u-1", ResourceVersion: pick(r, "", "9"),
				APIVersion: "v1", FieldPath: pick(r, "", "spec.x")}
			e.DeprecatedTopology = map[string]string{"a": "b"}
		}
		es.Endpoints = append(es.Endpoints, e)
	}
	for range r.IntN(3) {
		var p discoveryv1.EndpointPort
		if r.IntN(4) > 0 {
			p.Name = ptr(pick(r, "http", "", "dns"))
		}
		if r.IntN(4) > 0 {
			p.Protocol = ptr(corev1.Protocol(pick(r, "TCP", "UDP", "SCTP", "tcp")))
		}
		if r.IntN(4) > 0 {
			p.Port = ptr(int32(r.IntN(70000)))
		}
		if r.IntN(3) == 0 {
			p.AppProtocol = ptr("http")
		}
		es.Ports = append(es.Ports, p)
	}
	return es
}

// randObjectJSON returns randService(r, i) for even i, randSlice(r, i)
// for odd i, as encoding/json writes it.
func randObjectJSON(r *rand.Rand, i int) []byte {
	var obj any = randService(r, i)
	if i%2 == 1 {
		obj = randSlice(r, i)
	}
	js, err := json.Marshal(obj)
	if err != nil {
		panic(err)
	}
	return js
}

func pick[T any](r *rand.Rand, vs ...T) T { return vs[r.IntN(len(vs))] }

func ptr[T any](v T) *T { return &v }

func randBool(r *rand.Rand) *bool { return pick(r, nil, ptr(true), ptr(false)) }

func randLabels(r *rand.Rand, keys ...string) map[string]string {
	switch r.IntN(4) {
	case 0:
		return nil
	case 1:
		return map[string]string{}
	}
	m := map[string]string{}
	for _, k := range keys {
		if r.IntN(2) == 0 {
			m[k] = pick(r, "", "svc-1", "other")
		}
	}
	m["app"] = "x"
	return m
}

// rewrite re-encodes JSON with its members in a random order, random
// white space, strings escaped at random, and, if wild, what encoding/json
// treats specially or refuses: unknown keys, keys in another case or
// twice, nulls, numbers it cannot put in an int32, values of another type.
func rewrite(r *rand.Rand, js []byte, wild bool) []byte {
	var v any
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		panic(err)
	}
	var b bytes.Buffer
	writeValue(r, &b, v, wild)
	return b.Bytes()
}

func writeValue(r *rand.Rand, b *bytes.Buffer, v any, wild bool) {
	space := func() {
		if r.IntN(4) == 0 {
			b.WriteString(pick(r, " ", "\n  ", "\t", "\r\n"))
		}
	}
	space()
	if wild && r.IntN(150) == 0 {
		b.WriteString(pick(r, "null", "1.5", "-0", "2147483648", "1e2", `"x"`, "true", "{}", "[]", "[null]", `{"a":null}`, "007"))
		space()
		return
	}
	switch v := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		r.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
		if wild && r.IntN(20) == 0 {
			keys = append(keys, pick(r, "unknownKey", "items", "Kind", "NAME", "spec", "name"))
		}
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			space()
			if wild && r.IntN(150) == 0 {
				k = pick(r, "Name", "NAMESPACE", "Spec", "nodename", "ſpec", "\u212aind")
			}
			writeString(r, b, k, r.IntN(100) == 0)
			space()
			b.WriteByte(':')
			if val, ok := v[k]; ok {
				writeValue(r, b, val, wild)
			} else {
				writeValue(r, b, pick[any](r, "x", json.Number("7"), nil, map[string]any{"a": "b"}, []any{"c"}), wild)
			}
		}
		space()
		b.WriteByte('}')
	case []any:
		b.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				b.WriteByte(',')
			}
			writeValue(r, b, e, wild)
		}
		b.WriteByte(']')
	case string:
		writeString(r, b, v, true)
	case json.Number:
		b.WriteString(string(v))
	case bool:
		b.WriteString(strconv.FormatBool(v))
	case nil:
		b.WriteString("null")
	default:
		panic(fmt.Sprintf("%T", v))
	}
	space()
}

// writeString writes s as a JSON string, escaping characters at random
// if escape.
func writeString(r *rand.Rand, b *bytes.Buffer, s string, escape bool) {
	b.WriteByte('"')
	for _, c := range s {
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteRune(c)
		case c < 0x20 || escape && r.IntN(20) == 0:
			fmt.Fprintf(b, `\u%04x`, c)
		case c == '/' && r.IntN(2) == 0:
			b.WriteString(`\/`)
		default:
			b.WriteRune(c)
		}
	}
	b.WriteByte('"')
}

// The fast decoder reads Services and EndpointSlices with every field
// translate reads, in any order and spelling JSON allows, as encoding/json
// does, and declines what encoding/json refuses or reads its own way.
func TestFastDecodeMatchesEncodingJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	decoded, declined := 0, 0
	for i := range 4000 {
		js := randObjectJSON(r, i)
		// As encoding/json writes it: always decoded.
		if !checkFastDecode(t, js) {
			t.Fatalf("declined:\n%s", js)
		}
		// Rewritten in other ways JSON allows: decoded unless a key
		// is escaped.
		checkFastDecode(t, rewrite(r, js, false))
		// With what encoding/json refuses or reads its own way.
		if checkFastDecode(t, rewrite(r, js, true)) {
			decoded++
		} else {
			declined++
		}
	}
	t.Logf("wild inputs: %d decoded, %d declined", decoded, declined)
	if decoded < 400 || declined < 400 {
		t.Errorf("wild inputs: %d decoded, %d declined: want many of each", decoded, declined)
	}
}

// FuzzFastDecode: on any bytes, the fast decoder declines or decodes
// as encoding/json does.
func FuzzFastDecode(f *testing.F) {
	r := rand.New(rand.NewPCG(3, 4))
	for i := range 20 {
		f.Add(randObjectJSON(r, i))
	}
	f.Add([]byte(`{"apiVersion":"v1","kind":"Service","metadata":{"name":"a","namespace":"b"},"spec":{"ports":[{"port":80,"targetPort":"x"}]}}`))
	f.Fuzz(func(t *testing.T, js []byte) { checkFastDecode(t, js) })
}

// checkYAMLToJSON converts doc with blockYAMLToJSON and with YAMLToJSON:
// if the first does not decline, the second must succeed and give the
// same JSON tokens (keys in the same order, the same values). It reports
// whether blockYAMLToJSON converted doc.
func checkYAMLToJSON(t *testing.T, doc []byte) bool {
	t.Helper()
	got, ok := blockYAMLToJSON(doc)
	if !ok {
		return false
	}
	want, err := yaml.YAMLToJSON(doc)
	if err != nil {
		t.Fatalf("converted what YAMLToJSON refuses (%v):\n%s", err, doc)
	}
	g, w := jsonTokens(t, got), jsonTokens(t, want)
	if !reflect.DeepEqual(g, w) {
		t.Fatalf("converted\n%s\nto\n%s\nwhere YAMLToJSON gives\n%s", doc, got, want)
	}
	return true
}

func jsonTokens(t *testing.T, js []byte) []json.Token {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	var toks []json.Token
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return toks
		}
		if err != nil {
			t.Fatalf("%v:\n%s", err, js)
		}
		toks = append(toks, tok)
	}
}

func jsonValue(t *testing.T, js []byte) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("%v:\n%s", err, js)
	}
	return v
}

// writeYAML writes v as block YAML in a random style: indentation,
// sequences at or under their key, quoting, comments; if wild, also
// strings unquoted whatever they hold, and YAML that is not plain
// (anchors, flow collections, block scalars, tabs).
func writeYAML(r *rand.Rand, b *bytes.Buffer, v any, indent int, placed, wild bool) {
	pad := func(n int) { b.WriteString(strings.Repeat(" ", n)) }
	comment := func() {
		if r.IntN(15) == 0 {
			b.WriteString(pick(r, " # c", "  #: x"))
		}
		b.WriteByte('\n')
		if r.IntN(20) == 0 {
			pad(r.IntN(6))
			b.WriteString(pick(r, "# a comment\n", "\n"))
		}
	}
	step := pick(r, 2, 4)
	switch v := v.(type) {
	case map[string]any:
		keys := slices.Sorted(maps.Keys(v))
		r.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
		for i, k := range keys {
			if i > 0 || !placed {
				pad(indent)
			}
			b.WriteString(k)
			b.WriteByte(':')
			writeYAMLValue(r, b, v[k], indent, step, wild, true, comment)
		}
	default:
		panic("not a mapping")
	}
}

func writeYAMLValue(r *rand.Rand, b *bytes.Buffer, v any, indent, step int, wild, inMap bool, comment func()) {
	switch v.(type) {
	case map[string]any, []any:
		if r.IntN(4) == 0 {
			b.WriteByte(' ')
			writeFlow(r, b, v, wild)
			comment()
			return
		}
	}
	switch v := v.(type) {
	case map[string]any:
		if len(v) == 0 {
			b.WriteString(" {}")
			comment()
			return
		}
		comment()
		writeYAML(r, b, v, indent+step, false, wild)
	case []any:
		if len(v) == 0 {
			b.WriteString(" []")
			comment()
			return
		}
		comment()
		in := indent + step
		if inMap && r.IntN(2) == 0 {
			in = indent // a sequence at its key's indentation
		}
		for _, e := range v {
			b.WriteString(strings.Repeat(" ", in))
			b.WriteByte('-')
			if m, ok := e.(map[string]any); ok && len(m) > 0 && r.IntN(5) > 0 {
				// A mapping starting on the item's line.
				sp := pick(r, " ", "   ")
				b.WriteString(sp)
				writeYAML(r, b, m, in+1+len(sp), true, wild)
				continue
			}
			writeYAMLValue(r, b, e, in, step, wild, false, comment)
		}
	default:
		b.WriteByte(' ')
		b.WriteString(yamlScalar(r, v, wild))
		comment()
	}
}

// writeFlow writes v in YAML's flow style, on one line.
func writeFlow(r *rand.Rand, b *bytes.Buffer, v any, wild bool) {
	sep := func(i int) {
		if i > 0 {
			b.WriteString(pick(r, ", ", ",", " , "))
		}
	}
	switch v := v.(type) {
	case map[string]any:
		b.WriteString(pick(r, "{", "{ "))
		keys := slices.Sorted(maps.Keys(v))
		r.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
		for i, k := range keys {
			sep(i)
			b.WriteString(k + ": ")
			writeFlow(r, b, v[k], wild)
		}
		b.WriteString(pick(r, "}", " }"))
	case []any:
		b.WriteString(pick(r, "[", "[ "))
		for i, e := range v {
			sep(i)
			writeFlow(r, b, e, wild)
		}
		b.WriteString(pick(r, "]", " ]"))
	default:
		b.WriteString(yamlScalar(r, v, wild))
	}
}

func yamlScalar(r *rand.Rand, v any, wild bool) string {
	if wild && r.IntN(60) == 0 {
		return pick(r, "yes", "On", "~", "0x1F", "012", "1_000", "1.5", ".inf", "+1", "-1", "-0", "&a x", "*a", "!!str x",
			"|\n  text", "{a: b}", "[a, b]", "'it''s'", `"a\tb"`, "a: b", "a #b", "2026-01-01", "1e3", "99999999999999999999", "\tx", "é",
			"0c7f-11", "0b101", "0o17", "12:30", "2001:db8::1", "1.2.3", "1_0", "0x_1F", "1234-5", "10.0.0.0/8", "0.5", "1.")
	}
	switch v := v.(type) {
	case nil:
		return pick(r, "null", "")
	case bool:
		return strconv.FormatBool(v)
	case json.Number:
		return string(v)
	case string:
		switch r.IntN(5) {
		case 0:
			return "'" + strings.ReplaceAll(v, "'", "''") + "'"
		case 1:
			if !strings.ContainsAny(v, "\"\\") {
				return `"` + v + `"`
			}
		}
		if wild || v != "" && !strings.ContainsAny(v, ":#'\"\\") && isLetter(v[0]) && !yaml11Word([]byte(v)) {
			return v
		}
		return "'" + strings.ReplaceAll(v, "'", "''") + "'"
	}
	panic(fmt.Sprintf("%T", v))
}

// blockYAMLToJSON converts Services and EndpointSlices with every field
// translate reads, written in the styles kubectl and people write, as
// YAMLToJSON does, and declines what YAMLToJSON refuses or reads its own
// way. The objects it converts then decode fast as encoding/json decodes
// YAMLToJSON's JSON.
func TestBlockYAMLToJSONMatchesYAMLToJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	converted, declined, wildConverted := 0, 0, 0
	for i := range 3000 {
		js := randObjectJSON(r, i)
		y, err := yaml.JSONToYAML(js)
		if err != nil {
			t.Fatal(err)
		}
		// As sigs.k8s.io/yaml writes it, then in random styles.
		docs := [][]byte{y}
		v := jsonValue(t, js)
		for _, wild := range []bool{false, true} {
			var b bytes.Buffer
			writeYAML(r, &b, v.(map[string]any), 0, false, wild)
			docs = append(docs, b.Bytes())
		}
		for k, doc := range docs {
			ok := checkYAMLToJSON(t, doc)
			// What sigs.k8s.io/yaml writes is converted, unless it
			// holds what the converter leaves to YAMLToJSON.
			if k == 0 && !ok && !bytes.ContainsAny(doc, "éö") && !bytes.Contains(doc, []byte(`a"b`)) {
				t.Fatalf("declined:\n%s", doc)
			}
			switch {
			case ok && k == 2:
				wildConverted++
			case ok:
				converted++
			default:
				declined++
			}
			if js, ok := blockYAMLToJSON(doc); ok {
				checkFastDecode(t, js)
			}
		}
	}
	t.Logf("%d converted, %d declined (%d wild converted)", converted, declined, wildConverted)
	if converted < 3000 || wildConverted < 400 {
		t.Errorf("%d converted, %d wild: want most", converted, wildConverted)
	}
}

// FuzzBlockYAMLToJSON: on any bytes, blockYAMLToJSON declines or gives
// YAMLToJSON's value.
func FuzzBlockYAMLToJSON(f *testing.F) {
	f.Add([]byte(svcA))
	f.Add([]byte(sliceA))
	f.Add([]byte("a:\n- b: 1\n  c:\n  - 10.0.0.1\nd: 'x''y'\n"))
	f.Fuzz(func(t *testing.T, doc []byte) { checkYAMLToJSON(t, doc) })
}

// Every pair of printable ASCII characters, at the start, in the middle
// and at the end of a scalar or key in each place the converter reads
// one (a block value, a sequence item, a flow mapping's value and key, a
// flow sequence's item, quoted or not): it declines or agrees with
// YAMLToJSON. The fuzzer found '?' in a flow scalar (go-yaml ends a plain
// scalar there) only after minutes of CPU; this walks the whole alphabet.
func TestBlockYAMLToJSONEveryCharacterPair(t *testing.T) {
	templates := []string{
		"a: %s\n", "a:\n- %s\n", "a: {b: %s}\n", "a: {b: x, c: %s}\n",
		"a: {%s: x}\n", "a: [%s]\n", "a: [x, %s]\n", "%s: x\n",
		"a: '%s'\n", "a: \"%s\"\n", "a: [\"%s\"]\n", "a: %s # c\n",
	}
	converted := 0
	for c1 := byte(0x20); c1 < 0x7f; c1++ {
		for c2 := byte(0x20); c2 < 0x7f; c2++ {
			pair := string([]byte{c1, c2})
			for _, s := range []string{pair, "x" + pair, pair + "x", "x" + pair + "1", "1" + pair} {
				for _, tmpl := range templates {
					if checkYAMLToJSON(t, []byte(fmt.Sprintf(tmpl, s))) {
						converted++
					}
				}
			}
		}
	}
	t.Logf("%d of %d converted", converted, 95*95*5*len(templates))
	if converted < 95*95*5*len(templates)/4 {
		t.Errorf("only %d converted", converted)
	}
}

// The kind the fast decoder guesses first (kindHint) only steers it: an
// object whose guess is wrong (a "kind" member further in that is not
// its own, a Service of another apiVersion) is decoded as encoding/json
// decodes it, or declined; a List is declined (and not decoded as the
// kind of its first item).
func TestFastDecodeKindGuess(t *testing.T) {
	for _, tc := range []struct {
		js    string
		guess objKind
		want  bool // decoded
	}{
		{`{"endpoints":[{"addresses":["10.0.0.1"],"targetRef":{"kind":"Service","name":"x"}}],"addressType":"IPv4","apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"a"}}`, kindService, true},
		{`{"addressType":"IPv4","apiVersion":"discovery.k8s.io/v1","endpoints":[{"addresses":["10.0.0.1"],"targetRef":{"kind":"Service","name":"x"}}],"kind":"EndpointSlice","metadata":{"name":"a"}}`, kindSlice, true},
		{`{"addressType":"IPv4","apiVersion":"v1","kind":"Service","metadata":{"name":"a"}}`, kindSlice, true},
		{`{"metadata":{"name":"a"},"spec":{"x":{"kind":"EndpointSlice"}},"apiVersion":"v1","kind":"Service"}`, kindSlice, true},
		{`{"addressType":"IPv4","endpoints":[],"kind" : "EndpointSlice","apiVersion":"discovery.k8s.io/v1"}`, kindSlice, true},
		{`{"apiVersion":"serving.knative.dev/v1","kind":"Service","metadata":{"name":"a"}}`, kindService, false},
		{`{"apiVersion":"v1","metadata":{},"items":[{"apiVersion":"v1","kind":"Service","metadata":{"name":"a"}}],"kind":"List"}`, kindService, false},
		{`{"apiVersion":"v1","items":[{"apiVersion":"v1","kind":"Service","metadata":{"name":"a"}}],"kind":"List"}`, 0, false},
		{`{"apiVersion":"v1","kind":"ServiceAccount","metadata":{"name":"a"}}`, 0, false},
	} {
		if got := kindHint([]byte(tc.js)); got != tc.guess {
			t.Errorf("kindHint = %v, want %v: %s", got, tc.guess, tc.js)
		}
		if got := checkFastDecode(t, []byte(tc.js)); got != tc.want {
			t.Errorf("decoded %v, want %v: %s", got, tc.want, tc.js)
		}
	}
}

// stringStops and specials flag the first byte of a word that is not
// plain (plainByte), or that is a quote, a backslash or a bracket, as a
// byte at a time finds it.
func TestWordStops(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	interesting := []byte{0, 0x1f, 0x20, 0x21, '"', '#', '[', '\\', ']', '{', '}', 0x7b, 0x7f, 0x80, 0x81, 0xa0, 0xdb, 0xdf, 0xff, 'a'}
	tests := []struct {
		name string
		word func(uint64) uint64
		stop func(byte) bool
	}{
		{"stringStops", stringStops, func(c byte) bool { return !plainByte[c] }},
		{"specials", specials, func(c byte) bool { return bytes.IndexByte([]byte(`"\\{}[]`), c) >= 0 }},
	}
	var b [8]byte
	for i := range 300000 {
		for k := range b {
			b[k] = 'a'
			if i%3 == 0 {
				b[k] = byte(r.IntN(256))
			} else if r.IntN(8) == 0 {
				b[k] = interesting[r.IntN(len(interesting))]
			}
		}
		for _, tc := range tests {
			want := 8
			for k, c := range b {
				if tc.stop(c) {
					want = k
					break
				}
			}
			m := tc.word(binary.LittleEndian.Uint64(b[:]))
			got := 8
			if m != 0 {
				got = bits.TrailingZeros64(m) >> 3
			}
			if got != want || m&^0x8080808080808080 != 0 {
				t.Fatalf("%s(%q) = %#x: first byte %d, want %d", tc.name, b, m, got, want)
			}
		}
	}
}

// Conditions as encoding/json writes them are read without a call per
// member (compactConditions), as the general path reads them; any other
// form (white space, another order, null, a missing member) is left to
// the general path, which reads it as encoding/json does.
func TestCompactConditions(t *testing.T) {
	forms := []string{
		`{"ready":true,"serving":true,"terminating":false}`,  // compact
		`{"ready":false,"serving":false,"terminating":true}`, // compact
		`{"ready":true,"serving":false,"terminating":false}`, // compact
		`{"ready": true,"serving":true,"terminating":false}`,
		`{"serving":true,"ready":true,"terminating":false}`,
		`{"ready":null,"serving":true,"terminating":false}`,
		`{"ready":true,"serving":true}`,
		`{"ready":true,"serving":true,"terminating":false,"x":1}`,
		`{"ready":true,"serving":true,"terminating":falsey}`,
		`{"ready":true,"serving":true,"terminating":false`,
	}
	for i, form := range forms {
		var d fastDecoder
		d.b = []byte(form)
		var c discoveryv1.EndpointConditions
		if got, want := d.compactConditions(&c), i < 3; got != want || !got && d.i != 0 {
			t.Errorf("%s: compact %v (read to %d), want %v", form, got, d.i, want)
		}
		js := `{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"a"},"addressType":"IPv4","endpoints":[{"addresses":["10.0.0.1"],"conditions":` + form + `}]}`
		if decoded := checkFastDecode(t, []byte(js)); decoded != (i < 8) {
			t.Errorf("%s: decoded %v, want %v", form, decoded, i < 8)
		}
	}
	// Reading them copies nothing of what follows (a conversion of the
	// rest to a string for strings.HasPrefix copied it, and doubled a
	// load's CPU).
	d := fastDecoder{reuse: true, b: append([]byte(forms[0]), make([]byte, 1<<16)...)}
	var c discoveryv1.EndpointConditions
	if allocs := testing.AllocsPerRun(1000, func() {
		d.i = 0
		d.recycle()
		if !d.compactConditions(&c) {
			t.Fatal("not read")
		}
	}); allocs > 0 {
		t.Errorf("%.1f allocations a read, want none", allocs)
	}
}
