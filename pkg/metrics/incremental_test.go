package metrics

import (
	"math/rand/v2"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/model/modeltest"
	"github.com/sluice-lb/sluice/pkg/reconciler"
	"github.com/sluice-lb/sluice/pkg/reconciler/fakedp"
)

// TestSetProgrammedIncremental: the counts and the no_local_endpoints
// gauges kept from each state's changes equal those recounted from the
// whole state, over random chains of states.
func TestSetProgrammedIncremental(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 14))
		next := modeltest.Chain(rng, 24, func(rng *rand.Rand, s *model.Service) {
			s.Kind = []model.FrontendKind{model.ClusterIP, model.NodePort}[rng.IntN(2)]
			s.DropWhenEmpty = rng.IntN(2) == 0
			s.ExternalLocal = s.Kind != model.ClusterIP && rng.IntN(2) == 0
			s.TwoScopes = s.ExternalLocal
		})
		inc := New()
		noLocal := 0
		for round := range 40 {
			st := next()
			inc.SetProgrammed(st)
			full := New()
			full.SetProgrammed(&model.State{Services: st.Services})
			if inc.counts != full.counts {
				t.Fatalf("seed %d round %d: counts %+v, recounted %+v", seed, round, inc.counts, full.counts)
			}
			for _, fam := range ipFamilies {
				for _, policy := range []string{"internal", "external"} {
					got := testutil.ToFloat64(inc.kubeProxy.noLocalEndpts.WithLabelValues(fam, policy))
					want := testutil.ToFloat64(full.kubeProxy.noLocalEndpts.WithLabelValues(fam, policy))
					if got != want {
						t.Fatalf("seed %d round %d: no_local_endpoints %s %s = %v, recounted %v", seed, round, fam, policy, got, want)
					}
					noLocal += int(got)
				}
			}
		}
		if noLocal == 0 {
			t.Errorf("seed %d: no Service port without local endpoints: the test does not exercise them", seed)
		}
	}
}

// TestBackendCounterFollowsReconciler: with the agent's reconciler
// counting the backends, the counts after each state it programmed are
// those recounted from the whole state, over a random chain of states
// whose Services share backends.
func TestBackendCounterFollowsReconciler(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 14))
	next := modeltest.Chain(rng, 24, func(*rand.Rand, *model.Service) {})
	rec := reconciler.New(fakedp.New(64, 64, 256), nil)
	m := New()
	m.SetBackendCounter(rec.BackendCounts)
	for round := range 40 {
		st := next()
		if err := rec.Apply(st); err != nil {
			t.Fatal(err)
		}
		m.SetProgrammed(st)
		if got, want := m.counts, CountState(st); got != want {
			t.Fatalf("round %d: counts %+v, recounted %+v", round, got, want)
		}
		if m.backendRefs != nil {
			t.Fatalf("round %d: SetProgrammed keeps its own map of %d backends", round, len(m.backendRefs))
		}
	}
}
