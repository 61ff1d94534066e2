package reconciler_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

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
	batchFails := 0
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { batchFails += seeded(t, seed, randomOpts{}).batchFails })
	}
	if batchFails < 20 {
		t.Errorf("only %d batches failed part-way in 20 runs: the test does not exercise them", batchFails)
	}
	t.Logf("%d batches failed part-way", batchFails)
}

// TestRandomizedAffinity is TestRandomized with session affinity that
// comes, goes and changes its timeout, on frontends of one scope and of
// two: masters of both scopes carry the timeout, and every move of
// clients' affinity names a slot that holds its backend (the fake checks
// it) when it is made.
func TestRandomizedAffinity(t *testing.T) {
	for _, opts := range []randomOpts{{affinity: true}, {affinity: true, ranges: true, scopes: true}} {
		moves := 0
		for seed := range uint64(20) {
			t.Run(fmt.Sprintf("scopes=%v/%d", opts.scopes, seed), func(t *testing.T) { moves += seeded(t, seed, opts).moves })
		}
		if moves < 20 {
			t.Errorf("scopes=%v: only %d session affinity moves in 20 runs: the test does not exercise them", opts.scopes, moves)
		}
	}
}

// TestRandomizedSourceRanges is TestRandomized with LoadBalancer frontends
// whose loadBalancerSourceRanges come and go: no master ever checks
// ranges that are not there, and none are left once an Apply succeeds.
func TestRandomizedSourceRanges(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { seeded(t, seed, randomOpts{ranges: true}) })
	}
}

// TestRandomizedScopes is TestRandomized with frontends that gain and lose
// an internal scope (externalTrafficPolicy Local), change kind (and so
// their address's membership in the service IPs) and drop when empty: no
// master ever says two scopes without its internal scope, no ClusterIP
// address is a service IP without a master, and what an Apply leaves is
// exactly the desired state.
func TestRandomizedScopes(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { seeded(t, seed, randomOpts{ranges: true, scopes: true}) })
	}
}

// TestRandomizedDualStack is TestRandomizedScopes (with affinity) with
// IPv4 and IPv6 frontends side by side: the invariants (a frontend's
// slots name backends of its family, its master a rev_nat entry of its
// family) hold after every operation, and the state converges.
func TestRandomizedDualStack(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			seeded(t, seed, randomOpts{dualStack: true, ranges: true, scopes: true, affinity: true})
		})
	}
}

// seeded runs 60 rounds of randomized from seed, checks that they
// exercised what opts asks for, and returns what they exercised.
func seeded(t *testing.T, seed uint64, opts randomOpts) exercised {
	seen := randomized(t, rand.New(rand.NewPCG(seed, 42)), 60, opts)
	if opts.ranges && seen.ranges < 30 {
		t.Errorf("only %d of 60 rounds programmed source ranges: the test does not exercise them", seen.ranges)
	}
	if seen.standby < 40 {
		t.Errorf("only %d UDP backends in standby in 60 rounds: the test does not exercise them", seen.standby)
	}
	if opts.scopes && (seen.scopes < 60 || seen.clusterIPs < 60) {
		t.Errorf("%d frontends with two scopes, %d ClusterIPs in 60 rounds: the test does not exercise them", seen.scopes, seen.clusterIPs)
	}
	return seen
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
		opts := randomOpts{ranges: c.Bool(), scopes: c.Bool(), affinity: c.Bool()}
		// A round takes a hundred bytes or so: a longer input, more
		// rounds, up to 20 (once the bytes run out, rounds of empty states).
		randomized(t, c, min(1+len(data)/100, 20), opts)
	})
}

type randomOpts struct {
	ranges bool // LoadBalancer frontends with source ranges
	scopes bool // frontends with two scopes, of changing kinds
	// session affinity that comes, goes and changes its timeout
	affinity bool
	// dualStack: half the frontends are IPv6, with IPv6 backends and
	// source ranges.
	dualStack bool
	// hints: each state keeps some frontends of the one before (the same
	// *Service) and says which it changed (model.State.BaseGen, Changed),
	// as the sources' tracker does.
	hints bool
}

// TestRandomizedHints is TestRandomizedScopes (with affinity) with states that say what
// changed since the one before: the reconciler looks at those frontends
// only when it applied the one before entirely, and must converge to
// exactly the desired state all the same.
func TestRandomizedHints(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			seeded(t, seed, randomOpts{ranges: true, scopes: true, affinity: true, hints: true})
		})
	}
}

// exercised counts what a randomized run programmed: rounds with source
// ranges, frontends with two scopes, ClusterIP frontends, the session
// affinity entries it moved to another slot, the batches failed
// part-way (new frontends are programmed in batches, batch.go), and the
// UDP backends its Services held in standby.
type exercised struct{ ranges, scopes, clusterIPs, moves, batchFails, standby int }

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
// frontends and source ranges, and frontends of two scopes, as opts asks),
// each under a random rate of failing writes, with now and then an agent
// restart, and checks the fake's invariants and the convergence after
// each. It returns what the rounds exercised.
func randomized(t *testing.T, rng chooser, rounds int, opts randomOpts) exercised {
	f := newFake(t)
	r := reconciler.New(f, nil)
	fes := make([]model.L4Addr, 8)
	for i := range fes {
		// Two ports of each address with scopes: its service IP comes
		// and goes with the last ClusterIP among them.
		a := byte(i + 1)
		if opts.scopes {
			a = byte(i/2 + 1)
		}
		ip := netip.AddrFrom4([4]byte{10, 96, 0, a})
		if opts.dualStack && (i/2)%2 == 1 {
			ip = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 0x96, 15: a})
		}
		fes[i] = model.L4Addr{Addr: ip, Port: 80 + uint16(i%4), Proto: model.Protocol([]model.Protocol{model.TCP, model.UDP}[i%2])}
	}
	// Backends of fe's family: some IPv6 backends are those of IPv4
	// ones with the IPv4 address mapped into 2001:db8::/96.
	backends := func(fe model.L4Addr) []model.Backend {
		var bs []model.Backend
		for range rng.IntN(6) {
			a := netip.AddrFrom4([4]byte{10, 0, 0, byte(1 + rng.IntN(10))})
			if fe.Addr.Is6() {
				a = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: a.As4()[3]})
			}
			bs = append(bs, model.Backend{L4Addr: model.L4Addr{Addr: a, Port: 8080, Proto: fe.Proto}})
		}
		return model.SortBackends(bs)
	}
	ranges := func(fe model.L4Addr) (out []netip.Prefix) {
		for _, p := range randomRanges {
			if fe.Addr.Is6() {
				p = netip.PrefixFrom(netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0x77, 15: p.Addr().As4()[0]}), 96+p.Bits())
			}
			if rng.IntN(2) == 0 {
				out = append(out, p)
			}
		}
		return out
	}
	// standby draws serving endpoints of s's that neither scope uses
	// (terminating while others are ready, left out by topology): their
	// entries stay, and their flows, as long as a Service holds them.
	standby := func(fe model.L4Addr, s *model.Service) []model.L4Addr {
		var out []model.L4Addr
		for _, b := range backends(fe) {
			is := func(x model.Backend) bool { return x.L4Addr == b.L4Addr }
			if !slices.ContainsFunc(s.Backends, is) && !slices.ContainsFunc(s.InternalBackends, is) {
				out = append(out, b.L4Addr)
			}
		}
		return slices.Compact(out) // sorted already
	}
	scopesSeen, cipsSeen, standbySeen := 0, 0, 0
	var prev *model.State
	randomState := func() *model.State {
		st := model.NewState()
		for i, fe := range fes {
			if opts.hints && prev != nil && prev.Services.Get(fe) != nil && rng.IntN(2) == 0 {
				s := prev.Services.Get(fe)
				st.Services.Set(fe, s)
				if s.TwoScopes {
					scopesSeen++
				}
				if opts.scopes && s.Kind == model.ClusterIP {
					cipsSeen++
				}
				continue
			}
			if rng.IntN(4) == 0 {
				continue
			}
			s := svc(fe, fmt.Sprint("s", i), backends(fe)...)
			if opts.scopes {
				s.Kind = []model.FrontendKind{model.ClusterIP, model.NodePort, model.LoadBalancer}[rng.IntN(3)]
				s.DropWhenEmpty = len(s.Backends) == 0 && rng.IntN(2) == 0
				if s.Kind != model.ClusterIP && rng.IntN(2) == 0 {
					s.ExternalLocal, s.TwoScopes = true, true
					s.InternalBackends = backends(fe)
					scopesSeen++
				}
				if s.Kind == model.ClusterIP {
					cipsSeen++
				}
			}
			if opts.ranges && !opts.scopes {
				s.Kind = []model.FrontendKind{model.ClusterIP, model.LoadBalancer}[rng.IntN(2)]
				s.SourceRanges = ranges(fe)
			}
			if opts.ranges && opts.scopes && s.Kind == model.LoadBalancer {
				s.SourceRanges = ranges(fe)
			}
			if opts.affinity {
				s.AffinityTimeout = []time.Duration{0, time.Second, time.Hour}[rng.IntN(3)]
			}
			if fe.Proto == model.UDP && rng.IntN(2) == 0 {
				s.Standby = standby(fe, s)
				standbySeen += len(s.Standby)
			}
			st.Services.Set(fe, s)
		}
		if opts.hints {
			st.Gen = model.NewGeneration()
			if prev != nil {
				st.BaseGen = prev.Gen
				for _, fe := range fes {
					if st.Services.Get(fe) != prev.Services.Get(fe) {
						st.Changed = append(st.Changed, fe)
					}
				}
			}
			prev = st
		}
		return st
	}
	withRanges, moves := 0, 0 // rounds that programmed source ranges; affinity moves
	batchFails := 0           // failures injected into an entry of a batch
	incremental := 0          // Applies that looked at the changed frontends only
	for round := range rounds {
		st := randomState()
		failPct := 0 // of the writes
		if rng.IntN(3) == 0 {
			failPct = 15
		}
		f.Fail = func(op fakedp.Op) error {
			if rng.IntN(100) < failPct {
				if op.Batch {
					batchFails++
				}
				return errors.New("injected")
			}
			return nil
		}
		had := backendEntries(t, f)
		err := r.Apply(st)
		if failPct == 0 && err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		checkKeptStandby(t, f, st, had)
		if m := reconciler.UDPNamedMismatch(r); m != "" {
			t.Fatalf("round %d: %s", round, m)
		}
		lost := lostEntries(t, f, had)
		for _, x := range f.AffinityFixes() {
			if x.Slot != 0 {
				moves++
			}
		}
		if err == nil {
			checkProgrammed(t, f, st)
		}
		restarted := rng.IntN(8) == 0
		if restarted { // agent restart
			f.Fail = nil
			incremental += reconciler.IncrementalApplies(r)
			r = reconciler.New(f, nil)
			if err := r.Restore(); err != nil {
				t.Fatal(err)
			}
		}
		// Converge without failures.
		f.Fail = nil
		had = backendEntries(t, f)
		mustApply(t, r, st)
		checkProgrammed(t, f, st)
		checkKeptStandby(t, f, st, had)
		// Every UDP backend whose entry went had its flows flushed (but
		// a restart forgets the flushes a failure left pending).
		for a := range lostEntries(t, f, had) {
			lost[a] = true
		}
		if !restarted {
			for a := range lost {
				if a.Proto == model.UDP && !slices.Contains(f.Flushed(), a) {
					t.Errorf("round %d: backend %s lost its entry, its flows not flushed", round, a)
				}
			}
		}
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
	if incremental += reconciler.IncrementalApplies(r); opts.hints && incremental < rounds/4 && rounds >= 10 {
		t.Errorf("%d Applies in %d rounds looked at the changed frontends only: the test does not exercise it", incremental, rounds)
	}
	return exercised{ranges: withRanges, scopes: scopesSeen, clusterIPs: cipsSeen, moves: moves, batchFails: batchFails, standby: standbySeen}
}

// lostEntries returns the backend addresses of had the fake no longer
// holds.
func lostEntries(t testing.TB, f *fakedp.Fake, had map[model.L4Addr]bool) map[model.L4Addr]bool {
	now := backendEntries(t, f)
	lost := map[model.L4Addr]bool{}
	for a := range had {
		if !now[a] {
			lost[a] = true
		}
	}
	return lost
}

// TestRandomizedCapacity checks that with tight maps every service either
// is programmed exactly or keeps its previous programming, and the
// invariants always hold. Half the frontends are IPv6, in maps of their
// own (fakedp refuses a write to a full one: a write error, not a
// capacity one); a frontend refused for capacity is refused for its own
// family's maps, or for services of both families.
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
			v6 := i%2 == 1
			fe := famFrontend(v6, i)
			var bs []model.Backend
			for range rng.IntN(6) {
				b := be(0, 1+rng.IntN(16), model.TCP)
				if v6 {
					b.Addr = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: b.Addr.As4()[3]})
				}
				bs = append(bs, b)
			}
			st.Services.Set(fe, svc(fe, fmt.Sprint("s", i), bs...))
		}
		before := programmed(t, f)
		err := r.Apply(st)
		if err != nil {
			capErrs++
		}
		if err != nil && !errors.Is(err, reconciler.ErrCapacity) {
			t.Fatalf("round %d: %v", round, err)
		}
		for fe, e := range frontendErrors(t, err) {
			fam := "IPv4"
			if fe.Addr.Is6() {
				fam = "IPv6"
			}
			if msg := e.Error(); !strings.Contains(msg, " "+fam+" ") && !strings.Contains(msg, "both families") {
				t.Fatalf("round %d: %s refused for another family's maps: %v", round, fe, e)
			}
		}
		after := programmed(t, f)
		for fe, s := range st.Services.All() {
			var want []model.L4Addr
			for _, b := range s.Backends {
				want = append(want, b.L4Addr)
			}
			dfe := reconciler.DefaultScope(fe)
			got := after[dfe]
			if fmt.Sprint(got) != fmt.Sprint(want) && (len(got) > 0 || len(want) > 0) && fmt.Sprint(got) != fmt.Sprint(before[dfe]) {
				t.Fatalf("round %d: %s is %v: neither desired %v nor previous %v", round, fe, got, want, before[dfe])
			}
		}
		for fe := range after {
			if _, ok := st.Services.Lookup(fe.L4Addr); !ok {
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
