package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sluice-lb/sluice/pkg/datapath"
	"github.com/sluice-lb/sluice/test/e2e/harness"
)

// The modes. Each runs on a node of its own for the whole run.
const (
	modeNative  = "xdp-native"
	modeGeneric = "xdp-generic"
	modeTC      = "tc"
	modeNft     = "iptables-nft"
	modeLegacy  = "iptables-legacy"
)

var allModes = []string{modeNative, modeGeneric, modeTC, modeNft, modeLegacy}

func isSluice(mode string) bool {
	return mode == modeNative || mode == modeGeneric || mode == modeTC
}

// sluiceAgent is cmd/sluice running in a node namespace.
type sluiceAgent struct {
	*harness.Agent
}

// startSluice starts the agent on n with the manifest at path, its pins
// under a bpffs directory of this run, and stops and cleans it up when the
// lab closes.
func (l *lab) startSluice(n *node, bins harness.Binaries, path string) error {
	xdp := map[string]string{modeNative: "native", modeGeneric: "generic", modeTC: "off"}[n.mode]
	bpffs := filepath.Join(datapath.DefaultBPFFS, l.topo.Prefix()+n.ns.Name[len(l.topo.Prefix()):])
	a := harness.NewAgent(bins, n.ns, harness.AgentConfig{
		Manifests: path, BPFFS: bpffs, Devices: []string{"eth0", "eth1"},
		Extra: []string{"--node-name", "node-a", "--node-ip", n.addr.String(), "--xdp=" + xdp,
			"--log-level", "info", "--resync-interval", "0", "--conntrack-gc-interval", "0",
			"--health-check-node-ports=false"},
	})
	if err := a.Start(); err != nil {
		return err
	}
	n.agent = &sluiceAgent{a}
	l.topo.Defer(func() error {
		var errs []string
		if err := a.Stop(); err != nil {
			errs = append(errs, fmt.Sprintf("stop: %v", err))
		}
		if err := a.Cleanup(context.Background()); err != nil {
			errs = append(errs, fmt.Sprintf("cleanup: %v", err))
		}
		if len(errs) > 0 {
			return fmt.Errorf("agent on %s: %s", n.ns.Name, strings.Join(errs, "; "))
		}
		return nil
	})
	return nil
}

// counter returns one of the agent's datapath counters.
func (a *sluiceAgent) counter(name string) (uint64, error) {
	out, err := a.Counters(context.Background())
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == name {
			var n uint64
			_, err := fmt.Sscan(f[1], &n)
			return n, err
		}
	}
	return 0, fmt.Errorf("no counter %s", name)
}

// loadIptables loads the kube-proxy-shaped rules into n's namespace with
// the mode's iptables-restore and returns how long that took.
func loadIptables(ctx context.Context, n *node, ruleset []byte) (time.Duration, error) {
	bin := map[string]string{modeNft: "iptables-nft-restore", modeLegacy: "iptables-legacy-restore"}[n.mode]
	cmd := n.ns.Command(ctx, bin, "--noflush")
	cmd.Stdin = bytes.NewReader(ruleset)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("%s in %s: %w: %s", bin, n.ns.Name, err, stderr.String())
	}
	return time.Since(start), nil
}

func writeManifest(dir string, svcs []service) (string, error) {
	path := filepath.Join(dir, "services.yaml")
	return path, os.WriteFile(path, manifest(svcs), 0o600)
}
