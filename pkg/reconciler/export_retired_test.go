package reconciler

import "time"

// SetClock makes r read the time, for retired masters (retired.go), from
// now.
func SetClock(r *Reconciler, now func() time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.clock = now
}
