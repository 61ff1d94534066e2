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
// addresses that neither the maps hold nor the desired state wants.
func (r *Reconciler) releaseReservations(services map[model.L4Addr]*model.Service, want map[model.L4Addr]bool) {
	for fe, id := range r.serviceOf {
		if wanted(services, fe) {
			continue
		}
		if _, ok := r.frontends[fe]; ok {
			continue
		}
		if cur, ok := r.revNat[id]; ok && cur == fe {
			continue
		}
		delete(r.serviceOf, fe)
		r.maybeReleaseService(id, fe)
	}
	for a, id := range r.backendOf {
		if _, ok := r.backends[id]; ok || want[a] || r.slotRefs[id] > 0 {
			continue
		}
		delete(r.backendOf, a)
		r.maybeReleaseBackend(id, a)
	}
}

// deleteUnusedBackends deletes the backend entries that lost their last
// slot (or never got one), unless a frontend being programmed wants their
// address under that id.
func (r *Reconciler) deleteUnusedBackends(want map[model.L4Addr]bool) error {
	if len(r.backendCand) == 0 {
		return nil // the common case: no iterator to allocate
	}
	var errs []error
	for _, id := range slices.Sorted(maps.Keys(r.backendCand)) {
		a, ok := r.backends[id]
		if !ok || r.slotRefs[id] > 0 {
			delete(r.backendCand, id)
			continue
		}
		if want[a] && r.backendOf[a] == id {
			continue
		}
		r.writes++
		if err := r.dp.DeleteBackend(id); err != nil {
			errs = append(errs, fmt.Errorf("delete backend %d (%s): %w", id, a, err))
			continue
		}
		delete(r.backends, id)
		delete(r.backendCand, id)
		if r.backendOf[a] == id {
			delete(r.backendOf, a)
		}
		r.maybeReleaseBackend(id, a)
	}
	return errors.Join(errs...)
}

// deleteUnusedRevNat deletes the rev_nat entries of services no master
// names, unless a desired frontend is being programmed under that id.
func (r *Reconciler) deleteUnusedRevNat(services map[model.L4Addr]*model.Service) error {
	if len(r.revNatCand) == 0 {
		return nil // the common case: no iterator to allocate
	}
	var errs []error
	for _, id := range slices.Sorted(maps.Keys(r.revNatCand)) {
		fe, ok := r.revNat[id]
		if !ok || r.masterRef[id] > 0 {
			delete(r.revNatCand, id)
			continue
		}
		if wanted(services, fe) && r.serviceOf[fe] == id {
			continue // its master failed to be written; reused next time
		}
		r.writes++
		if err := r.dp.DeleteRevNat(id); err != nil {
			errs = append(errs, fmt.Errorf("delete rev_nat %d (%s): %w", id, fe, err))
			continue
		}
		delete(r.revNat, id)
		delete(r.revNatCand, id)
		if r.serviceOf[fe] == id {
			delete(r.serviceOf, fe)
		}
		r.maybeReleaseService(id, fe)
	}
	return errors.Join(errs...)
}

// maybeReleaseService frees a service id once nothing holds or reserves it.
func (r *Reconciler) maybeReleaseService(id ServiceID, fe Frontend) {
	if _, ok := r.revNat[id]; ok || r.masterRef[id] > 0 {
		return
	}
	delete(r.masterRef, id)
	if r.serviceOf[fe] == id {
		return
	}
	r.svcIDs.release(uint32(id))
}

// maybeReleaseBackend frees a backend id once nothing holds or reserves it.
func (r *Reconciler) maybeReleaseBackend(id BackendID, a model.L4Addr) {
	if _, ok := r.backends[id]; ok || r.slotRefs[id] > 0 || r.backendOf[a] == id {
		return
	}
	r.beIDs.release(uint32(id))
}
