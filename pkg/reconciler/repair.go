package reconciler

// Repair of drift found by the periodic re-read (recheck.go) without a dump
// of the maps: the view is brought to what the maps hold for the entries
// that drifted, exactly as loadKernel would have made it from a dump (the
// entries, the users counted for each id, the id each frontend and backend
// address is known by, the candidates for deletion, the service IPs'
// masters), and the frontends those entries touch are no longer in sync.
// The Apply that follows writes what differs from the desired state in
// its make-before-break order, as it did after a rebuild from a dump: the
// maps come out the same.
//
// At 30,000 Services x 10 a rebuild made ~150 MB of heap and ~2 CPU-seconds
// (a dump of every map and a new view) for one entry changed with bpftool;
// this makes heap in proportion to the entries that drifted, and two walks
// of the maps (one when nothing is missing).
//
// One thing a rebuild did that this does not: it made the id allocators
// anew from the ids in the maps, losing the order in which ids were
// freed (their quarantine, idalloc.go). Here they are kept, so an id the
// repair allocates (a backend whose entry was deleted is rewritten under
// a new one, as after a rebuild) may be another than a rebuild's.

import (
	"iter"
	"log/slog"
	"net/netip"
	"slices"

	"github.com/sluice-lb/sluice/pkg/model"
)

// drift is what the maps hold for the entries a re-read found them to
// differ from the view in: an entry the view holds under another value
// or not at all (present, with the maps' value), or one the view holds
// and the maps do not (not present).
type drift struct {
	masters  []masterDrift
	slots    []slotDrift
	backends []backendDrift
	revNat   []revNatDrift
	ranges   []rangeDrift
	ips      []ipDrift
	// sameKey counts, per map, the entries present that the view holds
	// under another value (the others it does not hold at all).
	sameKey [nMaps]int
}

type (
	masterDrift struct {
		fe      Frontend
		m       Master
		present bool
	}
	slotDrift struct {
		fe      Frontend
		slot    uint32
		id      BackendID
		present bool
	}
	backendDrift struct {
		id      BackendID
		addr    model.L4Addr
		present bool
	}
	revNatDrift struct {
		id      ServiceID
		fe      Frontend
		present bool
	}
	rangeDrift struct {
		fe      model.L4Addr
		p       netip.Prefix
		present bool
	}
	ipDrift struct {
		a       netip.Addr
		present bool
	}
)

// len returns how many entries d names.
func (d *drift) len() int {
	return len(d.masters) + len(d.slots) + len(d.backends) + len(d.revNat) + len(d.ranges) + len(d.ips)
}

// DriftMaps names the maps a re-read counts drifted entries in, in the
// order of DriftStats.Entries, as the repair's log line names them
// (masters and slots are both in the services maps).
var DriftMaps = [nMaps]string{
	mapMasters: "masters", mapSlots: "slots", mapBackends: "backends",
	mapRevNat: "rev_nat", mapRanges: "source_ranges", mapServiceIPs: "service_ips",
}

// counts are d's entries, per map.
func (d *drift) counts() [nMaps]int {
	return [nMaps]int{
		mapMasters: len(d.masters), mapSlots: len(d.slots), mapBackends: len(d.backends),
		mapRevNat: len(d.revNat), mapRanges: len(d.ranges), mapServiceIPs: len(d.ips),
	}
}

// logAttrs are d's counts, per map, for the log.
func (d *drift) logAttrs() []any {
	attrs := make([]any, 0, nMaps)
	for k, n := range d.counts() {
		attrs = append(attrs, slog.Int(DriftMaps[k], n))
	}
	return attrs
}

// rangeKey is a source range of a frontend.
type rangeKey struct {
	fe model.L4Addr
	p  netip.Prefix
}

// markWalk is the KernelVisitor of a re-read's second walk: it marks in
// the view (the walked fields) the entries of the maps in want that the
// view holds, whatever their value, so that those it holds and the maps
// do not are found unmarked. Source ranges, few, are collected instead.
type markWalk struct {
	r      *Reconciler
	want   [nMaps]bool
	ranges map[rangeKey]bool
}

func (w *markWalk) Master(fe Frontend, _ Master) bool {
	if v := w.r.frontends.val(fe); w.want[mapMasters] && v != nil && v.hasMaster {
		v.walked = true
	}
	return true
}

func (w *markWalk) Slot(fe Frontend, slot uint32, _ BackendID) bool {
	if v := w.r.frontends.val(fe); w.want[mapSlots] && v != nil && int64(slot) < int64(len(v.slots.ids)) {
		v.slots.ids[slot].walked = true
	}
	return true
}

func (w *markWalk) Backend(id BackendID, _ model.L4Addr) bool {
	if e := w.r.backends.at(uint32(id)); w.want[mapBackends] && e != nil {
		e.walked = true
	}
	return true
}

func (w *markWalk) RevNat(id ServiceID, _ Frontend) bool {
	if e := w.r.revNat.at(uint32(id)); w.want[mapRevNat] && e != nil {
		e.walked = true
	}
	return true
}

func (w *markWalk) SourceRange(fe model.L4Addr, p netip.Prefix) bool {
	if w.want[mapRanges] {
		w.ranges[rangeKey{fe, p}] = true
	}
	return true
}

func (w *markWalk) ServiceIP(a netip.Addr) bool {
	if e := w.r.ips.val(a); w.want[mapServiceIPs] && e.inSet {
		e.walked = true
		w.r.ips.put(a, e)
	}
	return true
}

// findMissing adds to d the entries the view holds that the maps do not,
// of the maps short says hold fewer than it (how many fewer): a second
// walk marks what the maps hold, then the view's unmarked entries are
// the missing ones (and every mark is cleared). It reports false when
// the walk fails, when it finds other numbers than short (the maps
// changed between the walks), or when d would name more than maxDrift
// entries: the view is then rebuilt from a dump.
func (r *Reconciler) findMissing(d *drift, short [nMaps]int) bool {
	w := markWalk{r: r}
	for k, n := range short {
		w.want[k] = n > 0
	}
	if w.want[mapRanges] {
		w.ranges = map[rangeKey]bool{}
	}
	err := r.dp.Walk(&w)
	var found [nMaps]int
	over := false // more than maxDrift: d is left short of some
	room := func(k int) bool {
		found[k]++
		over = over || d.len() >= maxDrift
		return !over
	}
	if w.want[mapMasters] || w.want[mapSlots] || w.want[mapRanges] {
		for fe, v := range r.frontends.all() {
			if w.want[mapMasters] && v.hasMaster && !v.walked && room(mapMasters) {
				d.masters = append(d.masters, masterDrift{fe: fe})
			}
			v.walked = false
			if w.want[mapSlots] {
				for s := range v.slots.ids {
					e := &v.slots.ids[s]
					if e.ok && !e.walked && room(mapSlots) {
						d.slots = append(d.slots, slotDrift{fe: fe, slot: uint32(s)})
					}
					e.walked = false
				}
			}
			for _, p := range v.ranges() {
				if w.want[mapRanges] && !w.ranges[rangeKey{fe.L4Addr, p}] && room(mapRanges) {
					d.ranges = append(d.ranges, rangeDrift{fe: fe.L4Addr, p: p})
				}
			}
		}
	}
	if w.want[mapBackends] {
		r.backends.takeUnwalked(func(id uint32) {
			if room(mapBackends) {
				d.backends = append(d.backends, backendDrift{id: BackendID(id)})
			}
		})
	}
	if w.want[mapRevNat] {
		r.revNat.takeUnwalked(func(id uint32) {
			if room(mapRevNat) {
				d.revNat = append(d.revNat, revNatDrift{id: ServiceID(id)})
			}
		})
	}
	if w.want[mapServiceIPs] {
		for a, e := range r.ips.all() {
			if e.inSet && !e.walked && room(mapServiceIPs) {
				d.ips = append(d.ips, ipDrift{a: a})
			}
			if e.walked {
				e.walked = false
				r.ips.put(a, e)
			}
		}
	}
	switch {
	case err != nil:
		r.log.Debug("Second walk of the datapath maps failed, reading them whole", "err", err)
		return false
	case found != short:
		r.log.Debug("The datapath maps changed between two walks, reading them whole")
		return false
	case over:
		r.logMassDrift()
		return false
	}
	return true
}

// takeUnwalked calls f with every id that holds an entry and was not
// marked walked, in order, and clears the marks.
func (t *idTable[V, P]) takeUnwalked(f func(id uint32)) {
	take := func(id uint32, e *idEntry) {
		if e.held != heldNone && !e.walked {
			f(id)
		}
		e.walked = false
	}
	for id := range t.dense {
		take(uint32(id), &t.dense[id])
	}
	for id, e := range t.high {
		take(id, e)
	}
}

// touched is what patching the view changed, for settle to bring the
// rest of the view (ids chosen, candidates, frontends in sync) in line.
type touched struct {
	fes   map[Frontend]bool     // masters, slots, ranges, or the id chosen for them
	sids  map[ServiceID]bool    // rev_nat entries, or the masters naming them
	ids   map[BackendID]bool    // backend entries, or the slots naming them
	addrs map[model.L4Addr]bool // backend addresses held by another id now
}

// patchView brings the view to what the maps hold for the entries d
// names, as loadKernel would have read them, and the rest of the view in
// line (settle). The next Apply is then not incremental (it looks at every
// desired frontend, as after a rebuild) and looks for reservations to
// release, as after a rebuild.
func (r *Reconciler) patchView(d *drift) {
	t := touched{fes: map[Frontend]bool{}, sids: map[ServiceID]bool{}, ids: map[BackendID]bool{}, addrs: map[model.L4Addr]bool{}}
	for _, e := range d.backends {
		r.patchBackend(e, &t)
	}
	for _, e := range d.revNat {
		r.patchRevNat(e, &t)
	}
	for _, e := range d.masters {
		r.patchMaster(e, &t)
	}
	for _, e := range d.slots {
		r.patchSlot(e, &t)
	}
	for _, e := range d.ranges {
		r.patchRange(e, &t)
	}
	for _, e := range d.ips {
		r.setInServiceIPs(e.a, e.present)
		r.ipDirty[e.a] = true
	}
	r.settle(&t)
	r.appliedGen = 0
	r.dirty = true
}

// frontendToPatch returns fe's view, made if present (an entry of a
// frontend the view does not know); nil if neither.
func (r *Reconciler) frontendToPatch(fe Frontend, present bool, t *touched) *frontendView {
	v := r.frontends.val(fe)
	if v == nil && present {
		v = r.frontend(fe)
	}
	if v != nil {
		t.fes[fe] = true
	}
	return v
}

func (r *Reconciler) patchMaster(e masterDrift, t *touched) {
	v := r.frontendToPatch(e.fe, e.present, t)
	if v == nil {
		return
	}
	retiredAt, wasRetired := r.retiredAt[e.fe]
	if v.hasMaster {
		old := v.master
		r.revNat.addRefs(uint32(old.ID), -1)
		t.sids[old.ID] = true
		if isClusterIP(e.fe, old) {
			r.unrefServiceIP(e.fe.Addr)
			r.ipDirty[e.fe.Addr] = true
		}
		v.hasMaster, v.master = false, Master{}
		r.entries[v.fam]--
		delete(r.retiredAt, e.fe)
	}
	if e.present {
		if wasRetired && e.m.Flags&FlagRetired != 0 {
			r.retiredAt[e.fe] = retiredAt // still retired: its time kept
		}
		r.holdMaster(e.fe, v, e.m)
		t.sids[e.m.ID] = true
	}
}

func (r *Reconciler) patchSlot(e slotDrift, t *touched) {
	v := r.frontendToPatch(e.fe, e.present, t)
	if v == nil {
		return
	}
	if old, ok := v.slots.get(e.slot); ok {
		r.backends.addRefs(uint32(old), -1)
		t.ids[old] = true
		v.slots.del(e.slot)
		r.entries[v.fam]--
	}
	if e.present {
		r.holdSlot(v, e.slot, e.id)
		t.ids[e.id] = true
	}
}

func (r *Reconciler) patchBackend(e backendDrift, t *touched) {
	patchEntry(&r.backends, r.beIDs, uint32(e.id), e.addr, e.present,
		func(a model.L4Addr) { t.addrs[a] = true },
		func(id uint32, a model.L4Addr) { r.putBackend(BackendID(id), a) },
		func(id uint32, old model.L4Addr) {
			r.backends.del(id)
			r.nbackends[familyOf(old.Addr)]--
		})
	t.ids[e.id] = true
}

func (r *Reconciler) patchRevNat(e revNatDrift, t *touched) {
	patchEntry(&r.revNat, r.svcIDs, uint32(e.id), e.fe, e.present,
		func(fe Frontend) { t.fes[fe] = true },
		func(id uint32, fe Frontend) { r.revNat.put(id, fe) },
		func(id uint32, _ Frontend) { r.revNat.del(id) })
	t.sids[ServiceID(e.id)] = true
}

// patchEntry brings the entry of tab under id to what the maps hold: v
// if present, else none, with put and del; the id is marked used in ids
// (as loadKernel marks the ids it reads), and touch hears of the value
// it held and the one it holds.
func patchEntry[V comparable, P keyPacking[V]](tab *idTable[V, P], ids *idAllocator, id uint32, v V, present bool,
	touch func(V), put, del func(uint32, V),
) {
	if old, ok := tab.get(id); ok {
		touch(old)
		if !present {
			del(id, old)
		}
	}
	if present {
		put(id, v)
		ids.markUsed(id)
		touch(v)
	}
}

func (r *Reconciler) patchRange(e rangeDrift, t *touched) {
	v := r.frontendToPatch(DefaultScope(e.fe), e.present, t)
	if v == nil {
		return
	}
	switch has := v.hasRange(e.p); {
	case e.present && !has:
		v.addRange(e.p)
		r.ranges[v.fam]++
	case !e.present && has:
		v.deleteRange(e.p)
		r.ranges[v.fam]--
	}
}

// settle brings what the view derives from its entries in line with
// patched ones, as loadKernel derives it from a dump: the id each
// frontend is known by (its master's, if no other master names it, else
// the lowest rev_nat entry for it that no master names) and each backend
// address (of the ids holding it, the most named, then the lowest); the
// entries no one names, candidates for deletion; the ids no one holds,
// released. Every frontend whose programming may read differently now is
// no longer in sync, so that the Apply compares it in full.
func (r *Reconciler) settle(t *touched) {
	// Service ids, and the frontends known by them or naming them.
	if len(t.sids) > 0 {
		for fe, v := range r.frontends.all() {
			if v.hasMaster && t.sids[v.master.ID] {
				t.fes[fe] = true
			}
		}
		for fe, id := range r.serviceOf.all() {
			if t.sids[id] {
				t.fes[fe] = true
			}
		}
		for id := range t.sids {
			if fe, ok := r.revNat.get(uint32(id)); ok {
				t.fes[fe] = true
			}
		}
	}
	if len(t.fes) > 0 {
		// The lowest rev_nat entry no master names, of each frontend
		// touched.
		unnamed := map[Frontend]ServiceID{}
		for id, fe := range r.revNat.all() {
			if _, ok := unnamed[fe]; !ok && t.fes[fe] && r.revNat.refs(id) == 0 {
				unnamed[fe] = ServiceID(id)
			}
		}
		for fe := range t.fes {
			want, ok := unnamed[fe]
			if v := r.frontends.val(fe); v != nil && v.hasMaster && r.revNat.refs(uint32(v.master.ID)) == 1 {
				want, ok = v.master.ID, true
			}
			cur, had := r.serviceOf.get(fe)
			switch {
			case ok:
				r.serviceOf.put(fe, want)
			case had:
				r.serviceOf.del(fe)
			}
			if had && cur != want {
				t.sids[cur] = true
			}
		}
	}
	settleIDs(&r.revNat, r.revNatCand, t.sids, func(id ServiceID) {
		r.svcIDs.release(uint32(id)) // no frontend is known by it: serviceOf names held ids only now
	})

	// Backend ids, and the addresses they hold.
	for id := range t.ids {
		if a, ok := r.backends.get(uint32(id)); ok {
			t.addrs[a] = true
		}
	}
	if len(t.addrs) > 0 {
		best := map[model.L4Addr]BackendID{}
		for id, a := range r.backends.all() {
			if !t.addrs[a] {
				continue
			}
			if cur, ok := best[a]; !ok || r.backends.refs(id) > r.backends.refs(uint32(cur)) {
				best[a] = BackendID(id)
			}
		}
		for a := range t.addrs {
			cur, had := r.backendOf.get(a)
			want, ok := best[a]
			switch {
			case ok:
				r.backendOf.put(a, want)
				t.ids[want] = true
			case had:
				r.backendOf.del(a)
			}
			if had {
				t.ids[cur] = true
			}
		}
	}
	var unheld []BackendID // released unless an address is known by it
	settleIDs(&r.backends, r.backendCand, t.ids, func(id BackendID) { unheld = append(unheld, id) })
	if len(unheld) > 0 {
		reserved := map[BackendID]bool{}
		for _, id := range r.backendOf.all() {
			reserved[id] = true
		}
		for _, id := range unheld {
			if !reserved[id] {
				r.beIDs.release(uint32(id))
			}
		}
	}
	// Frontends whose slots name a backend id touched: what they hold,
	// or the id their backends' addresses are known by, changed.
	if len(t.ids) > 0 {
		for fe, v := range r.frontends.all() {
			for s := range v.slots.ids {
				if e := v.slots.ids[s]; e.ok && t.ids[e.id] {
					t.fes[fe] = true
					break
				}
			}
		}
	}
	for fe := range t.fes {
		v := r.frontends.val(fe)
		if v == nil {
			continue
		}
		v.synced = false
		if !v.hasMaster && v.slots.n == 0 && len(v.ranges()) == 0 {
			r.setService(fe, v, nil)
			r.frontends.del(fe) // as a dump would not have made it
		}
	}
}

// settleIDs makes the ids touched of tab that hold an entry nobody
// names the candidates for deletion cand holds (and no others touched),
// as loadKernel makes them; those that neither hold an entry nor are
// named go to gone.
func settleIDs[ID ~uint32, V comparable, P keyPacking[V]](tab *idTable[V, P], cand, touched map[ID]bool, gone func(ID)) {
	for id := range touched {
		held, refs := tab.has(uint32(id)), tab.refs(uint32(id))
		if held && refs == 0 {
			cand[id] = true
		} else {
			delete(cand, id)
		}
		if !held && refs <= 0 {
			tab.clearRefs(uint32(id))
			gone(id)
		}
	}
}

// all yields the ids that hold an entry, in order, with the entry's
// value.
func (t *idTable[V, P]) all() iter.Seq2[uint32, V] {
	return func(yield func(uint32, V) bool) {
		for id := range t.dense {
			if e := &t.dense[id]; e.held != heldNone {
				v, _ := t.value(uint32(id), e)
				if !yield(uint32(id), v) {
					return
				}
			}
		}
		if len(t.high) == 0 {
			return
		}
		ids := make([]uint32, 0, len(t.high))
		for id, e := range t.high {
			if e.held != heldNone {
				ids = append(ids, id)
			}
		}
		slices.Sort(ids)
		for _, id := range ids {
			v, _ := t.value(id, t.high[id])
			if !yield(id, v) {
				return
			}
		}
	}
}
