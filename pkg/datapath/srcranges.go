package datapath

// loadBalancerSourceRanges (sluice_src_ranges, an LPM trie): the prefixes
// a frontend flagged SVC_F_SRC_RANGES accepts sources from. The reconciler
// orders these writes around the frontend's master (pkg/reconciler,
// srcranges.go); here each is one idempotent map update or delete.

import (
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/pkg/model"
)

// srcRangeKey returns the key of prefix p of frontend fe: the frontend's
// 64 bits (vip, port, proto, pad) always match, then p's own bits.
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

// checkSourceRange validates frontend fe and prefix p for the IPv4 map.
func checkSourceRange(fe model.L4Addr, p netip.Prefix) (model.L4Addr, error) {
	fe, err := checkL4(fe)
	if err != nil {
		return fe, fmt.Errorf("frontend %w", err)
	}
	if !p.IsValid() || !p.Addr().Is4() {
		return fe, fmt.Errorf("source range %s of %s: not an IPv4 prefix", p, fe)
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
	k := srcRangeKey(fe, p)
	one := uint8(1)
	if err := m.srcRanges.Put(&k, &one); err != nil {
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
	k := srcRangeKey(fe, p)
	if err := deleteIgnoringMissing(m.srcRanges, &k); err != nil {
		return fmt.Errorf("delete source range %s of %s: %w", p, fe, err)
	}
	return nil
}

// SourceRangeCapacity returns the size of sluice_src_ranges.
func (m *Maps) SourceRangeCapacity() int {
	return int(m.srcRanges.MaxEntries())
}

// dumpSourceRanges reads sluice_src_ranges back: frontend -> prefixes
// (nil if the map is empty).
func dumpSourceRanges(srcRanges *ebpf.Map) (map[model.L4Addr][]netip.Prefix, error) {
	var out map[model.L4Addr][]netip.Prefix
	var k sockSrcRangeKey
	var v uint8
	it := srcRanges.Iterate()
	for it.Next(&k, &v) {
		bits := int(k.Prefixlen) - 64
		if bits < 0 || bits > 32 {
			// Only a key that covers a whole frontend can be told
			// apart; the agent writes no other.
			return nil, fmt.Errorf("dump %s: key with prefix length %d", mapSrcRanges, k.Prefixlen)
		}
		fe := model.L4Addr{Addr: addrFromBE32(k.Vip), Port: portFromBE16(k.Port), Proto: model.Protocol(k.Proto)}
		if out == nil {
			out = map[model.L4Addr][]netip.Prefix{}
		}
		out[fe] = append(out[fe], netip.PrefixFrom(addrFromBE32(k.Saddr), bits))
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("dump %s: %w", mapSrcRanges, err)
	}
	return out, nil
}
