package kube

import (
	"context"
	"time"
)

// runner calls fn when asked to, but never more often than every minInterval
// and at least every maxInterval, and retries a failed call with exponential
// backoff. It is kube-proxy's BoundedFrequencyRunner reduced to what a single
// caller needs: requests that arrive while a call is waiting or running fold
// into one later call.
//
// Scenario: a Deployment rollout changes 40 EndpointSlices in 300ms. The
// first change runs fn at once (the last run was long ago); the other 39 set
// the pending flag while minInterval passes, and fn runs once more for all of
// them.
type runner struct {
	fn          func(periodic bool) error
	minInterval time.Duration
	maxInterval time.Duration
	maxBackoff  time.Duration

	kick chan struct{}
	now  func() time.Time
}

func newRunner(fn func(periodic bool) error, minInterval, maxInterval time.Duration) *runner {
	maxBackoff := 30 * time.Second
	if maxInterval > 0 && maxInterval < maxBackoff {
		maxBackoff = maxInterval
	}
	return &runner{
		fn:          fn,
		minInterval: minInterval,
		maxInterval: maxInterval,
		maxBackoff:  maxBackoff,
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

// initialBackoff is the first retry delay after a failed run.
const initialBackoff = 500 * time.Millisecond

// Loop runs until ctx is done.
func (r *runner) Loop(ctx context.Context) {
	var (
		lastRun time.Time // zero: never ran, so the first request runs at once
		pending bool      // a request is waiting for minInterval to pass
		retryAt time.Time // non-zero: the last run failed; run again then
		backoff = initialBackoff
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
		case !retryAt.IsZero():
			next = retryAt
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
		err := r.fn(periodic)
		lastRun, pending = r.now(), false
		if err != nil {
			retryAt = lastRun.Add(backoff)
			backoff = min(2*backoff, r.maxBackoff)
			continue
		}
		retryAt, backoff = time.Time{}, initialBackoff
	}
}
