package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestSocketLBOffWarns: --socket-lb=false says at start, at Warn, that
// the node's own connections to Services are no longer translated (tc's
// egress program translates replies only). The run stops at the missing
// --manifests file, after the warning and before anything is loaded.
func TestSocketLBOffWarns(t *testing.T) {
	const warning = `level=WARN msg="--socket-lb=false: the node's own connections to Services are not translated`
	for _, c := range []struct {
		args []string
		warn bool
	}{
		{[]string{"--socket-lb=false"}, true},
		{[]string{"--cgroup", filepath.Join(t.TempDir(), "cgroup")}, false},
	} {
		stderr := runToMissingManifests(t, c.args...)
		if strings.Contains(stderr, warning) != c.warn {
			t.Errorf("%q: warning logged %v, want %v; stderr:\n%s", c.args, !c.warn, c.warn, stderr)
		}
	}
}
