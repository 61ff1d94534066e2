package main

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/pkg/health"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// status shows /healthz and /livez, and why one fails.
func TestStatusHealth(t *testing.T) {
	live := liveArgs(t)
	p := health.NewProxier(time.Minute, nil)
	p.SetNode(false, "node node-a is tainted ToBeDeletedByClusterAutoscaler")
	healthAddr := serve(t, health.HandlerWith(func() error { return nil }, nil, p))
	base := append(live, "status", "--health-addr", healthAddr, "--metrics-addr", "127.0.0.1:1")

	s := decode[Status](t, runOK(t, append(base, "-o", "json")...))
	if s.Agent.Healthz != "503: node node-a is tainted ToBeDeletedByClusterAutoscaler" || s.Agent.Livez != "ok" {
		t.Errorf("status -o json: healthz %q, livez %q", s.Agent.Healthz, s.Agent.Livez)
	}
	want := "Health:     /healthz 503: node node-a is tainted ToBeDeletedByClusterAutoscaler, /livez ok\n"
	if table := runOK(t, base...); !strings.Contains(table, want) {
		t.Errorf("status table lacks %q:\n%s", want, table)
	}
}

// status of an agent that is not ready says why in full, with the
// Services that failed, from the metrics address's /readyz?verbose (the
// health address cuts the reason short and names no Service); with no
// metrics address answering, the health address's short reason.
func TestStatusNotReadyVerbose(t *testing.T) {
	live := liveArgs(t)
	failures := []*reconciler.FrontendError{{Service: model.ServicePortName{Namespace: "default", Name: "big"},
		Frontend: model.L4Addr{Addr: netip.MustParseAddr("10.96.0.99"), Port: 80, Proto: model.TCP}, Err: reconciler.ErrCapacity}}
	u := health.NewUnprogrammed()
	u.SetFailures(failures)
	notReady := func() error {
		return fmt.Errorf("applying desired state failed (retrying): %w", errors.New("write default/big 10.96.0.99:80/TCP: no room"))
	}
	healthAddr := serve(t, health.Handler(notReady, u))
	mux := http.NewServeMux()
	mux.Handle("/readyz", health.VerboseReadyz(notReady, u))
	metricsAddr := serve(t, mux)

	s := decode[Status](t, runOK(t, append(live, "status", "--health-addr", healthAddr, "--metrics-addr", metricsAddr, "-o", "json")...))
	if s.Agent.Ready || !strings.Contains(s.Agent.Readiness, "default/big") || !strings.Contains(s.Agent.Readiness, "no room") {
		t.Errorf("status with the metrics address: ready %v, readiness %q; want the Service and the full reason", s.Agent.Ready, s.Agent.Readiness)
	}
	s = decode[Status](t, runOK(t, append(live, "status", "--health-addr", healthAddr, "--metrics-addr", "127.0.0.1:1", "-o", "json")...))
	if s.Agent.Ready || s.Agent.Readiness == "" || strings.Contains(s.Agent.Readiness, "default/big") || strings.Contains(s.Agent.Readiness, "10.96.0.99") {
		t.Errorf("status without the metrics address: ready %v, readiness %q; want the health address's short reason, no Service", s.Agent.Ready, s.Agent.Readiness)
	}
}
