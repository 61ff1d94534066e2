package reconciler

import (
	"maps"
	"math/rand/v2"
	"testing"
)

// TestPackedMapAsGoMap: random puts, getOrPuts, deletes and walks that delete part of
// what they yield leave a packedMap holding what a Go map does after each
// step. Few keys from a small range crowd a small table (long runs of
// probes, runs that wrap past its end, tables grown from every size);
// keys 0 and all ones are keys like any other.
func TestPackedMapAsGoMap(t *testing.T) {
	for seed := range uint64(200) {
		rnd := rand.New(rand.NewPCG(seed, 14))
		m := makePackedMap[int](rnd.IntN(20))
		want := map[uint64]int{}
		keyRange := 1 + rnd.IntN(300)
		key := func() uint64 {
			k := uint64(rnd.IntN(keyRange))
			if k == 1 {
				return ^uint64(0)
			}
			return k << (rnd.IntN(2) * 32) // high or low bits only
		}
		for step := range 400 {
			switch op := rnd.IntN(12); {
			case op < 5:
				k, v := key(), rnd.Int()
				m.put(k, v)
				want[k] = v
			case op >= 10:
				// getOrPut: an existing key's value, or a new one's.
				k, v := key(), rnd.Int()
				wv, had := want[k]
				got, ok := m.getOrPut(k, func() int { return v })
				if !had {
					wv = v
					want[k] = v
				}
				if got != wv || ok != had {
					t.Fatalf("seed %d step %d: getOrPut %d = %d %v, want %d %v", seed, step, k, got, ok, wv, had)
				}
			case op < 9:
				k := key()
				m.del(k)
				delete(want, k)
			default:
				// Delete about a third of the entries while walking.
				seen := map[uint64]bool{}
				for k, v := range m.all() {
					if seen[k] || want[k] != v {
						t.Fatalf("seed %d step %d: walk yields %d=%d (seen %v), want %d", seed, step, k, v, seen[k], want[k])
					}
					seen[k] = true
					if rnd.IntN(3) == 0 {
						m.del(k)
						delete(want, k)
						seen[k] = false
					}
				}
				for k := range want {
					if _, ok := seen[k]; !ok {
						t.Fatalf("seed %d step %d: walk missed %d", seed, step, k)
					}
				}
			}
			if m.n != len(want) {
				t.Fatalf("seed %d step %d: %d entries, want %d", seed, step, m.n, len(want))
			}
			for k := range uint64(keyRange) {
				for _, k := range []uint64{k, k << 32, ^uint64(0)} {
					v, ok := m.get(k)
					if wv, wok := want[k]; ok != wok || v != wv {
						t.Fatalf("seed %d step %d: get %d = %d %v, want %d %v", seed, step, k, v, ok, wv, wok)
					}
				}
			}
			got := map[uint64]int{}
			for k, v := range m.all() {
				got[k] = v
			}
			if !maps.Equal(got, want) {
				t.Fatalf("seed %d step %d: walk yields %v, want %v", seed, step, got, want)
			}
		}
	}
}
