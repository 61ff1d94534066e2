package datapath

// loadBalancerSourceRanges (sluice_src_ranges): the prefixes a frontend
// flagged SVC_F_SRC_RANGES accepts sources from.

import (
	"fmt"
	"net/netip"

	"github.com/sluice-lb/sluice/pkg/model"
)

func srcRangeKey(fe model.L4Addr, p netip.Prefix) sockSrcRangeKey {
	p = p.Masked()
	return sockSrcRangeKey{
		Prefixlen: 64 + uint32(p.Bits()),
		Vip:       be32(fe.Addr),
		Port:      be16(fe.Port),
		Proto:     uint8(fe.Proto),
		Saddr:     be32(p.Addr()),
	}
}

// wantSourceRanges returns the sluice_src_ranges keys st asks for.
func wantSourceRanges(st *model.State) map[sockSrcRangeKey]bool {
	want := map[sockSrcRangeKey]bool{}
	if st == nil {
		return want
	}
	for fe, svc := range st.Services {
		if svc == nil || svc.Kind == model.ClusterIP {
			continue
		}
		fe, err := checkL4(fe)
		if err != nil {
			continue
		}
		for _, p := range svc.SourceRanges {
			if p.Addr().Unmap().Is4() {
				p = netip.PrefixFrom(p.Addr().Unmap(), min(p.Bits(), 32))
				want[srcRangeKey(fe, p)] = true
			}
		}
	}
	return want
}

// AddSourceRanges writes the loadBalancerSourceRanges st asks for. Run it
// before the reconciler sets SVC_F_SRC_RANGES on a master, so a frontend
// never checks ranges that are not there yet.
func (m *Maps) AddSourceRanges(st *model.State) error {
	one := uint8(1)
	for k := range wantSourceRanges(st) {
		if err := m.srcRanges.Put(&k, &one); err != nil {
			return fmt.Errorf("add source range of %s: %w", addrFromBE32(k.Vip), err)
		}
	}
	return nil
}

// PruneSourceRanges deletes the ranges st does not ask for (after the
// reconciler has applied st).
func (m *Maps) PruneSourceRanges(st *model.State) error {
	want := wantSourceRanges(st)
	var doomed []sockSrcRangeKey
	var k sockSrcRangeKey
	var v uint8
	it := m.srcRanges.Iterate()
	for it.Next(&k, &v) {
		if !want[k] {
			doomed = append(doomed, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("list source ranges: %w", err)
	}
	for i := range doomed {
		if err := deleteIgnoringMissing(m.srcRanges, &doomed[i]); err != nil {
			return fmt.Errorf("delete source range: %w", err)
		}
	}
	return nil
}
