package reconciler_test

import (
	"slices"
	"testing"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// TestFirstChangesKeepTheBackendTable: the changes after a first program
// hand each backend they add a new id, above the ones in use, until the
// ids freed come out of quarantine. The first program sizes the table of
// backends by id for them: none of those changes copies the table (4.8 MB
// at 30,000 Services x 10 endpoints, issue 14's fortieth pass). So does a
// view read from the maps, at a restart (or a re-read rebuilt from a
// dump).
func TestFirstChangesKeepTheBackendTable(t *testing.T) {
	for _, restart := range []bool{false, true} {
		t.Run(map[bool]string{false: "first program", true: "restart"}[restart], func(t *testing.T) {
			const n, k = 200, 10
			st := bigState(n, k)
			dp := newFake(t)
			r := reconciler.New(dp, nil)
			mustApply(t, r, st)
			if restart {
				r = reconciler.New(dp, nil)
				if err := r.Restore(); err != nil {
					t.Fatal(err)
				}
				mustApply(t, r, st)
			}
			table := reconciler.BackendTableCap(r)
			s := st.Services.Get(vip(42))
			orig := s.Backends
			moved := model.SortBackends(append(slices.Clone(orig[1:]), be(42, 99, model.TCP)))
			for i := range reconciler.BackendIDQuarantine + 64 {
				s.Backends = orig
				if i%2 == 0 {
					s.Backends = moved
				}
				mustApply(t, r, st)
				if got := reconciler.BackendTableCap(r); got != table {
					t.Fatalf("change %d: the backend table grew from %d ids to %d", i+1, table, got)
				}
			}
		})
	}
}
