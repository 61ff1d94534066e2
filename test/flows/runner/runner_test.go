package runner

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/agentproc"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/test/flows"
)

// Where the corpus, the known failures and the report are, relative to
// this package.
const (
	corpusDir      = ".."
	knownFailures  = "../known-failures.txt"
	reportPath     = "../results/latest.md"
	envUpdateKnown = "SLUICE_FLOWS_UPDATE_KNOWN"
)

func TestMain(m *testing.M) {
	if topology.IsProber() {
		os.Exit(topology.ProberMain())
	}
	os.Exit(agentproc.RunTests(m))
}

// TestFlows runs the corpus (every case, in parallel up to -parallel) and
// compares the failures with known-failures.txt.
func TestFlows(t *testing.T) {
	testutil.Privileged(t)
	testutil.NeedBPFFS(t)
	testutil.NeedCommands(t, "nsenter", "ip", "nft")
	corpus, err := flows.Load(corpusDir)
	if err != nil {
		t.Fatal(err)
	}
	known, err := readKnown(knownFailures)
	if err != nil {
		t.Fatalf("%s: %v", knownFailures, err)
	}
	all := map[string]bool{}
	var order []string
	for _, c := range corpus.Cases {
		for _, st := range c.Steps {
			for _, f := range st.Flows {
				id := c.Name + "/" + f.Name
				if strings.Contains(id, knownSep) {
					t.Fatalf("flow ID %q contains %q, the known-failures separator", id, knownSep)
				}
				all[id] = true
				order = append(order, id)
			}
		}
	}
	bin := agentproc.Shared(t)

	start := time.Now()
	var mu sync.Mutex
	byCase := map[string][]*FlowResult{}
	t.Run("case", func(t *testing.T) {
		for _, c := range corpus.Cases {
			t.Run(c.Name, func(t *testing.T) {
				t.Parallel()
				res := runCase(t, bin, c)
				mu.Lock()
				byCase[c.Name] = res
				mu.Unlock()
			})
		}
	})
	var results []*FlowResult
	for _, c := range corpus.Cases {
		results = append(results, byCase[c.Name]...)
	}
	took := time.Since(start).Round(time.Second)
	if len(results) == 0 {
		t.Fatal("no case ran")
	}

	s := Summarize(results)
	header := fmt.Sprintf("%d of %d cases run in %v (sluice %s, %s).", len(byCase), len(corpus.Cases), took, gitDescribe(), time.Now().UTC().Format(time.DateTime+" UTC"))
	var rep bytes.Buffer
	if err := WriteReport(&rep, header, results); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(reportPath), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(reportPath, rep.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s (%d cases in %v; report: test/flows/results/latest.md)", s.Line(), len(byCase), took)
	var classes strings.Builder
	for _, c := range slices.Sorted(maps.Keys(s.Classes)) {
		fmt.Fprintf(&classes, "\n  %3d  %s", s.Classes[c], c)
	}
	if classes.Len() > 0 {
		t.Logf("failures by class:%s", classes.String())
	}

	if os.Getenv(envUpdateKnown) != "" {
		if err := os.WriteFile(knownFailures, []byte(UpdateKnown(known, all, results, order)), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s rewritten from this run (%s set)", knownFailures, envUpdateKnown)
		return
	}
	for _, e := range Compare(known, all, results) {
		t.Error(e)
	}
}

// gitDescribe names the checkout the agent was built from.
func gitDescribe() string {
	out, err := exec.CommandContext(context.Background(), "git", "describe", "--always", "--dirty").Output()
	if err != nil {
		return "unknown commit"
	}
	return strings.TrimSpace(string(out))
}
