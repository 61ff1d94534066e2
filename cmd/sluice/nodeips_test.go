package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// nodeWith returns the Node "node-a" with addresses, each "type=address"
// (InternalIP, ExternalIP, Hostname).
func nodeWith(addrs ...string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}
	for _, a := range addrs {
		typ, addr, _ := strings.Cut(a, "=")
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeAddressType(typ), Address: addr})
	}
	return n
}

// TestNodeAddressesOf: kube-proxy's node IPs (detectNodeIPs over
// GetNodeHostIPs). --node-ip gives its families alone and the Node the
// others (a dual-stack node whose DaemonSet passes its one hostIP);
// NodePorts are served by default on the first address of each family
// only, never on a secondary InternalIP or an ExternalIP, nor on a
// loopback one; external flows are source-NATed to any of them, and the
// devices default comes from all of them.
func TestNodeAddressesOf(t *testing.T) {
	for _, c := range []struct {
		name       string
		flag       string
		node       *corev1.Node
		all, ports string
	}{
		{"two InternalIPs and an ExternalIP: NodePorts on the first InternalIP only", "",
			nodeWith("InternalIP=10.0.0.2", "ExternalIP=203.0.113.2", "InternalIP=10.0.1.2", "Hostname=node-a"),
			"[10.0.0.2 10.0.1.2 203.0.113.2]", "[10.0.0.2]"},
		{"dual stack, --node-ip of IPv4 (status.hostIP): IPv6 from the Node", "10.0.0.9",
			nodeWith("InternalIP=10.0.0.2", "InternalIP=fd00::2", "ExternalIP=2001:db8::2"),
			"[10.0.0.9 fd00::2 2001:db8::2]", "[10.0.0.9 fd00::2]"},
		{"dual stack, --node-ip of IPv6: IPv4 from the Node", "fd00::9",
			nodeWith("InternalIP=10.0.0.2", "InternalIP=fd00::2"),
			"[fd00::9 10.0.0.2]", "[fd00::9 10.0.0.2]"},
		{"--node-ip of both families: the Node's are not used", "10.0.0.9,fd00::9",
			nodeWith("InternalIP=10.0.0.2", "InternalIP=fd00::2"),
			"[10.0.0.9 fd00::9]", "[10.0.0.9 fd00::9]"},
		{"IPv6 first: the Node's primary family", "",
			nodeWith("InternalIP=fd00::2", "InternalIP=10.0.0.2"),
			"[fd00::2 10.0.0.2]", "[fd00::2 10.0.0.2]"},
		{"an ExternalIP is primary in a family without InternalIP", "",
			nodeWith("ExternalIP=2001:db8::2", "InternalIP=10.0.0.2", "ExternalIP=203.0.113.2"),
			"[10.0.0.2 2001:db8::2 203.0.113.2]", "[10.0.0.2 2001:db8::2]"},
		{"a loopback node IP serves no NodePorts", "",
			nodeWith("InternalIP=127.0.0.1", "InternalIP=fd00::2"),
			"[127.0.0.1 fd00::2]", "[fd00::2]"},
		{"no Node", "10.0.0.9", nil, "[10.0.0.9]", "[10.0.0.9]"},
		{"nothing", "", nil, "[]", "[]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			flagIPs, err := parseNodeIPs(c.flag)
			if err != nil {
				t.Fatal(err)
			}
			na := nodeAddressesOf(flagIPs, c.node)
			if got := fmt.Sprint(na.all); got != c.all {
				t.Errorf("node addresses %s, want %s", got, c.all)
			}
			// --nodeport-addresses primary (the default), as main
			// serves it, on a node whose interfaces hold every
			// address (nodeportaddrs_test.go: one that does not).
			np := nodePortsFor(nil, na.primaryNodePorts(), na.all, true)
			if got := fmt.Sprint(np.Addrs); got != c.ports {
				t.Errorf("NodePorts on %s, want %s", got, c.ports)
			}
			if got, want := fmt.Sprint(np.HealthHosts), c.ports; got != want {
				t.Errorf("health checks on %s, want %s", got, want)
			}
		})
	}
}

// TestWaitForNodeIPs: the start reads the Node until the API answers and
// the Node has addresses, as kube-proxy's node manager waits (its
// informer, then its poll); after the addresses' bound it goes on without
// them, and after the API's bound it fails with the last read's error.
// The Node's changes are made by the reads themselves (counted), so the
// test depends on no timing.
func TestWaitForNodeIPs(t *testing.T) {
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	const long = time.Hour // a bound no case here reaches

	// The API refuses the first two reads; the third finds no Node, the
	// fourth one without addresses (as a kubelet registers it), the
	// sixth the addresses its cloud provider set.
	client := fake.NewClientset()
	var reads atomic.Int32
	client.PrependReactor("get", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		switch n := reads.Add(1); n {
		case 1, 2:
			return true, nil, errors.New("connection refused")
		case 4:
			if err := client.Tracker().Add(nodeWith()); err != nil {
				t.Error(err)
			}
		case 6:
			if err := client.Tracker().Update(corev1.SchemeGroupVersion.WithResource("nodes"),
				nodeWith("InternalIP=10.0.0.2", "InternalIP=fd00::2"), ""); err != nil {
				t.Error(err)
			}
		}
		return false, nil, nil
	})
	n, err := waitForNodeIPs(ctx, client, "node-a", nil, long, long, time.Millisecond, log)
	if err != nil || n == nil || len(n.Status.Addresses) != 2 {
		t.Fatalf("waitForNodeIPs = %v, %v; want the Node with its addresses", n, err)
	}
	if got := reads.Load(); got != 6 {
		t.Errorf("%d reads, want 6 (until the addresses came)", got)
	}

	// A Node read already (NodeCIDR's) with addresses: no read.
	reads.Store(100)
	if n, err := waitForNodeIPs(ctx, client, "node-a", nodeWith("InternalIP=10.0.0.3"), long, long, time.Millisecond, log); err != nil ||
		n.Status.Addresses[0].Address != "10.0.0.3" || reads.Load() != 100 {
		t.Errorf("Node given with addresses: %v, %v after %d reads", n, err, reads.Load()-100)
	}

	// A Node that never gets addresses: kube-proxy goes on without.
	bare := fake.NewClientset(nodeWith("Hostname=node-a"))
	if n, err := waitForNodeIPs(ctx, bare, "node-a", nil, long, 20*time.Millisecond, time.Millisecond, log); err != nil || n == nil || n.Name != "node-a" {
		t.Errorf("Node without addresses: %v, %v; want it, and no error", n, err)
	}
	// bound holds the addresses' wait too: the start's waits stay
	// within what the startupProbe allows (a Node read already, as
	// NodeCIDR's, and a long ipBound).
	if n, err := waitForNodeIPs(ctx, bare, "node-a", nodeWith("Hostname=node-a"), 20*time.Millisecond, long, time.Millisecond, log); err != nil || n == nil {
		t.Errorf("overall bound: %v, %v; want the Node, and no error", n, err)
	}
	// No Node at all: the same.
	if n, err := waitForNodeIPs(ctx, fake.NewClientset(), "node-a", nil, long, 20*time.Millisecond, time.Millisecond, log); err != nil || n != nil {
		t.Errorf("no Node: %v, %v; want nil, no error", n, err)
	}

	// An API that never answers: an error with its last word.
	down := fake.NewClientset()
	down.PrependReactor("get", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	if _, err := waitForNodeIPs(ctx, down, "node-a", nil, 20*time.Millisecond, long, time.Millisecond, log); err == nil ||
		!strings.Contains(err.Error(), `reading node "node-a": the API did not answer`) || !strings.Contains(err.Error(), "last read: connection refused") {
		t.Errorf("API unreachable: %v", err)
	}

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := waitForNodeIPs(cctx, down, "node-a", nil, long, long, time.Millisecond, log); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled wait: %v, want context.Canceled", err)
	}
	// A signal in the addresses' wait (a Node without them) ends the
	// start too, not read as the wait timing out.
	if _, err := waitForNodeIPs(cctx, bare, "node-a", nodeWith("Hostname=node-a"), long, long, time.Millisecond, log); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled address wait: %v, want context.Canceled", err)
	}
}

// TestHostnameOverride: kubeadm's kube-proxy DaemonSet passes
// --hostname-override: the agent takes it as --node-name, as kube-proxy
// makes it (lower case, trimmed), over the --config file's
// hostnameOverride; beside a different --node-name it is an error.
func TestHostnameOverride(t *testing.T) {
	for _, c := range []struct {
		name, override string
		given          bool
		want, err      string
	}{
		{"", " Node-A ", false, "node-a", ""},
		{"from-config", "node-a", false, "node-a", ""},
		{"node-a", "Node-A", true, "node-a", ""},
		{"node-a", "", true, "node-a", ""},
		{"node-b", "node-a", true, "", `--node-name "node-b" and --hostname-override "node-a" name different nodes`},
		{"Node-A", "node-a", true, "node-a", ""},
		{"node-a", "  ", false, "", `--hostname-override "  ": empty after trimming`},
	} {
		name := c.name
		err := applyHostnameOverride(&name, c.override, c.given)
		switch {
		case c.err != "" && (err == nil || err.Error() != c.err):
			t.Errorf("%q, %q: %v, want %s", c.name, c.override, err, c.err)
		case c.err == "" && (err != nil || name != c.want):
			t.Errorf("%q, %q: %q, %v; want %q", c.name, c.override, name, err, c.want)
		}
	}
	if code := run([]string{"--node-name", "node-b", "--hostname-override", "node-a", "--manifests", "m.yaml"}); code != 2 {
		t.Errorf("two node names: exit %d, want 2", code)
	}
}
