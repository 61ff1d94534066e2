package testutil

import (
	"os"
	"os/exec"
	"testing"
)

// PrivilegedEnv, when set to anything but empty, turns the skip of a
// privileged test run without root into a failure.
const PrivilegedEnv = "SLUICE_PRIVILEGED_TESTS"

// Privileged is the first line of every test that needs root (BPF programs
// and maps, network namespaces, cgroups).
//
// Without root the test is skipped, so that `go test ./...` as a normal
// user still runs (and passes) everything that needs no privileges. A skip
// must never be how a privileged run passes, though: `make test` refuses to
// start without root and sets SLUICE_PRIVILEGED_TESTS=1, and a run with it
// set (make test, so CI; or anyone who wants to be sure) fails instead of
// skipping.
//
// Privileged checks only the user. What root needs besides (bpffs, cgroup2,
// nsenter) is set up by `make deps`; a root run where it is missing is a
// broken machine, not a reason to skip, so the helpers that need those
// (PinDir, NeedCommands, topology's cgroup) fail the test.
func Privileged(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() == 0 {
		return
	}
	const why = "needs root: BPF, network namespaces, cgroups"
	if os.Getenv(PrivilegedEnv) != "" {
		tb.Fatalf("%s (%s is set: privileged tests must run)", why, PrivilegedEnv)
	}
	tb.Skip(why)
}

// NeedCommands fails tb unless every command in names is on PATH: `make
// deps` installs them, so a missing one is a broken machine (see
// Privileged).
func NeedCommands(tb testing.TB, names ...string) {
	tb.Helper()
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			tb.Fatalf("%s not installed (`make deps` installs it): %v", n, err)
		}
	}
}
