package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil/agentproc"
	"github.com/sluice-lb/sluice/pkg/datapath"
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

// startSluice starts the agent on n with the manifest at path, its pins
// under a bpffs directory of this run, and stops and cleans it up when the
// lab closes.
func (l *lab) startSluice(n *node, bins agentproc.Binaries, path string) error {
	xdp := map[string]string{modeNative: "native", modeGeneric: "generic", modeTC: "off"}[n.mode]
	bpffs := filepath.Join(datapath.DefaultBPFFS, l.topo.Prefix()+n.ns.Name[len(l.topo.Prefix()):])
	a := agentproc.NewAgent(bins, n.ns, agentproc.AgentConfig{
		Manifests: path, BPFFS: bpffs, Devices: []string{"eth0", "eth1"},
		Extra: []string{"--node-name", "node-a", "--node-ip", n.addr.String(), "--xdp=" + xdp,
			"--log-level", "info", "--resync-interval", "0",
			"--health-check-node-ports=false"},
	})
	if err := a.Start(); err != nil {
		return err
	}
	n.agent = a
	l.topo.Defer(func() error { return a.Teardown(context.Background()) })
	return nil
}

// nftRestoreMax is the largest N loaded with iptables-nft-restore itself.
// iptables-nft-restore 1.8.9 is superlinear in the number of chains here
// (12 s at N=1000, 445 s at N=3000 on the 2-CPU bench machine): above
// this the same ruleset goes in through iptables-restore-translate and
// nft -f, which installs the same chains and rules, in the same order, in
// the same nf_tables kernel engine (see nftBaseChains for the
// differences).
const nftRestoreMax = 1000

// nftBaseChains are the built-in chains iptables-nft creates, which the
// translation of a --noflush ruleset leaves out.
const nftBaseChains = `add table ip filter
add chain ip filter INPUT { type filter hook input priority 0; policy accept; }
add chain ip filter FORWARD { type filter hook forward priority 0; policy accept; }
add chain ip filter OUTPUT { type filter hook output priority 0; policy accept; }
add table ip nat
add chain ip nat PREROUTING { type nat hook prerouting priority -100; policy accept; }
add chain ip nat INPUT { type nat hook input priority 100; policy accept; }
add chain ip nat OUTPUT { type nat hook output priority -100; policy accept; }
add chain ip nat POSTROUTING { type nat hook postrouting priority 100; policy accept; }
`

// loadIptables loads the kube-proxy-shaped rules into n's namespace with
// the mode's iptables-restore and returns how long that took and how.
func loadIptables(ctx context.Context, n *node, ruleset []byte, services int, tmp string) (time.Duration, string, error) {
	if n.mode == modeNft && services > nftRestoreMax {
		return loadTranslated(ctx, n, ruleset, tmp)
	}
	bin := map[string]string{modeNft: "iptables-nft-restore", modeLegacy: "iptables-legacy-restore"}[n.mode]
	cmd := n.ns.Command(ctx, bin, "--noflush")
	cmd.Stdin = bytes.NewReader(ruleset)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return 0, "", fmt.Errorf("%s in %s: %w: %s", bin, n.ns.Name, err, stderr.String())
	}
	return time.Since(start), bin + " --noflush", nil
}

// loadTranslated loads the ruleset as iptables-restore-translate renders
// it, with nft -f. The translator drops the "-p tcp/udp" of a DNAT rule
// that has no port match (nft then refuses "dnat to addr:port"), so the
// protocol is put back from the rule's comment ("bench/np-00042:udp").
func loadTranslated(ctx context.Context, n *node, ruleset []byte, tmp string) (time.Duration, string, error) {
	start := time.Now()
	in := filepath.Join(tmp, "rules.iptables")
	if err := os.WriteFile(in, ruleset, 0o600); err != nil {
		return 0, "", err
	}
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "iptables-restore-translate", "-f", in)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return 0, "", fmt.Errorf("iptables-restore-translate: %w: %s", err, stderr.String())
	}
	var script bytes.Buffer
	script.Grow(len(out) + 1<<20)
	script.WriteString(nftBaseChains)
	for _, line := range strings.SplitAfter(string(out), "\n") {
		if i := strings.Index(line, " counter dnat to "); i >= 0 {
			proto := "tcp"
			if strings.Contains(line[i:], ":udp\"") {
				proto = "udp"
			}
			line = line[:i] + " meta l4proto " + proto + line[i:]
		}
		script.WriteString(line)
	}
	nft := n.ns.Command(ctx, "nft", "-f", "-")
	nft.Stdin = &script
	if o, err := nft.CombinedOutput(); err != nil {
		return 0, "", fmt.Errorf("nft -f (translated iptables rules) in %s: %w: %s", n.ns.Name, err, tail(string(o), 2000))
	}
	return time.Since(start), "iptables-restore-translate | nft -f (iptables-nft-restore is too slow at this N)", nil
}

func writeManifest(dir string, svcs []service) (string, error) {
	path := filepath.Join(dir, "services.yaml")
	return path, os.WriteFile(path, manifest(svcs), 0o600)
}
