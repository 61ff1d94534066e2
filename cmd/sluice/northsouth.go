package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/sluice-lb/sluice/pkg/agent"
	"github.com/sluice-lb/sluice/pkg/datapath"
	"github.com/sluice-lb/sluice/pkg/healthcheck"
	"github.com/sluice-lb/sluice/pkg/model"
)

// North-south wiring: what NodePort, ExternalIP and LoadBalancer traffic
// needs beside the service maps the reconciler writes.

type northSouthConfig struct {
	gcEvery time.Duration // conntrack garbage collection period (0: off)
	hc      bool          // serve healthCheckNodePorts
}

// northSouthReconciler wraps the reconciler: loadBalancerSourceRanges are
// written before the masters that check them and pruned after, and the
// health check ports follow every applied state.
type northSouthReconciler struct {
	agent.Reconciler
	maps *datapath.Maps
	hc   *healthcheck.Server // nil: off
	log  *slog.Logger
}

func (n *northSouthReconciler) Apply(st *model.State) error {
	if err := n.maps.AddSourceRanges(st); err != nil {
		return err
	}
	if err := n.Reconciler.Apply(st); err != nil {
		return err
	}
	if err := n.maps.PruneSourceRanges(st); err != nil {
		return err
	}
	if n.hc != nil {
		// A port another process holds must not keep the datapath
		// from being programmed: report it, retry on the next state.
		if err := n.hc.Sync(st); err != nil {
			n.log.Error("health check ports", "err", err)
		}
	}
	return nil
}

// runConntrackGC deletes expired conntrack entries every period until ctx
// is done.
func runConntrackGC(ctx context.Context, m *datapath.Maps, every time.Duration, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		st, err := m.GCConntrack()
		if err != nil {
			log.Error("conntrack garbage collection", "err", err)
			continue
		}
		if st.Deleted > 0 {
			log.Debug("conntrack garbage collection", "deleted", st.Deleted)
		}
	}
}

// parseNodeIPs parses --node-ip: comma-separated IPv4 addresses.
func parseNodeIPs(s string) ([]netip.Addr, error) {
	var out []netip.Addr
	for _, f := range splitList(s) {
		a, err := netip.ParseAddr(f)
		if err != nil {
			return nil, fmt.Errorf("--node-ip %q: %w", f, err)
		}
		if !a.Unmap().Is4() {
			return nil, errors.New("--node-ip " + f + ": only IPv4 is served")
		}
		out = append(out, a.Unmap())
	}
	return out, nil
}
