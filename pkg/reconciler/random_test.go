package reconciler_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

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
		t.Run(fmt.Sprint(seed), func(t *testing.T) { randomized(t, seed, false, false) })
	}
}

// TestRandomizedAffinity is TestRandomized with session affinity that
// comes, goes and changes its timeout: masters carry the timeout, and
// every move of clients' affinity names a slot that holds its backend
// (the fake checks it) when it is made.
func TestRandomizedAffinity(t *testing.T) {
	moves := 0
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { moves += randomized(t, seed, false, true) })
	}
	if moves < 20 {
		t.Errorf("only %d session affinity moves in 20 runs: the test does not exercise them", moves)
	}
}

// TestRandomizedSourceRanges is TestRandomized with LoadBalancer frontends
// whose loadBalancerSourceRanges come and go: no master ever checks
// ranges that are not there, and none are left once an Apply succeeds.
func TestRandomizedSourceRanges(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { randomized(t, seed, true, false) })
	}
}

var randomRanges = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.7.0/24"), netip.MustParsePrefix("192.0.2.1/32"),
}

// randomized runs one randomized test and returns how many session
// affinity moves it made.
func randomized(t *testing.T, seed uint64, ranges, affinity bool) (moves int) {
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
			s := svc(fe, fmt.Sprint("s", i), bs...)
			if ranges {
				s.Kind = []model.FrontendKind{model.ClusterIP, model.LoadBalancer}[rng.IntN(2)]
				for _, p := range randomRanges {
					if rng.IntN(2) == 0 {
						s.SourceRanges = append(s.SourceRanges, p)
					}
				}
			}
			if affinity {
				s.AffinityTimeout = []time.Duration{0, time.Second, time.Hour}[rng.IntN(3)]
			}
			st.Services[fe] = s
		}
		return st
	}
	withRanges := 0 // rounds that programmed source ranges
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
		for _, x := range f.AffinityFixes() {
			if x.Slot != 0 {
				moves++
			}
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
		if v := f.Check(); len(v) > 0 {
			t.Fatalf("round %d: %v", round, v)
		}
		ks, _ := f.Dump()
		if len(ks.SourceRanges) > 0 {
			withRanges++
		}
		for fe, s := range st.Services {
			if m := ks.Masters[fe]; m.AffinityTimeout != reconciler.AffinitySeconds(s) ||
				(m.Flags&reconciler.FlagAffinity != 0) != (s.AffinityTimeout > 0) {
				t.Errorf("round %d: %s master %+v, want affinity %v", round, fe, m, s.AffinityTimeout)
			}
		}
		f.ResetCounts()
		mustApply(t, r, st)
		if n := f.Writes(); n != 0 {
			t.Fatalf("round %d: re-apply wrote %d", round, n)
		}
		if t.Failed() {
			t.Fatalf("round %d:\n%s", round, f)
		}
	}
	if ranges && withRanges < 30 {
		t.Errorf("only %d of 60 rounds programmed source ranges: the test does not exercise them", withRanges)
	}
	return moves
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
