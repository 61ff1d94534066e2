package reconciler

// The service IPs (kube-proxy nftables' cluster-ips set): the addresses of
// the ClusterIP frontends. A packet to one of them on a port or protocol
// that no frontend serves is rejected, as kube-proxy's nftables mode
// rejects it; one to another address of the service CIDR is dropped (the
// datapath's per-node settings). An address is in the set exactly while a
// ClusterIP master at that address is programmed: it joins right after the
// first one is written and leaves right before the last one is deleted. So
// a frontend is never rejected while it is being programmed (its packets
// find no set entry before they find its master), and a packet that finds
// no master of a removed frontend finds no set entry either once the
// address has no frontend left.

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
)

// serviceIP is what the reconciler knows of one address: how many
// ClusterIP masters are programmed at it, and whether the map holds it.
// One map of both (Reconciler.ips) costs half of two: an address of
// neither is not in it.
type serviceIP struct {
	refs  int32
	inSet bool
	// walked says a re-read's second walk found the address in the map
	// (repair.go).
	walked bool
}

// ipRefs returns how many ClusterIP masters are programmed at a.
func (r *Reconciler) ipRefs(a netip.Addr) int32 { return r.ips.val(a).refs }

// inServiceIPs reports whether the map holds a.
func (r *Reconciler) inServiceIPs(a netip.Addr) bool { return r.ips.val(a).inSet }

// setInServiceIPs records whether the map holds a.
func (r *Reconciler) setInServiceIPs(a netip.Addr, in bool) {
	e := r.ips.val(a)
	switch {
	case in && !e.inSet:
		r.nServiceIPs++
	case !in && e.inSet:
		r.nServiceIPs--
	}
	e.inSet = in
	r.putServiceIP(a, e)
}

func (r *Reconciler) putServiceIP(a netip.Addr, e serviceIP) {
	if e == (serviceIP{}) {
		r.ips.del(a)
		return
	}
	r.ips.put(a, e)
}

// refServiceIP counts a ClusterIP master programmed at a.
func (r *Reconciler) refServiceIP(a netip.Addr) {
	e := r.ips.val(a)
	e.refs++
	r.ips.put(a, e)
}

// unrefServiceIP counts a ClusterIP master at a gone.
func (r *Reconciler) unrefServiceIP(a netip.Addr) {
	e := r.ips.val(a)
	e.refs = max(e.refs-1, 0)
	r.putServiceIP(a, e)
	if e.refs == 0 && e.inSet {
		r.ipDirty[a] = true // left behind by a failure: repaired by syncServiceIPs
	}
}

// joinServiceIPs adds a to the service IPs if it is not there.
func (r *Reconciler) joinServiceIPs(a netip.Addr) error {
	if r.inServiceIPs(a) {
		return nil
	}
	r.writes++
	if err := r.dp.UpsertServiceIP(a); err != nil {
		r.ipDirty[a] = true
		return fmt.Errorf("upsert service IP %s: %w", a, err)
	}
	r.setInServiceIPs(a, true)
	delete(r.ipDirty, a)
	return nil
}

// leaveServiceIPs removes a from the service IPs if the ClusterIP master
// about to go (or stop being one) is the last at a.
func (r *Reconciler) leaveServiceIPs(a netip.Addr) error {
	if !r.inServiceIPs(a) || r.ipRefs(a) > 1 {
		return nil
	}
	r.writes++
	if err := r.dp.DeleteServiceIP(a); err != nil {
		return fmt.Errorf("delete service IP %s: %w", a, err)
	}
	r.setInServiceIPs(a, false)
	delete(r.ipDirty, a)
	return nil
}

// syncServiceIPs brings the addresses whose membership may be wrong (after
// a failed write, or as restored from the maps) to what the programmed
// masters say.
func (r *Reconciler) syncServiceIPs() error {
	if len(r.ipDirty) == 0 {
		return nil
	}
	var errs []error
	for _, a := range slices.SortedFunc(maps.Keys(r.ipDirty), netip.Addr.Compare) {
		var err error
		switch want := r.ipRefs(a) > 0; {
		case want && !r.inServiceIPs(a):
			err = r.joinServiceIPs(a)
		case !want && r.inServiceIPs(a):
			r.writes++
			if err = r.dp.DeleteServiceIP(a); err != nil {
				err = fmt.Errorf("delete service IP %s: %w", a, err)
			} else {
				r.setInServiceIPs(a, false)
			}
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		delete(r.ipDirty, a)
	}
	return errors.Join(errs...)
}
