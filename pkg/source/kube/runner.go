package kube

import (
	"context"
	"time"
)

// runner calls fn when asked to, but never more often than every minInterval
// and at least every maxInterval. It is kube-proxy's BoundedFrequencyRunner
// reduced to what a single caller needs: requests that arrive while a call
// is waiting or running fold into one later call. It does not retry: fn
// only hands a state to the agent, which retries failed applies itself.
//
// Scenario: a Deployment rollout changes 40 EndpointSlices in 300ms. The
// first change runs fn at once (the last run was long ago); the other 39 set
// the pending flag while minInterval passes, and fn runs once more for all of
// them.
type runner struct {
	fn          func(periodic bool)
	minInterval time.Duration
	maxInterval time.Duration

	kick chan struct{}
	now  func() time.Time
}

func newRunner(fn func(periodic bool), minInterval, maxInterval time.Duration) *runner {
	return &runner{
		fn:          fn,
		minInterval: minInterval,
		maxInterval: maxInterval,
		kick:        make(chan struct{}, 1),
		now:         time.Now,
	}
}

// Request asks for a run as soon as minInterval allows. It never blocks.
func (r *runner) Request() {
	select {
	case r.kick <- struct{}{}:
	default: // a request is already pending; it covers this one
	}
}

// Loop runs until ctx is done.
func (r *runner) Loop(ctx context.Context) {
	var (
		lastRun time.Time // zero: never ran, so the first request runs at once
		pending bool      // a request is waiting for minInterval to pass
	)
	started := r.now()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		select {
		case <-r.kick:
			pending = true
		default:
		}
		now := r.now()
		base := lastRun
		if base.IsZero() {
			base = started
		}
		var next time.Time
		periodic := false
		switch {
		case pending:
			next = lastRun.Add(r.minInterval)
		case r.maxInterval > 0:
			next, periodic = base.Add(r.maxInterval), true
		}
		if next.IsZero() && !pending {
			// Nothing to do and no periodic runs: wait for a request.
			select {
			case <-ctx.Done():
				return
			case <-r.kick:
				pending = true
			}
			continue
		}
		if wait := next.Sub(now); wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				return
			case <-r.kick:
				pending = true
				timer.Stop() // Go >= 1.23: no stale tick survives Stop
				continue
			case <-timer.C:
			}
		}
		if ctx.Err() != nil {
			return
		}
		r.fn(periodic)
		lastRun, pending = r.now(), false
	}
}
