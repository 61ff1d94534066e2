package health

import (
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/model/modeltest"
)

// TestLocalIndexIncremental: the health check ports kept from each
// state's changes equal those recomputed from the whole state, and every
// port whose answer changed is among those update says it touched (Sync
// looks at those only), over random chains of states.
func TestLocalIndexIncremental(t *testing.T) {
	served := 0
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 14))
		next := modeltest.Chain(rng, 24, func(rng *rand.Rand, s *model.Service) {
			if rng.IntN(3) == 0 {
				return
			}
			s.ExternalLocal = true
			// Few ports, shared by the frontends of one Service
			// (modeltest names every other frontend alike).
			s.HealthCheckNodePort = 32000 + uint16(len(s.Name.Name)%3)
			for range rng.IntN(3) {
				s.LocalReady = append(s.LocalReady, netip.AddrFrom4([4]byte{10, 1, 0, byte(1 + rng.IntN(4))}))
			}
		})
		var x localIndex
		var before map[uint16]PortStatus
		for round := range 40 {
			st := next()
			touched := x.update(st)
			want := LocalEndpoints(&model.State{Services: st.Services})
			got := map[uint16]PortStatus{}
			for n := range x.ports {
				got[n] = x.status(n)
			}
			if !maps.Equal(got, want) {
				t.Fatalf("seed %d round %d: ports %v, recomputed %v", seed, round, got, want)
			}
			for n := range mapsUnion(before, want) {
				if before[n] != want[n] && !slices.Contains(touched, n) {
					t.Fatalf("seed %d round %d: port %d changed from %v to %v, not touched (%v)", seed, round, n, before[n], want[n], touched)
				}
			}
			before = want
			served += len(want)
		}
	}
	if served < 100 {
		t.Errorf("only %d ports served in all rounds: the test does not exercise them", served)
	}
}

func mapsUnion(a, b map[uint16]PortStatus) map[uint16]bool {
	out := map[uint16]bool{}
	for n := range a {
		out[n] = true
	}
	for n := range b {
		out[n] = true
	}
	return out
}
