package reconciler

// The flows of a removed UDP frontend. kube-proxy's conntrack keeps
// translating them until they idle out: CleanStaleEntries
// (pkg/proxy/conntrack/cleanup.go) keys only the frontends the Service
// ports have now, so a frontend that went is never cleaned, and a backend
// its Service port still serves through another frontend keeps every
// flow. With SetUDPRetireTimeout a removed UDP frontend's master is
// retired as a TCP one's is (retired.go), and its backends are not
// flushed.
//
// The datapath follows a UDP flow only while its backend's entry holds
// the flow's address (ct_fwd_usable): so the backends the retired
// master's flows may use (its slots' at the retirement, its internal
// scope's, its Service's standby ones) are held, their entries kept
// until the retirement ends, as standby backends are (standby.go).
//
// Those flows must not be followed for another Service: the datapath
// checks an entry's backend, not its Service, so a frontend at the same
// address, port and protocol programmed later (a LoadBalancer IP, an
// external IP or a NodePort number given to another Service, or the same
// Service made again with other endpoints) would send the old flows'
// packets to the old backends. kube-proxy's CleanStaleEntries deletes
// them then (the address:port is a frontend again, and their endpoint
// not one of its serving ones). So the reconciler remembers, per removed
// UDP frontend, the backends its flows may use (udpFlows), while the
// master is retired and after it is deleted (the entries of a flow whose
// backend pushes live on: its replies are still translated back and
// refresh them). A frontend programmed at that address claims them
// (claimUDPFlows): the backends its Service does not serve are flushed
// (by address, the only flush the datapath has: their flows through
// other frontends go too), the others keep their flows, as under
// kube-proxy. A backend flushed for any reason leaves the record.
//
// A record whose master went (unheld) has no end of its own: a flow
// whose backend keeps sending lives on (its replies refresh its entry),
// so the age of a record says nothing of its flows, and dropping it
// silently would let a later claim follow them for the new Service.
// Records cost Go memory only, so they are bounded apart from the
// retired masters and generously (udpFlowsMaxBackends recorded backends
// in all); past that the oldest unheld records (by when their hold
// ended) are evicted, their backends flushed (as before retirement):
// rare, and the flows most likely gone.
//
// An agent restart would forget them (the service maps do not say which
// backends a retired master's flows use): Restore rebuilds them from the
// datapath's conntrack (UDPFlowReader, restoreUDPFlows), whose forward
// entries name each UDP flow's frontend and backend.

import (
	"cmp"
	"slices"
	"time"

	"github.com/sluice-lb/sluice/pkg/model"
)

// udpFlows is what the reconciler knows of the flows of a removed UDP
// frontend (its default scope's address).
type udpFlows struct {
	backends []model.L4Addr // sorted, unique
	// held: the frontend's master is retired, and heldRefs counts
	// backends.
	held bool
	// unheldAt: when the hold ended (settleUDPFlows), for eviction
	// oldest first.
	unheldAt time.Time
}

// udpFlowsMaxBackends bounds the backends the unheld records hold in
// all (Go memory only: 65,536 addresses are a few MB).
const udpFlowsMaxBackends = 1 << 16

// holdUDPFlows records, at the retirement of UDP frontend fe (view v,
// its slots not yet deleted), the backends its flows may use, and holds
// their entries. A record the address had (its master deleted before)
// is merged in.
func (r *Reconciler) holdUDPFlows(fe Frontend, v *frontendView) {
	var bs []model.L4Addr
	add := func(v *frontendView) {
		if v == nil {
			return
		}
		if v.hasMaster {
			for s := uint32(1); s <= v.master.Count; s++ {
				if id, ok := v.slots.get(s); ok && r.isReal(id) {
					a, _ := r.backend(id)
					bs = append(bs, a)
				}
			}
		}
		if v.svc != nil {
			bs = append(bs, v.svc.Standby...)
		}
	}
	add(v)
	add(r.frontends.val(Frontend{L4Addr: fe.L4Addr, Scope: ScopeInternal}))
	if v.svc == nil {
		// Restored and not programmed since: no Service names its
		// standby backends, conntrack named its flows' (Restore).
		bs = append(bs, r.restoredFlows[fe.L4Addr]...)
	}
	rec := r.udpFlows[fe.L4Addr]
	if rec != nil {
		if rec.held {
			r.releaseUDPFlows(rec)
		}
		bs = append(bs, rec.backends...)
	} else {
		rec = &udpFlows{}
		r.udpFlows[fe.L4Addr] = rec
	}
	bs = slices.DeleteFunc(bs, func(a model.L4Addr) bool { return a.Proto != model.UDP })
	slices.SortFunc(bs, model.L4Addr.Compare)
	rec.backends, rec.held = slices.Compact(bs), true
	for _, a := range rec.backends {
		r.heldRefs[a]++
	}
	// Held now (or, with a Service, its standby backends named).
	r.dropRestoredFlows(fe.L4Addr)
}

// dropRestoredFlows forgets the flows Restore read at addr
// (restoredFlows): a backend nothing else keeps becomes a candidate for
// deletion.
func (r *Reconciler) dropRestoredFlows(addr model.L4Addr) {
	bs, ok := r.restoredFlows[addr]
	if !ok {
		return
	}
	delete(r.restoredFlows, addr)
	for _, a := range bs {
		r.unkeep(r.restoredRefs, a)
	}
}

// unkeep takes one of refs' references to backend a off (heldRefs,
// restoredRefs); the last gone, a backend nothing else keeps (no slot,
// keptForFlows false) becomes a candidate for deletion, which flushes its
// flows (deleteUnusedBackends).
func (r *Reconciler) unkeep(refs map[model.L4Addr]int32, a model.L4Addr) {
	if n := refs[a] - 1; n > 0 {
		refs[a] = n
		return
	}
	delete(refs, a)
	if id, ok := r.backendOf.get(a); ok && r.isReal(id) && r.backends.refs(uint32(id)) <= 0 && !r.keptForFlows(a) {
		r.backendCand[id] = true
	}
}

// keptForFlows says whether backend a's entry is kept, with no slot
// naming it, for flows: a Service port's standby backend, one a retired
// UDP master holds (heldForFlows), or one the flows Restore read name
// (restoredHeld).
func (r *Reconciler) keptForFlows(a model.L4Addr) bool {
	return r.standby(a) || r.heldForFlows(a) || r.restoredHeld(a)
}

// settleRestoredFlows, once an Apply (of services) has removed and
// programmed its frontends, forgets the flows Restore read at every
// address but those whose master is still live though services do not
// want it (its retirement, or its removal, failed: the next Apply retries
// it, and holdUDPFlows wants them then). The others are of no use any
// more: their master retired or deleted, or wanted (its view has its
// Service, or its programming failed and its Service names the backends
// it wants, standby ones too, while it is refused). Not only once an
// Apply ends in sync: a frontend refused at every Apply would keep their
// backends' entries for ever, out of the room a refused frontend may
// free (freeable).
func (r *Reconciler) settleRestoredFlows(services model.Services) {
	for addr := range r.restoredFlows {
		fe := DefaultScope(addr)
		if v := r.frontends.val(fe); v != nil && v.hasMaster && v.master.Flags&FlagRetired == 0 && !wanted(services, fe) {
			continue
		}
		r.dropRestoredFlows(addr)
	}
}

// restoredHeld says whether the flows Restore read at a live master's
// address name backend a (its entry is kept until they are used or
// dropped).
func (r *Reconciler) restoredHeld(a model.L4Addr) bool { return r.restoredRefs[a] > 0 }

// releaseUDPFlows lets go of the entries rec holds: a backend nothing
// else keeps becomes a candidate for deletion (which flushes its flows:
// deleteUnusedBackends).
func (r *Reconciler) releaseUDPFlows(rec *udpFlows) {
	for _, a := range rec.backends {
		r.unkeep(r.heldRefs, a)
	}
	rec.held = false
}

// heldForFlows says whether a removed UDP frontend's retired master holds
// backend a (its entry is kept).
func (r *Reconciler) heldForFlows(a model.L4Addr) bool { return r.heldRefs[a] > 0 }

// flowsKeep says whether the retired master at addr holds backend a: the
// internal scope removed after it does not flush it.
func (r *Reconciler) flowsKeep(addr model.L4Addr, a model.L4Addr) bool {
	rec := r.udpFlows[addr]
	if rec == nil || !rec.held {
		return false
	}
	_, ok := slices.BinarySearchFunc(rec.backends, a, model.L4Addr.Compare)
	return ok
}

// settleUDPFlows ends the holds of the records whose master is no longer
// retired (past its time, evicted, or gone from the maps): the record
// stays, for a frontend that claims the address later. Past
// udpFlowsCap backends in the unheld records, the oldest of them (by
// when their hold ended, then by address) are evicted, their backends
// flushed.
func (r *Reconciler) settleUDPFlows() {
	if len(r.udpFlows) == 0 {
		return
	}
	now := r.clock()
	n := 0
	var unheld []model.L4Addr
	for addr, rec := range r.udpFlows {
		if rec.held {
			if _, ok := r.retiredAt[DefaultScope(addr)]; ok {
				continue
			}
			r.releaseUDPFlows(rec)
			rec.unheldAt = now
		}
		n += len(rec.backends)
		unheld = append(unheld, addr)
	}
	if n <= r.udpFlowsCap {
		return
	}
	slices.SortFunc(unheld, func(a, b model.L4Addr) int {
		return cmp.Or(r.udpFlows[a].unheldAt.Compare(r.udpFlows[b].unheldAt), a.Compare(b))
	})
	for _, addr := range unheld {
		if n <= r.udpFlowsCap {
			break
		}
		rec := r.udpFlows[addr]
		for _, a := range rec.backends {
			r.pendingFlush[a] = true
		}
		n -= len(rec.backends)
		delete(r.udpFlows, addr)
	}
}

// claimUDPFlows, before the changed frontends are programmed, flushes the
// backends of a removed UDP frontend's flows that the Service now
// programmed at its address does not serve, and forgets the record.
func (r *Reconciler) claimUDPFlows(changed []*desiredFrontend) {
	if len(r.udpFlows) == 0 {
		return
	}
	for _, d := range changed {
		rec := r.udpFlows[d.fe.L4Addr]
		if rec == nil {
			continue
		}
		for _, a := range rec.backends {
			if !servesAddr(d.svc, a) {
				r.pendingFlush[a] = true
			}
		}
		if rec.held {
			r.releaseUDPFlows(rec)
		}
		delete(r.udpFlows, d.fe.L4Addr)
	}
}

// flushedUDPFlows drops the backends just flushed from the records of
// deleted masters (their flows are gone), and the records left empty.
func (r *Reconciler) flushedUDPFlows(flushed map[model.L4Addr]bool) {
	for addr, rec := range r.udpFlows {
		if rec.held {
			continue
		}
		rec.backends = slices.DeleteFunc(rec.backends, func(a model.L4Addr) bool { return flushed[a] })
		if len(rec.backends) == 0 {
			delete(r.udpFlows, addr)
		}
	}
}

// restoreUDPFlows, at Restore, rebuilds from the datapath's conntrack
// (UDPFlowReader) the records a restart forgot, when removed UDP
// frontends are retired: the flows at a retired master's address make a
// held record (their backends' entries kept for them, as at the
// retirement), those at an address without a master an unheld one (for
// a later claim), and those at a live master's are kept for its
// retirement before its first program (restoredFlows). A failed read is
// logged; what it read is used (a table the datapath could not read to
// its end, the others), the rest left unknown, as before they were read. A flow
// counts only while the datapath follows it: its entry's backend id
// names its backend's address in the maps.
func (r *Reconciler) restoreUDPFlows() {
	rd, ok := r.dp.(UDPFlowReader)
	if !ok || r.retireUDPAfter <= 0 {
		return
	}
	flows, err := rd.UDPFlowBackends()
	if err != nil {
		// What was read is used: a flow missed is one whose backend
		// is not held, as before the tables were read.
		r.log.Warn("Failed to read the backends of all UDP flows from conntrack: the flows of removed frontends not read are not known",
			"error", err, "frontends", len(flows))
	}
	r.restoredFlows, r.restoredRefs = nil, nil
	now := r.clock()
	for addr, fbs := range flows {
		if addr.Proto != model.UDP || r.udpFlows[addr] != nil {
			continue
		}
		// Only the flows the datapath still follows (ct_fwd_usable):
		// an entry whose backend id no longer names its address (the
		// backend deleted, and the agent gone before its flush) is none,
		// and a record of it would flush, at a later claim, a pod that
		// took the address since.
		var bs []model.L4Addr
		for _, b := range fbs {
			if a, ok := r.backend(b.ID); ok && a == b.Addr && a.Proto == model.UDP {
				bs = append(bs, a)
			}
		}
		slices.SortFunc(bs, model.L4Addr.Compare)
		if bs = slices.Compact(bs); len(bs) == 0 {
			continue
		}
		switch v := r.frontends.val(DefaultScope(addr)); {
		case v != nil && v.hasMaster && v.master.Flags&FlagRetired == 0:
			if r.restoredFlows == nil {
				r.restoredFlows = map[model.L4Addr][]model.L4Addr{}
				r.restoredRefs = map[model.L4Addr]int32{}
			}
			r.restoredFlows[addr] = bs
			for _, a := range bs {
				r.restoredRefs[a]++
			}
		case v != nil && v.hasMaster:
			r.udpFlows[addr] = &udpFlows{backends: bs, held: true}
			for _, a := range bs {
				r.heldRefs[a]++
			}
		default:
			r.udpFlows[addr] = &udpFlows{backends: bs, unheldAt: now}
		}
	}
}
