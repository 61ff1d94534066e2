package main

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/pkg/health"
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
