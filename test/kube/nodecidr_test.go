package kube

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-lb/sluice/internal/testutil/agentproc"
	"github.com/sluice-lb/sluice/internal/testutil/kubeclient"
	"github.com/sluice-lb/sluice/pkg/datapath"
)

// TestNodeCIDRMode: with --detect-local-mode NodeCIDR the agent tells pods
// by its Node's podCIDRs, as kube-proxy does. The Node is registered
// without them (as a kubelet registers it, before the allocator gives it
// its range): the agent waits, not ready, and once they are set programs
// them as its cluster CIDRs (sluice_node_cidrs), --cluster-cidr ignored,
// serves, and tells a pod by them (the short-circuit of an
// externalTrafficPolicy Local NodePort). When the Node's podCIDRs change (the Node registered again
// with another range), the agent exits non-zero, naming the old and new
// ones, for the DaemonSet to restart it.
func TestNodeCIDRMode(t *testing.T) {
	e := setupTrafficNode(t, false)
	c := e.kube.Client
	a := startWaitingAgent(t, e, e.agentConfig([]string{"--detect-local-mode", "NodeCIDR", "--cluster-cidr", "10.200.0.0/16"}), "the Node's podCIDRs")

	// The client's subnet: the client stands for a pod of this node.
	pod4 := netip.PrefixFrom(e.lb.ClientAddr, 24).Masked().String()
	const newPod4, pod6 = "10.244.7.0/24", "fd00:10:244:7::/64"
	kubeclient.UpdateNode(t, t.Context(), c, "node", func(n *corev1.Node) {
		n.Spec.PodCIDR, n.Spec.PodCIDRs = pod4, []string{pod4}
	})
	if err := a.WaitReady(60 * time.Second); err != nil {
		t.Fatal(err)
	}
	p, err := datapath.OpenPinned(a.BPFFS)
	if err != nil {
		t.Fatal(err)
	}
	cidrs, err := p.NodeCIDRs()
	if cerr := p.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, nc := range cidrs {
		// The service CIDRs (the default ServiceCIDR's) are there too.
		if s := nc.String(); strings.HasPrefix(s, "cluster ") {
			got = append(got, s)
		}
	}
	if want := []string{"cluster " + pod4}; !slices.Equal(got, want) {
		t.Errorf("sluice_node_cidrs hold the cluster CIDRs %q, want %q (the Node's podCIDRs, not --cluster-cidr)", got, want)
	}
	if log := a.Log.String(); !strings.Contains(log, "--cluster-cidr (the configuration's clusterCIDR) ignored") {
		t.Errorf("the agent did not say --cluster-cidr is ignored; its log:\n%s", log)
	}

	vip := e.webService(t, 0, 1, 2)
	eventually(t, "the service to answer on "+vip, 30*time.Second, func() error {
		_, err := e.get(vip, time.Second)
		return err
	})
	// The client's address is in the Node's podCIDR and not in
	// --cluster-cidr: it is a pod, and a pod reaching a NodePort of an
	// externalTrafficPolicy Local Service is short-circuited to all its
	// endpoints (here all on other nodes), where an external client would
	// find none on this node and be dropped.
	local := createService(t, c, "default", "local", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	}, svcPort("http", 80, "http"))
	createSlice(t, c, makeSlice("default", "local", "local-a", slicePorts{"http": 8080}, ready(e.addrs[0]), ready(e.addrs[1])))
	nodePort := fmt.Sprintf("%s:%d", e.lb.NodeAddr, local.Spec.Ports[0].NodePort)
	eventually(t, "the pod client to reach the externalTrafficPolicy Local NodePort "+nodePort, 30*time.Second, func() error {
		_, err := e.get(nodePort, time.Second)
		return err
	})

	// The API lets podCIDRs be set once: they change when the Node is
	// deleted and registered again, with another range.
	if err := c.CoreV1().Nodes().Delete(t.Context(), "node", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().Nodes().Create(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node"},
		Spec: corev1.NodeSpec{PodCIDR: newPod4, PodCIDRs: []string{newPod4, pod6}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the agent to exit after its Node's podCIDRs changed", 30*time.Second, func() error {
		if a.Exited() == nil {
			return errors.New("still running")
		}
		return nil
	})
	var exit *exec.ExitError
	if err := a.Exited(); !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Errorf("%v, want exit status 1", err)
	}
	want := fmt.Sprintf("node node: spec.podCIDRs changed from [%s] to [%s %s]", pod4, newPod4, pod6)
	// The agent's last word: the source's error ended it.
	failed := false
	for _, l := range strings.Split(a.Log.String(), "\n") {
		failed = failed || strings.Contains(l, "level=ERROR") && strings.Contains(l, `msg="agent failed"`) && strings.Contains(l, want)
	}
	if !failed {
		t.Errorf("the agent's log has no \"agent failed\" error holding %q:\n%s", want, a.Log.String())
	}
}

// startWaitingAgent starts an agent on e's node with cfg and returns it
// once its log says it is waiting for what (`waiting for <what>`, the
// start's wait for the Node), not ready. It is torn down at cleanup, its
// log printed if the test failed.
func startWaitingAgent(t *testing.T, e *trafficEnv, cfg agentproc.AgentConfig, what string) *agentproc.Agent {
	t.Helper()
	a := agentproc.NewAgent(e.bins, e.lb.Node, cfg)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent log:\n%s", a.Log.String())
		}
		if a.Exited() == nil {
			if err := a.Teardown(context.Background()); err != nil {
				t.Error(err)
			}
		} else if err := a.Cleanup(context.Background()); err != nil {
			t.Error(err)
		}
	})
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the agent to wait for "+what, 30*time.Second, func() error {
		if err := a.Exited(); err != nil {
			t.Fatalf("%v while waiting for %s", err, what)
		}
		if !strings.Contains(a.Log.String(), "waiting for "+what) {
			return errors.New("not waiting")
		}
		return nil
	})
	if err := a.Ready(); err == nil {
		t.Fatalf("ready before %s", what)
	}
	return a
}
