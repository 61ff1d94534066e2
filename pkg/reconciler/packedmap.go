package reconciler

import (
	"iter"
	"math/bits"
)

// packedMap is the part of a keyMap whose keys pack into a uint64 (IPv4):
// an open-addressing hash table, linear probing, deleting by shifting the
// entries after back (no tombstones), keys and values in slices of their
// own and a tag a slot: 0 for an empty slot, else 7 bits of its key's
// hash that its home does not use. A probe reads the tags and reads a
// key only where the tag is its key's: a new key's insert (every
// backend address of a first program) passes the slots of its run
// without reading their keys, which are megabytes and missed the cache
// on most of them (issue 14, fifty-ninth pass). A Go map of 240,000
// backend addresses (uint64 keys, uint32 ids: issue 14's 30,000
// Services x 8) took 9 MiB, 39 bytes an entry at the load it had; this
// takes 13 bytes a slot at a load of 0.5 to 0.75 (grown by half when it
// passes 0.75; 2/3 when presized): 17-26 bytes an entry.
type packedMap[V any] struct {
	keys []uint64
	vals []V
	tags []uint8 // slot i's tag; 0: slot i is empty
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

func (m *packedMap[V]) used(i int) bool { return m.tags[i] != 0 }

// slot returns k's first slot, the high bits of a mix of k's bits scaled
// to the table (so any number of slots will do), and its tag, the mix's
// low bits (never 0).
func (m *packedMap[V]) slot(k uint64) (int, uint8) {
	// MurmurHash3's 64-bit finalizer.
	k ^= k >> 33
	k *= 0xff51afd7ed558ccd
	k ^= k >> 33
	k *= 0xc4ceb9fe1a85ec53
	k ^= k >> 33
	hi, _ := bits.Mul64(k, uint64(len(m.keys)))
	return int(hi), uint8(k) | 1
}

// home is k's first slot.
func (m *packedMap[V]) home(k uint64) int {
	i, _ := m.slot(k)
	return i
}

// find returns k's slot, or the empty slot where it would go, and k's
// tag.
func (m *packedMap[V]) find(k uint64) (int, uint8, bool) {
	i, t := m.slot(k)
	for {
		switch m.tags[i] {
		case 0:
			return i, t, false
		case t:
			if m.keys[i] == k {
				return i, t, true
			}
		}
		if i++; i == len(m.keys) {
			i = 0
		}
	}
}

func (m *packedMap[V]) get(k uint64) (V, bool) {
	if m.n > 0 {
		if i, _, ok := m.find(k); ok {
			return m.vals[i], true
		}
	}
	var zero V
	return zero, false
}

// getOrPut returns k's value, or adds k with the value mk returns (and
// reports false): one probe where a get and then a put make two.
func (m *packedMap[V]) getOrPut(k uint64, mk func() V) (V, bool) {
	i, t, ok := 0, uint8(0), false
	if len(m.keys) > 0 {
		if i, t, ok = m.find(k); ok {
			return m.vals[i], true
		}
	}
	if (m.n+1)*packedMaxLoadDen > len(m.keys)*packedMaxLoadNum {
		m.resize(max(packedMinSlots, len(m.keys)+len(m.keys)/2))
		i, t, _ = m.find(k)
	}
	v := mk()
	m.keys[i], m.vals[i], m.tags[i] = k, v, t
	m.n++
	return v, false
}

func (m *packedMap[V]) put(k uint64, v V) {
	if len(m.keys) > 0 {
		if i, _, ok := m.find(k); ok {
			m.vals[i] = v
			return
		}
	}
	if (m.n+1)*packedMaxLoadDen > len(m.keys)*packedMaxLoadNum {
		m.resize(max(packedMinSlots, len(m.keys)+len(m.keys)/2))
	}
	i, t, _ := m.find(k)
	m.keys[i], m.vals[i], m.tags[i] = k, v, t
	m.n++
}

// resize rehashes the entries into n slots.
func (m *packedMap[V]) resize(n int) {
	old := *m
	*m = packedMap[V]{keys: make([]uint64, n), vals: make([]V, n), tags: make([]uint8, n)}
	for i := range old.keys {
		if old.used(i) {
			j, t, _ := m.find(old.keys[i])
			m.keys[j], m.vals[j], m.tags[j] = old.keys[i], old.vals[i], t
			m.n++
		}
	}
}

func (m *packedMap[V]) del(k uint64) {
	if m.n == 0 {
		return
	}
	i, _, ok := m.find(k)
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
		m.keys[i], m.vals[i], m.tags[i] = m.keys[j], m.vals[j], m.tags[j]
		i = j
	}
	var zero V
	m.keys[i], m.vals[i], m.tags[i] = 0, zero, 0
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
