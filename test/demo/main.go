// Command demo shows Sluice balancing a ClusterIP without a cluster: it
// builds a throwaway topology of network namespaces (a client, a node and
// three backend "pods" serving HTTP), writes a manifest with a Service and
// its EndpointSlice, runs the sluice agent on the node, sends requests from
// the client to the ClusterIP and shows which pod answered each. Everything
// is removed on exit, also on Ctrl-C.
//
//	go run ./test/demo            (as root; `make demo` builds first)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/agentproc"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
)

const (
	clusterIP = "10.96.0.10"
	port      = 80
)

func main() {
	requests := flag.Int("requests", 30, "requests to send to the ClusterIP")
	binDir := flag.String("bin", "", "directory holding sluice and sluicectl (default: build them)")
	hold := flag.Bool("hold", false, "keep everything up until Ctrl-C, to look around")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if _, err := run(ctx, *binDir, *requests, *hold); err != nil {
		if errors.Is(err, context.Canceled) {
			fmt.Println("\ninterrupted; cleaned up")
			os.Exit(130)
		}
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		os.Exit(1)
	}
}

// run is the demo. It returns how many requests each pod answered (every
// pod a key), for its test.
func run(ctx context.Context, binDir string, requests int, hold bool) (answers map[string]int, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("run as root: the demo creates network namespaces and loads BPF programs")
	}
	tmp, err := os.MkdirTemp("", "sluice-demo-")
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, os.RemoveAll(tmp)) }()

	bins := agentproc.Binaries{Sluice: filepath.Join(binDir, "sluice"), Sluicectl: filepath.Join(binDir, "sluicectl")}
	if binDir == "" {
		step("building sluice and sluicectl")
		if bins, err = agentproc.Build(ctx, tmp); err != nil {
			return nil, err
		}
	}

	step("creating namespaces: client, node, backend1..3")
	topo, err := topology.New()
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := topo.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("remove topology: %w", cerr))
		}
	}()
	lb, err := topo.BuildLB(3)
	if err != nil {
		return nil, err
	}
	pods, err := lb.ServeHTTP(8080, "pod-")
	if err != nil {
		return nil, err
	}
	for i, be := range lb.Backends {
		fmt.Printf("    %s serves HTTP on %s:8080 (namespace %s)\n", pods[i], lb.BackendAddrs[i], be.Name)
	}
	fmt.Printf("    client %s -> node %s (%s), route %s via the node\n", lb.ClientAddr, lb.NodeAddr, lb.NodeDev, topology.ServiceRange)

	step("writing the manifest")
	svc := agentproc.Service{Name: "web", ClusterIP: clusterIP, Endpoints: lb.BackendAddrStrings(),
		Ports: []agentproc.Port{{Name: "http", Protocol: "TCP", Port: port, TargetPort: "8080", EndpointPort: 8080}}}
	manifest := filepath.Join(tmp, "web.yaml")
	if err := agentproc.WriteFile(manifest, svc.YAML()); err != nil {
		return nil, err
	}
	fmt.Print(indent(svc.YAML()))

	step("starting the agent in the node namespace")
	agent := agentproc.NewAgent(bins, lb.Node, agentproc.AgentConfig{
		Manifests: manifest,
		Devices:   []string{lb.NodeDev},
		BPFFS:     filepath.Join(testutil.BPFFS, topo.Prefix()+"demo"),
	})
	fmt.Printf("    sluice %s\n", strings.Join(agent.Args, " "))
	// Registered after the namespaces, so it runs before they go.
	topo.Defer(func() error {
		err := agent.Teardown(context.Background())
		if err != nil {
			fmt.Printf("agent log:\n%s", agent.Log)
		}
		return err
	})
	if err := agent.Start(); err != nil {
		return nil, err
	}
	if err := agent.WaitReady(30 * time.Second); err != nil {
		fmt.Printf("agent log:\n%s", agent.Log)
		return nil, err
	}
	fmt.Println("    /readyz: 200, the datapath matches the manifest")
	if dump, err := agent.Services(ctx); err == nil {
		fmt.Print(indent("$ sluicectl services\n" + dump))
	}

	step(fmt.Sprintf("sending %d requests from the client to http://%s:%d/", requests, clusterIP, port))
	client := lb.Client.HTTPClient(3 * time.Second)
	counts := map[string]int{}
	for _, p := range pods {
		counts[p] = 0
	}
	fmt.Println("    REQUEST  ANSWERED BY")
	for i := 1; i <= requests; i++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		who, err := topology.WhoAnswered(client, fmt.Sprintf("http://%s:%d/", clusterIP, port))
		if err != nil {
			return nil, fmt.Errorf("request %d: %w", i, err)
		}
		counts[who]++
		fmt.Printf("    %7d  %s\n", i, who)
	}

	step("spread over the backends")
	fmt.Println("    POD    ANSWERS")
	for _, p := range pods {
		fmt.Printf("    %-5s  %3d  %s\n", p, counts[p], strings.Repeat("#", counts[p]))
	}
	if c, err := agent.Counters(ctx); err == nil {
		fmt.Print(indent("$ sluicectl counters\n" + c))
	}
	if hold {
		step("holding; press Ctrl-C to clean up. Meanwhile, for example:")
		fmt.Printf("    nsenter --net=%s curl http://%s/\n", lb.Client.Path, clusterIP)
		fmt.Printf("    %s --bpffs %s services\n", bins.Sluicectl, agent.BPFFS)
		fmt.Printf("    bpftool map dump pinned %s/sluice/sluice_services_v2\n", agent.BPFFS)
		<-ctx.Done()
	}
	step("cleaning up: agent stop, sluice cleanup, namespaces removed")
	return counts, nil
}

func step(s string) { fmt.Printf("\n==> %s\n", s) }

func indent(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return "    " + strings.Join(lines, "\n    ") + "\n"
}
