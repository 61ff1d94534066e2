package testutil

import (
	"syscall"
	"testing"
	"time"
)

// CPUTime is the user plus system CPU time the process used so far (all
// its threads: the garbage collector's work counts). On a machine shared
// with other work it varies less than the wall-clock time.
func CPUTime(tb testing.TB) time.Duration {
	tb.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
