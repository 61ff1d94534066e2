package main

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/health"
	"github.com/sluice-lb/sluice/pkg/model"
)

// TestHealthCheckPortsFollowProxier: the healthCheckNodePorts runAgent
// serves answer from the Proxier /livez answers from (the Kubernetes
// source's): 503 with serviceProxyHealthy false while the datapath is
// stale, though the Service has a ready local endpoint; without one (the
// manifest source) the proxy is healthy.
func TestHealthCheckPortsFollowProxier(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	if hc := healthCheckPorts(northSouthConfig{}, nil, log); hc != nil {
		t.Fatal("health check ports served with --health-check-node-ports=false")
	}
	// A change an hour old not programmed, against a minute's timeout.
	stale := health.NewProxier(time.Minute, func() time.Time { return time.Now().Add(-time.Hour) })
	for _, c := range []struct {
		what string
		prox *health.Proxier
		code int
		body string
	}{
		{"stale Proxier", stale, http.StatusServiceUnavailable, `"serviceProxyHealthy": false`},
		{"no Proxier", nil, http.StatusOK, `"serviceProxyHealthy": true`},
	} {
		port := uint16(testutil.FreePorts(t, 1)[0])
		hc := healthCheckPorts(northSouthConfig{hc: true, hcHosts: []string{"127.0.0.1"}}, c.prox, log)
		hc.SetProgrammed(localLBState(port))
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
		if err != nil {
			hc.Close()
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		hc.Close()
		if resp.StatusCode != c.code || !strings.Contains(string(body), c.body) {
			t.Errorf("%s: %d %q, want %d with %s", c.what, resp.StatusCode, body, c.code, c.body)
		}
	}
}

// localLBState is a state of one Service, default/web: an
// externalTrafficPolicy Local LoadBalancer whose healthCheckNodePort is
// port, with one ready local endpoint.
func localLBState(port uint16) *model.State {
	fe := model.L4Addr{Addr: netip.MustParseAddr("198.51.100.1"), Port: 80, Proto: model.TCP}
	ep := netip.MustParseAddr("10.1.0.1")
	st := model.NewState()
	st.Services.Set(fe, &model.Service{Name: model.ServicePortName{Namespace: "default", Name: "web"},
		Kind: model.LoadBalancer, Frontend: fe, ExternalLocal: true, HealthCheckNodePort: port,
		Backends:   []model.Backend{{L4Addr: model.L4Addr{Addr: ep, Port: 8080, Proto: model.TCP}}},
		LocalReady: []netip.Addr{ep}})
	return st
}
