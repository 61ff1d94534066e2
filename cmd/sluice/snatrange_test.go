package main

import (
	"strings"
	"testing"
)

// TestSNATPortRangeFlag: a --snat-port-range the datapath could not use
// is a command-line error (exit 2, before anything starts) that names the
// flag and says what is wrong.
func TestSNATPortRangeFlag(t *testing.T) {
	for _, c := range []struct{ value, want string }{
		{"61000", "want MIN-MAX"},
		{"65535-61000", "65535-61000 is empty (MIN > MAX)"},
		{"80-2000", "80-2000 starts below 1024"},
		{"61000-70000", `MAX "70000" is not a port`},
	} {
		stderr := captureStderr(t, func() {
			if code := run([]string{"--snat-port-range", c.value, "--manifests", "x.yaml"}); code != 2 {
				t.Errorf("--snat-port-range %s: exit %d, want 2", c.value, code)
			}
		})
		if !strings.Contains(stderr, "sluice: --snat-port-range: ") || !strings.Contains(stderr, c.want) {
			t.Errorf("--snat-port-range %s: stderr %q, want the flag named and %q", c.value, stderr, c.want)
		}
	}
}
