package main

// The README's first command (`make demo`) runs this program: its test
// runs the same code, so a demo that no longer balances, or no longer
// starts, fails `make test` rather than a new user's first try.

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/agentproc"
)

func TestMain(m *testing.M) { os.Exit(agentproc.RunTests(m)) }

// TestDemo: the demo, with the binaries built once, sends its requests to
// the ClusterIP; every one is answered (run fails on the first that is
// not) and each of the three pods answers some. With 60 requests picked
// at random among three pods, one pod is left out once in 10^10 runs.
func TestDemo(t *testing.T) {
	testutil.Privileged(t)
	testutil.NeedBPFFS(t)
	bins := agentproc.Shared(t)
	dir := filepath.Dir(bins.Sluice)
	if filepath.Dir(bins.Sluicectl) != dir {
		t.Fatalf("sluice (%s) and sluicectl (%s) are not built side by side", bins.Sluice, bins.Sluicectl)
	}
	const requests = 60
	answers, err := run(t.Context(), dir, requests, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(answers) != 3 {
		t.Fatalf("answers %v: want the three pods", answers)
	}
	total := 0
	for pod, n := range answers {
		if n == 0 {
			t.Errorf("%s answered none of %d requests (answers %v)", pod, requests, answers)
		}
		total += n
	}
	if total != requests {
		t.Fatalf("%d answers counted for %d requests (%v)", total, requests, answers)
	}
}
