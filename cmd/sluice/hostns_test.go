package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestSocketLBHostNetnsOnlyWarns: --socket-lb-host-netns-only says at
// start, at Warn, that without --devices pods reach no Service (their
// packets arrive on devices no tc runs on), and that it does nothing
// with --socket-lb=false. The run stops at the missing --manifests file,
// after the warnings and before anything is loaded.
func TestSocketLBHostNetnsOnlyWarns(t *testing.T) {
	const (
		noDevices = `level=WARN msg="--socket-lb-host-netns-only without --devices: `
		noSockLB  = `level=WARN msg="--socket-lb-host-netns-only does nothing with --socket-lb=false`
	)
	cgroup := filepath.Join(t.TempDir(), "cgroup")
	for _, c := range []struct {
		args                []string
		noDevices, noSockLB bool
	}{
		{[]string{"--socket-lb-host-netns-only", "--cgroup", cgroup}, true, false},
		{[]string{"--socket-lb-host-netns-only", "--cgroup", cgroup, "--devices", "lo"}, false, false},
		{[]string{"--socket-lb-host-netns-only", "--socket-lb=false", "--devices", "lo"}, false, true},
		{[]string{"--cgroup", cgroup}, false, false},
	} {
		stderr := runToMissingManifests(t, c.args...)
		if strings.Contains(stderr, noDevices) != c.noDevices || strings.Contains(stderr, noSockLB) != c.noSockLB {
			t.Errorf("%q: want the --devices warning %v, the --socket-lb=false one %v; stderr:\n%s", c.args, c.noDevices, c.noSockLB, stderr)
		}
	}
}
