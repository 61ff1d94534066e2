package reconciler

import "github.com/sluice-lb/sluice/pkg/model"

// Holds reports whether the maps hold svc's frontend exactly as svc asks:
// its backends, flags and source ranges, in each of its scopes. The maps do not record which
// Service a frontend was programmed for; what they hold is the next best
// thing. The sources' change tracker asks it when several Services claim a
// frontend none of them holds yet, so that after an agent restart the
// frontend stays with the Service it was programmed for (first come keeps
// it, see pkg/source/tracker).
func (r *Reconciler) Holds(svc *model.Service) bool {
	if svc == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	fe := DefaultScope(svc.Frontend)
	if !r.inSyncFrontend(fe, newDesired(fe, svc)) {
		return false
	}
	if !svc.TwoScopes {
		return true
	}
	in := Frontend{L4Addr: svc.Frontend, Scope: ScopeInternal}
	return r.inSyncFrontend(in, newDesired(in, svc))
}
