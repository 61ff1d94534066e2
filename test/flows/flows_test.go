package flows

import (
	"bytes"
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// flowCounts is what each ported file must hold, as
// testdata/kubeproxy-flows.yaml says: kube-proxy's flows in each mode and
// the corpus's, and their family ("": IPv4).
type flowCounts struct {
	NFTables int             `json:"nftables"`
	IPTables int             `json:"iptables"`
	Corpus   int             `json:"corpus"`
	Family   corev1.IPFamily `json:"family"`
}

// readTestdata returns the content of testdata/name.
func readTestdata(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestCorpus loads the whole corpus (Load validates it) and checks that
// the port of kube-proxy's tables is complete.
func TestCorpus(t *testing.T) {
	var kubeProxyFlows map[string]flowCounts
	if err := yaml.UnmarshalStrict([]byte(readTestdata(t, "kubeproxy-flows.yaml")), &kubeProxyFlows); err != nil {
		t.Fatal(err)
	}
	c, err := Load(".")
	if err != nil {
		t.Fatal(err)
	}
	var nft, ipt, ported int
	portedBy := map[corev1.IPFamily]int{}
	var table strings.Builder
	fmt.Fprintf(&table, "%-48s %6s %6s %6s %6s %6s %6s\n", "file", "flows", "nft", "ipt", "dev", "skip", "derived")
	for _, f := range c.Files() {
		n := c.Count(func(cs *Case) bool { return cs.File == f })
		fmt.Fprintf(&table, "%-48s %6d %6d %6d %6d %6d %6d\n", f, n.Flows, n.NFTables, n.IPTables, n.Deviations, n.Skipped, n.Derived)
		want, ok := kubeProxyFlows[f]
		switch {
		case strings.HasPrefix(f, "kubeproxy/") && !ok:
			t.Errorf("%s: a ported file that kubeProxyFlows does not list", f)
		case ok:
			if n.NFTables != want.NFTables || n.IPTables != want.IPTables || n.Ported != want.Corpus || n.Derived != 0 {
				t.Errorf("%s: %d nftables, %d iptables, %d ported and %d derived flows; want %d, %d, %d and 0",
					f, n.NFTables, n.IPTables, n.Ported, n.Derived, want.NFTables, want.IPTables, want.Corpus)
			}
			family := cmp.Or(want.Family, corev1.IPv4Protocol)
			if other := c.Count(func(cs *Case) bool { return cs.File == f && cs.IPFamily != family }); other.Flows != 0 {
				t.Errorf("%s: %d flows are not %s", f, other.Flows, family)
			}
			nft += want.NFTables
			ipt += want.IPTables
			ported += want.Corpus
			portedBy[family] += want.Corpus
		case n.Ported != 0:
			t.Errorf("%s: %d flows outside kubeproxy/ claim a kube-proxy test", f, n.Ported)
		}
	}
	for f := range kubeProxyFlows {
		if !slices.Contains(c.Files(), f) {
			t.Errorf("%s: missing", f)
		}
	}
	all := c.Count(nil)
	if all.NFTables != nft || all.IPTables != ipt || all.Ported != ported {
		t.Errorf("corpus: %d nftables, %d iptables, %d ported flows; want %d, %d, %d", all.NFTables, all.IPTables, all.Ported, nft, ipt, ported)
	}
	// Per family: the ported flows are the table's; IPv6 has kube-proxy's
	// few IPv6 subtests and the derived twins of the IPv4 cases (issue 10).
	for _, fam := range []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol} {
		n := c.Count(func(cs *Case) bool { return cs.IPFamily == fam })
		if n.Ported != portedBy[fam] {
			t.Errorf("%s: %d ported flows, want %d", fam, n.Ported, portedBy[fam])
		}
		if n.Flows == 0 || n.Flows != all.ByFamily[fam] {
			t.Errorf("%s: %d flows (%d by ByFamily)", fam, n.Flows, all.ByFamily[fam])
		}
		fmt.Fprintf(&table, "%-48s %6d %6d %6d %6d %6d %6d\n", "total "+string(fam), n.Flows, n.NFTables, n.IPTables, n.Deviations, n.Skipped, n.Derived)
	}
	if all.ByFamily[corev1.IPv4Protocol]+all.ByFamily[corev1.IPv6Protocol] != all.Flows {
		t.Errorf("%d flows, %v by family", all.Flows, all.ByFamily)
	}
	// TestCategorizeEndpoints has 32 cases.
	if len(c.Translations) != 32 {
		t.Errorf("%d translation cases, want 32", len(c.Translations))
	}
	fmt.Fprintf(&table, "%-48s %6d %6d %6d %6d %6d %6d\n", "total", all.Flows, all.NFTables, all.IPTables, all.Deviations, all.Skipped, all.Derived)
	t.Logf("flows per file:\n%s\n%d ported flows, %d IPv4 and %d IPv6 (kube-proxy runs %d in nftables mode, %d in iptables mode), %d derived; %d translation cases",
		table.String(), all.Ported, portedBy[corev1.IPv4Protocol], portedBy[corev1.IPv6Protocol], all.NFTables, all.IPTables, all.Derived, len(c.Translations))
}

// TestVariants checks that a variant gets its node settings and its
// overrides, and only those, in kube-proxy's case and in its IPv6 twin.
func TestVariants(t *testing.T) {
	c, err := Load(".")
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*Case{}
	for _, cs := range c.Cases {
		byName[cs.Name] = cs
	}
	for _, tc := range []struct {
		family corev1.IPFamily
		prefix string
		// kubeProxy is kube-proxy's answer to a flow: iptables' in the
		// ported case; in the derived twin, which names no kube-proxy
		// test, the nftables answer beside a deviation, else the
		// expectation.
		kubeProxy func(f *Flow) (Expect, bool)
	}{
		{corev1.IPv4Protocol, "kubeproxy/internal-external-masquerade/InternalExternalMasquerade/",
			func(f *Flow) (Expect, bool) { return f.KubeProxyExpect(ModeIPTables) }},
		{corev1.IPv6Protocol, "extras/v6/internal-external-masquerade/InternalExternalMasquerade/",
			func(f *Flow) (Expect, bool) {
				if f.KubeProxy.NFTables != nil {
					return *f.KubeProxy.NFTables, true
				}
				return f.Expect, f.Deviation == ""
			}},
	} {
		t.Run(string(tc.family), func(t *testing.T) {
			checkVariants(t, byName, tc.prefix, tc.family, tc.kubeProxy)
		})
	}
}

// checkVariants checks the four variants of TestInternalExternalMasquerade
// under prefix, cases of family.
func checkVariants(t *testing.T, byName map[string]*Case, prefix string, family corev1.IPFamily, kubeProxy func(f *Flow) (Expect, bool)) {
	t.Helper()
	flow := func(cs *Case, name string) *Flow {
		t.Helper()
		for _, st := range cs.Steps {
			for _, f := range st.Flows {
				if f.Name == name {
					return f
				}
			}
		}
		t.Fatalf("%s: no flow %q", cs.Name, name)
		return nil
	}
	base, noLD, all := byName[prefix+"base"], byName[prefix+"no LocalTrafficDetector"], byName[prefix+"masqueradeAll"]
	if base == nil || noLD == nil || all == nil {
		t.Fatalf("variants missing: %v %v %v", base, noLD, all)
	}
	for _, cs := range []*Case{base, noLD, all} {
		if cs.IPFamily != family {
			t.Errorf("%s: family %s, want %s", cs.Name, cs.IPFamily, family)
		}
	}
	if !base.Node.ClusterCIDR.IsValid() || base.Node.ClusterCIDR.Addr().Is6() != (family == corev1.IPv6Protocol) ||
		noLD.Node.ClusterCIDR.IsValid() || base.Node.MasqueradeAll || !all.Node.MasqueradeAll {
		t.Errorf("node settings: base %+v, no detector %+v, masqueradeAll %+v", base.Node, noLD.Node, all.Node)
	}
	if got := flow(base, "pod to ClusterIP").Expect.Masquerade; got != MasqueradeNo {
		t.Errorf("base: pod to ClusterIP masquerade %v", got)
	}
	if got := flow(all, "pod to ClusterIP").Expect.Masquerade; got != MasqueradeYes {
		t.Errorf("masqueradeAll: pod to ClusterIP masquerade %v", got)
	}
	if got := flow(noLD, "pod to LB with eTP:Local").Expect.Endpoints; len(got) != 1 {
		t.Errorf("no detector: pod to LB with eTP:Local reaches %v, want the local endpoint only", got)
	}
	// The deviation holds without --masquerade-all and goes with it.
	for cs, want := range map[*Case]bool{base: true, noLD: true, all: false} {
		f := flow(cs, "external to NodePort")
		if (f.Deviation != "") != want || (f.Expect.Masquerade == MasqueradeRemote) != want {
			t.Errorf("%s: external to NodePort: deviation %q, masquerade %v", cs.Name, f.Deviation, f.Expect.Masquerade)
		}
		if kp, ok := kubeProxy(f); !ok || kp.Masquerade != MasqueradeYes {
			t.Errorf("%s: external to NodePort: kube-proxy expects %v (%v), want masqueraded", cs.Name, kp, ok)
		}
	}
	// Flows the variants do not override are the base's.
	if f, g := flow(base, "node to LB"), flow(all, "node to LB"); !f.Expect.Equal(g.Expect) {
		t.Errorf("node to LB: base %v, masqueradeAll %v", f.Expect, g.Expect)
	}
}

// TestSteps checks that each step sees the objects in effect then, and that
// Manifest renders them as YAML that decodes to the same objects, in
// kube-proxy's case and in its IPv6 twin.
func TestSteps(t *testing.T) {
	c, err := Load(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, clusterIP string }{
		{"kubeproxy/internal-traffic-policy/internalTrafficPolicy is cluster", "172.30.1.1"},
		{"extras/v6/internal-traffic-policy/internalTrafficPolicy is cluster", "fd00:172:30::1:1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cs *Case
			for _, x := range c.Cases {
				if x.Name == tc.name {
					cs = x
				}
			}
			if cs == nil || len(cs.Steps) != 2 {
				t.Fatalf("case: %+v", cs)
			}
			checkSteps(t, cs, tc.clusterIP)
		})
	}
	// A step without objects (every one deleted) must not be an empty
	// file, which the agent takes for one caught mid-write: only white
	// space means that (pkg/source/manifest).
	if m, err := Manifest(nil); err != nil || len(bytes.TrimSpace(m)) == 0 {
		t.Errorf("manifest of no objects %q (%v): want a comment", m, err)
	}
}

// checkSteps checks the two steps of an "internalTrafficPolicy is cluster"
// case: the Service svc1 at clusterIP and its slice, then the Service alone.
func checkSteps(t *testing.T, cs *Case, clusterIP string) {
	t.Helper()
	kinds := func(objs []Object) (k []string) {
		for _, o := range objs {
			k = append(k, o.Ref().Kind)
		}
		return k
	}
	if got := kinds(cs.Steps[0].Objects()); !slices.Equal(got, []string{"Service", "EndpointSlice"}) {
		t.Errorf("step 1 objects: %v", got)
	}
	if got := kinds(cs.Steps[1].Objects()); !slices.Equal(got, []string{"Service"}) {
		t.Errorf("step 2 objects: %v", got)
	}
	m, err := Manifest(cs.Steps[0].Objects())
	if err != nil {
		t.Fatal(err)
	}
	docs := bytes.Split(m, []byte("---\n"))
	if len(docs) != 2 {
		t.Fatalf("manifest has %d documents:\n%s", len(docs), m)
	}
	var svc corev1.Service
	if err := yaml.UnmarshalStrict(docs[0], &svc); err != nil {
		t.Fatal(err)
	}
	if svc.Spec.ClusterIP != clusterIP || svc.Name != "svc1" {
		t.Errorf("manifest Service: %+v", svc)
	}
}

func TestAffinityTimeout(t *testing.T) {
	var svc corev1.Service
	if got := AffinityTimeout(&svc); got.Seconds() != 10800 {
		t.Errorf("default: %v", got)
	}
	if err := yaml.Unmarshal([]byte(`{spec: {sessionAffinityConfig: {clientIP: {timeoutSeconds: 2}}}}`), &svc); err != nil {
		t.Fatal(err)
	}
	if got := AffinityTimeout(&svc); got.Seconds() != 2 {
		t.Errorf("2 s: %v", got)
	}
}

// TestAffinityTimeoutTwins checks that each session affinity case's IPv6
// twin gives its Services the timeouts the IPv4 case does (the runner
// waits them out), and that one of them is not the default.
func TestAffinityTimeoutTwins(t *testing.T) {
	c, err := Load(".")
	if err != nil {
		t.Fatal(err)
	}
	timeouts := map[string]map[string]string{} // file -> case/step/Service -> timeout
	for _, cs := range c.Cases {
		if cs.File != "extras/session-affinity.yaml" && cs.File != "extras/v6/session-affinity.yaml" {
			continue
		}
		_, name, _ := strings.Cut(strings.TrimPrefix(cs.Name, "extras/"), "session-affinity/")
		for i, st := range cs.Steps {
			for _, o := range st.Objects() {
				if o.Service != nil {
					if timeouts[cs.File] == nil {
						timeouts[cs.File] = map[string]string{}
					}
					timeouts[cs.File][fmt.Sprintf("%s/%d/%s", name, i, o.Service.Name)] = AffinityTimeout(o.Service).String()
				}
			}
		}
	}
	v4, v6 := timeouts["extras/session-affinity.yaml"], timeouts["extras/v6/session-affinity.yaml"]
	if len(v4) == 0 || fmt.Sprint(v4) != fmt.Sprint(v6) {
		t.Errorf("session affinity timeouts by case, step and Service:\nIPv4 %v\nIPv6 %v", v4, v6)
	}
	if !slices.ContainsFunc(slices.Collect(maps.Values(v4)), func(d string) bool { return d != "3h0m0s" }) {
		t.Errorf("no session affinity case has a timeout of its own: %v", v4)
	}
}

func TestParseAddrSloppy(t *testing.T) {
	for in, want := range map[string]string{"172.30.0.041": "172.30.0.41", "10.180.00.001": "10.180.0.1", "fd00::1": "fd00::1"} {
		got, err := parseAddr(in)
		if err != nil || got != netip.MustParseAddr(want) {
			t.Errorf("parseAddr(%q) = %v, %v; want %s", in, got, err, want)
		}
	}
	for _, in := range []string{"1.2.3", "1.2.3.256", "bogus", ""} {
		if _, err := parseAddr(in); err == nil {
			t.Errorf("parseAddr(%q) succeeded", in)
		}
	}
}

// TestRejects checks that Load refuses what a runner could not trust.
func TestRejects(t *testing.T) {
	validCase := readTestdata(t, "valid-case.yaml")
	load := func(doc string) error {
		_, err := LoadFS(fstest.MapFS{"x.yaml": {Data: []byte(doc)}})
		return err
	}
	if err := load(validCase); err != nil {
		t.Fatalf("the valid case: %v", err)
	}
	for _, tc := range []struct {
		name, old, new, want string
	}{
		{"unknown field", "    destination: {ip: 172.30.0.41, port: 80}", "    destination: {ip: 172.30.0.41, port: 80}\n    colour: red", "unknown field"},
		{"unknown object field", "      clusterIP: 172.30.0.41", "      clusterIP: 172.30.0.41\n      clusterIp: 172.30.0.41", "unknown field"},
		{"field name in the wrong case", "    expect: {endpoints: [10.180.0.1:80, 10.180.2.1:80], masquerade: false}", "    Expect: {endpoints: [10.180.0.1:80, 10.180.2.1:80], masquerade: false}", "unknown field"},
		{"not a Service", "kind: Service", "kind: Pod", "want a v1 Service"},
		{"endpoint not in the slices", "[10.180.0.1:80, 10.180.2.1:80], masquerade: false}", "[10.180.0.9:80, 10.180.2.1:80], masquerade: false}", "10.180.0.9:80 is not an endpoint"},
		{"wrong endpoint port", "[10.180.0.1:80, 10.180.2.1:80], masquerade: false}", "[10.180.0.1:8080, 10.180.2.1:80], masquerade: false}", "10.180.0.1:8080 is not an endpoint"},
		{"no Service at the destination", "destination: {ip: 172.30.0.41, port: 80}", "destination: {ip: 172.30.0.41, port: 81}", "no Service serves"},
		{"duplicate flow name", "name: external to NodePort", "name: pod to ClusterIP", "name used twice"},
		{"masquerade missing", "10.180.2.1:80], masquerade: false}", "10.180.2.1:80]}", "masquerade is required"},
		{"deviation without kube-proxy's answer", "    kubeProxy: {nftables: {endpoints: [10.180.0.1:80, 10.180.2.1:80], masquerade: true}}\n", "", "deviation given but the expectation is kube-proxy's own"},
		{"kube-proxy's answer without deviation", "    deviation: keeps the client\n", "", "no deviation is given"},
		{"placement disagrees with nodeName", "10.180.0.1: local,", "10.180.0.1: remote,", "placed remote but its nodeName"},
		{"endpoint without placement", "{10.180.0.1: local, 10.180.2.1: remote}", "{10.180.0.1: local}", "has no placement"},
		{"external source is a pod", "ip: 203.0.113.2}", "ip: 10.0.0.7}", "external source 10.0.0.7"},
		{"node source is not the node's", "source: {kind: pod, ip: 10.0.0.2}", "source: {kind: node, ip: 192.168.0.9}", "not one of the node's addresses"},
		{"untouched without a sink", "expect: {endpoints: [10.180.0.1:80, 10.180.2.1:80], masquerade: false}", "expect: {verdict: UNTOUCHED}", "needs a sink"},
		{"verdict and endpoints", "masquerade: false}", "masquerade: false, verdict: DROP}", "exactly one of endpoints and verdict"},
		{"remote masquerade with one side only", "[10.180.0.1:80, 10.180.2.1:80], masquerade: remote}", "[10.180.0.1:80], masquerade: remote}", "needs endpoints both local and remote"},
		{"IPv6 in an IPv4 case", "ip: 10.0.0.2}", "ip: \"fd00::2\"}", "not a IPv4 address"},
		{"duplicate key", "    deviation: keeps the client\n", "    deviation: keeps the client\n    deviation: twice\n", "already"},
		{"kube-proxy mode the case lacks", "kubeProxy: {nftables: {", "kubeProxy: {modes: [iptables], iptables: {", "kubeProxy mode \"iptables\" is not among the case's"},
		{"slice of a missing Service", "kubernetes.io/service-name: svc1}", "kubernetes.io/service-name: svc9}", "names Service \"svc9\""},
		{"no kube-proxy origin and not derived", "  kubeProxy: [{file: pkg/proxy/nftables/proxier_test.go, test: TestX}]\n", "", "exactly one of kubeProxy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(validCase, tc.old) {
				t.Fatalf("the valid case has no %q", tc.old)
			}
			err := load(strings.Replace(validCase, tc.old, tc.new, 1))
			if tc.want == "" {
				if err != nil {
					t.Fatalf("rejected: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
		})
	}

	// Variants: an override must name a flow and change something.
	variant := validCase + `  variants:
  - name: v
    overrides:
      nothing: {expect: {verdict: DROP}}
`
	if err := load(variant); err == nil || !strings.Contains(err.Error(), `override of "nothing" names no flow`) {
		t.Errorf("override of a missing flow: %v", err)
	}
	variant = validCase + `  variants:
  - name: v
    overrides:
      pod to ClusterIP: {expect: {endpoints: [10.180.0.1:80, 10.180.2.1:80], masquerade: false}}
`
	if err := load(variant); err == nil || !strings.Contains(err.Error(), "expects what the flow already does") {
		t.Errorf("override that changes nothing: %v", err)
	}
}
