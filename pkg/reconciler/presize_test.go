package reconciler_test

import (
	"slices"
	"testing"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
	"github.com/sluice-lb/sluice/pkg/reconciler/fakedp"
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

// presizing is a fake datapath that hears the first program's hint
// (reconciler.FrontendPresizer).
type presizing struct {
	*fakedp.Fake
	calls [][2]int
}

func (p *presizing) PresizeFrontends(n4, n6 int) { p.calls = append(p.calls, [2]int{n4, n6}) }

// TestFirstProgramPresizesTheDatapath: a first program tells a datapath
// that keeps bookkeeping per frontend how many frontends of each family
// come (the real maps presize their table of the slots' ranges, which
// grew one frontend at a time), once; the changes after it do not. Fails
// without the hint: no call.
func TestFirstProgramPresizesTheDatapath(t *testing.T) {
	const n, k = 200, 10
	st := bigState(n, k)
	dp := &presizing{Fake: newFake(t)}
	r := reconciler.New(dp, nil)
	mustApply(t, r, st)
	if want := [][2]int{{n, 0}}; !slices.Equal(dp.calls, want) {
		t.Fatalf("first program: PresizeFrontends calls %v, want %v", dp.calls, want)
	}
	s := st.Services.Get(vip(42))
	s.Backends = model.SortBackends(append(slices.Clone(s.Backends[1:]), be(42, 99, model.TCP)))
	mustApply(t, r, st)
	if len(dp.calls) != 1 {
		t.Errorf("a change: PresizeFrontends calls %v, want the first program's only", dp.calls)
	}
}
