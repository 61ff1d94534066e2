package agentproc

import (
	"fmt"
	"testing"

	"github.com/sluice-lb/sluice/internal/testutil"
)

func TestAppliedGeneration(t *testing.T) {
	a := &Agent{Log: &testutil.Buffer{}}
	if g := a.AppliedGeneration(); g != 0 {
		t.Errorf("no log: generation %d", g)
	}
	line := func(gen int) string {
		return fmt.Sprintf("time=2026-01-01T00:00:00Z level=INFO msg=\"desired state applied\" generation=%d services=3 took=1ms\n", gen)
	}
	_, _ = fmt.Fprint(a.Log, "=== start sluice\n", line(1), line(3), line(2))
	if g := a.AppliedGeneration(); g != 3 {
		t.Errorf("generation %d, want 3", g)
	}
	// A restarted agent counts from 1 again: only its own lines count.
	_, _ = fmt.Fprint(a.Log, "=== start sluice\n", "level=INFO msg=\"loaded\"\n")
	if g := a.AppliedGeneration(); g != 0 {
		t.Errorf("after a restart: generation %d, want 0", g)
	}
	_, _ = fmt.Fprint(a.Log, line(1))
	if g := a.AppliedGeneration(); g != 1 {
		t.Errorf("after a restart: generation %d, want 1", g)
	}
}
