package reconciler

import (
	"slices"
	"time"

	"github.com/sluice-lb/sluice/pkg/model"
)

// SetClock makes r read the time, for retired masters (retired.go), from
// now.
func SetClock(r *Reconciler, now func() time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.clock = now
}

// SetUDPFlowsCap bounds the backends of r's unheld UDP flow records at n
// (udpFlowsMaxBackends otherwise).
func SetUDPFlowsCap(r *Reconciler, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.udpFlowsCap = n
}

// UDPFlowRecords returns r's UDP flow records: per removed frontend's
// address, its backends and whether a retired master holds them.
func UDPFlowRecords(r *Reconciler) map[model.L4Addr]UDPFlowRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[model.L4Addr]UDPFlowRecord, len(r.udpFlows))
	for a, rec := range r.udpFlows {
		out[a] = UDPFlowRecord{Backends: slices.Clone(rec.backends), Held: rec.held}
	}
	return out
}

// UDPFlowRecord is one of UDPFlowRecords.
type UDPFlowRecord struct {
	Backends []model.L4Addr
	Held     bool
}

// Refresh rebuilds r's view from a dump of the maps, as an Apply does
// when its re-read finds drift it cannot repair entry by entry.
func Refresh(r *Reconciler) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.refresh()
}
