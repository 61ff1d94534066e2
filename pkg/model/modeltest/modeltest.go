// Package modeltest makes chains of desired states for the tests of what
// consumes model.State's change hints (Gen, BaseGen, Changed): each state
// is made from the one before as the sources' tracker makes it, so a test
// can check that a consumer's incremental result equals its full
// recomputation. L4 is a small constructor for the fixtures of any test.
package modeltest

import (
	"fmt"
	"math/rand/v2"
	"net/netip"

	"github.com/sluice-lb/sluice/pkg/model"
)

// Chain returns a function that returns, at each call, a random state of
// up to frontends frontends made from the one before: it keeps about half
// of them (the very same *model.Service), replaces, removes or adds the
// others, and says which it changed. One state in eight says nothing
// (BaseGen 0), as a state the tracker rebuilt. shape gives each new
// Service the fields the test cares about.
func Chain(rng *rand.Rand, frontends int, shape func(rng *rand.Rand, s *model.Service)) func() *model.State {
	var prev *model.State
	return func() *model.State {
		st := &model.State{Gen: model.NewGeneration()}
		var b model.ServicesBuilder
		for i := range frontends {
			fe := model.L4Addr{Addr: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Port: 80, Proto: model.TCP}
			if prev != nil && prev.Services.Get(fe) != nil && rng.IntN(2) == 0 {
				b.Set(fe, prev.Services.Get(fe))
				continue
			}
			if rng.IntN(4) == 0 {
				continue
			}
			s := &model.Service{Name: model.ServicePortName{Namespace: "default", Name: fmt.Sprint("s", i%(frontends/2+1)), Port: "http"}, Frontend: fe}
			for range rng.IntN(4) {
				s.Backends = append(s.Backends, model.Backend{L4Addr: model.L4Addr{
					Addr: netip.AddrFrom4([4]byte{10, 1, 0, byte(1 + rng.IntN(8))}), Port: 8080, Proto: model.TCP}})
			}
			s.Backends = model.SortBackends(s.Backends)
			shape(rng, s)
			b.Set(fe, s)
		}
		st.Services = b.Services()
		if prev != nil && rng.IntN(8) != 0 {
			st.BaseGen = prev.Gen
			for i := range frontends {
				fe := model.L4Addr{Addr: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Port: 80, Proto: model.TCP}
				if st.Services.Get(fe) != prev.Services.Get(fe) {
					st.Changed = append(st.Changed, fe)
				}
			}
		}
		prev = st
		return st
	}
}
