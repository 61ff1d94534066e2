package reconciler

// The reconciler's view of the kernel's maps: what each frontend holds
// (master, slots), the backends and rev_nat entries, and the reference
// counts that say when an entry lost its last user. It is filled from a
// dump (Restore, refresh) and updated after every write that succeeded.

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/sluice-lb/sluice/pkg/model"
)

// frontendView is what the maps hold for one frontend.
type frontendView struct {
	hasMaster bool
	master    Master
	slots     slotMap        // slot >= 1 -> backend
	ranges    []netip.Prefix // source ranges, sorted by netip.Prefix.Compare
	fam       family         // the maps it is in (capacity.go)

	// synced says the frontend was last fully programmed with
	// syncedAddrs and syncedRanges and nothing touched it since (a fast
	// path for Apply).
	synced       bool
	syncedAddrs  []model.L4Addr
	syncedRanges []netip.Prefix

	name model.ServicePortName // who it was programmed for; empty if restored
}

// refresh re-reads the maps into the view, keeping what is not in them
// (pending conntrack flushes and session affinity fixes).
func (r *Reconciler) refresh() error {
	ks, err := r.dp.Dump()
	if err != nil {
		return fmt.Errorf("refresh: dump datapath maps: %w", err)
	}
	flush, aff, writes, inSync := r.pendingFlush, r.pendingAffinity, r.writes, r.inSync
	r.reset()
	r.loadKernel(ks)
	r.pendingFlush, r.pendingAffinity, r.writes, r.inSync = flush, aff, writes, inSync
	return nil
}

// loadKernel fills the (reset) view from a dump of the maps.
func (r *Reconciler) loadKernel(ks *KernelState) {
	r.lastRead = time.Now()
	for id, addr := range ks.Backends {
		r.putBackend(id, addr)
		r.beIDs.markUsed(uint32(id))
	}
	for id, fe := range ks.RevNat {
		r.revNat[id] = fe
		r.svcIDs.markUsed(uint32(id))
	}
	for fe, m := range ks.Masters {
		v := r.frontend(fe)
		v.hasMaster, v.master = true, m
		r.entries[v.fam]++
		r.masterRef[m.ID]++
		r.svcIDs.markUsed(uint32(m.ID))
		if isClusterIP(fe, m) {
			r.refServiceIP(fe.Addr)
			r.ipDirty[fe.Addr] = true
		}
	}
	for _, a := range ks.ServiceIPs {
		r.ipSet[a] = true
		r.ipDirty[a] = true
	}
	for fe, slots := range ks.Slots {
		v := r.frontend(fe)
		for s, id := range slots {
			if s == 0 {
				continue
			}
			v.slots.put(s, id)
			r.entries[v.fam]++
			r.slotRefs[id]++
			r.beIDs.markUsed(uint32(id))
		}
	}
	for fe, ps := range ks.SourceRanges {
		if len(ps) == 0 {
			continue
		}
		v := r.frontend(DefaultScope(fe))
		v.ranges = slices.Compact(slices.SortedFunc(slices.Values(ps), netip.Prefix.Compare))
		r.ranges[v.fam] += len(v.ranges)
	}
	// Choose the id each frontend and backend address is known by. A
	// master's id wins over a rev_nat entry naming the same frontend; of
	// several ids for one backend address (strays), the most named, then the
	// lowest, wins. The losers are rewritten and deleted by the next Apply.
	for _, fe := range slices.SortedFunc(maps.Keys(r.frontends), Frontend.Compare) {
		if v := r.frontends[fe]; v.hasMaster && r.masterRef[v.master.ID] == 1 {
			r.serviceOf[fe] = v.master.ID
		}
	}
	for _, id := range slices.Sorted(maps.Keys(r.revNat)) {
		fe := r.revNat[id]
		if _, ok := r.serviceOf[fe]; !ok && r.masterRef[id] == 0 {
			r.serviceOf[fe] = id
		}
	}
	for _, id := range slices.Sorted(maps.Keys(r.backends)) {
		a := r.backends[id]
		cur, ok := r.backendOf[a]
		if !ok || r.slotRefs[id] > r.slotRefs[cur] {
			r.backendOf[a] = id
		}
	}
	for id := range r.backends {
		if r.slotRefs[id] == 0 {
			r.backendCand[id] = true
		}
	}
	for id := range r.revNat {
		if r.masterRef[id] == 0 {
			r.revNatCand[id] = true
		}
	}
	r.dirty = true
}

func (r *Reconciler) frontend(fe Frontend) *frontendView {
	v := r.frontends[fe]
	if v == nil {
		v = &frontendView{fam: familyOf(fe.Addr)}
		r.frontends[fe] = v
	}
	return v
}

func (r *Reconciler) isReal(id BackendID) bool {
	_, ok := r.backends[id]
	return ok
}

func (r *Reconciler) setSlot(v *frontendView, s uint32, id BackendID) {
	if old, ok := v.slots.get(s); ok {
		r.unref(old)
	} else {
		r.entries[v.fam]++
	}
	v.slots.put(s, id)
	r.slotRefs[id]++
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
	if r.slotRefs[id]--; r.slotRefs[id] <= 0 {
		delete(r.slotRefs, id)
		r.backendCand[id] = true
		if _, real := r.backends[id]; !real {
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
	id BackendID
	ok bool
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
	m.ids[s] = slotEntry{id, true}
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
