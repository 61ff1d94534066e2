package reconciler

// BackendTableCap is how many backend ids r's table holds without
// growing.
func BackendTableCap(r *Reconciler) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return cap(r.backends.dense)
}
