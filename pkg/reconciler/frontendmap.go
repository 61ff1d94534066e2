package reconciler

import "iter"

// FrontendMap is a map keyed by Frontend for the datapath's tables: an
// IPv4 frontend (address, port, protocol, scope) packed into a uint64 in
// an open-addressing table (packedMap, as the reconciler's own maps of
// frontends: keyMap), the others in a Go map. Each family's slot table
// keeps its 30,000 frontends' ranges in one (issue 14, fifty-first pass):
// a Go map of them took 3 MB; 16 bytes a slot at a load of 2/3 (a uint64
// value) take 0.7 MB. The zero value is an empty map.
type FrontendMap[V any] struct {
	m keyMap[Frontend, V, frontendKeys]
}

// MakeFrontendMap returns a FrontendMap with room for n4 IPv4 and n6
// IPv6 frontends.
func MakeFrontendMap[V any](n4, n6 int) FrontendMap[V] {
	return FrontendMap[V]{m: keyMap[Frontend, V, frontendKeys]{packed: makePackedMap[V](n4), other: make(map[Frontend]V, n6)}}
}

// Get returns fe's value and whether fe has one.
func (m *FrontendMap[V]) Get(fe Frontend) (V, bool) { return m.m.get(fe) }

// Put sets fe's value.
func (m *FrontendMap[V]) Put(fe Frontend, v V) {
	if m.m.other == nil {
		m.m.other = map[Frontend]V{}
	}
	m.m.put(fe, v)
}

// Delete forgets fe.
func (m *FrontendMap[V]) Delete(fe Frontend) { m.m.del(fe) }

// Len is the number of frontends the map holds.
func (m *FrontendMap[V]) Len() int { return m.m.len() }

// All yields every frontend and its value, in no order. The body may
// delete the frontend it is given.
func (m *FrontendMap[V]) All() iter.Seq2[Frontend, V] { return m.m.all() }
