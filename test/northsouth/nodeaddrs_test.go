package northsouth

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/agentproc"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/datapath"
)

// nodeAddrsManifest is a NodePort Service whose endpoint is on the node.
const nodeAddrsManifest = `apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.0.1
  ports:
  - {name: tcp, port: 80, protocol: TCP, targetPort: 8080, nodePort: 30080}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: tcp, port: 8080, protocol: TCP}]
endpoints:
- {addresses: [10.1.0.2], conditions: {ready: true}, nodeName: node}
`

// TestNodePortFollowsAddresses: the NodePort addresses follow the node's
// interfaces at run time, as kube-proxy's (its nodeport-ips set is
// refilled from the interfaces on every sync). The real agent starts on
// a node holding none of the addresses NodePorts are to be served on:
// with --nodeport-addresses 192.168.7.0/24, an address inside it; with
// the default (primary), its --node-ip, which serves NodePorts only while
// an interface holds it. Once the address is added on its device, a
// client's connection to it reaches the pod; once deleted, its frontend
// is gone from the pinned maps and the connection is not answered.
//
//	client 10.0.0.2 ── (eth0 10.0.0.1) node (pa 10.1.0.1) ── pod 10.1.0.2
func TestNodePortFollowsAddresses(t *testing.T) {
	t.Run("cidr", func(t *testing.T) {
		testNodePortFollowsAddresses(t, "192.168.7.12", "--node-ip", "10.0.0.1", "--nodeport-addresses", "192.168.7.0/24")
	})
	t.Run("primary", func(t *testing.T) {
		testNodePortFollowsAddresses(t, "192.168.7.1", "--node-ip", "192.168.7.1")
	})
}

// testNodePortFollowsAddresses runs TestNodePortFollowsAddresses with
// the agent's arguments extra, adding and deleting addr.
func testNodePortFollowsAddresses(t *testing.T, addr string, extra ...string) {
	testutil.Privileged(t)
	b := agentproc.Shared(t)
	topo := topology.NewT(t)
	client, node, pod := topo.AddNST(t, "client"), topo.AddNST(t, "node"), topo.AddNST(t, "pod")
	must(t, topo.Veth(client, "eth0", node, "eth0"))
	must(t, client.AddAddr("eth0", pfx("10.0.0.2/24")))
	must(t, node.AddAddr("eth0", pfx("10.0.0.1/24")))
	must(t, topo.Veth(node, "pa", pod, "eth0"))
	must(t, node.AddAddr("pa", pfx("10.1.0.1/24")))
	must(t, pod.AddAddr("eth0", pfx("10.1.0.2/24")))
	must(t, client.AddRoute(pfx("0.0.0.0/0"), ip("10.0.0.1")))
	must(t, pod.AddRoute(pfx("0.0.0.0/0"), ip("10.1.0.1")))
	must(t, node.Sysctl("net/ipv4/ip_forward", "1"))
	serveWhoami(t, pod, "pod", "4")

	mf := filepath.Join(t.TempDir(), "cluster.yaml")
	must(t, os.WriteFile(mf, []byte(nodeAddrsManifest), 0o644))
	a := agentproc.StartAgent(t, b, node, agentproc.AgentConfig{
		Manifests: mf, Devices: []string{"eth0"},
		BPFFS: filepath.Join(datapath.DefaultBPFFS, topo.Prefix()+"node"),
		Extra: extra,
	}, 30*time.Second)

	frontend := addr + ":30080"
	// Served: a row of the frontend that is not a retired master (a
	// removed TCP frontend's, kept with no backends for its established
	// flows: README, the TCP-stray row).
	served := func() (bool, error) {
		out, err := a.Services(context.Background())
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, frontend) && !strings.Contains(line, "connections retired") {
				return true, err
			}
		}
		return false, err
	}
	if ok, err := served(); err != nil || ok {
		t.Fatalf("%s served before the node holds the address (%v)", frontend, err)
	}

	must(t, node.AddAddr("eth0", pfx(addr+"/24")))
	must(t, node.WaitLocal(ip(addr)))
	if err := testutil.Poll(30*time.Second, func() error {
		answer, err := askTCP(client, frontend, time.Second)
		if err != nil {
			return err
		}
		if !strings.HasPrefix(answer, "pod ") || seenFrom(answer) != "10.0.0.2" {
			return fmt.Errorf("answered %q, want pod seeing the client 10.0.0.2", answer)
		}
		return nil
	}); err != nil {
		t.Fatalf("the address added: no connection to %s: %v\n%s", frontend, err, a.Log.String())
	}
	if !strings.Contains(a.Log.String(), `msg="NodePort addresses changed" added=[`+addr+`]`) {
		t.Errorf("the change was not logged")
	}

	must(t, node.Run(context.Background(), "ip", "addr", "del", addr+"/24", "dev", "eth0"))
	if err := testutil.Poll(30*time.Second, func() error {
		if ok, err := served(); err != nil || ok {
			return fmt.Errorf("%s still in the maps (%v)", frontend, err)
		}
		return nil
	}); err != nil {
		t.Fatalf("the address deleted: %v", err)
	}
	if answer, err := askTCP(client, frontend, 2*time.Second); err == nil {
		t.Errorf("the address deleted: %s answered %q", frontend, answer)
	}
	if !strings.Contains(a.Log.String(), `removed=[`+addr+`]`) {
		t.Errorf("the removal was not logged")
	}
}
