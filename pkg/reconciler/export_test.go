package reconciler

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/sluice-lb/sluice/pkg/model"
)

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
	return int(r.drift.NoDrift)
}

// MapsMatchView is the periodic re-read's comparison of the maps with
// r's view, alone.
func MapsMatchView(r *Reconciler) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.mapsMatchView()
}

// Repairs counts the re-reads of the maps by r that found drift and
// brought it into the view entry by entry (no dump).
func Repairs(r *Reconciler) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return int(r.drift.Repaired)
}

// RebuildOnDrift makes r's re-reads rebuild the view from a dump on any
// drift, as they did before drift was repaired entry by entry: the
// reference the repair is compared with.
func RebuildOnDrift(r *Reconciler) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recheck = func() recheckOutcome {
		if r.mapsMatchView() {
			return noDrift
		}
		return rebuild
	}
}

// RecheckNow is the re-read an Apply makes when it is due, alone: it
// returns "no drift", "repaired" (drift brought into the view entry by
// entry) or "rebuilt" (the view rebuilt from a dump).
func RecheckNow(r *Reconciler) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch r.reread() {
	case noDrift:
		return "no drift", nil
	case repaired:
		return "repaired", nil
	}
	return "rebuilt", r.refresh()
}

// ViewString prints what r's view says of the maps and what it derives
// from them, sorted: the frontends' masters, slots and source ranges, the
// backend and rev_nat entries with the users naming each id, the id each
// backend address and frontend is known by, the candidates for deletion,
// the service IPs with their ClusterIP masters, and the counts per
// family. (Not whether frontends are in sync, their Services, the id
// allocators or the service IPs to look at again: a rebuild from a dump
// forgets those.)
func ViewString(r *Reconciler) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var sb strings.Builder
	for _, fe := range slices.SortedFunc(r.frontends.keys(), Frontend.Compare) {
		v := r.frontends.val(fe)
		fmt.Fprintf(&sb, "frontend %s master=%v %+v ranges=%v slots:", fe, v.hasMaster, v.master, v.ranges())
		for _, s := range v.slots.keys(0) {
			id, _ := v.slots.get(s)
			fmt.Fprintf(&sb, " %d=%d", s, id)
		}
		sb.WriteString("\n")
	}
	ids := map[uint32]bool{}
	for id := range len(r.backends.dense) + len(r.revNat.dense) {
		ids[uint32(id)] = true
	}
	for id := range r.backends.high {
		ids[id] = true
	}
	for id := range r.revNat.high {
		ids[id] = true
	}
	for _, id := range slices.Sorted(maps.Keys(ids)) {
		if a, ok := r.backends.get(id); ok || r.backends.refs(id) != 0 {
			fmt.Fprintf(&sb, "backend %d held=%v %s refs=%d\n", id, ok, a, r.backends.refs(id))
		}
		if fe, ok := r.revNat.get(id); ok || r.revNat.refs(id) != 0 {
			fmt.Fprintf(&sb, "rev_nat %d held=%v %s refs=%d\n", id, ok, fe, r.revNat.refs(id))
		}
	}
	var lines []string
	for a, id := range r.backendOf.all() {
		lines = append(lines, fmt.Sprintf("backendOf %s=%d", a, id))
	}
	for fe, id := range r.serviceOf.all() {
		lines = append(lines, fmt.Sprintf("serviceOf %s=%d", fe, id))
	}
	for id := range r.backendCand {
		lines = append(lines, fmt.Sprintf("backendCand %d", id))
	}
	for id := range r.revNatCand {
		lines = append(lines, fmt.Sprintf("revNatCand %d", id))
	}
	for a, e := range r.ips.all() {
		lines = append(lines, fmt.Sprintf("ip %s refs=%d in=%v", a, e.refs, e.inSet))
	}
	slices.Sort(lines)
	for _, l := range lines {
		sb.WriteString(l + "\n")
	}
	fmt.Fprintf(&sb, "nbackends=%v entries=%v ranges=%v backends=%d rev_nat=%d service_ips=%d\n",
		r.nbackends, r.entries, r.ranges, r.backends.len(), r.revNat.len(), r.nServiceIPs)
	return sb.String()
}

// mapsMatchView reports whether the maps hold exactly what the view says
// they hold: every entry read is in the view as it is, and each map holds
// as many entries as the view has of it. An error reading them is reported
// as a difference.
func (r *Reconciler) mapsMatchView() bool {
	c := viewCheck{r: r}
	if err := r.dp.Walk(&c); err != nil || c.over {
		return false
	}
	return c.matched == r.viewCounts()
}

// BackendCandidates counts the backend entries r holds as candidates for
// deletion, which each Apply sorts and scans.
func BackendCandidates(r *Reconciler) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.backendCand)
}

// UDPNamedMismatch says how r's index of UDP frontends by Service port
// (udpNamed) differs from what its views were programmed for; "" if it
// does not.
func UDPNamedMismatch(r *Reconciler) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	want := map[model.ServicePortName][]Frontend{}
	for fe, v := range r.frontends.all() {
		if fe.Proto == model.UDP && v.svc != nil {
			want[v.svc.Name] = append(want[v.svc.Name], fe)
		}
	}
	got := map[model.ServicePortName][]Frontend{}
	for name, fes := range r.udpNamed {
		got[name] = slices.SortedFunc(slices.Values(fes), Frontend.Compare)
	}
	for name := range want {
		slices.SortFunc(want[name], Frontend.Compare)
	}
	if !maps.EqualFunc(got, want, slices.Equal) {
		return fmt.Sprintf("udpNamed %v, views %v", got, want)
	}
	return ""
}
