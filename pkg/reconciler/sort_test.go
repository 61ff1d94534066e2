package reconciler

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/sluice-lb/sluice/pkg/model"
)

// randL4 returns an address among a few IPv4 ones, often, or IPv6 ones,
// when v6, with a port and protocol among a few: equal addresses, ports
// and protocols come up.
func randL4(rnd *rand.Rand, v6 bool) model.L4Addr {
	a := netip.AddrFrom4([4]byte{10, byte(rnd.IntN(2) * 200), 0, byte(rnd.IntN(4))})
	if v6 {
		a = netip.AddrFrom16([16]byte{0xfd, 15: byte(rnd.IntN(4))})
	}
	return model.L4Addr{Addr: a, Port: uint16(rnd.IntN(3)) << (8 * rnd.IntN(2)), Proto: []model.Protocol{model.TCP, model.UDP}[rnd.IntN(2)]}
}

// TestSortDesiredAsCompare: sortDesired orders frontends as
// Frontend.Compare does (a frontend's internal scope before its default
// one), packed when all are IPv4 and not when some are IPv6.
func TestSortDesiredAsCompare(t *testing.T) {
	for seed := range uint64(300) {
		rnd := rand.New(rand.NewPCG(seed, 14))
		v6 := seed%3 == 0
		ds := make([]*desiredFrontend, rnd.IntN(40))
		for i := range ds {
			ds[i] = &desiredFrontend{fe: Frontend{L4Addr: randL4(rnd, v6 && rnd.IntN(4) == 0), Scope: Scope(rnd.IntN(2))}}
		}
		want := slices.Clone(ds)
		slices.SortStableFunc(want, func(a, b *desiredFrontend) int { return a.fe.Compare(b.fe) })
		sortDesired(ds)
		for i := range ds {
			if ds[i].fe != want[i].fe {
				t.Fatalf("seed %d: frontend %d is %s, want %s", seed, i, ds[i].fe, want[i].fe)
			}
		}
	}
}

// TestSortedUniqueAsCompare: sortedUnique says what comparing each pair
// of neighbours with compareBackends says, IPv4 (packed) or not.
func TestSortedUniqueAsCompare(t *testing.T) {
	for seed := range uint64(2000) {
		rnd := rand.New(rand.NewPCG(seed, 14))
		v6 := seed%3 == 0
		bs := make([]model.Backend, rnd.IntN(6))
		for i := range bs {
			bs[i] = model.Backend{L4Addr: randL4(rnd, v6 && rnd.IntN(3) == 0)}
		}
		if rnd.IntN(2) == 0 {
			slices.SortFunc(bs, compareBackends)
		}
		want := true
		for i := 1; i < len(bs); i++ {
			if compareBackends(bs[i-1], bs[i]) >= 0 {
				want = false
			}
		}
		if got := sortedUnique(bs); got != want {
			t.Fatalf("seed %d: sortedUnique(%v) = %v, want %v", seed, bs, got, want)
		}
	}
}
