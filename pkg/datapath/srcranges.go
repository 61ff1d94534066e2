package datapath

// loadBalancerSourceRanges (sluice_src_ranges, an LPM trie): the prefixes
// a frontend flagged SVC_F_SRC_RANGES accepts sources from. The reconciler
// orders these writes around the frontend's master (pkg/reconciler,
// srcranges.go); here each is one idempotent map update or delete.

import (
	"fmt"
	"net/netip"

	"github.com/sluice-lb/sluice/pkg/model"
)

// srcRangeKey returns the key of prefix p of frontend fe: the frontend's
// 64 bits (vip, port, proto, pad) always match, then p's own bits. An
// IPv6 frontend's key is made of it by srcRange6Key.
func srcRangeKey(fe model.L4Addr, p netip.Prefix) sockSrcRangeKey {
	p = p.Masked()
	return sockSrcRangeKey{
		Prefixlen: 64 + uint32(p.Bits()),
		Vip:       addr4(fe.Addr),
		Port:      be16(fe.Port),
		Proto:     uint8(fe.Proto),
		Saddr:     addr4(p.Addr()),
	}
}

func (m *Maps) srcRangeMaps(p netip.Prefix) twin[sockSrcRangeKey, uint8, sockSrcRange6Key, uint8] {
	return twin[sockSrcRangeKey, uint8, sockSrcRange6Key, uint8]{m.srcRanges, m.srcRanges6, mapSrcRanges, mapSrcRanges6,
		func(k sockSrcRangeKey, v uint8, a netip.Addr) (sockSrcRange6Key, uint8) {
			return srcRange6Key(k, a, p.Masked()), v
		}}
}

// checkSourceRange validates frontend fe and prefix p, of fe's family.
func checkSourceRange(fe model.L4Addr, p netip.Prefix) (model.L4Addr, error) {
	fe, err := checkL4(fe)
	if err != nil {
		return fe, fmt.Errorf("frontend %w", err)
	}
	if !p.IsValid() || p.Addr().Zone() != "" || p.Addr().Is4In6() || is6(p.Addr()) != is6(fe.Addr) {
		return fe, fmt.Errorf("source range %s of %s: not a prefix of the frontend's family", p, fe)
	}
	return fe, nil
}

// UpsertSourceRange lets sources in p reach frontend fe while its master
// has SVC_F_SRC_RANGES.
func (m *Maps) UpsertSourceRange(fe model.L4Addr, p netip.Prefix) error {
	fe, err := checkSourceRange(fe, p)
	if err != nil {
		return fmt.Errorf("upsert source range: %w", err)
	}
	if err := m.srcRangeMaps(p).put(fe.Addr, srcRangeKey(fe, p), 1); err != nil {
		return fmt.Errorf("upsert source range %s of %s: %w", p, fe, err)
	}
	return nil
}

// DeleteSourceRange deletes source range p of frontend fe; deleting a
// missing one succeeds.
func (m *Maps) DeleteSourceRange(fe model.L4Addr, p netip.Prefix) error {
	fe, err := checkSourceRange(fe, p)
	if err != nil {
		return fmt.Errorf("delete source range: %w", err)
	}
	if err := m.srcRangeMaps(p).del(fe.Addr, srcRangeKey(fe, p)); err != nil {
		return fmt.Errorf("delete source range %s of %s: %w", p, fe, err)
	}
	return nil
}

// SourceRangeCapacity returns the size of sluice_src_ranges.
func (m *Maps) SourceRangeCapacity() int {
	return int(m.srcRanges.MaxEntries())
}
