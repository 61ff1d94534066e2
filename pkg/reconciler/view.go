package reconciler

// The reconciler's view of the kernel's maps: what each frontend holds
// (master, slots), the backends and rev_nat entries, and the reference
// counts that say when an entry lost its last user. It is filled from a
// dump (Restore, refresh), updated after every write that succeeded, and
// brought to what the maps hold for entries that drifted (repair.go).

import (
	"fmt"
	"iter"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/sluice-lb/sluice/pkg/model"
)

// frontendView is what the maps hold for one frontend. There is one per
// frontend (30,000 and more): its small fields come first, together, it
// keeps no copy of its backends and its source ranges apart, so that it
// takes 72 bytes (the 80-byte size class) where it took 208.
type frontendView struct {
	hasMaster bool
	// synced says the frontend was last fully programmed with the
	// backends its slots name and with its synced ranges (viewRanges),
	// and nothing touched it since (a fast path for Apply: fastInSync).
	synced bool
	fam    family // the maps it is in (capacity.go)
	// walked says a re-read's second walk found its master (repair.go);
	// false but during that walk. It takes a byte of the padding.
	walked bool
	master Master
	slots  slotMap // slot >= 1 -> backend
	// rs are its source ranges, nil for none: few frontends have any
	// (loadBalancerSourceRanges); two slices here made the view 112
	// bytes, 1 MB more at 30,000.
	rs *viewRanges

	// svc is the Service port it was programmed for, for its name; nil if
	// restored. It is the desired state's (it is never modified): Apply
	// points it at the newest state's Service whenever it looks at the
	// frontend, so that it keeps no Service of an older state alive.
	svc *model.Service
}

// viewRanges are the source ranges of a frontend's view.
type viewRanges struct {
	ranges []netip.Prefix // the ranges it holds, sorted by netip.Prefix.Compare
	// synced are those it was last fully programmed with (see
	// frontendView.synced).
	synced []netip.Prefix
}

// ranges returns the source ranges v holds, sorted.
func (v *frontendView) ranges() []netip.Prefix {
	if v.rs == nil {
		return nil
	}
	return v.rs.ranges
}

// syncedRanges returns the source ranges v was last fully programmed
// with.
func (v *frontendView) syncedRanges() []netip.Prefix {
	if v.rs == nil {
		return nil
	}
	return v.rs.synced
}

// setRanges sets the ranges v holds (sorted).
func (v *frontendView) setRanges(ps []netip.Prefix) {
	if rs := v.rangesToSet(ps); rs != nil {
		rs.ranges = ps
	}
}

// setSyncedRanges sets the ranges v was last fully programmed with.
func (v *frontendView) setSyncedRanges(ps []netip.Prefix) {
	if rs := v.rangesToSet(ps); rs != nil {
		rs.synced = ps
	}
}

// rangesToSet returns v's ranges, made if ps are some; nil if v has none
// and ps are none (nothing to set).
func (v *frontendView) rangesToSet(ps []netip.Prefix) *viewRanges {
	if v.rs == nil && len(ps) > 0 {
		v.rs = &viewRanges{}
	}
	return v.rs
}

// name is the Service port v was programmed for; empty if restored.
func (v *frontendView) name() model.ServicePortName {
	if v == nil || v.svc == nil {
		return model.ServicePortName{}
	}
	return v.svc.Name
}

// refresh re-reads the maps into the view, keeping what is not in them
// (pending conntrack flushes and session affinity fixes).
func (r *Reconciler) refresh() error {
	ks, err := r.dp.Dump()
	if err != nil {
		return fmt.Errorf("refresh: dump datapath maps: %w", err)
	}
	flush, aff, writes, inSync := r.pendingFlush, r.pendingAffinity, r.writes, r.inSync
	retired := r.retiredAt
	// The Service each view was last programmed for (v.svc), with its
	// master then: the maps do not say it. A view whose master the dump
	// shows unchanged keeps it, so that its Service's standby backends
	// stay counted and a retirement holds them (holdUDPFlows), and a
	// NodePort's removal knows its name (servedByName), as before the
	// rebuild. One whose master changed behind the agent's back gets its
	// Service again when the next Apply programs it.
	type programmed struct {
		m   Master
		svc *model.Service
	}
	var svcs map[Frontend]programmed
	for fe, v := range r.frontends.all() {
		if v.svc != nil && v.hasMaster {
			if svcs == nil {
				svcs = make(map[Frontend]programmed)
			}
			svcs[fe] = programmed{v.master, v.svc}
		}
	}
	r.reset()
	// A master still retired keeps its time (noteRetired times only
	// the others): a rebuild does not restart its timeout.
	r.retiredAt = retired
	r.loadKernel(ks)
	r.pendingFlush, r.pendingAffinity, r.writes, r.inSync = flush, aff, writes, inSync
	for fe, p := range svcs {
		if v := r.frontends.val(fe); v != nil && v.hasMaster && v.master == p.m {
			r.setService(fe, v, p.svc)
		}
	}
	for fe := range r.retiredAt {
		if v := r.frontends.val(fe); v == nil || !v.hasMaster || v.master.Flags&FlagRetired == 0 {
			delete(r.retiredAt, fe)
		}
	}
	return nil
}

// loadKernel fills the (reset) view from a dump of the maps.
func (r *Reconciler) loadKernel(ks *KernelState) {
	r.lastRead = time.Now()
	r.presizeKernel(ks)
	// The service CIDRs as the maps hold them: a restarted agent whose
	// first state names the same writes none (servicecidrs.go).
	r.cidrs, r.cidrsKnown = slices.Clone(ks.ServiceCIDRs), true
	for id, addr := range ks.Backends {
		r.putBackend(id, addr)
		r.beIDs.markUsed(uint32(id))
	}
	for id, fe := range ks.RevNat {
		r.revNat.put(uint32(id), fe)
		r.svcIDs.markUsed(uint32(id))
	}
	for fe, m := range ks.Masters {
		r.holdMaster(fe, r.frontend(fe), m)
	}
	for _, a := range ks.ServiceIPs {
		r.setInServiceIPs(a, true)
		r.ipDirty[a] = true
	}
	for fe, slots := range ks.Slots {
		v := r.frontend(fe)
		for s, id := range slots {
			if s == 0 {
				continue
			}
			r.holdSlot(v, s, id)
		}
	}
	for fe, ps := range ks.SourceRanges {
		if len(ps) == 0 {
			continue
		}
		v := r.frontend(DefaultScope(fe))
		v.setRanges(slices.Compact(slices.SortedFunc(slices.Values(ps), netip.Prefix.Compare)))
		r.ranges[v.fam] += len(v.ranges())
	}
	// Choose the id each frontend and backend address is known by. A
	// master's id wins over a rev_nat entry naming the same frontend; of
	// several ids for one backend address (strays), the most named, then the
	// lowest, wins. The losers are rewritten and deleted by the next Apply.
	for _, fe := range slices.SortedFunc(r.frontends.keys(), Frontend.Compare) {
		if v := r.frontends.val(fe); v.hasMaster && r.revNat.refs(uint32(v.master.ID)) == 1 {
			r.serviceOf.put(fe, v.master.ID)
		}
	}
	for _, id := range r.revNat.ids() {
		fe, _ := r.revNat.get(id)
		if _, ok := r.serviceOf.get(fe); !ok && r.revNat.refs(id) == 0 {
			r.serviceOf.put(fe, ServiceID(id))
		}
		if r.revNat.refs(id) == 0 {
			r.revNatCand[ServiceID(id)] = true
		}
	}
	for _, id := range r.backends.ids() {
		a, _ := r.backends.get(id)
		cur, ok := r.backendOf.get(a)
		if !ok || r.backends.refs(id) > r.backends.refs(uint32(cur)) {
			r.backendOf.put(a, BackendID(id))
		}
		if r.backends.refs(id) == 0 {
			r.backendCand[BackendID(id)] = true
		}
	}
	// What was read may hold ids the next Apply leaves reserved but
	// unused (a stray's), for its releaseReservations. Empty maps (the
	// agent's first start) hold none: the view is as New made it, and
	// a first program of 30,000 Services skips that walk.
	r.dirty = !ks.empty()
}

// holdMaster makes m fe's master in its view v, as read from the maps:
// its rev_nat id's users and its ClusterIP counted, the id used.
func (r *Reconciler) holdMaster(fe Frontend, v *frontendView, m Master) {
	v.hasMaster, v.master = true, m
	r.entries[v.fam]++
	r.revNat.addRefs(uint32(m.ID), 1)
	r.svcIDs.markUsed(uint32(m.ID))
	if isClusterIP(fe, m) {
		r.refServiceIP(fe.Addr)
		r.ipDirty[fe.Addr] = true
	}
	r.noteRetired(fe, m)
}

// holdSlot makes slot s of view v name backend id, as read from the maps:
// the backend's users counted, the id used.
func (r *Reconciler) holdSlot(v *frontendView, s uint32, id BackendID) {
	v.slots.put(s, id)
	r.entries[v.fam]++
	r.backends.addRefs(uint32(id), 1)
	r.beIDs.markUsed(uint32(id))
}

// presizeKernel makes the dense range of the id tables hold the ids of
// ks, and the quarantine's worth above them, when they are dense enough
// (as the allocators leave them).
func (r *Reconciler) presizeKernel(ks *KernelState) {
	var maxBackend, maxService uint32
	for id := range ks.Backends {
		maxBackend = max(maxBackend, uint32(id))
	}
	for _, slots := range ks.Slots {
		for _, id := range slots {
			maxBackend = max(maxBackend, uint32(id))
		}
	}
	for id := range ks.RevNat {
		maxService = max(maxService, uint32(id))
	}
	for _, m := range ks.Masters {
		maxService = max(maxService, uint32(m.ID))
	}
	// With the quarantine's room, as presize gives a first program: the
	// changes after a restart hand new ids above the ones read.
	if int64(maxBackend) < 2*int64(len(ks.Backends))+idTableSlack {
		r.backends.grow(int(maxBackend) + 1 + BackendIDQuarantine)
	}
	if int64(maxService) < 2*int64(len(ks.RevNat))+idTableSlack {
		r.revNat.grow(int(maxService) + 1 + ServiceIDQuarantine)
	}
}

func (r *Reconciler) frontend(fe Frontend) *frontendView {
	v := r.frontends.val(fe)
	if v == nil {
		v = &frontendView{fam: familyOf(fe.Addr)}
		r.frontends.put(fe, v)
	}
	return v
}

func (r *Reconciler) isReal(id BackendID) bool {
	return r.backends.has(uint32(id))
}

// backend returns the address the backend map holds under id.
func (r *Reconciler) backend(id BackendID) (model.L4Addr, bool) {
	return r.backends.get(uint32(id))
}

func (r *Reconciler) setSlot(v *frontendView, s uint32, id BackendID) {
	if old, ok := v.slots.get(s); ok {
		r.unref(old)
	} else {
		r.entries[v.fam]++
	}
	v.slots.put(s, id)
	r.backends.addRefs(uint32(id), 1)
	delete(r.backendCand, id) // named: not a candidate for deletion
}

func (r *Reconciler) deleteSlot(v *frontendView, s uint32) {
	old, ok := v.slots.get(s)
	if !ok {
		return
	}
	v.slots.del(s)
	r.entries[v.fam]--
	r.unref(old)
}

func (r *Reconciler) unref(id BackendID) {
	if r.backends.addRefs(uint32(id), -1) <= 0 {
		r.backends.clearRefs(uint32(id))
		r.backendCand[id] = true
		if !r.isReal(id) {
			// A stray slot named an id the backend map does not hold.
			r.beIDs.release(uint32(id))
		}
	}
}

// slotMap holds a frontend's slots, indexed by slot number: slots are
// dense (1..count), so a slice beats a map per frontend, in memory and in
// the time to fill it.
type slotMap struct {
	ids []slotEntry
	n   int // slots present
}

type slotEntry struct {
	id     BackendID
	ok     bool
	walked bool // as frontendView.walked, for the slot
}

func (m *slotMap) get(s uint32) (BackendID, bool) {
	if int64(s) >= int64(len(m.ids)) {
		return 0, false
	}
	e := m.ids[s]
	return e.id, e.ok
}

func (m *slotMap) put(s uint32, id BackendID) {
	if old := len(m.ids); int64(s) >= int64(old) {
		m.ids = slices.Grow(m.ids, int(s)+1-old)[:s+1]
		clear(m.ids[old:])
	}
	if !m.ids[s].ok {
		m.n++
	}
	m.ids[s] = slotEntry{id: id, ok: true}
}

func (m *slotMap) del(s uint32) {
	if int64(s) < int64(len(m.ids)) && m.ids[s].ok {
		m.ids[s] = slotEntry{}
		m.n--
	}
	for len(m.ids) > 0 && !m.ids[len(m.ids)-1].ok {
		m.ids = m.ids[:len(m.ids)-1]
	}
}

// keys returns the slots >= from that are present, in order.
func (m *slotMap) keys(from uint32) []uint32 {
	var out []uint32
	for s := int(from); s < len(m.ids); s++ {
		if m.ids[s].ok {
			out = append(out, uint32(s))
		}
	}
	return out
}

// idTable holds the entries of a map keyed by an id the reconciler
// allocates (backends, rev_nat) and how many users name each id (slots,
// masters; an id may be named without an entry: a stray restored from the
// kernel), indexed by id. The allocators keep ids dense (idAllocator), so
// a slice beats a Go map keyed by id: in memory, and a first program
// touches it in order instead of at random. A value is held packed (P),
// as the keyMaps pack their keys: 16 bytes an id for an IPv4 backend
// where the model.L4Addr alone takes 32; the others (IPv6) go in a map
// beside. An id far above the ones in use (a stray restored from the
// kernel) goes in a map too, so that it cannot make the slice huge.
type idTable[V comparable, P keyPacking[V]] struct {
	dense []idEntry
	high  map[uint32]*idEntry
	wide  map[uint32]V // the values that do not pack
	n     int          // entries present
}

type idEntry struct {
	key  uint64 // the value, packed, if held is heldPacked
	refs int32  // users naming the id
	held uint8  // whether the map holds a value under the id, and where
	// walked says a re-read's second walk found the entry (repair.go).
	walked bool
}

const (
	heldNone   = iota
	heldPacked // in key
	heldWide   // in idTable.wide
)

// idTableSlack is how far above the dense range an id may be and still
// grow it (besides doubling): ids handed out by an allocator are at most
// its quarantine above the ones in use.
const idTableSlack = 1 << 16

// at returns id's entry, or nil if it has none (no value, no users).
// The pointer is good until the next call that adds an id.
func (t *idTable[V, P]) at(id uint32) *idEntry {
	if int64(id) < int64(len(t.dense)) {
		return &t.dense[id]
	}
	return t.high[id]
}

// make returns id's entry, adding it (empty) if it has none.
func (t *idTable[V, P]) make(id uint32) *idEntry {
	if int64(id) < int64(len(t.dense)) {
		return &t.dense[id]
	}
	if int64(id) < 2*int64(len(t.dense))+idTableSlack {
		t.grow(int(id) + 1)
		return &t.dense[id]
	}
	e := t.high[id]
	if e == nil {
		if t.high == nil {
			t.high = map[uint32]*idEntry{}
		}
		e = &idEntry{}
		t.high[id] = e
	}
	return e
}

// grow makes the dense range hold ids below n, moving the entries of
// ids now in range out of high.
func (t *idTable[V, P]) grow(n int) {
	if n <= len(t.dense) {
		return
	}
	old := len(t.dense)
	t.dense = slices.Grow(t.dense, n-old)
	t.dense = t.dense[:cap(t.dense)] // the whole capacity: grow again only when it is full
	clear(t.dense[old:])
	for id, e := range t.high {
		if int64(id) < int64(len(t.dense)) {
			t.dense[id] = *e
			delete(t.high, id)
		}
	}
}

// value returns the value e, id's entry, holds.
func (t *idTable[V, P]) value(id uint32, e *idEntry) (V, bool) {
	var p P
	switch {
	case e == nil:
	case e.held == heldPacked:
		return p.unpack(e.key), true
	case e.held == heldWide:
		return t.wide[id], true
	}
	var zero V
	return zero, false
}

// get returns the value held under id.
func (t *idTable[V, P]) get(id uint32) (V, bool) { return t.value(id, t.at(id)) }

// packedAt returns the value held under id, packed, if it is held packed.
func (t *idTable[V, P]) packedAt(id uint32) (uint64, bool) {
	if e := t.at(id); e != nil && e.held == heldPacked {
		return e.key, true
	}
	return 0, false
}

// has reports whether the map holds an entry under id.
func (t *idTable[V, P]) has(id uint32) bool {
	e := t.at(id)
	return e != nil && e.held != heldNone
}

// put records that the map holds v under id, returning what it held.
func (t *idTable[V, P]) put(id uint32, v V) (old V, had bool) {
	var p P
	e := t.make(id)
	old, had = t.value(id, e)
	if !had {
		t.n++
	}
	if e.held == heldWide {
		delete(t.wide, id)
	}
	if k, ok := p.pack(v); ok {
		e.key, e.held = k, heldPacked
		return old, had
	}
	if t.wide == nil {
		t.wide = map[uint32]V{}
	}
	t.wide[id] = v
	e.key, e.held = 0, heldWide
	return old, had
}

// del records that the map holds nothing under id.
func (t *idTable[V, P]) del(id uint32) {
	e := t.at(id)
	if e == nil || e.held == heldNone {
		return
	}
	if e.held == heldWide {
		delete(t.wide, id)
	}
	e.key, e.held = 0, heldNone
	t.n--
	t.prune(id, e)
}

// refs returns how many users name id.
func (t *idTable[V, P]) refs(id uint32) int32 {
	if e := t.at(id); e != nil {
		return e.refs
	}
	return 0
}

// addRefs adds d users of id and returns how many there are.
func (t *idTable[V, P]) addRefs(id uint32, d int32) int32 {
	e := t.make(id)
	e.refs += d
	n := e.refs
	t.prune(id, e)
	return n
}

// clearRefs forgets the users of id.
func (t *idTable[V, P]) clearRefs(id uint32) {
	if e := t.at(id); e != nil {
		e.refs = 0
		t.prune(id, e)
	}
}

// prune drops id's entry from high once it holds nothing.
func (t *idTable[V, P]) prune(id uint32, e *idEntry) {
	if e.held == heldNone && e.refs == 0 && int64(id) >= int64(len(t.dense)) {
		delete(t.high, id)
	}
}

// len returns how many entries the map holds.
func (t *idTable[V, P]) len() int { return t.n }

// ids returns the ids the map holds entries under, in order.
func (t *idTable[V, P]) ids() []uint32 {
	out := make([]uint32, 0, t.n)
	for id := range t.dense {
		if t.dense[id].held != heldNone {
			out = append(out, uint32(id))
		}
	}
	for _, id := range slices.Sorted(maps.Keys(t.high)) {
		if t.high[id].held != heldNone {
			out = append(out, id)
		}
	}
	return out
}

// keyMap is a map keyed by an address with a port and protocol (a
// backend's address, or a frontend in its scope, P says which). An IPv4
// key, the common case, is packed into a uint64 (address, port,
// protocol, scope) and held in a packedMap: a third of the memory of the
// whole key (a netip.Addr is 16 bytes and a pointer), quicker to hash,
// and no Go map's groups around it. The others go in a Go map, keyed as
// they are.
type keyMap[K comparable, V any, P keyPacking[K]] struct {
	packed packedMap[V]
	other  map[K]V
}

// keyPacking packs the keys of a keyMap that fit in a uint64, and
// unpacks them.
type keyPacking[K any] interface {
	pack(K) (uint64, bool)
	unpack(uint64) K
}

type (
	addrKeys     struct{} // packs a netip.Addr
	backendKeys  struct{} // packs a backend's model.L4Addr
	frontendKeys struct{} // packs a Frontend
)

func (addrKeys) pack(a netip.Addr) (uint64, bool)      { return packL4(model.L4Addr{Addr: a}, 0) }
func (addrKeys) unpack(k uint64) netip.Addr            { return unpackL4(k).Addr }
func (backendKeys) pack(a model.L4Addr) (uint64, bool) { return packL4(a, 0) }
func (backendKeys) unpack(k uint64) model.L4Addr       { return unpackL4(k).L4Addr }
func (frontendKeys) pack(fe Frontend) (uint64, bool)   { return packL4(fe.L4Addr, fe.Scope) }
func (frontendKeys) unpack(k uint64) Frontend          { return unpackL4(k) }

// packL4 packs an IPv4 address, port, protocol and scope.
func packL4(a model.L4Addr, scope Scope) (uint64, bool) {
	if !a.Addr.Is4() {
		return 0, false
	}
	b := a.Addr.As4()
	return uint64(b[0])<<56 | uint64(b[1])<<48 | uint64(b[2])<<40 | uint64(b[3])<<32 |
		uint64(a.Port)<<16 | uint64(a.Proto)<<8 | uint64(scope), true
}

func unpackL4(k uint64) Frontend {
	return Frontend{
		L4Addr: model.L4Addr{
			Addr: netip.AddrFrom4([4]byte{byte(k >> 56), byte(k >> 48), byte(k >> 40), byte(k >> 32)}),
			Port: uint16(k >> 16), Proto: model.Protocol(k >> 8),
		},
		Scope: Scope(k),
	}
}

// makeKeyMap returns a keyMap with room for n IPv4 keys.
func makeKeyMap[K comparable, V any, P keyPacking[K]](n int) keyMap[K, V, P] {
	return keyMap[K, V, P]{packed: makePackedMap[V](n), other: map[K]V{}}
}

func (m *keyMap[K, V, P]) get(k K) (V, bool) {
	var p P
	if pk, ok := p.pack(k); ok {
		return m.packed.get(pk)
	}
	v, ok := m.other[k]
	return v, ok
}

// val returns k's value, or the zero value if it has none.
func (m *keyMap[K, V, P]) val(k K) V {
	v, _ := m.get(k)
	return v
}

// getOrPut returns k's value, or adds k with the value mk returns (and
// reports false).
func (m *keyMap[K, V, P]) getOrPut(k K, mk func() V) (V, bool) {
	var p P
	if pk, ok := p.pack(k); ok {
		return m.packed.getOrPut(pk, mk)
	}
	if v, ok := m.other[k]; ok {
		return v, true
	}
	v := mk()
	m.other[k] = v
	return v, false
}

func (m *keyMap[K, V, P]) put(k K, v V) {
	var p P
	if pk, ok := p.pack(k); ok {
		m.packed.put(pk, v)
		return
	}
	m.other[k] = v
}

func (m *keyMap[K, V, P]) del(k K) {
	var p P
	if pk, ok := p.pack(k); ok {
		m.packed.del(pk)
		return
	}
	delete(m.other, k)
}

func (m *keyMap[K, V, P]) len() int { return m.packed.n + len(m.other) }

// all yields every key and value, in no order. The body may delete the
// key it is given.
func (m *keyMap[K, V, P]) all() iter.Seq2[K, V] {
	return func(yield func(K, V) bool) {
		var p P
		for pk, v := range m.packed.all() {
			if !yield(p.unpack(pk), v) {
				return
			}
		}
		for k, v := range m.other {
			if !yield(k, v) {
				return
			}
		}
	}
}

// keys yields every key, in no order.
func (m *keyMap[K, V, P]) keys() iter.Seq[K] {
	return func(yield func(K) bool) {
		for k := range m.all() {
			if !yield(k) {
				return
			}
		}
	}
}
