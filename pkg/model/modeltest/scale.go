package modeltest

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/sluice-lb/sluice/pkg/model"
)

// Scale returns n ClusterIP services with 2 to 10 backends each (the
// shape of the sources' scale benchmarks), and a function that returns
// the next of two states made from each other that differ in one backend
// of one service, with change hints, for one-change benchmarks.
func Scale(n int) (*model.State, func() *model.State) {
	st := &model.State{Gen: model.NewGeneration()}
	var b model.ServicesBuilder
	for i := range n {
		fe := model.L4Addr{Addr: netip.AddrFrom4([4]byte{10, byte(96 + i>>16), byte(i >> 8), byte(i)}), Port: 80, Proto: model.TCP}
		s := &model.Service{Name: model.ServicePortName{Namespace: "bench", Name: fmt.Sprint("svc-", i), Port: "http"}, Frontend: fe}
		for j := range 2 + i%9 {
			s.Backends = append(s.Backends, model.Backend{L4Addr: model.L4Addr{
				Addr: netip.AddrFrom4([4]byte{byte(11 + j), byte(i >> 16), byte(i >> 8), byte(i)}), Port: 8080, Proto: model.TCP}})
		}
		b.Set(fe, s)
	}
	st.Services = b.Services()
	fe := model.L4Addr{Addr: netip.AddrFrom4([4]byte{10, byte(96 + (n/2)>>16), byte((n / 2) >> 8), byte(n / 2)}), Port: 80, Proto: model.TCP}
	moved := *st.Services.Get(fe)
	moved.Backends = append([]model.Backend{{L4Addr: model.L4Addr{Addr: netip.MustParseAddr("10.250.250.250"), Port: 8080, Proto: model.TCP}}}, moved.Backends[1:]...)
	moved.Backends = model.SortBackends(moved.Backends)
	other := st.Services // shares all but the path to fe
	other.Set(fe, &moved)
	states := [2]*model.State{
		{Services: other, Gen: model.NewGeneration(), BaseGen: st.Gen, Changed: []model.L4Addr{fe}},
		st,
	}
	i := 0
	return st, func() *model.State {
		s := states[i%2]
		i++
		// Each is made from the other.
		s.BaseGen = states[i%2].Gen
		s.Changed = []model.L4Addr{fe}
		return s
	}
}

// BenchOneChange benchmarks following one change at 30k and 100k services
// (sub-benchmarks 30k and 100k, issue 14): start gets Scale's first state
// and returns what follows a state; the loop times it on Scale's next
// states.
func BenchOneChange(b *testing.B, start func(b *testing.B, st *model.State) func(*model.State)) {
	for _, n := range []int{30000, 100000} {
		b.Run(fmt.Sprintf("%dk", n/1000), func(b *testing.B) {
			st, next := Scale(n)
			follow := start(b, st)
			b.ReportAllocs()
			for b.Loop() {
				follow(next())
			}
		})
	}
}
