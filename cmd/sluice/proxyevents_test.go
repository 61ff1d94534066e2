package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"syscall"
	"testing"

	"github.com/sluice-lb/sluice/pkg/agent"
	"github.com/sluice-lb/sluice/pkg/datapath"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/source/kube"
)

// failureSource is a source that records the server failures it is told,
// and answers that the API server refused them (which changes nothing of
// the agent's exit).
type failureSource struct {
	health []bool
	errs   []error
}

var errRefused = errors.New("refused")

func (*failureSource) Run(context.Context, func(*model.State)) error { return nil }

func (f *failureSource) ReportServerFailure(_ context.Context, health bool, err error) error {
	f.health, f.errs = append(f.health, health), append(f.errs, err)
	return errRefused
}

// The Kubernetes source satisfies what runAgent asks of a source to record
// kube-proxy's events about the agent's servers.
var (
	_ serverFailureReporter = (*kube.Source)(nil)
	_ bindFailureReporter   = (*kube.Source)(nil)
)

// A taken health or metrics port, which fails the agent's start, is told
// to a source that records it (the Kubernetes source's
// FailedToStartProxierHealthcheck, FailedToStartMetricServer on the Node),
// with the error the agent exits with.
func TestTakenPortReported(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	taken := held.Addr().String()
	for _, c := range []struct {
		health bool
		srv    listenAddrs
	}{{true, listenAddrs{health: taken}}, {false, listenAddrs{metrics: taken}}} {
		src := &failureSource{}
		var _ agent.Source = src
		err := runAgent(t.Context(), agent.Config{}, datapath.Config{}, 0, northSouthConfig{}, src, nil, nil, c.srv, slog.New(slog.DiscardHandler))
		if len(src.errs) != 1 || src.health[0] != c.health || !errors.Is(src.errs[0], syscall.EADDRINUSE) ||
			err == nil || src.errs[0].Error() != err.Error() || !strings.Contains(err.Error(), taken) {
			t.Errorf("health %v: reported %v (health %v); the agent failed with %v", c.health, src.errs, src.health, err)
		}
	}
}
