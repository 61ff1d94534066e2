package main

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/agent"
	"github.com/sluice-lb/sluice/pkg/datapath"
	"github.com/sluice-lb/sluice/pkg/metrics"
)

// TestPrepareReservesForPatterns: with a --devices pattern that matches
// no device yet (--devices=veth+ on a node without pods), the SNAT ports
// are still reserved from the node's ephemeral ports: the devices the
// pattern matches later masquerade from them. With no device and no
// pattern nothing is source-NATed, and nothing is reserved.
func TestPrepareReservesForPatterns(t *testing.T) {
	testutil.Privileged(t)
	const reserved = "/proc/sys/net/ipv4/ip_local_reserved_ports"
	for _, c := range []struct {
		name    string
		follow  bool
		reserve bool
	}{
		{"pattern", true, true},
		{"none", false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			bpffs := testutil.PinDir(t)
			t.Cleanup(func() {
				if err := datapath.Cleanup(bpffs); err != nil {
					t.Errorf("cleanup: %v", err)
				}
			})
			ns := topology.NewNS(t, "prep")
			ns.Enter(t)
			// Every SNAT port inside the ephemeral range.
			if err := os.WriteFile("/proc/sys/net/ipv4/ip_local_port_range", []byte("1024 65535"), 0); err != nil {
				t.Fatal(err)
			}
			dp, err := datapath.Open(datapath.Config{BPFFS: bpffs, DisableSocketLB: true, DeferDryRun: true})
			if err != nil {
				t.Fatal(err)
			}
			defer dp.Close()
			var cfg agent.Config
			if c.follow {
				cfg.FollowDevices = func(context.Context, agent.Datapath) {}
			}
			prepareDatapath(dp, cfg, metrics.New(), slog.New(slog.DiscardHandler))
			b, err := os.ReadFile(reserved)
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.TrimSpace(string(b)) != ""; got != c.reserve {
				t.Errorf("ip_local_reserved_ports = %q: reserved %v, want %v", b, got, c.reserve)
			}
		})
	}
}
