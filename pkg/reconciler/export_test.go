package reconciler

// IncrementalApplies counts the Applies of r that looked at the changed
// frontends of their state only (model.State.BaseGen).
func IncrementalApplies(r *Reconciler) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.incremental
}
