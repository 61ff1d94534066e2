package testutil

import (
	"strings"
	"testing"
)

// ContainsAll reports as an error of tb's (the test goes on) each of
// wants that s lacks, naming what s is and showing it.
func ContainsAll(tb testing.TB, what, s string, wants ...string) {
	tb.Helper()
	for _, want := range wants {
		if !strings.Contains(s, want) {
			tb.Errorf("%s lacks %q:\n%s", what, want, s)
		}
	}
}
