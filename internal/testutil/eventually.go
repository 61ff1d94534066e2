package testutil

import (
	"errors"
	"testing"
	"time"
)

// PollInterval is how often Eventually checks. It is short because most
// conditions are cheap and some are brief (a state an agent passes through
// between two fast retries); an expensive check takes its own time anyway.
const PollInterval = 5 * time.Millisecond

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

// Poll calls check every PollInterval until it returns nil, and returns
// nil; or, once timeout has passed, check's last error. For code that
// waits outside a test (the benchmarks); tests use Eventually.
func Poll(timeout time.Duration, check func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(PollInterval)
	}
}
