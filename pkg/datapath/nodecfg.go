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

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
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
	n, err := model.NormalPrefix(p)
	if err != nil {
		return NodeCIDR{}, fmt.Errorf("%s CIDR %w", flag, err)
	}
	return NodeCIDR{kind, n}, nil
}

// SetServiceCIDRs makes the service CIDRs of sluice_node_cidrs and
// sluice6_node_cidrs exactly cidrs (reconciler.Datapath), leaving the
// cluster CIDRs alone. A prefix that is no IPv4 or IPv6 prefix fails it
// before anything is written, and so does a family whose CIDRs, with its
// cluster CIDRs, would not fit its map (an ErrCapacity error naming the
// limit and the count; the maps keep what they hold). It writes only what
// differs: the CIDRs the maps lack, of both families, then the deletes of
// those no longer wanted (the deletes first where the old and the new
// would not fit together, setNodeCIDRs). Each CIDR is one entry, so a reader sees the old set, the new
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
// of other kinds stay. A family whose entries would then outnumber its
// map's capacity (cluster and service CIDRs share it: 64 a family) fails
// it with an ErrCapacity error naming the limit and the count, before
// anything is written: the maps keep what they hold. Otherwise the new
// entries are written first, then the stale ones go (an agent restarted
// with other CIDRs, a ServiceCIDR deleted); a family whose old and new
// entries together would not fit has its stale ones deleted first
// instead (a moment without them only lets through a packet that matched
// no frontend and no service IP).
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
	p4, err := planKeys(m.nodeCIDRs, mapNodeCIDRs, "IPv4", k4, func(k *sockNodeCidrKey) uint32 { return k.Kind }, owned)
	if err != nil {
		return err
	}
	p6, err := planKeys(m.nodeCIDRs6, mapNodeCIDRs6, "IPv6", k6, func(k *sockNodeCidr6Key) uint32 { return k.Kind }, owned)
	if err != nil {
		return err
	}
	if err := errors.Join(p4.err, p6.err); err != nil {
		return err
	}
	if err := errors.Join(p4.deleteFirst(), p6.deleteFirst()); err != nil {
		return err
	}
	if err := errors.Join(p4.put(), p6.put()); err != nil {
		return err
	}
	return errors.Join(p4.deleteStale(), p6.deleteStale())
}

// keyPlan is what setNodeCIDRs writes to one family's map: the keys it
// lacks, and the stale ones, deleted before the adds (tight) or after.
type keyPlan[K comparable] struct {
	m          *ebpf.Map
	name       string
	add, stale []K
	tight      bool
	err        error // the family would not fit: nothing to write
}

// planKeys reads the set m and plans its writes: keys' entries it lacks
// are added, the ones it holds that owned says are its caller's (by the
// key's kind) and that keys does not name are stale.
func planKeys[K comparable](m *ebpf.Map, name, family string, keys []K, kind func(*K) uint32, owned func(uint32) bool) (*keyPlan[K], error) {
	have := map[K]bool{}
	if err := eachEntry(m, name, func(k *K, _ *uint8) { have[*k] = true }); err != nil {
		return nil, err
	}
	p := &keyPlan[K]{m: m, name: name}
	final := map[K]bool{}
	for _, k := range keys {
		final[k] = true
		if !have[k] {
			p.add = append(p.add, k)
		}
	}
	for k := range have {
		switch {
		case final[k]:
		case owned(kind(&k)):
			p.stale = append(p.stale, k)
		default:
			final[k] = true
		}
	}
	capacity := 0
	if m != nil {
		capacity = int(m.MaxEntries())
	}
	if len(final) > capacity {
		var cluster, service int
		for k := range final {
			if kind(&k) == nodeCIDRService {
				service++
			} else {
				cluster++
			}
		}
		p.err = fmt.Errorf("%w: %s holds %d %s CIDRs at most (cluster and service CIDRs together), %d asked (%d cluster, %d service); the CIDRs it holds kept",
			reconciler.ErrCapacity, name, capacity, family, len(final), cluster, service)
		return p, nil
	}
	p.tight = len(have)+len(p.add) > capacity
	return p, nil
}

func (p *keyPlan[K]) put() error {
	one := uint8(1)
	for _, k := range p.add {
		if err := p.m.Put(&k, &one); err != nil {
			return fmt.Errorf("write %s: %w", p.name, err)
		}
	}
	return nil
}

func (p *keyPlan[K]) deleteFirst() error {
	if !p.tight {
		return nil
	}
	err := deleteKeys(p.m, p.name, p.stale)
	p.stale = nil
	return err
}

func (p *keyPlan[K]) deleteStale() error { return deleteKeys(p.m, p.name, p.stale) }

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
