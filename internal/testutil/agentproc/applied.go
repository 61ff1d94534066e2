package agentproc

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil"
)

// appliedRE matches the agent's log line for a desired state it programmed
// (pkg/agent: "desired state applied" with its generation).
var appliedRE = regexp.MustCompile(`msg="desired state applied" generation=(\d+)`)

// AppliedGeneration is the newest desired-state generation the running
// agent logged as applied, 0 if none yet. Generations count from 1 in each
// agent process, and a manifest source makes a new one on every reload, so
// a test that rewrites the manifest waits for a generation above the one
// it saw before writing (WaitApplied). /readyz alone does not say that the
// new file was read: until the source's debounce has passed, the agent is
// ready with the old state.
func (a *Agent) AppliedGeneration() int {
	log := a.Log.String()
	if i := strings.LastIndex(log, "=== start "); i >= 0 {
		log = log[i:] // this process's lines only
	}
	gen := 0
	for _, m := range appliedRE.FindAllStringSubmatch(log, -1) {
		if n, err := strconv.Atoi(m[1]); err == nil && n > gen {
			gen = n
		}
	}
	return gen
}

// WaitApplied waits until the agent has applied a generation above after
// and is ready again.
func (a *Agent) WaitApplied(after int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	err := testutil.Poll(timeout, func() error {
		if err := a.Exited(); err != nil {
			return nil
		}
		if g := a.AppliedGeneration(); g <= after {
			return fmt.Errorf("applied generation %d, waiting for one above %d", g, after)
		}
		return nil
	})
	if err := a.Exited(); err != nil {
		return err
	}
	if err != nil {
		return fmt.Errorf("agent did not apply a new desired state in %v: %w", timeout, err)
	}
	return a.WaitReady(time.Until(deadline) + time.Second)
}
