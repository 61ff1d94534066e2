package main

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestDetectLocalModeFlag: ClusterCIDR and NodeCIDR are taken; kube-proxy's
// interface modes and anything else are command-line errors naming the
// value and the modes Sluice has; NodeCIDR needs the Kubernetes source.
func TestDetectLocalModeFlag(t *testing.T) {
	for in, want := range map[string]string{"ClusterCIDR": "ClusterCIDR", "NodeCIDR": "NodeCIDR", "": "ClusterCIDR"} {
		if got, err := parseLocalMode(in); got != want || err != nil {
			t.Errorf("parseLocalMode(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for in, want := range map[string]string{
		"BridgeInterface":     `--detect-local-mode "BridgeInterface": Sluice tells pods by their source address only (ClusterCIDR or NodeCIDR)`,
		"InterfaceNamePrefix": `--detect-local-mode "InterfaceNamePrefix": Sluice tells pods by their source address only`,
		"nodecidr":            `--detect-local-mode "nodecidr": want ClusterCIDR or NodeCIDR`,
	} {
		if _, err := parseLocalMode(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("parseLocalMode(%q) = %v, want an error with %q", in, err, want)
		}
	}
	for _, args := range [][]string{
		{"--manifests", "m.yaml", "--detect-local-mode", "BridgeInterface"},
		{"--manifests", "m.yaml", "--detect-local-mode", "PodCIDR"},
		{"--manifests", "m.yaml", "--detect-local-mode", "NodeCIDR"},
	} {
		stderr := captureStderr(t, func() {
			if code := run(args); code != 2 {
				t.Errorf("sluice %q exited %d, want 2", args, code)
			}
		})
		if !strings.Contains(stderr, "--detect-local-mode") {
			t.Errorf("sluice %q: stderr does not name --detect-local-mode:\n%s", args, stderr)
		}
	}
}

// TestConfigNodeCIDRMode: the file's detectLocalMode NodeCIDR sets
// --detect-local-mode (its clusterCIDR still sets --cluster-cidr, which
// the agent then ignores), and with the manifest source the agent refuses
// it as a command-line error.
func TestConfigNodeCIDRMode(t *testing.T) {
	path := writeConfig(t, "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nclusterCIDR: 10.244.0.0/16\ndetectLocalMode: NodeCIDR\n")
	stderr := captureStderr(t, func() {
		if code := run([]string{"--config", path, "--manifests", "m.yaml"}); code != 2 {
			t.Errorf("exit %d, want 2", code)
		}
	})
	if !strings.Contains(stderr, "--detect-local-mode NodeCIDR takes the pods' CIDRs from this node's Node object") {
		t.Errorf("stderr:\n%s", stderr)
	}
}

// TestWaitForPodCIDRs: the wait reads the Node until it has podCIDRs
// (created without them, as a kubelet registers it, and allocated later),
// and after its bound fails with kube-proxy's words.
func TestWaitForPodCIDRs(t *testing.T) {
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)

	client := fake.NewClientset()
	if _, err := waitForPodCIDRs(ctx, client, "node-a", 50*time.Millisecond, 10*time.Millisecond, log); err == nil ||
		!strings.HasPrefix(err.Error(), `timeout waiting for node "node-a" to exist`) {
		t.Errorf("no Node: %v", err)
	}
	if _, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := waitForPodCIDRs(ctx, client, "node-a", 50*time.Millisecond, 10*time.Millisecond, log); err == nil ||
		!strings.HasPrefix(err.Error(), `timeout waiting for PodCIDR allocation on node "node-a"`) {
		t.Errorf("Node without podCIDRs: %v", err)
	}

	got := make(chan *corev1.Node, 1)
	go func() {
		n, err := waitForPodCIDRs(ctx, client, "node-a", time.Minute, 10*time.Millisecond, log)
		if err != nil {
			t.Error(err)
		}
		got <- n
	}()
	n, err := client.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Spec.PodCIDR, n.Spec.PodCIDRs = "10.244.1.0/24", []string{"10.244.1.0/24", "fd00:10:244:1::/64"}
	if _, err := client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if n := <-got; n == nil || !reflect.DeepEqual(n.Spec.PodCIDRs, []string{"10.244.1.0/24", "fd00:10:244:1::/64"}) {
		t.Errorf("waited for %v", n)
	}

	down := fake.NewClientset()
	down.PrependReactor("get", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	if _, err := waitForPodCIDRs(ctx, down, "node-a", 50*time.Millisecond, 10*time.Millisecond, log); err == nil ||
		!strings.HasPrefix(err.Error(), `timeout waiting for PodCIDR allocation on node "node-a"`) || !strings.Contains(err.Error(), "last read: connection refused") {
		t.Errorf("API unreachable: %v", err)
	}

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := waitForPodCIDRs(cctx, fake.NewClientset(), "node-a", time.Minute, 10*time.Millisecond, log); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled wait: %v, want context.Canceled", err)
	}
}

// TestNodePodCIDRs: the first CIDR of each family, masked, as kube-proxy's
// getLocalDetectors; a malformed one is an error naming the Node and the
// value.
func TestNodePodCIDRs(t *testing.T) {
	p := netip.MustParsePrefix
	node := func(cidrs ...string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}, Spec: corev1.NodeSpec{PodCIDRs: cidrs}}
	}
	for _, c := range []struct {
		in   []string
		want []netip.Prefix
	}{
		{[]string{"10.244.1.0/24"}, []netip.Prefix{p("10.244.1.0/24")}},
		{[]string{"fd00:10:244:1::/64", "10.244.1.1/24"}, []netip.Prefix{p("fd00:10:244:1::/64"), p("10.244.1.0/24")}},
		{[]string{"10.244.1.0/24", "10.244.2.0/24"}, []netip.Prefix{p("10.244.1.0/24")}},
		{[]string{"::ffff:10.244.1.0/120"}, []netip.Prefix{p("10.244.1.0/24")}},
	} {
		if got, err := nodePodCIDRs(node(c.in...)); err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("nodePodCIDRs(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
	}
	for in, want := range map[string]string{
		"10.244.1.0/33": `node node-a: spec.podCIDRs[1] "10.244.1.0/33"`,
		"10.244.1.0":    `node node-a: spec.podCIDRs[1] "10.244.1.0"`,
	} {
		if _, err := nodePodCIDRs(node("fd00::/64", in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("nodePodCIDRs(%q) = %v, want an error with %q", in, err, want)
		}
	}
	if _, err := nodePodCIDRs(node()); err == nil {
		t.Error("no podCIDRs: no error")
	}
}
