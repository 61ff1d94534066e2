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
// A state without HasServiceCIDRs (the manifest source) leaves them as the
// datapath was opened with them (--service-cidr).

import (
	"fmt"
	"net/netip"
	"slices"
)

// syncServiceCIDRs makes the datapath's service CIDRs those of st, unless
// the view says they are already.
func (r *Reconciler) syncServiceCIDRs(st []netip.Prefix) error {
	if r.cidrsKnown && slices.Equal(r.cidrs, st) {
		return nil
	}
	r.writes++
	if err := r.dp.SetServiceCIDRs(st); err != nil {
		// What the maps hold is not known: the next Apply writes
		// the set again.
		r.cidrsKnown = false
		return fmt.Errorf("set service CIDRs %v: %w", st, err)
	}
	r.cidrs, r.cidrsKnown = slices.Clone(st), true
	return nil
}
