package reconciler

// Cleanup after the frontends are programmed: entries nobody names any
// more are deleted, and ids nobody holds or reserves go back to their
// allocators (through the quarantine, see idAllocator).

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/sluice-lb/sluice/pkg/model"
)

// releaseReservations drops the ids chosen for frontends and backend
// addresses that neither the maps hold nor the desired state wants (want,
// made on first use). The cheap checks come first: after an Apply that
// left everything programmed, every id is held, and the set of wanted
// backends (300,000 addresses at 30,000 Services) is never made.
func (r *Reconciler) releaseReservations(services model.Services, want func() map[model.L4Addr]bool) {
	for fe, id := range r.serviceOf.all() {
		if cur, ok := r.revNat.get(uint32(id)); ok && cur == fe {
			continue
		}
		if _, ok := r.frontends.get(fe); ok {
			continue
		}
		if wanted(services, fe) {
			continue
		}
		r.serviceOf.del(fe)
		r.maybeReleaseService(id, fe)
	}
	for a, id := range r.backendOf.all() {
		if r.isReal(id) || r.backends.refs(uint32(id)) > 0 || want()[a] {
			continue
		}
		r.backendOf.del(a)
		r.maybeReleaseBackend(id, a)
	}
}

// deleteUnusedBackends deletes the backend entries that lost their last
// slot (or never got one), unless a frontend being programmed wants their
// address (want, made on first use) under that id, or a frontend's Service
// holds it in standby (standby.go: its flows name it), or a retired UDP
// master holds it for its flows, or the flows Restore read at a live UDP
// master name it until that master is retired or programmed
// (udpretired.go). A UDP backend whose entry goes is served by nothing
// (no slot, no standby): its flows are flushed, however it came to go
// (its Service deleted, an agent restart or a rebuild of the view that
// found it gone), as kube-proxy's go once their endpoint no longer
// serves.
func (r *Reconciler) deleteUnusedBackends(want func() map[model.L4Addr]bool) error {
	if len(r.backendCand) == 0 {
		return nil // the common case: no closures or iterator to allocate
	}
	return deleteUnused(r, idEntries[BackendID, model.L4Addr]{
		what: "backend", cand: r.backendCand, entries: &r.backends, idOf: &r.backendOf,
		wanted: func(a model.L4Addr) bool { return want()[a] },
		held:   r.keptForFlows,
		deleted: func(a model.L4Addr) {
			r.nbackends[familyOf(a.Addr)]--
			// A stray duplicate's delete (the address's entry is another
			// id's, which stays) ends nothing: its flows name the address,
			// which is still served.
			if id, ok := r.backendOf.get(a); ok {
				if _, live := r.backends.get(uint32(id)); live {
					return
				}
			}
			if a.Proto == model.UDP {
				r.pendingFlush[a] = true
			}
		},
		del:     r.dp.DeleteBackend,
		delMany: r.dp.DeleteBackends,
		release: r.maybeReleaseBackend,
	})
}

// deleteUnusedRevNat deletes the rev_nat entries of services no master
// names, unless a desired frontend is being programmed under that id.
func (r *Reconciler) deleteUnusedRevNat(services model.Services) error {
	if len(r.revNatCand) == 0 {
		return nil // the common case: no closures or iterator to allocate
	}
	return deleteUnused(r, idEntries[ServiceID, Frontend]{
		what: "rev_nat", cand: r.revNatCand, entries: &r.revNat, idOf: &r.serviceOf,
		wanted:  func(fe Frontend) bool { return wanted(services, fe) },
		del:     r.dp.DeleteRevNat,
		delMany: r.dp.DeleteRevNats,
		release: r.maybeReleaseService,
	})
}

// idEntries is one kind of map entry keyed by an id the reconciler
// allocates, as deleteUnused sees it: backends (key: the backend address)
// or rev_nat entries (key: the frontend).
type idEntries[ID ~uint32, K comparable] struct {
	what    string         // the map, for errors
	cand    map[ID]bool    // entries that may have lost their last user
	entries idTableOf[K]   // what the map holds, and the slots or masters naming each id
	idOf    idIndex[K, ID] // the id chosen for each key, held or reserved
	wanted  func(K) bool
	// held, if set, says an entry stays for as long as something holds
	// it that re-makes it a candidate when it lets go (a standby
	// backend: setService): it leaves the candidates meanwhile, so that
	// every Apply does not sort and scan it again.
	held    func(K) bool
	deleted func(K) // if set, hears of every entry deleted
	del     func(ID) error
	delMany func([]ID) (int, error)
	release func(ID, K)
}

// idTableOf is an idTable of values K (Reconciler.backends, revNat).
type idTableOf[K any] interface {
	get(id uint32) (K, bool)
	refs(id uint32) int32
	del(id uint32)
}

// idIndex is the id of each key (Reconciler.backendOf, serviceOf).
type idIndex[K, ID any] interface {
	val(K) ID
	del(K)
}

// deleteUnused deletes, in id order, the candidate entries nothing names,
// unless the desired state still wants their key under that id: its user
// failed to be written, and reuses the entry next time. Many go in one
// batch (nothing names them, so their order does not matter to a
// reader).
func deleteUnused[ID ~uint32, K comparable](r *Reconciler, e idEntries[ID, K]) error {
	var errs []error
	var ids []ID
	for _, id := range slices.Sorted(maps.Keys(e.cand)) {
		k, ok := e.entries.get(uint32(id))
		if !ok || e.entries.refs(uint32(id)) > 0 {
			delete(e.cand, id)
			continue
		}
		if e.idOf.val(k) == id {
			if e.held != nil && e.held(k) {
				delete(e.cand, id)
				continue
			}
			if e.wanted(k) {
				continue
			}
		}
		ids = append(ids, id)
	}
	deleted := func(i int) {
		id := ids[i]
		k, _ := e.entries.get(uint32(id))
		e.entries.del(uint32(id))
		if e.deleted != nil {
			e.deleted(k)
		}
		delete(e.cand, id)
		if e.idOf.val(k) == id {
			e.idOf.del(k)
		}
		e.release(id, k)
	}
	failed := func(i int, err error) {
		k, _ := e.entries.get(uint32(ids[i]))
		errs = append(errs, fmt.Errorf("delete %s %d (%v): %w", e.what, ids[i], k, err))
	}
	one := func(i int) error { return e.del(ids[i]) }
	if len(ids) == 1 {
		r.writes++
		if err := one(0); err != nil {
			failed(0, err)
		} else {
			deleted(0)
		}
		return errors.Join(errs...)
	}
	r.batch(len(ids), func() (int, error) { return e.delMany(ids) }, one, deleted, failed)
	return errors.Join(errs...)
}

// maybeReleaseService frees a service id once nothing holds or reserves it.
func (r *Reconciler) maybeReleaseService(id ServiceID, fe Frontend) {
	if r.revNat.has(uint32(id)) || r.revNat.refs(uint32(id)) > 0 {
		return
	}
	r.revNat.clearRefs(uint32(id))
	if r.serviceOf.val(fe) == id {
		return
	}
	r.svcIDs.release(uint32(id))
}

// maybeReleaseBackend frees a backend id once nothing holds or reserves it.
func (r *Reconciler) maybeReleaseBackend(id BackendID, a model.L4Addr) {
	if r.isReal(id) || r.backends.refs(uint32(id)) > 0 || r.backendOf.val(a) == id {
		return
	}
	r.beIDs.release(uint32(id))
}
