package main

import (
	"strings"
	"testing"
)

// TestXDPWithDevicePatternsWarns: --xdp with --devices patterns (pods'
// veths) is warned of at start; --xdp on exact devices, or patterns
// without --xdp, are not. The start then fails at the missing
// --manifests, before it loads or pins anything.
func TestXDPWithDevicePatternsWarns(t *testing.T) {
	const warned = `level=WARN msg="--xdp attaches XDP to the devices --devices' patterns match too`
	for _, c := range []struct {
		args []string
		warn bool
	}{
		{[]string{"--devices", "lo,sl-nomatch+", "--xdp", "generic"}, true},
		{[]string{"--devices", "lo", "--xdp", "generic"}, false},
		{[]string{"--devices", "lo,sl-nomatch+"}, false},
	} {
		stderr := runToMissingManifests(t, append([]string{"--socket-lb=false"}, c.args...)...)
		if strings.Contains(stderr, warned) != c.warn {
			t.Errorf("%q: warned %v, want %v; stderr:\n%s", c.args, !c.warn, c.warn, stderr)
		}
	}
}
