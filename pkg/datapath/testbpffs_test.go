package datapath

import (
	"strings"
	"testing"
)

// TestDefaultBPFFSRefusedInTests: a test binary may not pin at, or clean
// up, the host's own bpffs (the real agent's state): Open and Cleanup with
// the default fail before they touch it, naming the fix.
func TestDefaultBPFFSRefusedInTests(t *testing.T) {
	for _, bpffs := range []string{"", DefaultBPFFS, DefaultBPFFS + "/"} {
		if _, err := Open(Config{BPFFS: bpffs}); err == nil || !strings.Contains(err.Error(), "tests must set their own bpffs") {
			t.Errorf("Open with bpffs %q: %v, want the refusal", bpffs, err)
		}
		if err := Cleanup(bpffs); err == nil || !strings.Contains(err.Error(), "tests must set their own bpffs") {
			t.Errorf("Cleanup(%q): %v, want the refusal", bpffs, err)
		}
	}
	if err := refuseDefaultBPFFSInTest(t.TempDir()); err != nil {
		t.Errorf("a test's own directory refused: %v", err)
	}
}
