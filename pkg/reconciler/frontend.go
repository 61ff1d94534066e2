package reconciler

// Per-frontend programming: what a frontend of the desired state wants,
// whether the view already holds it, and the make-before-break writes that
// bring it there or remove it.

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/sluice-lb/sluice/pkg/model"
)

// desiredFrontend is one frontend of the desired state in one scope, with
// its backends and source ranges.
type desiredFrontend struct {
	fe    Frontend
	svc   *model.Service
	flags uint8 // MasterFlags
	// backends are the scope's backends, sorted by address, one per
	// address (only their L4Addr counts). They are svc's own when it
	// has them so (the translation makes them sorted and unique), not a
	// copy: a first program at 30,000 Services x 10 copied 9.6 MB of
	// addresses, which lived until the end of the apply, the agent's
	// peak of memory.
	backends []model.Backend
	ranges   []netip.Prefix // see desiredRanges
	view     *frontendView  // its view, once programFresh made it
}

func newDesired(fe Frontend, svc *model.Service) *desiredFrontend { return makeDesired(nil, fe, svc) }

// makeDesired makes fe's desired frontend, of svc, in d, or in a new one
// if d is nil, and returns it.
func makeDesired(d *desiredFrontend, fe Frontend, svc *model.Service) *desiredFrontend {
	if d == nil {
		d = new(desiredFrontend)
	}
	*d = desiredFrontend{fe: fe, svc: svc, flags: MasterFlags(svc, fe.Scope), backends: scopeBackends(svc, fe.Scope)}
	if !sortedUnique(d.backends) {
		d.backends = slices.Clone(d.backends)
		slices.SortFunc(d.backends, compareBackends)
		d.backends = slices.CompactFunc(d.backends, func(a, b model.Backend) bool { return a.L4Addr == b.L4Addr })
	}
	d.ranges = desiredRanges(svc, fe.Scope)
	return d
}

// compareBackends orders backends by address.
func compareBackends(a, b model.Backend) int { return a.L4Addr.Compare(b.L4Addr) }

// sortedUnique reports whether bs are sorted by address, each once. Two
// IPv4 addresses compare packed (packL4 keeps their order).
func sortedUnique(bs []model.Backend) bool {
	if len(bs) == 0 {
		return true
	}
	prev, prevOK := packL4(bs[0].L4Addr, 0)
	for i := 1; i < len(bs); i++ {
		k, ok := packL4(bs[i].L4Addr, 0)
		if ok && prevOK {
			if k <= prev {
				return false
			}
		} else if compareBackends(bs[i-1], bs[i]) >= 0 {
			return false
		}
		prev, prevOK = k, ok
	}
	return true
}

// fastInSync reports whether v (nil if unknown), fe's view, was fully
// programmed with exactly svc's backends and source ranges for its scope,
// and nothing touched it since. (Ranges given unsorted or with host bits
// make it false, as do backends not sorted: the full check then decides.)
//
// The backends are read from v's slots: while v is synced they are the
// ones it was programmed with, so the view keeps no copy of them (8 bytes
// a backend and frontend, 1.8 MiB at 30,000 Services x 8). Sorted, they
// must be svc's.
func (r *Reconciler) fastInSync(v *frontendView, fe Frontend, svc *model.Service) bool {
	bs := scopeBackends(svc, fe.Scope)
	if v == nil || !v.synced || !v.hasMaster || int64(v.master.Count) != int64(len(bs)) ||
		v.master.Flags != MasterFlags(svc, fe.Scope) || v.master.AffinityTimeout != AffinitySeconds(svc) {
		return false
	}
	// Equal flags: both check ranges, or neither does (and v has none).
	if synced := v.syncedRanges(); len(synced) > 0 && !slices.Equal(synced, svc.SourceRanges) {
		return false
	}
	// Packed (IPv4), the common case: the order of the keys is the
	// addresses'.
	keys := r.scratchKeys[:0]
	packed := true
	for s := uint32(1); s <= v.master.Count; s++ {
		id, ok := v.slots.get(s)
		if !ok {
			return false
		}
		k, ok := r.backends.packedAt(uint32(id))
		if !ok {
			packed = false // or no backend: the loop below tells
			break
		}
		keys = append(keys, k)
	}
	r.scratchKeys = keys
	if packed {
		slices.Sort(keys)
		for i, b := range bs {
			if k, ok := packL4(b.L4Addr, 0); !ok || k != keys[i] {
				return false
			}
		}
		return true
	}
	addrs := r.scratchAddrs[:0]
	for s := uint32(1); s <= v.master.Count; s++ {
		a, ok := r.slotBackend(v, s)
		if !ok {
			return false
		}
		addrs = append(addrs, a)
	}
	r.scratchAddrs = addrs
	slices.SortFunc(addrs, model.L4Addr.Compare)
	for i, b := range bs {
		if b.L4Addr != addrs[i] {
			return false
		}
	}
	return true
}

// slotBackend returns the address of the backend slot s of v names.
func (r *Reconciler) slotBackend(v *frontendView, s uint32) (model.L4Addr, bool) {
	id, ok := v.slots.get(s)
	if !ok {
		return model.L4Addr{}, false
	}
	return r.backend(id)
}

func (r *Reconciler) markSynced(fe Frontend, d *desiredFrontend) {
	if v := r.frontends.val(fe); v != nil {
		r.markViewSynced(fe, v, d)
	}
}

// markViewSynced records that v, fe's view, holds d.
func (r *Reconciler) markViewSynced(fe Frontend, v *frontendView, d *desiredFrontend) {
	v.synced = true
	r.setService(fe, v, d.svc)
	v.setSyncedRanges(d.ranges)
}

// inSyncFrontend reports whether fe is programmed exactly as d asks.
func (r *Reconciler) inSyncFrontend(fe Frontend, d *desiredFrontend) bool {
	v := r.frontends.val(fe)
	if v == nil || !v.hasMaster {
		return false
	}
	sid, ok := r.serviceOf.get(fe)
	if !ok || v.master != masterOf(sid, d) {
		return false
	}
	if a, ok := r.revNat.get(uint32(sid)); !ok || a != fe || r.revNat.refs(uint32(sid)) != 1 {
		return false
	}
	if v.slots.n != len(d.backends) || !slices.Equal(v.ranges(), d.ranges) {
		return false
	}
	for _, b := range d.backends {
		a := b.L4Addr
		id, ok := r.backendOf.get(a)
		if !ok || !r.isReal(id) {
			return false
		}
	}
	// Every slot 1..m must hold a wanted backend, each exactly once.
	seen := make(map[BackendID]bool, len(d.backends))
	for s := uint32(1); s <= uint32(len(d.backends)); s++ {
		id, ok := v.slots.get(s)
		a, real := r.backend(id)
		if !ok || seen[id] || !real || !wantsAddr(d, a) || r.backendOf.val(a) != id {
			return false
		}
		seen[id] = true
	}
	return true
}

// masterOf returns the master entry d wants under service id sid.
func masterOf(sid ServiceID, d *desiredFrontend) Master {
	return Master{ID: sid, Count: uint32(len(d.backends)), Flags: d.flags, AffinityTimeout: AffinitySeconds(d.svc)}
}

func wantsAddr(d *desiredFrontend, a model.L4Addr) bool {
	_, ok := slices.BinarySearchFunc(d.backends, a, func(b model.Backend, a model.L4Addr) int { return b.L4Addr.Compare(a) })
	return ok
}

// programFrontend brings one frontend to its desired programming, in
// make-before-break order, stopping at the first failed write (the view
// then says how far it got).
func (r *Reconciler) programFrontend(fe Frontend, d *desiredFrontend, capacity sizes) error {
	v := r.frontends.val(fe)
	m := uint32(len(d.backends))

	// Checked before any write, so a service that does not fit keeps its
	// previous programming. A new frontend leaves the reserve to changes
	// of programmed ones (capacity.go).
	if err := validate(d); err != nil {
		return err
	}
	if err := r.checkCapacity(r.capacityNeeded(fe, d), capacity, r.reserveFor(fe, capacity)); err != nil {
		return err
	}

	sid, haveSID := r.serviceOf.get(fe)
	if !haveSID {
		sid = ServiceID(r.svcIDs.alloc())
		if err := r.dp.ResetServiceStats(sid); err != nil {
			r.svcIDs.release(uint32(sid))
			return fmt.Errorf("reset counters of service %d: %w", sid, err)
		}
		r.serviceOf.put(fe, sid)
	} else if v != nil && v.hasMaster && v.master.Flags&FlagRetired != 0 {
		// A retired master overwritten (retired.go) keeps its id, but
		// the frontend is a new Service's (or the same Service's
		// again): its counters start from zero, as a new id's.
		if err := r.dp.ResetServiceStats(sid); err != nil {
			return fmt.Errorf("reset counters of service %d: %w", sid, err)
		}
	}
	if v != nil {
		v.synced = false
	}

	// Backends this frontend names now (within its count), and their
	// slots: to flush the conntrack of the UDP ones that leave it once it
	// no longer names them, and to move or end the session affinity of
	// clients stuck to them.
	var before []model.L4Addr
	var beforeIDs []BackendID
	var slotOf map[BackendID]uint32
	hadAffinity := v != nil && v.hasMaster && v.master.Flags&FlagAffinity != 0
	var oldTimeout uint32
	if hadAffinity {
		oldTimeout = v.master.AffinityTimeout
	}
	if v != nil && v.hasMaster {
		// Sized, not grown by append: five arrays for ten backends.
		before, beforeIDs = make([]model.L4Addr, 0, v.master.Count), make([]BackendID, 0, v.master.Count)
		slotOf = make(map[BackendID]uint32, v.master.Count)
		for s := uint32(1); s <= v.master.Count; s++ {
			if id, ok := v.slots.get(s); ok && r.isReal(id) {
				a, _ := r.backend(id)
				before = append(before, a)
				beforeIDs = append(beforeIDs, id)
				slotOf[id] = s
			}
		}
	}

	// 1. Backends.
	ids := make([]BackendID, len(d.backends))
	for i, b := range d.backends {
		a := b.L4Addr
		id, ok := r.backendOf.get(a)
		if !ok {
			id = BackendID(r.beIDs.alloc())
			r.backendOf.put(a, id)
		}
		ids[i] = id
		if cur, ok := r.backend(id); ok && cur == a {
			continue
		}
		r.writes++
		if err := r.dp.UpsertBackend(id, a); err != nil {
			return fmt.Errorf("upsert backend %d (%s): %w", id, a, err)
		}
		r.putBackend(id, a)
		r.backendCand[id] = true // until a slot names it
	}

	// 2. Reverse NAT.
	if cur, ok := r.revNat.get(uint32(sid)); !ok || cur != fe {
		r.writes++
		if err := r.dp.UpsertRevNat(sid, fe); err != nil {
			return fmt.Errorf("upsert rev_nat %d: %w", sid, err)
		}
		r.revNat.put(uint32(sid), fe)
		r.revNatCand[sid] = true // until a master names it
	}

	// 3. Slots 1..m: keep the wanted backends where they are, fill the
	// holes with the others.
	v = r.frontend(fe)
	want := make(map[BackendID]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	kept := make(map[BackendID]bool, len(ids))
	var holes []uint32
	for s := uint32(1); s <= m; s++ {
		id, ok := v.slots.get(s)
		if ok && want[id] && !kept[id] {
			kept[id] = true
			continue
		}
		holes = append(holes, s)
	}
	h := 0
	var moves []AffinityFix
	for _, id := range ids {
		if kept[id] {
			continue
		}
		s := holes[h]
		h++
		r.writes++
		if err := r.dp.UpsertSlot(fe, s, id); err != nil {
			return fmt.Errorf("upsert slot %d: %w", s, err)
		}
		r.setSlot(v, s, id)
		if old, ok := slotOf[id]; ok && old != s {
			moves = append(moves, AffinityFix{Frontend: fe, Backend: id, Slot: s})
		}
	}
	// A backend moved down into a hole (the frontend shrinks) still
	// holds its old slot too, until the master's count drops below it:
	// move its clients' session affinity now, while both slots are good,
	// or the count would end it.
	if hadAffinity && d.flags&FlagAffinity != 0 && len(moves) > 0 {
		r.writes++
		if err := r.dp.FixAffinity(moves); err != nil {
			// Those clients only select afresh: not worth failing
			// the frontend for.
			r.log.Warn("Failed to move session affinity to new slots; clients of the moved backends select afresh",
				"service", d.svc.Name, "frontend", fe, "error", err)
		}
	}

	// 4. Source ranges the master checks, before it checks them.
	if err := r.addRanges(fe.L4Addr, v, d.ranges); err != nil {
		return err
	}

	// 5. The master. A ClusterIP's address leaves the service IPs before
	// its last ClusterIP master stops being one (a frontend changed
	// kind), and joins them once one is written (see serviceips.go).
	wantM := masterOf(sid, d)
	if !v.hasMaster || v.master != wantM {
		wasCIP := v.hasMaster && isClusterIP(fe, v.master)
		isCIP := isClusterIP(fe, wantM)
		if wasCIP && !isCIP {
			if err := r.leaveServiceIPs(fe.Addr); err != nil {
				return err
			}
		}
		r.writes++
		if err := r.dp.UpsertMaster(fe, wantM); err != nil {
			return fmt.Errorf("upsert master: %w", err)
		}
		switch {
		case wasCIP && !isCIP:
			r.unrefServiceIP(fe.Addr)
		case isCIP && !wasCIP:
			r.refServiceIP(fe.Addr)
		}
		if v.hasMaster {
			r.revNat.addRefs(uint32(v.master.ID), -1)
			r.revNatCand[v.master.ID] = true
			r.maybeReleaseService(v.master.ID, fe)
		} else {
			r.entries[v.fam]++
		}
		v.hasMaster, v.master = true, wantM
		r.revNat.addRefs(uint32(sid), 1)
		delete(r.retiredAt, fe) // overwritten in place, if it was retired
	}
	// From here on no new connection can pick a backend that left: flush
	// the conntrack entries of the UDP ones the Service port no longer
	// serves, so their flows re-balance. One it still serves (in its other
	// scope, or in standby: terminating while others are ready, left out
	// by topology) keeps its flows, as kube-proxy's do (standby.go).
	for _, a := range before {
		if a.Proto == model.UDP && !wantsAddr(d, a) && !servesAddr(d.svc, a) {
			r.pendingFlush[a] = true
		}
	}
	// Nor follow a client's session affinity to one (the datapath checks
	// the slot): its entries go, so that the backend, should it come
	// back, starts without clients, as kube-proxy's affinity set of a
	// returning endpoint does.
	if hadAffinity {
		r.endAffinity(fe, oldTimeout, wantM, beforeIDs, want)
	}

	// 6. Slots above the new count.
	extra := v.slots.keys(m + 1)
	for i := len(extra) - 1; i >= 0; i-- {
		s := extra[i]
		r.writes++
		if err := r.dp.DeleteSlot(fe, s); err != nil {
			return fmt.Errorf("delete slot %d: %w", s, err)
		}
		r.deleteSlot(v, s)
	}

	// 7. Source ranges the master no longer checks (all of them if it
	// lost FlagSourceRanges).
	if err := r.pruneRanges(fe.L4Addr, v, d.ranges); err != nil {
		return err
	}

	// 8. Its address among the service IPs, if it is a ClusterIP's.
	if isClusterIP(fe, wantM) {
		return r.joinServiceIPs(fe.Addr)
	}
	return nil
}

// removeFrontend deletes a frontend nobody wants: master first (a
// ClusterIP's last master after its address left the service IPs), then
// its slots and source ranges. Its rev_nat entry goes at the end of Apply.
// The UDP backends still served keep their flows: by the Service its
// address now has in services, if any (a frontend that loses its
// internal scope, externalTrafficPolicy Local to Cluster), or, for a
// NodePort frontend at a node address that goes, by the Service port's
// NodePort frontends of the same number at other addresses
// (servedByName), or by the retired master at the same address, for its
// flows (an internal scope removed after its default scope retired:
// udpretired.go). A default scope's master may be retired instead, and a
// retired one is kept until its time is up (retired.go).
func (r *Reconciler) removeFrontend(fe Frontend, services model.Services) error {
	v := r.frontends.val(fe)
	if v.hasMaster && v.master.Flags&FlagRetired != 0 {
		if r.keepRetired(fe) {
			// Kept for its flows (retired.go); what a retirement that
			// failed part way left goes.
			return r.finishRetire(fe, v)
		}
	} else if r.mayRetire(fe, v) {
		return r.retire(fe, v)
	}
	still := services.Get(fe.L4Addr)
	var named []model.L4Addr
	if v.hasMaster {
		for s := uint32(1); s <= v.master.Count; s++ {
			if id, ok := v.slots.get(s); ok && r.isReal(id) {
				a, _ := r.backend(id)
				named = append(named, a)
			}
		}
		cip := isClusterIP(fe, v.master)
		if cip {
			if err := r.leaveServiceIPs(fe.Addr); err != nil {
				return err
			}
		}
		r.writes++
		if err := r.dp.DeleteSlot(fe, 0); err != nil {
			return fmt.Errorf("delete master: %w", err)
		}
		if cip {
			r.unrefServiceIP(fe.Addr)
		}
		v.hasMaster, v.synced = false, false
		r.entries[v.fam]--
		r.revNat.addRefs(uint32(v.master.ID), -1)
		r.revNatCand[v.master.ID] = true
		r.maybeReleaseService(v.master.ID, fe)
		delete(r.retiredAt, fe)
		if v.master.Flags&FlagAffinity != 0 {
			r.pendingAffinity[AffinityFix{Frontend: fe}] = true
		}
		for _, a := range named {
			if a.Proto == model.UDP && !servesAddr(still, a) && !r.servedByName(fe, v.svc, a, services) && !r.flowsKeep(fe.L4Addr, a) {
				r.pendingFlush[a] = true
			}
		}
	}
	if err := r.dropSlotsAndRanges(fe, v); err != nil {
		return err
	}
	r.frontends.del(fe)
	return nil
}

// endAffinity queues the deletion of the session affinity entries of
// frontend fe, which had affinity with oldTimeout, that the master now
// written, m, no longer honours: those of the backends in before that it
// no longer names (not in want), or all of them if it lost its affinity
// or had its timeout shortened (the entries would outlive the new
// timeout).
func (r *Reconciler) endAffinity(fe Frontend, oldTimeout uint32, m Master, before []BackendID, want map[BackendID]bool) {
	if m.Flags&FlagAffinity == 0 || m.AffinityTimeout < oldTimeout {
		r.pendingAffinity[AffinityFix{Frontend: fe}] = true
		return
	}
	for _, id := range before {
		if !want[id] {
			r.pendingAffinity[AffinityFix{Frontend: fe, Backend: id}] = true
		}
	}
}
