package reconciler

// The service CIDRs (kube-proxy nftables' "drop traffic to unallocated
// ClusterIPs"): a packet to an address in them that no frontend serves and
// that is no service IP is dropped. They change at run time with the
// cluster's ServiceCIDR objects (model.State.ServiceCIDRs), and this is
// where they are written, in an Apply's last phase, as one set: the
// datapath adds the new CIDRs, then deletes the ones no longer wanted.
//
// They need no place among the frontends' writes: the datapath drops for
// them only a packet that matched no frontend and no service IP (bpf/lib/
// tc_fam.h and socklb_fam.h no_service), so no CIDR added or removed can
// drop or let through a programmed ClusterIP's traffic, whatever the order.
// Each CIDR is one entry of an LPM trie, written whole; between the adds
// and the deletes the set is the union of the old and the new, so an
// unallocated address is at worst dropped a moment longer than asked.
// A set too large for the datapath's maps is refused whole and logged
// once, the Apply not failed (syncServiceCIDRs).
// A state without HasServiceCIDRs (the manifest source) leaves them as the
// datapath was opened with them (--service-cidr).

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
)

// syncServiceCIDRs makes the datapath's service CIDRs those of st, unless
// the view says they are already.
//
// A set the datapath refuses for its size (ErrCapacity: the maps hold 64
// CIDRs a family, the cluster CIDRs among them) is no failure of the
// Apply: the datapath wrote nothing and keeps the ranges it had, the
// frontends are programmed, and the drop of unallocated addresses is a
// nicety that is no reason to report the agent unready or retry every
// Apply in full. It is logged once, at Error, with the datapath's count
// and limit, and not tried again until the set or the maps change.
func (r *Reconciler) syncServiceCIDRs(st []netip.Prefix) error {
	if r.cidrsKnown && slices.Equal(r.cidrs, st) {
		return nil
	}
	if r.cidrsKnown && r.cidrsRefusedSet && slices.Equal(r.cidrsRefused, st) {
		return nil
	}
	r.writes++
	err := r.dp.SetServiceCIDRs(st)
	if errors.Is(err, ErrCapacity) {
		if !r.cidrsRefusedSet || !slices.Equal(r.cidrsRefused, st) {
			r.log.Error("service CIDRs (the ServiceCIDR objects' and --service-cidr's) not written: too many for the datapath; the ranges it holds kept, Services programmed",
				"service_cidrs", len(st), "err", err)
		}
		r.cidrsRefused, r.cidrsRefusedSet = slices.Clone(st), true
		return nil
	}
	if err != nil {
		// What the maps hold is not known: the next Apply writes
		// the set again.
		r.cidrsKnown = false
		return fmt.Errorf("set service CIDRs %v: %w", st, err)
	}
	r.cidrs, r.cidrsKnown = slices.Clone(st), true
	r.cidrsRefused, r.cidrsRefusedSet = nil, false
	return nil
}
