package deploy_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

var chartDir = filepath.Join("helm", "sluice")

// object is one decoded document: its kind and name, and the raw JSON to
// decode it further.
type object struct {
	Kind, Name string
	Raw        []byte
}

func decodeObjects(t *testing.T, b []byte) []object {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	var objs []object
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); errors.Is(err, io.EOF) {
			return objs
		} else if err != nil {
			t.Fatal(err)
		}
		if len(raw) == 0 || string(raw) == "null" {
			continue
		}
		var meta struct {
			Kind     string
			Metadata struct{ Name string }
		}
		mustJSON(t, raw, &meta)
		objs = append(objs, object{meta.Kind, meta.Metadata.Name, raw})
	}
}

func daemonSet(t *testing.T, o object) *appsv1.DaemonSet {
	t.Helper()
	var ds appsv1.DaemonSet
	mustJSON(t, o.Raw, &ds)
	return &ds
}

// render runs helm template on the chart with the given --set values and
// returns the ConfigMap and the DaemonSet.
func render(t *testing.T, sets ...string) (*corev1.ConfigMap, *appsv1.DaemonSet) {
	t.Helper()
	args := []string{"template", "sluice", chartDir, "--namespace", "kube-system"}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	var cm *corev1.ConfigMap
	var ds *appsv1.DaemonSet
	for _, o := range decodeObjects(t, run(t, ".", helm(t), args...)) {
		switch o.Kind {
		case "ConfigMap":
			cm = new(corev1.ConfigMap)
			mustJSON(t, o.Raw, cm)
		case "DaemonSet":
			ds = daemonSet(t, o)
		}
	}
	if cm == nil || ds == nil {
		t.Fatalf("helm template %q gave no ConfigMap or no DaemonSet", sets)
	}
	return cm, ds
}

// deploy/sluice.yaml is the chart rendered with its defaults, byte for
// byte: neither can drift from the other.
func TestManifestIsTheRenderedChart(t *testing.T) {
	helm(t) // build it first, outside the script's output
	want := run(t, ".", "bash", filepath.Join("tools", "manifests.sh"))
	got := mustRead(t, "sluice.yaml")
	if !bytes.Equal(got, want) {
		gl, wl := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
		for i := range max(len(gl), len(wl)) {
			g, w := lineAt(gl, i), lineAt(wl, i)
			if g != w {
				t.Fatalf("deploy/sluice.yaml differs from the rendered chart at line %d:\n  file:  %q\n  chart: %q\nrun `make manifests` and commit", i+1, g, w)
			}
		}
	}
}

func lineAt(lines []string, i int) string {
	if i < len(lines) {
		return lines[i]
	}
	return "<end of file>"
}

// helm lint --strict passes with the one required value set; without it
// helm template (and so helm install) refuses, saying what to set, and
// helm lint warns.
func TestChartLintsAndRequiresTheAPIServer(t *testing.T) {
	h := helm(t)
	out := run(t, ".", h, "lint", "--strict", chartDir, "--set", "apiServer.host=10.0.0.10")
	t.Logf("%s", out)
	out, err := exec.CommandContext(t.Context(), h, "template", "sluice", chartDir).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "apiServer.host: set the API server's real address") {
		t.Errorf("helm template without apiServer.host: %v\n%s", err, out)
	}
	out, _ = exec.CommandContext(t.Context(), h, "lint", chartDir).CombinedOutput()
	if !strings.Contains(string(out), "apiServer.host") {
		t.Errorf("helm lint without apiServer.host does not mention it:\n%s", out)
	}
}

// The pod template carries the SHA-256 of the ConfigMap's data (as JSON,
// keys sorted), so a config change, and only a config change, rolls the
// pods; agent flags given as values reach the command line through the
// ConfigMap.
func TestChartConfigChecksumAndFlags(t *testing.T) {
	cm, ds := render(t, "apiServer.host=api.example.test")
	sum := func(cm *corev1.ConfigMap) string {
		b, err := json.Marshal(cm.Data)
		if err != nil {
			t.Fatal(err)
		}
		s := sha256.Sum256(b)
		return hex.EncodeToString(s[:])
	}
	ann := ds.Spec.Template.Annotations["checksum/config"]
	if ann != sum(cm) {
		t.Errorf("checksum/config %s, the ConfigMap's data hashes to %s", ann, sum(cm))
	}
	if cm.Data["KUBERNETES_SERVICE_HOST"] != "api.example.test" || cm.Data["KUBERNETES_SERVICE_PORT"] != "6443" {
		t.Errorf("ConfigMap data %v", cm.Data)
	}

	cm2, ds2 := render(t, "apiServer.host=api.example.test", "config.xdp=generic", "config.devices=eth0\\,eth1")
	ann2 := ds2.Spec.Template.Annotations["checksum/config"]
	if ann2 == ann || ann2 != sum(cm2) {
		t.Errorf("after a config change checksum/config %s (was %s), data hashes to %s", ann2, ann, sum(cm2))
	}
	if cm2.Data["xdp"] != "generic" || cm2.Data["devices"] != "eth0,eth1" {
		t.Errorf("ConfigMap data %v", cm2.Data)
	}
	c := ds2.Spec.Template.Spec.Containers[0]
	for _, want := range []string{"--xdp=$(SLUICE_XDP)", "--devices=$(SLUICE_DEVICES)"} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("args %q lack %s", c.Args, want)
		}
	}

	_, ds3 := render(t, "apiServer.host=api.example.test", "resources.limits.memory=2Gi")
	if ds3.Spec.Template.Annotations["checksum/config"] != ann {
		t.Error("a change outside the ConfigMap changed checksum/config")
	}
}

// Every flag the DaemonSet passes is one the agent has (a misspelt flag
// would crash-loop every node), and every $(VAR) in its arguments names a
// variable the container defines (the kubelet leaves unknown ones as is).
func TestDaemonSetPassesOnlyRealFlags(t *testing.T) {
	help, err := exec.CommandContext(t.Context(), buildSluice(t), "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("sluice --help: %v\n%s", err, help)
	}
	text := string(help)
	flags := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`).FindAllStringSubmatch(text, -1) {
		flags[m[1]] = true
	}
	if !flags["in-cluster"] || !flags["manifests"] {
		t.Fatalf("could not read the flags from sluice --help:\n%s", text)
	}

	var values struct{ Config map[string]any }
	readYAML(t, filepath.Join(chartDir, "values.yaml"), &values)
	sets := []string{"apiServer.host=10.0.0.10"}
	for f := range values.Config {
		if !flags[f] {
			t.Errorf("values.yaml config.%s is not a flag of sluice", f)
		}
	}
	// The flags an operator is most likely to set, through values.
	for _, f := range []string{"devices", "xdp", "proxy-name", "kube-api-qps", "max-conntrack"} {
		sets = append(sets, fmt.Sprintf("config.%s=x", f))
	}
	for _, ds := range []*appsv1.DaemonSet{daemonSetOf(t, mustRead(t, "sluice.yaml")), func() *appsv1.DaemonSet { _, ds := render(t, sets...); return ds }()} {
		c := ds.Spec.Template.Spec.Containers[0]
		env := map[string]bool{}
		for _, e := range c.Env {
			env[e.Name] = true
		}
		for _, a := range c.Args {
			name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
			if !strings.HasPrefix(a, "--") || !flags[name] {
				t.Errorf("argument %q is not a flag of sluice", a)
			}
			for _, m := range regexp.MustCompile(`\$\(([A-Z0-9_]+)\)`).FindAllStringSubmatch(a, -1) {
				if !env[m[1]] {
					t.Errorf("argument %q refers to $(%s), which the container does not define", a, m[1])
				}
			}
		}
	}
}

func daemonSetOf(t *testing.T, b []byte) *appsv1.DaemonSet {
	t.Helper()
	for _, o := range decodeObjects(t, b) {
		if o.Kind == "DaemonSet" {
			return daemonSet(t, o)
		}
	}
	t.Fatal("no DaemonSet")
	return nil
}

// What the DaemonSet must hold to bootstrap a node without kube-proxy, and
// to be a good node agent, as kube-proxy's and Cilium's DaemonSets are.
func TestDaemonSetBootstrapsWithoutKubeProxy(t *testing.T) {
	ds := daemonSetOf(t, mustRead(t, "sluice.yaml"))
	spec := ds.Spec.Template.Spec
	if spec.DNSPolicy != corev1.DNSDefault {
		t.Errorf("dnsPolicy %q: a host name for the API server must resolve through the node's resolver, not cluster DNS (a ClusterIP only Sluice translates)", spec.DNSPolicy)
	}
	if spec.NodeSelector["kubernetes.io/os"] != "linux" {
		t.Errorf("nodeSelector %v", spec.NodeSelector)
	}
	if ds.Spec.UpdateStrategy.Type != appsv1.RollingUpdateDaemonSetStrategyType ||
		ds.Spec.UpdateStrategy.RollingUpdate == nil || ds.Spec.UpdateStrategy.RollingUpdate.MaxUnavailable.String() != "1" {
		t.Errorf("update strategy %+v, want a rolling update of one node at a time", ds.Spec.UpdateStrategy)
	}
	if _, ok := ds.Spec.Template.Annotations["checksum/config"]; !ok {
		t.Error("no checksum/config annotation")
	}
	c := spec.Containers[0]
	fromConfigMap := map[string]bool{}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil {
			fromConfigMap[e.Name] = true
		}
	}
	if !fromConfigMap["KUBERNETES_SERVICE_HOST"] || !fromConfigMap["KUBERNETES_SERVICE_PORT"] {
		t.Error("KUBERNETES_SERVICE_HOST/PORT are not overridden from the ConfigMap")
	}
	if strings.HasSuffix(c.Image, ":latest") || !strings.Contains(c.Image, ":") {
		t.Errorf("image %q is not a versioned tag", c.Image)
	}
	if c.Resources.Limits.Memory().IsZero() || c.Resources.Requests.Memory().IsZero() {
		t.Errorf("resources %v: want memory requests and limits", c.Resources)
	}
	var cmData map[string]string
	for _, o := range decodeObjects(t, mustRead(t, "sluice.yaml")) {
		if o.Kind == "ConfigMap" {
			var cm corev1.ConfigMap
			mustJSON(t, o.Raw, &cm)
			cmData = cm.Data
		}
	}
	if cmData["KUBERNETES_SERVICE_HOST"] != "API_SERVER_HOST" {
		t.Errorf("the ConfigMap's API server %q: want the placeholder the header tells to replace", cmData["KUBERNETES_SERVICE_HOST"])
	}
}

// Metrics stay on the node by default (kube-proxy's 127.0.0.1:10249), with
// no scrape annotations that could not be honoured; "node" binds the
// node's address and announces it; health stays on every address, where
// load balancers probe it.
func TestMetricsBindAddress(t *testing.T) {
	argOf := func(ds *appsv1.DaemonSet, flag string) string {
		for _, a := range ds.Spec.Template.Spec.Containers[0].Args {
			if v, ok := strings.CutPrefix(a, "--"+flag+"="); ok {
				return v
			}
		}
		return ""
	}
	for _, c := range []struct {
		sets           []string
		addr, scrapeOn string
	}{
		{nil, "127.0.0.1:10249", ""},
		{[]string{"metricsBindAddress=node"}, "[$(NODE_IP)]:10249", "10249"},
		{[]string{"metricsBindAddress=0.0.0.0", "ports.metrics=9249"}, "0.0.0.0:9249", "9249"},
		{[]string{"metricsBindAddress=::"}, "[::]:10249", "10249"},
		{[]string{"metricsBindAddress=::1"}, "[::1]:10249", ""},
		// In brackets, as kube-proxy's configuration writes an IPv6
		// host: bracketed once, and still the loopback (no scraping).
		{[]string{"metricsBindAddress=[::1]"}, "[::1]:10249", ""},
		{[]string{"metricsBindAddress=[::]"}, "[::]:10249", "10249"},
	} {
		_, ds := render(t, append([]string{"apiServer.host=10.0.0.10"}, c.sets...)...)
		if got := argOf(ds, "metrics-addr"); got != c.addr {
			t.Errorf("%v: --metrics-addr=%s, want %s", c.sets, got, c.addr)
		}
		if got := argOf(ds, "health-addr"); got != ":10256" {
			t.Errorf("%v: --health-addr=%s, want :10256 (every address)", c.sets, got)
		}
		ann := ds.Spec.Template.Annotations
		if ann["prometheus.io/port"] != c.scrapeOn || (ann["prometheus.io/scrape"] == "true") != (c.scrapeOn != "") {
			t.Errorf("%v: scrape annotations %q %q, want port %q", c.sets, ann["prometheus.io/scrape"], ann["prometheus.io/port"], c.scrapeOn)
		}
	}
	if got := argOf(daemonSetOf(t, mustRead(t, "sluice.yaml")), "metrics-addr"); got != "127.0.0.1:10249" {
		t.Errorf("sluice.yaml: --metrics-addr=%s", got)
	}

	// "node" on a node of either family: the address the kubelet puts in
	// $(NODE_IP) must come out of Go's host:port parsing whole (an IPv6
	// one unbracketed is "too many colons", and the agent would exit).
	_, ds := render(t, "apiServer.host=10.0.0.10", "metricsBindAddress=node")
	for _, ip := range []string{"192.168.1.10", "2001:db8::10"} {
		addr := strings.ReplaceAll(argOf(ds, "metrics-addr"), "$(NODE_IP)", ip)
		host, port, err := net.SplitHostPort(addr)
		if err != nil || host != ip || port != "10249" {
			t.Errorf("node IP %s: --metrics-addr=%s splits into %q %q, %v", ip, addr, host, port, err)
		}
	}
}

// The kubelet's probes: readiness on /readyz; startup and liveness on
// /livez, never /healthz, which fails on purpose while the Node is being
// deleted or tainted ToBeDeletedByClusterAutoscaler (KEP-3836): a
// liveness probe there would have the kubelet kill the agent during a
// drain. The startup probe's budget covers the NodeCIDR wait (5 minutes)
// before the health server listens.
func TestProbes(t *testing.T) {
	_, rendered := render(t, "apiServer.host=10.0.0.10")
	for name, ds := range map[string]*appsv1.DaemonSet{"sluice.yaml": daemonSetOf(t, mustRead(t, "sluice.yaml")), "the chart": rendered} {
		c := ds.Spec.Template.Spec.Containers[0]
		for _, p := range []struct {
			probe *corev1.Probe
			kind  string
			path  string
		}{
			{c.ReadinessProbe, "readiness", "/readyz"},
			{c.StartupProbe, "startup", "/livez"},
			{c.LivenessProbe, "liveness", "/livez"},
		} {
			if p.probe == nil || p.probe.HTTPGet == nil {
				t.Errorf("%s: no HTTP %s probe", name, p.kind)
				continue
			}
			if g := p.probe.HTTPGet; g.Path != p.path || g.Port.IntValue() != 10256 {
				t.Errorf("%s: %s probe on %s port %s, want %s port 10256", name, p.kind, g.Path, g.Port.String(), p.path)
			}
		}
		// The kubelet probes first initialDelaySeconds after the start,
		// then every periodSeconds, and restarts the container at the
		// failureThreshold-th failure in a row: (threshold-1) periods
		// after the first probe, not threshold periods.
		if s := c.StartupProbe; s != nil {
			if gaveUp := s.InitialDelaySeconds + (s.FailureThreshold-1)*s.PeriodSeconds; gaveUp <= 300 {
				t.Errorf("%s: the startup probe's last failure lands %d s after the start, within the 300 s NodeCIDR wait", name, gaveUp)
			}
		}
	}
}

// TestNodeByNodeSelector: deploy/README.md's node-by-node migration
// installs the chart with one more nodeSelector label; the chart must
// keep its default (Linux nodes) beside it, not replace it.
func TestNodeByNodeSelector(t *testing.T) {
	_, ds := render(t, "apiServer.host=10.0.0.10", `nodeSelector.sluice-lb\.io/proxy=sluice`)
	want := map[string]string{"kubernetes.io/os": "linux", "sluice-lb.io/proxy": "sluice"}
	if got := ds.Spec.Template.Spec.NodeSelector; !maps.Equal(got, want) {
		t.Errorf("nodeSelector %v, want %v", got, want)
	}
}

// podLabels reach the pod template, never the selector: monitoring that
// finds kube-proxy by its label (kube-prometheus-stack's k8s-app:
// kube-proxy) finds Sluice's pods, and the DaemonSet's own label stays.
func TestPodLabels(t *testing.T) {
	_, ds := render(t, "apiServer.host=10.0.0.10", "podLabels.k8s-app=kube-proxy", `podLabels.app\.kubernetes\.io/name=other`)
	want := map[string]string{"k8s-app": "kube-proxy", "app.kubernetes.io/name": "sluice"}
	if got := ds.Spec.Template.Labels; !maps.Equal(got, want) {
		t.Errorf("pod template labels %v, want %v", got, want)
	}
	if got, want := ds.Spec.Selector.MatchLabels, map[string]string{"app.kubernetes.io/name": "sluice"}; !maps.Equal(got, want) {
		t.Errorf("selector %v, want %v", got, want)
	}
	_, ds = render(t, "apiServer.host=10.0.0.10")
	if got, want := ds.Spec.Template.Labels, map[string]string{"app.kubernetes.io/name": "sluice"}; !maps.Equal(got, want) {
		t.Errorf("pod template labels by default %v, want %v", got, want)
	}
}

// TestChartSELinuxType: the agent runs as spc_t (values seLinuxOptions),
// which an enforcing node needs for it to write the host's bpffs, cgroup
// and /proc/sys/net, and null leaves the runtime's default label.
func TestChartSELinuxType(t *testing.T) {
	_, ds := render(t, "apiServer.host=10.0.0.10")
	sc := ds.Spec.Template.Spec.Containers[0].SecurityContext
	if sc == nil || sc.SELinuxOptions == nil || sc.SELinuxOptions.Type != "spc_t" || sc.SELinuxOptions.Level != "s0" {
		t.Errorf("default securityContext %+v, want seLinuxOptions type spc_t, level s0", sc)
	}
	_, ds = render(t, "apiServer.host=10.0.0.10", "seLinuxOptions=null")
	if sc := ds.Spec.Template.Spec.Containers[0].SecurityContext; sc == nil || sc.SELinuxOptions != nil {
		t.Errorf("seLinuxOptions unset: securityContext %+v, want no seLinuxOptions", sc)
	}
}
