package main

// kube-proxy's events about itself that concern the agent's servers, which
// the Kubernetes source records (pkg/source/kube, proxyevents.go): a
// health check port that cannot be bound, on its Service; the health or
// metrics server failing, which ends the agent, on the Node. The manifest
// source records none.

import (
	"context"
	"log/slog"
	"time"

	"github.com/sluice-lb/sluice/pkg/agent"
	"github.com/sluice-lb/sluice/pkg/health"
	"github.com/sluice-lb/sluice/pkg/model"
)

// bindFailureReporter records a health check port that cannot be bound
// (kube-proxy's FailedToStartServiceHealthcheck).
type bindFailureReporter interface {
	HealthCheckFailed(svc model.ServicePortName, port uint16, err error)
}

// serverFailureReporter records the health server's (health) or the
// metrics server's fatal failure on the Node (kube-proxy's
// FailedToStartProxierHealthcheck, FailedToStartMetricServer).
type serverFailureReporter interface {
	ReportServerFailure(ctx context.Context, health bool, err error) error
}

// reportBindFailures has hc's ports that cannot be bound told to src, if
// it records them.
func reportBindFailures(hc *health.NodePortServer, src agent.Source) {
	if r, ok := src.(bindFailureReporter); ok {
		hc.OnBindFailure(r.HealthCheckFailed)
	}
}

// serverFailureWait bounds the write of a server failure's event: the
// agent is exiting.
const serverFailureWait = 5 * time.Second

// reportServerFailure records that the health server (health) or the
// metrics server failed with err, if src records it.
func reportServerFailure(src agent.Source, health bool, err error, log *slog.Logger) {
	r, ok := src.(serverFailureReporter)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), serverFailureWait)
	defer cancel()
	if rerr := r.ReportServerFailure(ctx, health, err); rerr != nil {
		log.Warn("server failure not recorded as an event", "err", rerr)
	}
}
