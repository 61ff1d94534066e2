package datapath

// The service IPs and the node's CIDRs, what decides about a packet that
// no frontend serves (bpf/tc.c lb4_no_service, bpf/sock.c) and about
// which clients are internal. The reconciler orders the service-IP writes
// around the masters (pkg/reconciler, serviceips.go); here each is one
// idempotent update or delete. The node's CIDRs are per-node settings,
// written at Open from Config; the service CIDRs also at run time, as the
// cluster's ServiceCIDR objects change, by the reconciler
// (SetServiceCIDRs, pkg/reconciler/servicecidrs.go): one writer, the
// agent's apply loop.

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"
)

// serviceIPKey checks a for the service IPs and returns its IPv4 key
// (for an IPv6 address, the twin's key is made by serviceIPMaps).
func serviceIPKey(a netip.Addr) (uint32, error) {
	a = a.Unmap()
	if !a.IsValid() || a.Zone() != "" {
		return 0, fmt.Errorf("service IP %s: not an IPv4 or IPv6 address", a)
	}
	return addr4(a), nil
}

func (m *Maps) serviceIPMaps() twin[uint32, uint8, sockV6addr, uint8] {
	return twin[uint32, uint8, sockV6addr, uint8]{m.serviceIPs, m.serviceIPs6, mapServiceIPs, mapServiceIPs6,
		func(_ uint32, v uint8, a netip.Addr) (sockV6addr, uint8) { return v6addr(a), v }}
}

// UpsertServiceIP adds a to the service IPs: a packet to it that no
// frontend serves is rejected.
func (m *Maps) UpsertServiceIP(a netip.Addr) error {
	k, err := serviceIPKey(a)
	if err == nil {
		err = m.serviceIPMaps().put(a, k, 1)
	}
	if err != nil {
		return fmt.Errorf("upsert service IP %s: %w", a, err)
	}
	return nil
}

// DeleteServiceIP removes a from the service IPs; removing a missing one
// succeeds.
func (m *Maps) DeleteServiceIP(a netip.Addr) error {
	k, err := serviceIPKey(a)
	if err == nil {
		err = m.serviceIPMaps().del(a, k)
	}
	if err != nil {
		return fmt.Errorf("delete service IP %s: %w", a, err)
	}
	return nil
}

// NodeCIDR is one of the node's CIDRs as sluice_node_cidrs (an IPv4
// prefix) or sluice6_node_cidrs (an IPv6 one) holds it.
type NodeCIDR struct {
	Kind   uint32 // nodeCIDRCluster or nodeCIDRService
	Prefix netip.Prefix
}

// String is the CIDR with its kind: "cluster 10.244.0.0/16" or
// "service 10.96.0.0/12".
func (c NodeCIDR) String() string {
	kind := fmt.Sprintf("kind-%d", c.Kind)
	switch c.Kind {
	case nodeCIDRCluster:
		kind = "cluster"
	case nodeCIDRService:
		kind = "service"
	}
	return kind + " " + c.Prefix.String()
}

func nodeCIDRKey(c NodeCIDR) sockNodeCidrKey {
	p := c.Prefix.Masked()
	return sockNodeCidrKey{Prefixlen: 32 + uint32(p.Bits()), Kind: c.Kind, Addr: be32(p.Addr())}
}

func nodeCIDR6Key(c NodeCIDR) sockNodeCidr6Key {
	p := c.Prefix.Masked()
	return sockNodeCidr6Key{Prefixlen: 32 + uint32(p.Bits()), Kind: c.Kind, Addr: v6addr(p.Addr())}
}

// wantNodeCIDRs returns the entries cfg asks for, checked, of both
// families (an IPv4-mapped prefix is its IPv4 prefix).
func wantNodeCIDRs(cfg Config) ([]NodeCIDR, error) {
	var out []NodeCIDR
	for _, x := range []struct {
		kind  uint32
		flag  string
		cidrs []netip.Prefix
	}{{nodeCIDRCluster, "cluster", cfg.ClusterCIDRs}, {nodeCIDRService, "service", cfg.ServiceCIDRs}} {
		for _, p := range x.cidrs {
			c, err := checkNodeCIDR(x.kind, x.flag, p)
			if err != nil {
				return nil, err
			}
			out = append(out, c)
		}
	}
	return out, nil
}

// checkNodeCIDR checks p, a CIDR of kind (named flag in the error), and
// returns its entry: masked, an IPv4-mapped prefix as its IPv4 prefix.
func checkNodeCIDR(kind uint32, flag string, p netip.Prefix) (NodeCIDR, error) {
	if !p.IsValid() || p.Addr().Zone() != "" || p.Addr().Is4In6() && p.Bits() < 96 {
		return NodeCIDR{}, fmt.Errorf("%s CIDR %s: not an IPv4 or IPv6 prefix", flag, p)
	}
	if p.Addr().Is4In6() {
		p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	return NodeCIDR{kind, p.Masked()}, nil
}

// SetServiceCIDRs makes the service CIDRs of sluice_node_cidrs and
// sluice6_node_cidrs exactly cidrs (reconciler.Datapath), leaving the
// cluster CIDRs alone. A prefix that is no IPv4 or IPv6 prefix fails it
// before anything is written. It writes only what differs: the CIDRs the
// maps lack, of both families, then the deletes of those no longer
// wanted. Each CIDR is one entry, so a reader sees the old set, the new
// one, or their union: an unallocated address is at worst dropped a
// moment longer; and the programs drop for these only a packet that
// matched no frontend and no service IP (no_service in bpf/lib/tc_fam.h
// and bpf/lib/socklb_fam.h), so no order of these writes touches a
// programmed ClusterIP's traffic.
func (m *Maps) SetServiceCIDRs(cidrs []netip.Prefix) error {
	want := make([]NodeCIDR, 0, len(cidrs))
	for _, p := range cidrs {
		c, err := checkNodeCIDR(nodeCIDRService, "service", p)
		if err != nil {
			return err
		}
		want = append(want, c)
	}
	return m.setNodeCIDRs(want, func(kind uint32) bool { return kind == nodeCIDRService })
}

// hasCIDR reports whether cidrs has a prefix of kind in the IPv6 family
// (v6) or the IPv4 one.
func hasCIDR(cidrs []NodeCIDR, kind uint32, v6 bool) bool {
	return slices.ContainsFunc(cidrs, func(c NodeCIDR) bool { return c.Kind == kind && c.Prefix.Addr().Is6() == v6 })
}

// setNodeCIDRs makes sluice_node_cidrs and sluice6_node_cidrs hold want,
// each its family's, and, of the kinds owned says, nothing else: entries
// of other kinds stay. The new entries of both families are written
// first, then the stale ones go (an agent restarted with other CIDRs, a
// ServiceCIDR deleted).
func (m *Maps) setNodeCIDRs(want []NodeCIDR, owned func(kind uint32) bool) error {
	var k4 []sockNodeCidrKey
	var k6 []sockNodeCidr6Key
	for _, c := range want {
		if c.Prefix.Addr().Is6() {
			k6 = append(k6, nodeCIDR6Key(c))
		} else {
			k4 = append(k4, nodeCIDRKey(c))
		}
	}
	stale4, err := putKeys(m.nodeCIDRs, mapNodeCIDRs, k4, func(k *sockNodeCidrKey) bool { return owned(k.Kind) })
	if err != nil {
		return err
	}
	stale6, err := putKeys(m.nodeCIDRs6, mapNodeCIDRs6, k6, func(k *sockNodeCidr6Key) bool { return owned(k.Kind) })
	if err != nil {
		return err
	}
	if err := deleteKeys(m.nodeCIDRs, mapNodeCIDRs, stale4); err != nil {
		return err
	}
	return deleteKeys(m.nodeCIDRs6, mapNodeCIDRs6, stale6)
}

// putKeys writes to the set m the keys it lacks (each -> 1), and returns
// the keys it holds that owned says are its caller's and that keys does
// not name: the stale ones, for deleteKeys once the new ones are in.
func putKeys[K comparable](m *ebpf.Map, name string, keys []K, owned func(*K) bool) ([]K, error) {
	have := map[K]bool{}
	if err := eachEntry(m, name, func(k *K, _ *uint8) { have[*k] = true }); err != nil {
		return nil, err
	}
	one := uint8(1)
	for _, k := range keys {
		if have[k] {
			delete(have, k)
			continue
		}
		if err := m.Put(&k, &one); err != nil {
			return nil, fmt.Errorf("write %s: %w", name, err)
		}
	}
	var stale []K
	for k := range have {
		if owned(&k) {
			stale = append(stale, k)
		}
	}
	return stale, nil
}

// deleteKeys deletes keys from m; a missing one is no error.
func deleteKeys[K any](m *ebpf.Map, name string, keys []K) error {
	for _, k := range keys {
		if err := deleteIgnoringMissing(m, &k); err != nil {
			return fmt.Errorf("delete stale entry of %s: %w", name, err)
		}
	}
	return nil
}

// NodeCIDRs reads sluice_node_cidrs and sluice6_node_cidrs back.
func (m *Maps) NodeCIDRs() ([]NodeCIDR, error) {
	var out []NodeCIDR
	err := errors.Join(
		eachEntry(m.nodeCIDRs, mapNodeCIDRs, func(k *sockNodeCidrKey, _ *uint8) {
			out = append(out, NodeCIDR{k.Kind, netip.PrefixFrom(addrFromBE32(k.Addr), int(k.Prefixlen)-32)})
		}),
		eachEntry(m.nodeCIDRs6, mapNodeCIDRs6, func(k *sockNodeCidr6Key, _ *uint8) {
			out = append(out, NodeCIDR{k.Kind, netip.PrefixFrom(addrFrom16(k.Addr), int(k.Prefixlen)-32)})
		}),
	)
	if err != nil {
		return nil, err
	}
	return out, nil
}
