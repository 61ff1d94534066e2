package reconciler

import (
	"iter"
	"math/bits"
)

// packedMap is the part of a keyMap whose keys pack into a uint64 (IPv4):
// an open-addressing hash table, linear probing, deleting by shifting the
// entries after back (no tombstones), keys and values in slices of their
// own and a bitmap of the slots in use. A Go map of 240,000 backend
// addresses (uint64 keys, uint32 ids: issue 14's 30,000 Services x 8)
// took 9 MiB, 39 bytes an entry at the load it had; this takes 12.1 bytes
// a slot at a load of 0.5 to 0.75 (grown by half when it passes 0.75; 2/3
// when presized): 16-24 bytes an entry.
type packedMap[V any] struct {
	keys []uint64
	vals []V
	full []uint64 // bit i: slot i holds an entry
	n    int
}

const (
	packedMaxLoadNum, packedMaxLoadDen = 3, 4
	packedMinSlots                     = 8
)

// makePackedMap returns a packedMap with room for n entries and some
// more (a load of 2/3 at n): the first program presizes the view's maps,
// and the next change should not grow them at once.
func makePackedMap[V any](n int) packedMap[V] {
	var m packedMap[V]
	if n > 0 {
		m.resize(max(packedMinSlots, n+n/2))
	}
	return m
}

func (m *packedMap[V]) used(i int) bool { return m.full[i/64]&(1<<(i%64)) != 0 }

// home is k's first slot: the high bits of a mix of k's bits, scaled to
// the table (so any number of slots will do).
func (m *packedMap[V]) home(k uint64) int {
	// MurmurHash3's 64-bit finalizer.
	k ^= k >> 33
	k *= 0xff51afd7ed558ccd
	k ^= k >> 33
	k *= 0xc4ceb9fe1a85ec53
	k ^= k >> 33
	hi, _ := bits.Mul64(k, uint64(len(m.keys)))
	return int(hi)
}

// find returns k's slot, or the empty slot where it would go.
func (m *packedMap[V]) find(k uint64) (int, bool) {
	i := m.home(k)
	for m.used(i) {
		if m.keys[i] == k {
			return i, true
		}
		if i++; i == len(m.keys) {
			i = 0
		}
	}
	return i, false
}

func (m *packedMap[V]) get(k uint64) (V, bool) {
	if m.n > 0 {
		if i, ok := m.find(k); ok {
			return m.vals[i], true
		}
	}
	var zero V
	return zero, false
}

// getOrPut returns k's value, or adds k with the value mk returns (and
// reports false): one probe where a get and then a put make two.
func (m *packedMap[V]) getOrPut(k uint64, mk func() V) (V, bool) {
	i, ok := 0, false
	if len(m.keys) > 0 {
		if i, ok = m.find(k); ok {
			return m.vals[i], true
		}
	}
	if (m.n+1)*packedMaxLoadDen > len(m.keys)*packedMaxLoadNum {
		m.resize(max(packedMinSlots, len(m.keys)+len(m.keys)/2))
		i, _ = m.find(k)
	}
	v := mk()
	m.keys[i], m.vals[i] = k, v
	m.full[i/64] |= 1 << (i % 64)
	m.n++
	return v, false
}

func (m *packedMap[V]) put(k uint64, v V) {
	if len(m.keys) > 0 {
		if i, ok := m.find(k); ok {
			m.vals[i] = v
			return
		}
	}
	if (m.n+1)*packedMaxLoadDen > len(m.keys)*packedMaxLoadNum {
		m.resize(max(packedMinSlots, len(m.keys)+len(m.keys)/2))
	}
	i, _ := m.find(k)
	m.keys[i], m.vals[i] = k, v
	m.full[i/64] |= 1 << (i % 64)
	m.n++
}

// resize rehashes the entries into n slots.
func (m *packedMap[V]) resize(n int) {
	old := *m
	*m = packedMap[V]{keys: make([]uint64, n), vals: make([]V, n), full: make([]uint64, (n+63)/64)}
	for i := range old.keys {
		if old.used(i) {
			j, _ := m.find(old.keys[i])
			m.keys[j], m.vals[j] = old.keys[i], old.vals[i]
			m.full[j/64] |= 1 << (j % 64)
			m.n++
		}
	}
}

func (m *packedMap[V]) del(k uint64) {
	if m.n == 0 {
		return
	}
	i, ok := m.find(k)
	if !ok {
		return
	}
	m.n--
	// Move back each entry after i, up to the next empty slot, whose
	// home is not between i (exclusive) and where it is: it would not be
	// found past the hole.
	for j := i; ; {
		if j++; j == len(m.keys) {
			j = 0
		}
		if !m.used(j) {
			break
		}
		h := m.home(m.keys[j])
		if i <= j && i < h && h <= j || i > j && (h > i || h <= j) {
			continue
		}
		m.keys[i], m.vals[i] = m.keys[j], m.vals[j]
		i = j
	}
	var zero V
	m.keys[i], m.vals[i] = 0, zero
	m.full[i/64] &^= 1 << (i % 64)
}

// all yields every entry, in no order. The body may delete the key it is
// given: the walk goes down from an empty slot, so an entry that moves
// back into the slot deleted was yielded already.
func (m *packedMap[V]) all() iter.Seq2[uint64, V] {
	return func(yield func(uint64, V) bool) {
		if m.n == 0 {
			return
		}
		e := 0
		for m.used(e) {
			e++
		}
		for s := 1; s < len(m.keys); s++ {
			i := e - s
			if i < 0 {
				i += len(m.keys)
			}
			if m.used(i) && !yield(m.keys[i], m.vals[i]) {
				return
			}
		}
	}
}
