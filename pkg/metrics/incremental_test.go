package metrics

import (
	"math/rand/v2"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/model/modeltest"
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
