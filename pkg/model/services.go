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
	ents := make([]ServiceEntry, 0, len(m))
	for k, v := range m {
		ents = append(ents, ServiceEntry{k, v})
	}
	s, _ := BuildServices(ents)
	return s
}

// ServiceEntry is a frontend and its Service, as BuildServices takes them.
type ServiceEntry struct {
	Key L4Addr
	Svc *Service
}

// BuildServices returns a Services holding ents, made in one pass from
// the bottom up: the trie a ServicesBuilder would make by setting them
// one by one in that order (the same nodes, each leaf's frontends in the
// same order), without its cost. Set one by one, each frontend walks its
// path from the root, and a leaf that fills is split and its frontends
// set again; here the frontends are sorted into their subtrees by the
// bits of their hashes, level by level (a stable counting sort), a node
// is made once its frontends are known, and the leaves' arrays and the
// nodes are cut from a few large ones: about a dozen allocations where
// the inserts made one or two a node, and some per split (a first
// desired state, or a state made after a conflict, at 30,000 frontends).
//
// It reports false, and returns an empty Services, if a frontend comes
// twice in ents: the caller decides which one holds it.
func BuildServices(ents []ServiceEntry) (Services, bool) {
	if len(ents) == 0 {
		return Services{}, true
	}
	b := bulkBuild{
		hs: make([]uint64, len(ents)), es: make([]sentry, len(ents)),
		hs2: make([]uint64, len(ents)), es2: make([]sentry, len(ents)),
		leafHs: make([]uint64, 0, len(ents)), leafEs: make([]sentry, 0, len(ents)),
	}
	for i, e := range ents {
		b.hs[i], b.es[i] = hashOf(e.Key), sentry{e.Key, e.Svc}
	}
	root := b.node(0, 0, len(ents), false)
	if b.dup {
		return Services{}, false
	}
	return Services{root: root, n: len(ents)}, true
}

// bulkBuild is the state of one BuildServices.
type bulkBuild struct {
	// The frontends and their hashes, sorted level by level into their
	// subtrees: a node at depth d sorts its range of one pair into the
	// same range of the other (hs, es at even depths, hs2, es2 at odd).
	hs, hs2 []uint64
	es, es2 []sentry
	// The leaves' arrays, cut from these in turn; nodes, cut likewise.
	leafHs []uint64
	leafEs []sentry
	nodes  []snode
	dup    bool
}

// alloc returns a new node, cut from a block of them.
func (b *bulkBuild) alloc() *snode {
	if len(b.nodes) == cap(b.nodes) {
		b.nodes = make([]snode, 0, 256)
	}
	b.nodes = b.nodes[:len(b.nodes)+1]
	// Its edit is nil, no builder's (a builder has one before its first
	// change): every builder copies it before a change.
	return &b.nodes[len(b.nodes)-1]
}

// node makes the node at depth d of the frontends in [lo, hi) of the pair
// that odd says (hs2, es2 if odd).
func (b *bulkBuild) node(d, lo, hi int, odd bool) *snode {
	hs, es, dhs, des := b.hs, b.es, b.hs2, b.es2
	if odd {
		hs, es, dhs, des = dhs, des, hs, es
	}
	if hi-lo <= leafMax || !canSplit(d) {
		return b.leaf(hs[lo:hi], es[lo:hi])
	}
	// A stable counting sort by the child each goes to: the order of
	// the frontends within a child stays the order they were given in,
	// as the inserts would leave it.
	var count [sfan + 1]int
	for _, h := range hs[lo:hi] {
		count[index(h, d)+1]++
	}
	for i := 1; i <= sfan; i++ {
		count[i] += count[i-1]
	}
	next := count
	for j := lo; j < hi; j++ {
		i := index(hs[j], d)
		dhs[lo+next[i]], des[lo+next[i]] = hs[j], es[j]
		next[i]++
	}
	n := b.alloc()
	n.interior = true
	for i := range sfan {
		if count[i] < count[i+1] {
			n.kids[i] = b.node(d+1, lo+count[i], lo+count[i+1], !odd)
		}
	}
	return n
}

// leaf makes a leaf of hs and es, checking that no frontend comes twice
// (the same frontend has the same hash: it can only be in the same leaf).
func (b *bulkBuild) leaf(hs []uint64, es []sentry) *snode {
	for i := range hs {
		for j := range i {
			if hs[j] == hs[i] && es[j].key == es[i].key {
				b.dup = true
			}
		}
	}
	m := len(b.leafHs)
	b.leafHs, b.leafEs = append(b.leafHs, hs...), append(b.leafEs, es...)
	n := b.alloc()
	// Cut to their length: an append to a leaf must not reach into the
	// next one's (no builder appends to these in place, see alloc).
	n.hashes, n.ents = b.leafHs[m:len(b.leafHs):len(b.leafHs)], b.leafEs[m:len(b.leafEs):len(b.leafEs)]
	return n
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
