package model

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
)

// checkServices fails unless s holds exactly want.
func checkServices(t *testing.T, what string, s Services, want map[L4Addr]*Service) {
	t.Helper()
	if s.Len() != len(want) {
		t.Fatalf("%s: Len %d, want %d", what, s.Len(), len(want))
	}
	n := 0
	for k, v := range s.All() {
		n++
		if want[k] != v {
			t.Fatalf("%s: All yields %v -> %p, want %p", what, k, v, want[k])
		}
	}
	if n != len(want) {
		t.Fatalf("%s: All yields %d, want %d", what, n, len(want))
	}
	for k, v := range want {
		if got, ok := s.Lookup(k); !ok || got != v || s.Get(k) != v || !s.Has(k) {
			t.Fatalf("%s: Lookup(%v) = %p, %v, want %p", what, k, got, ok, v)
		}
	}
}

// Random changes of a Services, through Set, Delete and builders, leave
// it equal to a map changed alike, and leave every earlier Services as it
// was: a change copies, it never changes what an older value holds.
func TestServicesPersistent(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	// Few addresses, so that leaves fill, split and empty again.
	key := func() L4Addr {
		return L4Addr{Addr: netip.AddrFrom4([4]byte{10, 96, byte(rng.IntN(4)), byte(rng.IntN(256))}), Port: 80, Proto: Protocol(6 + 11*rng.IntN(2))}
	}
	type snapshot struct {
		s    Services
		want map[L4Addr]*Service
	}
	var snaps []snapshot
	var s Services
	want := map[L4Addr]*Service{}
	for i := range 3000 {
		switch rng.IntN(3) {
		case 0:
			k := key()
			v := &Service{Frontend: k}
			s.Set(k, v)
			want[k] = v
		case 1:
			k := key()
			s.Delete(k)
			delete(want, k)
		default: // a batch through one builder, as the tracker makes a state
			b := s.Edit()
			for range rng.IntN(64) {
				k := key()
				if rng.IntN(3) == 0 {
					b.Delete(k)
					delete(want, k)
					continue
				}
				v := &Service{Frontend: k}
				b.Set(k, v)
				want[k] = v
				if b.Get(k) != v || b.Len() != len(want) {
					t.Fatalf("builder: Get(%v) = %p, want %p; Len %d, want %d", k, b.Get(k), v, b.Len(), len(want))
				}
			}
			s = b.Services()
			// Changes after Services() do not reach it.
			b.Set(key(), &Service{})
			b.Delete(key())
		}
		checkServices(t, "current", s, want)
		if i%100 == 0 {
			snaps = append(snaps, snapshot{s, maps.Clone(want)})
		}
	}
	for i, sn := range snaps {
		checkServices(t, fmt.Sprint("snapshot ", i), sn.s, sn.want)
	}
	checkServices(t, "NewServices", NewServices(want), want)
	checkServices(t, "zero", Services{}, nil)
}

// nodes lists the nodes of s.
func nodes(s Services) map[*snode]bool {
	seen := map[*snode]bool{}
	var walk func(*snode)
	walk = func(n *snode) {
		if n == nil {
			return
		}
		seen[n] = true
		if n.interior {
			for _, k := range n.kids {
				walk(k)
			}
		}
	}
	walk(s.root)
	return seen
}

// One frontend replaced among 30,000 and 100,000 copies the nodes on its
// path only (as many at 100,000 as at 30,000): the new Services shares all
// the others with the old one, which still holds the old Service.
func TestServicesSetSharesTheRest(t *testing.T) {
	for _, n := range []int{30000, 100000} {
		var b ServicesBuilder
		for i := range n {
			k := L4Addr{Addr: netip.AddrFrom4([4]byte{10, byte(96 + i>>16), byte(i >> 8), byte(i)}), Port: 80, Proto: TCP}
			b.Set(k, &Service{Frontend: k})
		}
		old := b.Services()
		k := L4Addr{Addr: netip.AddrFrom4([4]byte{10, 96, 1, 2}), Port: 80, Proto: TCP}
		was := old.Get(k)
		cur := old
		cur.Set(k, &Service{Frontend: k})
		if old.Get(k) != was || cur.Get(k) == was || cur.Len() != n || old.Len() != n {
			t.Fatalf("%d: the old Services changed, or the new one did not", n)
		}
		on, cn := nodes(old), nodes(cur)
		fresh := 0
		for c := range cn {
			if !on[c] {
				fresh++
			}
		}
		// The root, at most four interior nodes under it, a leaf.
		if fresh > 6 || len(cn) != len(on) {
			t.Errorf("%d: %d of %d nodes copied (old %d nodes), want the path only", n, fresh, len(cn), len(on))
		}
		t.Logf("%d frontends: %d nodes, %d copied", n, len(cn), fresh)
	}
}

// sameTrie fails unless a and b are the same trie: the same nodes, interior
// or leaf, in the same places, each leaf with the same frontends and
// Services in the same order.
func sameTrie(t *testing.T, what string, a, b *snode, path []int) {
	t.Helper()
	switch {
	case (a == nil) != (b == nil):
		t.Fatalf("%s: at %v: node %v, want %v", what, path, a != nil, b != nil)
	case a == nil:
		return
	case a.interior != b.interior:
		t.Fatalf("%s: at %v: interior %v, want %v", what, path, a.interior, b.interior)
	case a.interior:
		for i := range a.kids {
			sameTrie(t, what, a.kids[i], b.kids[i], append(path, i))
		}
		return
	}
	if !slices.Equal(a.hashes, b.hashes) || !slices.Equal(a.ents, b.ents) {
		t.Fatalf("%s: at %v: leaf of %d frontends, want %d (or another order)", what, path, len(a.ents), len(b.ents))
	}
}

// BuildServices makes the trie that setting the same frontends one by one
// through a ServicesBuilder makes (random sets of random sizes, around the
// leaves' size and well past it, keys from narrow and wide ranges), and
// it is a Services like any other: changes copy, never change it.
func TestBuildServicesAsInserts(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	sizes := []int{0, 1, 2, leafMax - 1, leafMax, leafMax + 1, 8 * leafMax, 8*leafMax + 1, 30000}
	for range 60 {
		sizes = append(sizes, rng.IntN(3000))
	}
	for run, n := range sizes {
		span := 1 + rng.IntN(4) // third octets: a narrow range repeats keys more
		if run%3 == 0 {
			span = 256
		}
		seen := map[L4Addr]bool{}
		var ents []ServiceEntry
		var b ServicesBuilder
		want := map[L4Addr]*Service{}
		for tries := 0; len(ents) < n && tries < 4*n; tries++ {
			k := L4Addr{Addr: netip.AddrFrom4([4]byte{10, byte(rng.IntN(4)), byte(rng.IntN(span)), byte(rng.IntN(256))}),
				Port: uint16(rng.IntN(3)), Proto: Protocol(6 + 11*rng.IntN(2))}
			if seen[k] {
				continue // at most 4n tries: the range may hold fewer
			}
			seen[k] = true
			v := &Service{Frontend: k}
			ents = append(ents, ServiceEntry{k, v})
			b.Set(k, v)
			want[k] = v
		}
		what := fmt.Sprintf("run %d, %d frontends", run, len(ents))
		got, ok := BuildServices(ents)
		if !ok {
			t.Fatalf("%s: reports a frontend twice", what)
		}
		inc := b.Services()
		sameTrie(t, what, got.root, inc.root, nil)
		checkServices(t, what, got, want)
		if len(ents) == 0 {
			continue
		}
		// A change of the built Services copies: the original holds
		// what it held.
		c := got
		e := ents[rng.IntN(len(ents))]
		c.Set(e.Key, &Service{})
		c.Delete(ents[rng.IntN(len(ents))].Key)
		c.Set(L4Addr{Addr: netip.AddrFrom4([4]byte{192, 0, 2, 1}), Port: 1, Proto: TCP}, &Service{})
		checkServices(t, what+", after changes of a copy", got, want)
	}
}

// BuildServices reports a frontend given twice, wherever it is among the
// others.
func TestBuildServicesDuplicate(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, n := range []int{2, 3, leafMax, leafMax + 1, 1000, 20000} {
		ents := make([]ServiceEntry, n)
		for i := range ents {
			k := L4Addr{Addr: netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), Port: 80, Proto: TCP}
			ents[i] = ServiceEntry{k, &Service{Frontend: k}}
		}
		if _, ok := BuildServices(ents); !ok {
			t.Fatalf("%d distinct frontends: reported twice", n)
		}
		i, j := rng.IntN(n), rng.IntN(n-1)
		if j >= i {
			j++
		}
		ents[j].Key = ents[i].Key
		if s, ok := BuildServices(ents); ok || s.Len() != 0 {
			t.Fatalf("%d frontends, %d as %d: not reported (Len %d)", n, j, i, s.Len())
		}
	}
}
