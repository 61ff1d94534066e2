package testutil

import (
	"errors"
	"testing"
	"time"
)

// The first checks follow each other closely, because most conditions
// are cheap and some states are brief (an agent between two fast
// retries); the interval then doubles up to maxPollInterval, so that a
// check that is expensive (a sluicectl process, a round of HTTP requests)
// does not load a shared machine while it waits for seconds.
const (
	minPollInterval = 5 * time.Millisecond
	maxPollInterval = 100 * time.Millisecond
)

// Eventually calls check until it returns nil. If timeout passes first it
// fails tb, naming what it waited for and check's last error.
func Eventually(tb testing.TB, what string, timeout time.Duration, check func() error) {
	tb.Helper()
	if err := Poll(timeout, check); err != nil {
		tb.Fatalf("timed out after %v waiting for %s: %v", timeout, what, err)
	}
}

// EventuallyTrue is Eventually for a condition that has no error to tell.
func EventuallyTrue(tb testing.TB, what string, timeout time.Duration, cond func() bool) {
	tb.Helper()
	if Poll(timeout, func() error {
		if cond() {
			return nil
		}
		return errNotYet
	}) != nil {
		tb.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
}

var errNotYet = errors.New("condition not met")

// Poll calls check until it returns nil, and returns nil; or, once
// timeout has passed, check's last error. For code that waits outside a
// test (the demo, the benchmarks); tests use Eventually.
func Poll(timeout time.Duration, check func() error) error {
	deadline := time.Now().Add(timeout)
	interval := minPollInterval
	for {
		err := check()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(interval)
		interval = min(2*interval, maxPollInterval)
	}
}
