package main

import (
	"strings"
	"testing"
)

// TestSNATTimeWaitFlag: --conntrack-tcp-snat-time-wait shorter than the
// close timeout (a closed source-NATed flow would live less than any
// other closed flow) and 0 are refused, naming the flag. A close timeout
// over the flag's default (120 s) with the flag not given is accepted
// (the default raised to it), as before the flag existed: the run goes
// on to the next check, which a bad --map-refresh-interval fails.
func TestSNATTimeWaitFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--conntrack-tcp-snat-time-wait", "5s"}, "--conntrack-tcp-snat-time-wait 5s: must be >= --conntrack-tcp-close-timeout (10s)"},
		{[]string{"--conntrack-tcp-snat-time-wait", "1m", "--conntrack-tcp-close-timeout", "2m"}, "--conntrack-tcp-snat-time-wait 1m0s: must be >= --conntrack-tcp-close-timeout (2m0s)"},
		{[]string{"--conntrack-tcp-snat-time-wait", "0s"}, "--conntrack-tcp-snat-time-wait 0s: must be > 0"},
	} {
		stderr := captureStderr(t, func() {
			if code := run(append(c.args, "--manifests", "x.yaml")); code != 2 {
				t.Errorf("%q: exit %d, want 2", c.args, code)
			}
		})
		if !strings.Contains(stderr, c.want) {
			t.Errorf("%q: stderr:\n%s\nwant %q", c.args, stderr, c.want)
		}
	}
	stderr := captureStderr(t, func() {
		if code := run([]string{"--conntrack-tcp-close-timeout", "3m", "--map-refresh-interval", "-1s", "--manifests", "x.yaml"}); code != 2 {
			t.Errorf("close timeout 3m, bad --map-refresh-interval: exit %d, want 2", code)
		}
	})
	if strings.Contains(stderr, "snat-time-wait") || !strings.Contains(stderr, "--map-refresh-interval -1s") {
		t.Errorf("close timeout 3m, --conntrack-tcp-snat-time-wait not given: stderr:\n%s\nwant only --map-refresh-interval refused", stderr)
	}
}
