package reconciler_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
	"github.com/sluice-lb/sluice/pkg/reconciler/fakedp"
)

// TestRandomized applies random desired states with randomly failing
// writes, restarts and tight capacities, checking the full invariants
// after every single map operation, and that every failure-free Apply
// converges to exactly the desired state.
func TestRandomized(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 42))
			f := newFake(t)
			r := reconciler.New(f, nil)
			fes := make([]model.L4Addr, 8)
			for i := range fes {
				fes[i] = model.L4Addr{Addr: netip.AddrFrom4([4]byte{10, 96, 0, byte(i + 1)}), Port: 80, Proto: model.Protocol([]model.Protocol{model.TCP, model.UDP}[i%2])}
			}
			randomState := func() *model.State {
				st := model.NewState()
				for i, fe := range fes {
					if rng.IntN(4) == 0 {
						continue
					}
					var bs []model.Backend
					for range rng.IntN(6) {
						bs = append(bs, model.Backend{L4Addr: model.L4Addr{
							Addr: netip.AddrFrom4([4]byte{10, 0, 0, byte(1 + rng.IntN(10))}), Port: 8080, Proto: fe.Proto,
						}})
					}
					st.Services[fe] = svc(fe, fmt.Sprint("s", i), bs...)
				}
				return st
			}
			for round := range 60 {
				st := randomState()
				failRate := 0.0
				if rng.IntN(3) == 0 {
					failRate = 0.15
				}
				f.Fail = func(fakedp.Op) error {
					if rng.Float64() < failRate {
						return errors.New("injected")
					}
					return nil
				}
				err := r.Apply(st)
				if failRate == 0 && err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
				if err == nil {
					checkProgrammed(t, f, st)
				}
				if rng.IntN(8) == 0 { // agent restart
					f.Fail = nil
					r = reconciler.New(f, nil)
					if err := r.Restore(); err != nil {
						t.Fatal(err)
					}
				}
				// Converge without failures.
				f.Fail = nil
				mustApply(t, r, st)
				checkProgrammed(t, f, st)
				f.ResetCounts()
				mustApply(t, r, st)
				if n := f.Writes(); n != 0 {
					t.Fatalf("round %d: re-apply wrote %d", round, n)
				}
				if t.Failed() {
					t.Fatalf("round %d:\n%s", round, f)
				}
			}
		})
	}
}

// TestRandomizedCapacity checks that with tight maps every service either
// is programmed exactly or keeps its previous programming, and the
// invariants always hold.
func TestRandomizedCapacity(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	f := fakedp.New(5, 12, 20)
	f.CheckAll = true
	r := reconciler.New(f, nil)
	capErrs := 0
	for round := range 200 {
		st := model.NewState()
		for i := range 6 {
			if rng.IntN(3) == 0 {
				continue
			}
			fe := vip(i)
			var bs []model.Backend
			for range rng.IntN(6) {
				bs = append(bs, be(0, 1+rng.IntN(16), model.TCP))
			}
			st.Services[fe] = svc(fe, fmt.Sprint("s", i), bs...)
		}
		before := programmed(t, f)
		err := r.Apply(st)
		if err != nil {
			capErrs++
		}
		if err != nil && !errors.Is(err, reconciler.ErrCapacity) {
			t.Fatalf("round %d: %v", round, err)
		}
		after := programmed(t, f)
		for fe, s := range st.Services {
			var want []model.L4Addr
			for _, b := range s.Backends {
				want = append(want, b.L4Addr)
			}
			got := after[fe]
			if fmt.Sprint(got) != fmt.Sprint(want) && (len(got) > 0 || len(want) > 0) && fmt.Sprint(got) != fmt.Sprint(before[fe]) {
				t.Fatalf("round %d: %s is %v: neither desired %v nor previous %v", round, fe, got, want, before[fe])
			}
		}
		for fe := range after {
			if _, ok := st.Services[fe]; !ok {
				t.Fatalf("round %d: %s still programmed", round, fe)
			}
		}
		if v := f.Violations(); len(v) > 0 {
			t.Fatalf("round %d: %v", round, v)
		}
	}
	if capErrs < 20 || capErrs > 180 {
		t.Errorf("%d of 200 rounds hit the capacity: the test does not exercise it", capErrs)
	}
	t.Logf("%d rounds hit the capacity", capErrs)
}
