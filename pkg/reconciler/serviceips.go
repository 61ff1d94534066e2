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

// refServiceIP counts a ClusterIP master programmed at a.
func (r *Reconciler) refServiceIP(a netip.Addr) { r.ipRefs.put(a, r.ipRefs.val(a)+1) }

// unrefServiceIP counts a ClusterIP master at a gone.
func (r *Reconciler) unrefServiceIP(a netip.Addr) {
	if n := r.ipRefs.val(a) - 1; n > 0 {
		r.ipRefs.put(a, n)
	} else {
		r.ipRefs.del(a)
		if r.ipSet.val(a) {
			r.ipDirty[a] = true // left behind by a failure: repaired by syncServiceIPs
		}
	}
}

// joinServiceIPs adds a to the service IPs if it is not there.
func (r *Reconciler) joinServiceIPs(a netip.Addr) error {
	if r.ipSet.val(a) {
		return nil
	}
	r.writes++
	if err := r.dp.UpsertServiceIP(a); err != nil {
		r.ipDirty[a] = true
		return fmt.Errorf("upsert service IP %s: %w", a, err)
	}
	r.ipSet.put(a, true)
	delete(r.ipDirty, a)
	return nil
}

// leaveServiceIPs removes a from the service IPs if the ClusterIP master
// about to go (or stop being one) is the last at a.
func (r *Reconciler) leaveServiceIPs(a netip.Addr) error {
	if !r.ipSet.val(a) || r.ipRefs.val(a) > 1 {
		return nil
	}
	r.writes++
	if err := r.dp.DeleteServiceIP(a); err != nil {
		return fmt.Errorf("delete service IP %s: %w", a, err)
	}
	r.ipSet.del(a)
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
		switch want := r.ipRefs.val(a) > 0; {
		case want && !r.ipSet.val(a):
			err = r.joinServiceIPs(a)
		case !want && r.ipSet.val(a):
			r.writes++
			if err = r.dp.DeleteServiceIP(a); err != nil {
				err = fmt.Errorf("delete service IP %s: %w", a, err)
			} else {
				r.ipSet.del(a)
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
