package model

import (
	"hash/maphash"
	"iter"
	"slices"
)

// Services maps frontends to their Services: a persistent map, which a
// change copies only in part. It is a hash trie: interior nodes of 8
// children, each chosen by 3 bits of the frontend's hash, and leaves of at
// most 64 frontends (a leaf that would hold more splits into 8, of 8 on
// average). A copy with a frontend added, replaced or removed copies the
// nodes on that frontend's path only (four or five interior nodes of 8
// pointers and one leaf, at 30,000 frontends as at 100,000) and shares
// every other node with the original, which does not change: so a new
// desired state made from the last one by one change costs what changed,
// not a copy of all of them.
//
// The zero value is empty. A Services value is used as a value: copies of
// it share nodes, which nothing changes once a Services holds them (Set
// and Delete make new ones; ServicesBuilder changes in place only the
// nodes it made). Its order of iteration is not specified (as a Go map's).
type Services struct {
	root *snode
	n    int
}

const (
	sbits = 3
	sfan  = 1 << sbits
	// leafMax is the most frontends a leaf holds (but at the last depth,
	// where whole hashes collide).
	leafMax = 64
)

// snode is a node of the trie: interior (its children in kids, in the
// node itself: one memory access a level less) or a leaf.
type snode struct {
	// edit is the ServicesBuilder edit that made the node: that edit may
	// change it in place, no other may.
	edit     *edit
	interior bool
	kids     [sfan]*snode
	// A leaf's frontends, and their hashes (hashOf) apart: a lookup
	// scans 8 bytes a frontend, not 48 (hash, frontend and Service).
	hashes []uint64
	ents   []sentry
}

type sentry struct {
	key L4Addr
	svc *Service
}

// edit identifies one ServicesBuilder edit (not of size 0: each must have
// its own address).
type edit struct{ _ byte }

var seed = maphash.MakeSeed()

func hashOf(k L4Addr) uint64 { return maphash.Comparable(seed, k) }

// index is the child of an interior node at depth d that h goes to. At
// depth 21, the hash's last bit; no leaf deeper than that splits.
func index(h uint64, d int) int { return int(h >> (d * sbits) & (sfan - 1)) }

func canSplit(d int) bool { return d*sbits < 64 }

// NewServices returns a Services holding the entries of m.
func NewServices(m map[L4Addr]*Service) Services {
	var b ServicesBuilder
	for k, v := range m {
		b.Set(k, v)
	}
	return b.Services()
}

// Len returns the number of frontends.
func (s Services) Len() int { return s.n }

// Get returns the Service of frontend k, nil if none.
func (s Services) Get(k L4Addr) *Service {
	svc, _ := s.Lookup(k)
	return svc
}

// Has reports whether frontend k has a Service.
func (s Services) Has(k L4Addr) bool {
	_, ok := s.Lookup(k)
	return ok
}

// Lookup returns the Service of frontend k, and whether there is one.
func (s Services) Lookup(k L4Addr) (*Service, bool) {
	n := s.root
	h := hashOf(k)
	for d := 0; n != nil && n.interior; d++ {
		n = n.kids[index(h, d)]
	}
	if n != nil {
		for i, x := range n.hashes {
			if x == h && n.ents[i].key == k {
				return n.ents[i].svc, true
			}
		}
	}
	return nil, false
}

// All yields every frontend and its Service, in no specified order.
func (s Services) All() iter.Seq2[L4Addr, *Service] {
	return func(yield func(L4Addr, *Service) bool) { s.root.all(yield) }
}

func (n *snode) all(yield func(L4Addr, *Service) bool) bool {
	if n == nil {
		return true
	}
	if n.interior {
		for _, k := range n.kids {
			if !k.all(yield) {
				return false
			}
		}
	}
	for _, e := range n.ents {
		if !yield(e.key, e.svc) {
			return false
		}
	}
	return true
}

// Keys yields every frontend, in no specified order.
func (s Services) Keys() iter.Seq[L4Addr] {
	return func(yield func(L4Addr) bool) {
		for k := range s.All() {
			if !yield(k) {
				return
			}
		}
	}
}

// Map returns the frontends and Services as a new map (for tests and
// dumps).
func (s Services) Map() map[L4Addr]*Service {
	m := make(map[L4Addr]*Service, s.n)
	for k, v := range s.All() {
		m[k] = v
	}
	return m
}

// Set makes s map frontend k to v. Other Services values s was copied
// to, or from, do not change.
func (s *Services) Set(k L4Addr, v *Service) {
	b := s.Edit()
	b.Set(k, v)
	*s = b.Services()
}

// Delete removes frontend k from s. Other Services values s was copied
// to, or from, do not change.
func (s *Services) Delete(k L4Addr) {
	b := s.Edit()
	b.Delete(k)
	*s = b.Services()
}

// Edit returns a builder that starts from s; s does not change.
func (s Services) Edit() *ServicesBuilder {
	return &ServicesBuilder{s: s}
}

// ServicesBuilder makes a Services by a series of changes: the first change
// of a node s shares copies it, the next ones change the copy in place.
// The zero value starts from an empty Services.
type ServicesBuilder struct {
	s  Services
	ed *edit
}

// Services returns the Services built so far. Later changes to the
// builder do not change it.
func (b *ServicesBuilder) Services() Services {
	b.ed = nil // the next change starts a new edit
	return b.s
}

// Len returns the number of frontends built so far.
func (b *ServicesBuilder) Len() int { return b.s.n }

// Get returns the Service of frontend k built so far, nil if none.
func (b *ServicesBuilder) Get(k L4Addr) *Service { return b.s.Get(k) }

// Has reports whether frontend k has a Service built so far.
func (b *ServicesBuilder) Has(k L4Addr) bool { return b.s.Has(k) }

// Set maps frontend k to v.
func (b *ServicesBuilder) Set(k L4Addr, v *Service) {
	if b.ed == nil {
		b.ed = &edit{}
	}
	var added bool
	b.s.root, added = b.set(b.s.root, 0, hashOf(k), k, v)
	if added {
		b.s.n++
	}
}

// Delete removes frontend k.
func (b *ServicesBuilder) Delete(k L4Addr) {
	if !b.s.Has(k) {
		return // nothing to copy
	}
	if b.ed == nil {
		b.ed = &edit{}
	}
	b.s.root = b.del(b.s.root, 0, hashOf(k), k)
	b.s.n--
}

// mutable returns n if this edit made it, else a copy of n this edit made.
func (b *ServicesBuilder) mutable(n *snode) *snode {
	if n.edit == b.ed {
		return n
	}
	c := &snode{edit: b.ed, interior: n.interior, kids: n.kids}
	if !n.interior {
		c.hashes = append(make([]uint64, 0, len(n.hashes)+1), n.hashes...)
		c.ents = append(make([]sentry, 0, len(n.ents)+1), n.ents...)
	}
	return c
}

func (b *ServicesBuilder) set(n *snode, d int, h uint64, k L4Addr, v *Service) (*snode, bool) {
	if n == nil {
		hashes, ents := make([]uint64, 1, 2), make([]sentry, 1, 2)
		hashes[0], ents[0] = h, sentry{k, v}
		return &snode{edit: b.ed, hashes: hashes, ents: ents}, true
	}
	n = b.mutable(n)
	if n.interior {
		i := index(h, d)
		var added bool
		n.kids[i], added = b.set(n.kids[i], d+1, h, k, v)
		return n, added
	}
	for i, x := range n.hashes {
		if x == h && n.ents[i].key == k {
			n.ents[i].svc = v
			return n, false
		}
	}
	n.hashes, n.ents = append(n.hashes, h), append(n.ents, sentry{k, v})
	if len(n.ents) > leafMax && canSplit(d) {
		hashes, ents := n.hashes, n.ents
		n.hashes, n.ents, n.interior = nil, nil, true
		for j, e := range ents {
			i := index(hashes[j], d)
			n.kids[i], _ = b.set(n.kids[i], d+1, hashes[j], e.key, e.svc)
		}
	}
	return n, true
}

// del removes k, which n holds; it returns nil for a node left empty.
func (b *ServicesBuilder) del(n *snode, d int, h uint64, k L4Addr) *snode {
	n = b.mutable(n)
	if n.interior {
		i := index(h, d)
		n.kids[i] = b.del(n.kids[i], d+1, h, k)
		for _, c := range n.kids {
			if c != nil {
				return n
			}
		}
		return nil
	}
	i := 0
	for n.hashes[i] != h || n.ents[i].key != k {
		i++
	}
	n.hashes, n.ents = slices.Delete(n.hashes, i, i+1), slices.Delete(n.ents, i, i+1)
	if len(n.ents) == 0 {
		return nil
	}
	return n
}
