package main

import (
	"context"
	"errors"

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
