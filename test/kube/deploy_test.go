package kube

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/sluice-lb/sluice/test/kube/kubeenv"
)

// deployObjects reads every object of deploy/*.yaml.
func deployObjects(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "..", "deploy", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no deploy/*.yaml (%v)", err)
	}
	var objs []*unstructured.Unstructured
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, decodeObjects(t, f, b)...)
	}
	return objs
}

func decodeObjects(t *testing.T, what string, b []byte) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	for {
		var u unstructured.Unstructured
		if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if len(u.Object) == 0 {
			continue
		}
		objs = append(objs, &u)
	}
	return objs
}

// apply creates (or with dryRun, validates creating) objs on the apiserver
// as it would for kubectl apply --server-side: every field is checked
// against the schema, unknown fields are errors, and admission runs.
func apply(t *testing.T, cfg *rest.Config, objs []*unstructured.Unstructured, dryRun bool) {
	t.Helper()
	for _, err := range tryApply(t, cfg, objs, dryRun) {
		t.Error(err)
	}
}

func tryApply(t *testing.T, cfg *rest.Config, objs []*unstructured.Unstructured, dryRun bool) (errs []error) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	disco := kubeenv.Discovery(t, cfg)
	groups, err := restmapper.GetAPIGroupResources(disco)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDiscoveryRESTMapper(groups)
	opts := metav1.PatchOptions{FieldManager: "sluice-test", FieldValidation: "Strict", Force: new(true)}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	for _, u := range objs {
		gvk := u.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %w", gvk, u.GetName(), err))
			continue
		}
		body, err := u.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == "namespace" {
			ri = dyn.Resource(m.Resource).Namespace(u.GetNamespace())
		}
		if _, err := ri.Patch(context.Background(), u.GetName(), "application/apply-patch+yaml", body, opts); err != nil {
			errs = append(errs, fmt.Errorf("apply %s %s/%s: %w", gvk.Kind, u.GetNamespace(), u.GetName(), err))
		}
	}
	return errs
}

// The manifests are valid for the real apiserver: a server-side dry run
// with strict field validation and admission (the priority class must
// exist, the DaemonSet must pass its validation).
func TestDeployManifestsServerSideDryRun(t *testing.T) {
	env := startEnv(t)
	objs := deployObjects(t)
	var kinds []string
	for _, u := range objs {
		kinds = append(kinds, u.GetKind())
	}
	for _, k := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet"} {
		if !slices.Contains(kinds, k) {
			t.Errorf("deploy/ has no %s (has %v)", k, kinds)
		}
	}
	apply(t, env.Config, objs, true)

	// The dry run does catch schema errors: a misspelt field and a bad
	// capability type fail.
	for _, u := range objs {
		if u.GetKind() != "DaemonSet" {
			continue
		}
		bad := u.DeepCopy()
		if err := unstructured.SetNestedField(bad.Object, true, "spec", "template", "spec", "hostNetwrk"); err != nil {
			t.Fatal(err)
		}
		if errs := tryApply(t, env.Config, []*unstructured.Unstructured{bad}, true); len(errs) == 0 {
			t.Error("a DaemonSet with an unknown field passed the dry run")
		} else {
			t.Logf("misspelt field rejected: %v", errs[0])
		}
	}

	// Dry run means nothing was stored.
	if _, err := env.Client.AppsV1().DaemonSets("kube-system").Get(context.Background(), "sluice", metav1.GetOptions{}); err == nil {
		t.Error("a dry run stored the DaemonSet")
	}
}

// renderChart runs helm template on deploy/helm/sluice (building the
// pinned helm the first time on a machine) and returns its objects.
func renderChart(t *testing.T, release, namespace string, sets ...string) []*unstructured.Unstructured {
	t.Helper()
	script := filepath.Join("..", "..", "deploy", "tools", "helm.sh")
	out, err := exec.Command("bash", script).Output()
	if err != nil {
		t.Fatalf("%s: %v", script, err)
	}
	args := []string{"template", release, filepath.Join("..", "..", "deploy", "helm", "sluice"), "--namespace", namespace}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	cmd := exec.Command(strings.TrimSpace(string(out)), args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	rendered, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return decodeObjects(t, "helm template", rendered)
}

// The chart rendered with other values than deploy/sluice.yaml's (another
// release and namespace, agent flags as values, other resources) is valid
// for the real apiserver too: a server-side dry run, as for deploy/.
func TestChartServerSideDryRun(t *testing.T) {
	env := startEnv(t)
	if _, err := env.Client.CoreV1().Namespaces().Create(context.Background(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "edge-system"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct {
		release, namespace string
		sets               []string
	}{
		{"sluice", "kube-system", []string{"apiServer.host=10.0.0.10"}},
		{"edge", "edge-system", []string{"apiServer.host=api.example.test", "apiServer.port=443",
			"config.xdp=generic", "config.devices=eth0", "config.max-backends=524288",
			"resources.limits.memory=2Gi", "hostPaths.cgroup=/sys/fs/cgroup/unified", "image.tag=0.1.0-rc1"}},
	} {
		objs := renderChart(t, r.release, r.namespace, r.sets...)
		var kinds []string
		for _, u := range objs {
			kinds = append(kinds, u.GetKind())
			if ns := u.GetNamespace(); ns != "" && ns != r.namespace {
				t.Errorf("%s %s rendered into namespace %s, want %s", u.GetKind(), u.GetName(), ns, r.namespace)
			}
		}
		if len(objs) != 5 {
			t.Errorf("release %s: rendered %v, want the five objects of deploy/", r.release, kinds)
		}
		apply(t, env.Config, objs, true)
	}
}

// The DaemonSet asks for what a node proxy needs and no more.
func TestDeployDaemonSetShape(t *testing.T) {
	var ds appsv1.DaemonSet
	for _, u := range deployObjects(t) {
		if u.GetKind() == "DaemonSet" {
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &ds); err != nil {
				t.Fatal(err)
			}
		}
	}
	spec := ds.Spec.Template.Spec
	if !spec.HostNetwork {
		t.Error("not hostNetwork")
	}
	if spec.PriorityClassName != "system-node-critical" {
		t.Errorf("priorityClassName = %q", spec.PriorityClassName)
	}
	if !slices.ContainsFunc(spec.Tolerations, func(tol corev1.Toleration) bool {
		return tol.Operator == corev1.TolerationOpExists && tol.Key == "" && tol.Effect == ""
	}) {
		t.Errorf("does not tolerate every taint: %v", spec.Tolerations)
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers", len(spec.Containers))
	}
	c := spec.Containers[0]
	sc := c.SecurityContext
	if sc == nil || sc.Privileged == nil || *sc.Privileged {
		t.Error("container is (or may be) privileged; capabilities should do")
	}
	if sc != nil && sc.Capabilities != nil {
		for _, cap := range []corev1.Capability{"BPF", "NET_ADMIN", "SYS_ADMIN", "PERFMON"} {
			if !slices.Contains(sc.Capabilities.Add, cap) {
				t.Errorf("capability %s not added", cap)
			}
		}
		// BPF memory is charged to the memory cgroup (5.11+), and the
		// agent never raises RLIMIT_MEMLOCK.
		if slices.Contains(sc.Capabilities.Add, "SYS_RESOURCE") {
			t.Error("SYS_RESOURCE added: nothing uses it")
		}
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Error("no /readyz readiness probe")
	}
	// /livez: /healthz fails on purpose while the Node is drained (KEP-3836).
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil || c.LivenessProbe.HTTPGet.Path != "/livez" {
		t.Error("no /livez liveness probe")
	}
	if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "metrics" }) {
		t.Error("no metrics port")
	}
	mounts := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			mounts[v.Name] = v.HostPath.Path
		}
	}
	if mounts["bpffs"] != "/sys/fs/bpf" || mounts["cgroup2"] != "/sys/fs/cgroup" {
		t.Errorf("hostPath volumes = %v, want bpffs and cgroup2", mounts)
	}
	if !slices.Contains(c.Args, "--in-cluster") {
		t.Errorf("args %v lack --in-cluster", c.Args)
	}
}

// The ClusterRole is enough for the source, and forbids what the agent has
// no business doing: kubeenv created deploy/'s ServiceAccount, ClusterRole
// and binding, and the source runs with the ServiceAccount's token (as
// every test here does).
func TestDeployRBACSufficesForTheSource(t *testing.T) {
	env := startEnv(t)
	dp := newFake()
	p := startProxy(t, env.AgentConfig, dp, proxyOpts{})
	web := createService(t, env.Client, "default", "web", nil, svcPort("http", 80, "http"))
	createSlice(t, env.Client, makeSlice("default", "web", "web-a", slicePorts{"http": 8080}, ready("10.0.1.1")))
	wantProgrammed(t, dp, map[string][]string{fe(web, 80): {be("10.0.1.1", 8080)}})
	if !p.src.Synced() {
		t.Error("not synced")
	}

	// It may read, not write; and it may not read what it does not need.
	ctx := context.Background()
	limited := kubeenv.Clientset(t, env.AgentConfig)
	for what, err := range map[string]error{
		"create a Service": func() error {
			_, err := limited.CoreV1().Services("default").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "x"},
				Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 1}}}}, metav1.CreateOptions{})
			return err
		}(),
		"delete an EndpointSlice": limited.DiscoveryV1().EndpointSlices("default").Delete(ctx, "web-a", metav1.DeleteOptions{}),
		"list Secrets": func() error {
			_, err := limited.CoreV1().Secrets("kube-system").List(ctx, metav1.ListOptions{})
			return err
		}(),
		"list Pods": func() error {
			_, err := limited.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
			return err
		}(),
		"create an Event": func() error {
			_, err := limited.CoreV1().Events("default").Create(ctx, &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "x"},
				InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: nodeName}}, metav1.CreateOptions{})
			return err
		}(),
	} {
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s as sluice: %v, want forbidden", what, err)
		}
	}
}
