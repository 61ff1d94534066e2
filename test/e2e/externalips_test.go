package e2e

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/agentproc"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
)

// TestExternalIPsGate: the real agent with --allow-service-external-ips=false
// (kube-proxy's feature gate AllowServiceExternalIPs off, as against
// CVE-2020-8554) serves a Service's ClusterIP but not its externalIP: the
// maps hold no frontend for it and a client's connection to it reaches no
// backend. The same agent restarted with the gate on (its default) serves
// both, over the same pins.
func TestExternalIPsGate(t *testing.T) {
	const (
		clusterIP  = "10.96.0.20"
		externalIP = "10.96.7.7" // in topology.ServiceRange: the client routes it to the node
	)
	bins, topo, lb := newLB(t, 1)
	names, err := lb.ServeHTTP(8080, "backend-")
	if err != nil {
		t.Fatal(err)
	}
	svc := agentproc.Service{Name: "web", ClusterIP: clusterIP, Endpoints: lb.BackendAddrStrings(), Ports: []agentproc.Port{agentproc.TCP("http", 80, 8080)}}.YAML()
	svc = strings.Replace(svc, "  type: ClusterIP\n", "  type: ClusterIP\n  externalIPs: ["+externalIP+"]\n", 1)
	manifest := filepath.Join(t.TempDir(), "services.yaml")
	if err := agentproc.WriteFile(manifest, agentproc.Manifest(svc)); err != nil {
		t.Fatal(err)
	}
	const gateOff = "--allow-service-external-ips=false"
	a := agentproc.StartAgent(t, bins, lb.Node, agentproc.AgentConfig{
		Manifests: manifest,
		Devices:   []string{lb.NodeDev},
		BPFFS:     filepath.Join(testutil.BPFFS, topo.Prefix()+"extip"),
		Extra:     []string{gateOff},
	}, 30*time.Second)
	client := lb.Client.HTTPClient(3 * time.Second)
	answers := func(addr string) error {
		who, err := topology.WhoAnswered(client, "http://"+addr+":80/")
		if err != nil {
			return err
		}
		if who != names[0] {
			return fmt.Errorf("%s answered from %q, want %q", addr, who, names[0])
		}
		return nil
	}
	frontends := func() (clusterIPServed, externalIPServed bool) {
		dump, err := a.Services(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(dump, "\n") {
			clusterIPServed = clusterIPServed || strings.HasPrefix(l, clusterIP+":80/")
			externalIPServed = externalIPServed || strings.HasPrefix(l, externalIP+":80/")
		}
		return clusterIPServed, externalIPServed
	}

	if err := answers(clusterIP); err != nil {
		t.Fatalf("gate off: the ClusterIP: %v", err)
	}
	if c, x := frontends(); !c || x {
		t.Errorf("gate off: frontends: ClusterIP %v, ExternalIP %v; want the ClusterIP only", c, x)
	}
	if err := answers(externalIP); err == nil {
		t.Errorf("gate off: the externalIP %s reached a backend", externalIP)
	}

	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}
	a.Args = slices.DeleteFunc(a.Args, func(s string) bool { return s == gateOff })
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	if err := a.WaitReady(30 * time.Second); err != nil {
		t.Fatalf("gate on: %v", err)
	}
	testutil.Eventually(t, "the externalIP to be served with the gate on", 15*time.Second, func() error {
		if c, x := frontends(); !c || !x {
			return fmt.Errorf("frontends: ClusterIP %v, ExternalIP %v; want both", c, x)
		}
		return answers(externalIP)
	})
}
