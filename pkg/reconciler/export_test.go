package reconciler

// IncrementalApplies counts the Applies of r that looked at the changed
// frontends of their state only (model.State.BaseGen).
func IncrementalApplies(r *Reconciler) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.incremental
}

// ReservationSweeps counts the Applies of r that looked for reserved
// ids to release (after a failure, or a Restore that read entries).
func ReservationSweeps(r *Reconciler) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sweeps
}

// SetBatchMin sets the fewest new frontends r programs in batches; 0
// never batches.
func SetBatchMin(r *Reconciler, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.batchMin = n
}

// SetFreshChunk sets how many new frontends r programs at once.
func SetFreshChunk(r *Reconciler, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.freshChunk = n
}

// Rechecks counts the re-reads of the maps by r that found no drift and
// kept the view.
func Rechecks(r *Reconciler) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rechecks
}

// MapsMatchView is the periodic re-read's comparison of the maps with
// r's view, alone.
func MapsMatchView(r *Reconciler) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.mapsMatchView()
}
