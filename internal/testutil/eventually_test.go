package testutil

import (
	"errors"
	"testing"
	"time"
)

func TestPoll(t *testing.T) {
	n := 0
	// A bound far beyond the 15 ms three checks take: only a failing run
	// waits it out (1 s failed a run the race detector's load held back
	// that long between two checks).
	if err := Poll(10*time.Second, func() error {
		if n++; n < 3 {
			return errors.New("not yet")
		}
		return nil
	}); err != nil || n != 3 {
		t.Errorf("Poll = %v after %d checks, want nil after 3", err, n)
	}
	start := time.Now()
	err := Poll(20*time.Millisecond, func() error { return errors.New("never") })
	if err == nil || err.Error() != "never" {
		t.Errorf("Poll of a check that never passes = %v, want its last error", err)
	}
	if took := time.Since(start); took < 20*time.Millisecond {
		t.Errorf("Poll gave up after %v, before its timeout", took)
	}
}
