package main

import (
	"errors"
	"log/slog"
	"slices"
	"testing"
	"time"
)

// TestDryRunLoaderCollectsAroundTheLoad: the dry-run programs load on a
// collected heap (the first apply's garbage gone), and the free heap is
// given back after, whether the load worked or not.
func TestDryRunLoaderCollectsAroundTheLoad(t *testing.T) {
	for _, loadErr := range []error{nil, errors.New("verifier says no")} {
		var calls []string
		l := &dryRunLoader{
			load: func() (time.Duration, error) {
				calls = append(calls, "load")
				return time.Millisecond, loadErr
			},
			collect: func() { calls = append(calls, "collect") },
			release: func() { calls = append(calls, "release") },
			log:     slog.New(slog.DiscardHandler),
		}
		l.run()
		if want := []string{"collect", "load", "release"}; !slices.Equal(calls, want) {
			t.Errorf("load error %v: calls %q, want %q", loadErr, calls, want)
		}
	}
}
