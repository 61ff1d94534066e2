package reconciler_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/sluice-lb/sluice/internal/testutil"
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
		t.Run(fmt.Sprint(seed), func(t *testing.T) { randomized(t, rand.New(rand.NewPCG(seed, 42)), 60, false) })
	}
}

// TestRandomizedSourceRanges is TestRandomized with LoadBalancer frontends
// whose loadBalancerSourceRanges come and go: no master ever checks
// ranges that are not there, and none are left once an Apply succeeds.
func TestRandomizedSourceRanges(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			if n := randomized(t, rand.New(rand.NewPCG(seed, 42)), 60, true); n < 30 {
				t.Errorf("only %d of 60 rounds programmed source ranges: the test does not exercise them", n)
			}
		})
	}
}

// FuzzApply is TestRandomized with the fuzzer's bytes for its decisions:
// which frontends a state has, their backends, kinds and source ranges,
// which writes fail, when the agent restarts. The invariants are checked
// after every map operation, and every failure-free Apply must converge
// to the desired state and leave nothing to write again. The seeds are
// bytes of TestRandomized's generators, so the corpus starts where the
// seeded test stands.
func FuzzApply(f *testing.F) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 42))
		b := make([]byte, 512)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c := testutil.NewChoices(data)
		ranges := c.Bool()
		// A round takes a hundred bytes or so: a longer input, more
		// rounds, up to 20 (once the bytes run out, rounds of empty states).
		randomized(t, c, min(1+len(data)/100, 20), ranges)
	})
}

// chooser is where randomized takes its decisions from: a seeded
// *rand.Rand, or the fuzzer's bytes (testutil.Choices).
type chooser interface {
	IntN(n int) int
}

var randomRanges = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.7.0/24"), netip.MustParsePrefix("192.0.2.1/32"),
}

// randomized applies rounds random desired states (with LoadBalancer
// frontends and source ranges if ranges), each under a random rate of
// failing writes, with now and then an agent restart, and checks the
// fake's invariants and the convergence after each. It returns how many
// rounds programmed source ranges.
func randomized(t *testing.T, rng chooser, rounds int, ranges bool) int {
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
			st.Services[fe] = s
		}
		return st
	}
	withRanges := 0 // rounds that programmed source ranges
	for round := range rounds {
		st := randomState()
		failPct := 0 // of the writes
		if rng.IntN(3) == 0 {
			failPct = 15
		}
		f.Fail = func(fakedp.Op) error {
			if rng.IntN(100) < failPct {
				return errors.New("injected")
			}
			return nil
		}
		err := r.Apply(st)
		if failPct == 0 && err != nil {
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
		if v := f.Check(); len(v) > 0 {
			t.Fatalf("round %d: %v", round, v)
		}
		if ks, _ := f.Dump(); len(ks.SourceRanges) > 0 {
			withRanges++
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
	return withRanges
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
