package main

import (
	"errors"
	"log/slog"
	"net"
	"strings"
	"syscall"
	"testing"

	"github.com/sluice-lb/sluice/pkg/agent"
	"github.com/sluice-lb/sluice/pkg/datapath"
)

// TestTakenPortNamesKubeProxy: when the health or metrics address is
// taken (as kube-proxy's own listeners take them on a node where it
// still runs), the agent's start fails before it touches the datapath,
// with an error naming the address and kube-proxy as the likely holder,
// told to the source (kube-proxy's events about its servers).
func TestTakenPortNamesKubeProxy(t *testing.T) {
	held := heldPort(t)
	taken := held.Addr().String()
	for _, c := range []struct {
		name string
		srv  listenAddrs
	}{
		{"health", listenAddrs{health: taken}},
		{"metrics", listenAddrs{metrics: taken}},
	} {
		// A taken port fails before the datapath or the metrics are
		// used: none is given. The source is told (the Kubernetes
		// source's FailedToStartProxierHealthcheck,
		// FailedToStartMetricServer on the Node), with the error the
		// agent exits with.
		src := &failureSource{}
		var _ agent.Source = src
		err := runAgent(t.Context(), agent.Config{}, datapath.Config{BPFFS: t.TempDir()}, 0, northSouthConfig{}, src, nil, nil, c.srv, slog.New(slog.DiscardHandler))
		if err == nil {
			t.Fatalf("%s: the agent started on a taken port %s", c.name, taken)
		}
		if len(src.errs) != 1 || src.health[0] != (c.name == "health") || !errors.Is(src.errs[0], syscall.EADDRINUSE) || src.errs[0].Error() != err.Error() {
			t.Errorf("%s: reported %v (health %v); the agent failed with %v", c.name, src.errs, src.health, err)
		}
		msg := err.Error()
		// kube-proxy's defaults of both families (its bindAddress picks).
		for _, want := range []string{c.name + " listener", taken, "address already in use", "is kube-proxy still running on this node?",
			"10256", "10249", "0.0.0.0", "[::]", "127.0.0.1", "[::1]"} {
			if !strings.Contains(msg, want) {
				t.Errorf("%s: error %q does not say %q", c.name, msg, want)
			}
		}
	}
}

// A listener error other than a taken port does not blame kube-proxy.
func TestListenErrorWithoutHint(t *testing.T) {
	_, err := listenServer("health", "192.0.2.1:0") // TEST-NET-1: no interface holds it
	if err == nil {
		t.Skip("192.0.2.1 is an address of this host")
	}
	if !strings.HasPrefix(err.Error(), "health listener: ") || strings.Contains(err.Error(), "kube-proxy") {
		t.Errorf("error %q", err)
	}
}

// TestFailedStartClosesHealthListener: a start that fails after the
// health server listened (here at the metrics server's taken port) closes
// the health listener: its port is free again.
func TestFailedStartClosesHealthListener(t *testing.T) {
	held := heldPort(t)
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	health := free.Addr().String()
	if err := free.Close(); err != nil {
		t.Fatal(err)
	}
	srv := listenAddrs{health: health, metrics: held.Addr().String()}
	if err := runAgent(t.Context(), agent.Config{}, datapath.Config{BPFFS: t.TempDir()}, 0, northSouthConfig{}, &failureSource{}, nil, nil, srv, slog.New(slog.DiscardHandler)); err == nil {
		t.Fatal("the agent started on a taken metrics port")
	}
	again, err := net.Listen("tcp", health)
	if err != nil {
		t.Fatalf("the health port after the failed start: %v", err)
	}
	again.Close()
}

// heldPort returns a listener on a loopback port that the test holds
// (nothing accepts on it) until it ends.
func heldPort(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}
