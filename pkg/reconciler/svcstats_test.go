package reconciler_test

import (
	"testing"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
	"github.com/sluice-lb/sluice/pkg/reconciler/fakedp"
)

// TestServiceStatsResetAtAllocation: the per-Service counters of a service
// id are zeroed when the id is allocated, never while a frontend holds it
// (the fake reports a reset of an id in use as a violation), and an id
// kept across applies is not reset again: its counters go on.
func TestServiceStatsResetAtAllocation(t *testing.T) {
	f := newFake(t)
	f.Record = true
	r := reconciler.New(f, nil)
	a, b := vip(1), vip(2)
	mustApply(t, r, state(svc(a, "a", be(1, 1, model.TCP))))
	mustApply(t, r, state(svc(a, "a", be(1, 1, model.TCP), be(1, 2, model.TCP))))
	if n := f.Count(fakedp.OpResetStats); n != 1 {
		t.Errorf("after two applies of one frontend: %d resets, want 1 (at its id's allocation)", n)
	}

	// Churn frontends until ids are reused (after the quarantine): each
	// new frontend's id is reset before its rev_nat entry names it.
	reused := false
	seen := map[reconciler.ServiceID]bool{}
	for i := range reconciler.ServiceIDQuarantine + 8 {
		f.ResetCounts()
		fe := b
		if i%2 == 1 {
			fe = vip(3)
		}
		mustApply(t, r, state(svc(a, "a", be(1, 1, model.TCP)), svc(fe, "churn", be(1, 3, model.TCP))))
		var resetID reconciler.ServiceID
		for _, op := range f.Ops {
			switch op.Kind {
			case fakedp.OpResetStats:
				resetID = op.Service
			case fakedp.OpUpsertRevNat:
				if op.Service != resetID {
					t.Fatalf("apply %d: rev_nat %d written, last reset %d", i, op.Service, resetID)
				}
			}
		}
		if resetID == 0 {
			t.Fatalf("apply %d: a new frontend's id was not reset: %v", i, f.Ops)
		}
		reused = reused || seen[resetID]
		seen[resetID] = true
	}
	if !reused {
		t.Errorf("no id was reused in %d applies: the test does not reach reuse", reconciler.ServiceIDQuarantine+8)
	}
	if v := f.Violations(); len(v) > 0 {
		t.Errorf("violations: %v", v)
	}
}
