package testutil

import (
	"context"
	"testing"
)

// RunUntilCleanup runs run in a goroutine of its own until the test ends:
// its context is cancelled at cleanup, and tb fails if run returns an
// error then (what names it in the failure). Run loops that return nil
// when cancelled (a source, an agent) are its use.
func RunUntilCleanup(tb testing.TB, what string, run func(ctx context.Context) error) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	tb.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			tb.Errorf("%s: %v", what, err)
		}
	})
}
