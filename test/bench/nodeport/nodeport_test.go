package main

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/test/bench/harness"
)

// TestRunTiny runs the whole benchmark at a tiny N: every mode forwards
// UDP and TCP to the remote backend, the XDP modes through the XDP fast
// path, the programs forward in BPF_PROG_TEST_RUN, and the report is
// written and parses. No timing is asserted.
func TestRunTiny(t *testing.T) {
	testutil.Privileged(t)
	cfg, err := parseConfig([]string{"-services", "5", "-endpoints", "3", "-rounds", "1", "-duration", "300ms",
		"-udp-senders", "1", "-udp-flows", "4", "-tcp-workers", "2", "-prog-iterations", "200", "-out", t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	back, md := harness.RunAndReadBack(t, 3*time.Minute,
		func(ctx context.Context, log *slog.Logger) (*result, error) { return run(ctx, cfg, log) },
		func(r *result) ([]string, error) { return writeReport(cfg.OutDir, cfg.Stamp, r) })
	if len(back.Modes) != len(allModes) {
		t.Fatalf("report has %d modes, want %d", len(back.Modes), len(allModes))
	}
	if m := back.Machine; m.CPUs == 0 || m.Kernel == "" || m.Source == "" {
		t.Errorf("the report's machine lacks its CPUs, kernel or source: %+v", m)
	}
	for _, m := range back.Modes {
		if len(m.UDP) != 1 || m.UDP[0].RecvPPS <= 0 {
			t.Errorf("%s: no UDP reached the backend: %+v", m.Mode, m.UDP)
		}
		if len(m.TCP) != 1 || m.TCP[0].ConnsPerSec <= 0 {
			t.Errorf("%s: no TCP connection completed: %+v", m.Mode, m.TCP)
		}
		if (m.Mode == modeNative || m.Mode == modeGeneric) && m.Counters["xdp_fwd"] == 0 {
			t.Errorf("%s: the XDP program forwarded nothing (counters %v)", m.Mode, m.Counters)
		}
	}
	// Every mode against tc and against iptables-nft, except each base
	// against itself.
	if want := 2 * (len(allModes) - 1); len(back.Ratios) != want {
		t.Errorf("%d ratios, want %d", len(back.Ratios), want)
	}
	if len(back.ProgRun) == 0 {
		t.Fatal("no BPF_PROG_TEST_RUN results")
	}
	for _, p := range back.ProgRun {
		if p.TCVerdict != tcActRedirect || (p.XDPVerdict != xdpRedirect && p.XDPVerdict != xdpTX) {
			t.Errorf("%s: verdicts tc %d, XDP %d: want forwarded (tc %d, XDP %d or %d)", p.Packet, p.TCVerdict, p.XDPVerdict, tcActRedirect, xdpTX, xdpRedirect)
		}
		if p.TCNs <= 0 || p.XDPNs <= 0 {
			t.Errorf("%s: no per-packet time: %+v", p.Packet, p)
		}
	}
	testutil.ContainsAll(t, "the Markdown report", md, "## Ratios", "| xdp-native | tc |", "## Per packet", "## Caveats")
}

// TestTargetIsLast: the target's NodePort rules are the last ones in
// KUBE-NODEPORTS and its ClusterIP rules the last service rules in
// KUBE-SERVICES, so iptables walks every other service first.
func TestTargetIsLast(t *testing.T) {
	svcs, err := layout(50, 3)
	if err != nil {
		t.Fatal(err)
	}
	var nodePorts, services []string
	for _, l := range strings.Split(string(iptablesRestore(svcs)), "\n") {
		switch {
		case strings.HasPrefix(l, "-A KUBE-NODEPORTS "):
			nodePorts = append(nodePorts, l)
		case strings.HasPrefix(l, "-A KUBE-SERVICES ") && !strings.Contains(l, "KUBE-NODEPORTS"):
			services = append(services, l)
		}
	}
	if len(nodePorts) != 51 || len(services) != 51 {
		t.Fatalf("%d KUBE-NODEPORTS and %d KUBE-SERVICES rules, want 51 each", len(nodePorts), len(services))
	}
	for _, want := range []string{"np-00049:tcp", "np-00049:udp"} {
		if !strings.Contains(nodePorts[49]+nodePorts[50], want) || !strings.Contains(services[49]+services[50], want) {
			t.Errorf("the last rules do not match %s:\n%s\n%s", want, nodePorts[50], services[50])
		}
	}
	if !strings.Contains(string(manifest(svcs[49:])), "nodePort: 30049}") {
		t.Error("manifest lacks the target's NodePort")
	}
}
