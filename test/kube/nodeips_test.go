package kube

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestNodeAddressesLate: the agent takes its node IPs from the Node, which
// may have none yet when it starts (a kubelet registers before its cloud
// provider sets the addresses). It waits for them, not ready, as
// kube-proxy's node manager waits, and once they come serves NodePorts on
// them, on the devices holding them: no --node-ip and no --devices here,
// so an agent that went on without the addresses would attach to no
// device and the NodePort would never answer.
func TestNodeAddressesLate(t *testing.T) {
	e := setupTrafficNode(t, false)
	c := e.kube.Client
	setAddresses := func(addrs ...corev1.NodeAddress) {
		t.Helper()
		n, err := c.CoreV1().Nodes().Get(t.Context(), "node", metav1.GetOptions{})
		if err == nil {
			n.Status.Addresses = addrs
			_, err = c.CoreV1().Nodes().UpdateStatus(t.Context(), n, metav1.UpdateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	setAddresses()
	cfg := e.agentConfig(nil)
	cfg.Devices = nil
	a := startWaitingAgent(t, e, cfg, "the Node's addresses")
	setAddresses(corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: e.lb.NodeAddr.String()},
		corev1.NodeAddress{Type: corev1.NodeHostName, Address: "node"})
	if err := a.WaitReady(60 * time.Second); err != nil {
		t.Fatal(err)
	}

	svc := createService(t, c, "default", "np", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort },
		svcPort("http", 80, "http"))
	createSlice(t, c, makeSlice("default", "np", "np-a", slicePorts{"http": 8080}, ready(e.addrs[0]), ready(e.addrs[1])))
	nodePort := fmt.Sprintf("%s:%d", e.lb.NodeAddr, svc.Spec.Ports[0].NodePort)
	eventually(t, "the client to reach the NodePort "+nodePort, 30*time.Second, func() error {
		_, err := e.get(nodePort, time.Second)
		return err
	})
}
