package reconciler

// Retired frontends: a removed TCP or UDP frontend's established flows
// keep working, as under kube-proxy, whose conntrack keeps translating an
// established flow after its Service port went (its rules match
// `ct state new` only, and its UDP cleanup keys only the frontends the
// Service ports have now).
//
// The datapath looks a packet's conntrack entry up only under a
// frontend's master (bpf/tc.c, tc_ingress). So a removal does not delete
// the master of a frontend's default scope: it writes a retired one
// in its place (FlagRetired, count 0, FlagExternal kept, the same service
// id, whose rev_nat entry stays), then deletes its slots and source
// ranges as before. The datapath treats a retired master as absent for a
// packet or socket that would start a flow, and follows an established
// flow's forward entry under it. A frontend added again at the same
// address, port and protocol overwrites it in place, under the same id.
//
// A retired master is deleted (its id then released as any removed
// frontend's) by the first Apply after the retirement timeout of its
// protocol (SetRetireTimeout: the agent's TCP established timeout;
// SetUDPRetireTimeout: its UDP timeout; by then the datapath's conntrack
// has let every flow idle since the removal go). One restored from the
// maps (a restart) is timed from the restore. A UDP frontend's
// retirement also holds the entries of the backends its flows use, and
// its flows are flushed when another Service takes its address and port
// (udpretired.go). An internal scope is never retired: the datapath
// looks up the default scope's master only.
//
// At most retireCap masters are retired at once (1/16 of --max-services,
// at least 1), so that they never fill the service maps; past it a
// removed frontend's master is deleted at once, as before retirement
// (its established flows then end as they did).

import (
	"fmt"
	"slices"
	"time"

	"github.com/sluice-lb/sluice/pkg/model"
)

// SetRetireTimeout sets how long a removed TCP frontend's master is kept
// retired for its established flows (the datapath's TCP established
// timeout); 0, the default, deletes it at once. Retired masters already
// past a shorter timeout go with the next Apply.
func (r *Reconciler) SetRetireTimeout(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.retireAfter = max(d, 0)
}

// SetUDPRetireTimeout sets how long a removed UDP frontend's master is
// kept retired for its flows (the datapath's UDP timeout); 0, the
// default, deletes it at once and flushes its backends as removeFrontend
// decides. Retired masters already past a shorter timeout go with the
// next Apply.
func (r *Reconciler) SetUDPRetireTimeout(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.retireUDPAfter = max(d, 0)
}

// retireTimeout returns how long a removed frontend of protocol p is kept
// retired (0: not at all).
func (r *Reconciler) retireTimeout(p model.Protocol) time.Duration {
	switch p {
	case model.TCP:
		return r.retireAfter
	case model.UDP:
		return r.retireUDPAfter
	}
	return 0
}

// Retired returns the frontends whose masters are retired, with when
// each was retired (or read from the maps).
func (r *Reconciler) Retired() map[Frontend]time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[Frontend]time.Time, len(r.retiredAt))
	for fe, t := range r.retiredAt {
		out[fe] = t
	}
	return out
}

// RetiredCounts returns how many masters are retired now, of both
// families, and how many of them are IPv6's. Each holds its service id
// (a rev_nat entry) and one service map entry of its family (its master:
// its slots are gone), which the desired state no longer counts: pkg/metrics
// adds them to the fill ratios at scrape time.
func (r *Reconciler) RetiredCounts() (retired, retired6 int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for fe := range r.retiredAt {
		if familyOf(fe.Addr) == ipv6 {
			retired6++
		}
	}
	return len(r.retiredAt), retired6
}

// retireCap returns how many masters may be retired at once.
func (r *Reconciler) retireCap() int {
	services, _, _ := r.dp.Capacity()
	return max(services/16, 1)
}

// mayRetire reports whether removing fe, whose view v has a live master,
// retires the master rather than deleting it.
func (r *Reconciler) mayRetire(fe Frontend, v *frontendView) bool {
	return r.retireTimeout(fe.Proto) > 0 && v.hasMaster && fe.Scope == ScopeDefault &&
		len(r.retiredAt) < r.retireCap()
}

// retiredMaster returns the master that retires m.
func retiredMaster(m Master) Master {
	return Master{ID: m.ID, Flags: FlagRetired | m.Flags&FlagExternal}
}

// retire retires fe's master (view v): the retired master is written over
// it (a ClusterIP's address leaves the service IPs first, as it does
// before a removal's delete), then its slots and source ranges go as a
// removal's do. Its rev_nat entry and service id stay, held by the
// retired master.
func (r *Reconciler) retire(fe Frontend, v *frontendView) error {
	m := v.master
	cip := isClusterIP(fe, m)
	if cip {
		if err := r.leaveServiceIPs(fe.Addr); err != nil {
			return err
		}
	}
	rm := retiredMaster(m)
	r.writes++
	if err := r.dp.UpsertMaster(fe, rm); err != nil {
		return fmt.Errorf("retire master: %w", err)
	}
	if fe.Proto == model.UDP {
		// Once the master is retired (a failed write leaves the live
		// master and no record), and before its slots go: they name
		// the backends to hold.
		r.holdUDPFlows(fe, v)
	}
	if cip {
		r.unrefServiceIP(fe.Addr)
	}
	v.master, v.synced = rm, false
	r.retiredAt[fe] = r.clock()
	if m.Flags&FlagAffinity != 0 {
		r.pendingAffinity[AffinityFix{Frontend: fe}] = true
	}
	return r.finishRetire(fe, v)
}

// finishRetire deletes the slots and source ranges of fe (view v), whose
// master is retired: retire's tail, also run for a retired master kept
// (removeFrontend), so that a retirement that failed part way (a failed
// delete, or a crash after the master's write, read back by Restore) is
// finished by a later Apply.
func (r *Reconciler) finishRetire(fe Frontend, v *frontendView) error {
	return r.dropSlotsAndRanges(fe, v)
}

// dropSlotsAndRanges deletes fe's slots (view v) and source ranges, and
// forgets its Service: what a removal and a retirement both do after the
// master's write.
func (r *Reconciler) dropSlotsAndRanges(fe Frontend, v *frontendView) error {
	for _, s := range v.slots.keys(1) {
		r.writes++
		if err := r.dp.DeleteSlot(fe, s); err != nil {
			return fmt.Errorf("delete slot %d: %w", s, err)
		}
		r.deleteSlot(v, s)
	}
	if err := r.pruneRanges(fe.L4Addr, v, nil); err != nil {
		return err
	}
	r.setService(fe, v, nil)
	return nil
}

// noteRetired times m, fe's master as read from the maps, from now if it
// is a retired one.
func (r *Reconciler) noteRetired(fe Frontend, m Master) {
	if m.Flags&FlagRetired == 0 {
		return
	}
	if _, ok := r.retiredAt[fe]; !ok {
		r.retiredAt[fe] = r.clock()
	}
}

// keepRetired reports whether fe's retired master stays: timed, and not
// past the timeout.
func (r *Reconciler) keepRetired(fe Frontend) bool {
	_, ok := r.retiredAt[fe]
	return ok && !r.retiredExpired(fe)
}

// retiredExpired reports whether fe's master is retired and past its
// protocol's timeout (any is, once retirement is off).
func (r *Reconciler) retiredExpired(fe Frontend) bool {
	t, ok := r.retiredAt[fe]
	d := r.retireTimeout(fe.Proto)
	return ok && (d <= 0 || !r.clock().Before(t.Add(d)))
}

// expiredRetired appends to gone the retired frontends past the timeout
// that services do not want again (those are overwritten in place).
func (r *Reconciler) expiredRetired(services model.Services, gone []Frontend) []Frontend {
	for fe := range r.retiredAt {
		if !wanted(services, fe) && r.retiredExpired(fe) {
			gone = append(gone, fe)
		}
	}
	return gone
}

// freeRetired makes room for a frontend that does not fit (checkCapacity):
// it deletes every retired master the Apply's services do not want, its
// time up or not (all of them rather than the oldest first: a full map is
// rare, and each is one entry), the rev_nat entries no master names
// (theirs, and those of frontends phase 1 removed, which would otherwise
// go only in phase 3, after the check), releasing their ids, and the
// backend entries only retired UDP masters held. It reports
// whether it freed anything; a failed delete is logged and left to the
// rest of the Apply (the frontend is then refused as before).
func (r *Reconciler) freeRetired() bool {
	if len(r.retiredAt) == 0 && len(r.revNatCand) == 0 {
		return false
	}
	services := r.applying
	before := r.inUse()
	var evict []Frontend
	for fe := range r.retiredAt {
		if !wanted(services, fe) {
			evict = append(evict, fe)
		}
	}
	slices.SortFunc(evict, Frontend.Compare)
	for _, fe := range evict {
		v := r.frontends.val(fe)
		if v == nil {
			delete(r.retiredAt, fe)
			continue
		}
		t := r.retiredAt[fe]
		delete(r.retiredAt, fe) // so removeFrontend does not keep it
		if err := r.removeFrontend(fe, services); err != nil {
			if r.frontends.val(fe) != nil && v.hasMaster {
				r.retiredAt[fe] = t
			}
			r.log.Warn("Failed to delete a retired master to make room", "frontend", fe, "error", err)
		}
	}
	if err := r.deleteUnusedRevNat(services); err != nil {
		r.log.Warn("Failed to delete unused rev_nat entries to make room", "error", err)
	}
	// The backends the deleted UDP masters held for their flows, and
	// nothing else keeps: their records let go (settleUDPFlows), they go
	// now rather than in phase 3 (their flows flushed, as at the end of
	// a retirement).
	r.settleUDPFlows()
	if r.applyingWant != nil {
		if err := r.deleteUnusedBackends(r.applyingWant); err != nil {
			r.log.Warn("Failed to delete unused backends to make room", "error", err)
		}
	}
	after := r.inUse()
	return after.services < before.services || after.entries != before.entries || after.backends != before.backends
}
