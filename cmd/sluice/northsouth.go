package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/sluice-lb/sluice/pkg/datapath"
)

// North-south helpers beside the reconciler: conntrack garbage collection
// and the --node-ip flag. (loadBalancerSourceRanges are the reconciler's,
// health check ports an agent Observer: see runAgent.)

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
		n, err := m.GCConntrack()
		if err != nil {
			log.Error("conntrack garbage collection", "err", err)
			continue
		}
		if n > 0 {
			log.Debug("conntrack garbage collection", "deleted", n)
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
