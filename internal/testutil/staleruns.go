package testutil

import (
	"errors"
	"math"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// StaleRuns lists the entries of dir named prefix+"<pid>-..." whose pid is
// not a running process: what a test run that was killed (a timeout's
// SIGQUIT, a ^C) left behind, since its cleanups never ran. Entries of this
// process and names of another form are never listed. Names carry their
// run's pid for this purpose: the topology package's namespaces and cgroups
// ("sl-<pid>-"), PinDir's bpffs directories ("sluice-test-<pid>-").
func StaleRuns(dir, prefix string) []string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var stale []string
	for _, e := range entries {
		name := e.Name()
		rest, ok := strings.CutPrefix(name, prefix)
		if !ok {
			continue
		}
		pidStr, _, ok := strings.Cut(rest, "-")
		if !ok {
			continue
		}
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid <= 0 || pid > math.MaxInt32 || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			stale = append(stale, name)
		}
	}
	return stale
}
