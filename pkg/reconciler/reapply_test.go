package reconciler_test

import (
	"testing"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// TestReapplyIsPartial: the state applied last, applied again (the
// source's periodic sync and the agent's resync hand the same state
// over), costs what a state with no change costs and is reported a
// partial sync, as kube-proxy's periodic syncs are: not a comparison of
// every frontend, once a minute at 30,000 Services
// (kubeproxy_sync_full_proxy_rules_duration_seconds would count each).
// After a failed Apply it is a full one again, which retries.
func TestReapplyIsPartial(t *testing.T) {
	f := newFake(t)
	r := reconciler.New(f, nil)
	st := bigState(50, 3)
	st.Gen = model.NewGeneration()
	mustApply(t, r, st)
	f.ResetCounts()
	inc := reconciler.IncrementalApplies(r)
	mustApply(t, r, st)
	if reconciler.IncrementalApplies(r) != inc+1 || r.LastApplyFull() {
		t.Errorf("the same state again: incremental applies %d -> %d, reported full %v; want an incremental, partial one",
			inc, reconciler.IncrementalApplies(r), r.LastApplyFull())
	}
	if f.Writes() != 0 {
		t.Errorf("the same state again wrote %d times", f.Writes())
	}
	checkProgrammed(t, f, st)

	// A state made from it with its Changed, then that one again.
	var first model.L4Addr
	for a := range st.Services.Keys() {
		first = a
		break
	}
	next := &model.State{Services: st.Services, Gen: model.NewGeneration(), BaseGen: st.Gen, Changed: []model.L4Addr{first}}
	mustApply(t, r, next)
	mustApply(t, r, next)
	if r.LastApplyFull() {
		t.Error("a derived state applied again reported full")
	}
	checkProgrammed(t, f, next)

	// A state without a generation is compared whole, every time.
	plain := &model.State{Services: st.Services}
	mustApply(t, r, plain)
	mustApply(t, r, plain)
	if !r.LastApplyFull() {
		t.Error("a state without a generation was not compared whole")
	}
}
