package reconciler

// loadBalancerSourceRanges. A frontend whose master has FlagSourceRanges
// drops every source none of its ranges contains, so a range must be in the
// map before a master checks it, and a master that checks ranges must never
// find none: ranges are added before the master that sets the flag, and
// deleted only after the master stopped checking them (it lost the flag or
// is gone). When a frontend's ranges change, the new ones are added before
// the old ones go, so for a moment both are allowed, never neither.

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/sluice-lb/sluice/pkg/model"
)

// desiredRanges returns the source ranges svc's frontend must hold in
// scope: its loadBalancerSourceRanges, masked, sorted and unique, when its
// master there checks them (MasterFlags: the default scope's), else none.
func desiredRanges(svc *model.Service, scope Scope) []netip.Prefix {
	if MasterFlags(svc, scope)&FlagSourceRanges == 0 {
		return nil
	}
	out := make([]netip.Prefix, 0, len(svc.SourceRanges))
	for _, p := range svc.SourceRanges {
		out = append(out, p.Masked())
	}
	slices.SortFunc(out, netip.Prefix.Compare)
	return slices.Compact(out)
}

// addRanges writes the ranges of want that v does not hold.
func (r *Reconciler) addRanges(fe model.L4Addr, v *frontendView, want []netip.Prefix) error {
	for _, p := range want {
		if v.hasRange(p) {
			continue
		}
		r.writes++
		if err := r.dp.UpsertSourceRange(fe, p); err != nil {
			return fmt.Errorf("upsert source range %s: %w", p, err)
		}
		v.addRange(p)
		r.ranges[v.fam]++
	}
	return nil
}

// pruneRanges deletes the ranges v holds that want (sorted) does not name.
func (r *Reconciler) pruneRanges(fe model.L4Addr, v *frontendView, want []netip.Prefix) error {
	for _, p := range slices.Clone(v.ranges()) {
		if _, ok := slices.BinarySearchFunc(want, p, netip.Prefix.Compare); ok {
			continue
		}
		r.writes++
		if err := r.dp.DeleteSourceRange(fe, p); err != nil {
			return fmt.Errorf("delete source range %s: %w", p, err)
		}
		v.deleteRange(p)
		r.ranges[v.fam]--
	}
	return nil
}

func (v *frontendView) hasRange(p netip.Prefix) bool {
	_, ok := slices.BinarySearchFunc(v.ranges(), p, netip.Prefix.Compare)
	return ok
}

func (v *frontendView) addRange(p netip.Prefix) {
	if i, ok := slices.BinarySearchFunc(v.ranges(), p, netip.Prefix.Compare); !ok {
		v.setRanges(slices.Insert(v.ranges(), i, p))
	}
}

func (v *frontendView) deleteRange(p netip.Prefix) {
	if i, ok := slices.BinarySearchFunc(v.ranges(), p, netip.Prefix.Compare); ok {
		v.setRanges(slices.Delete(v.ranges(), i, i+1))
	}
}
