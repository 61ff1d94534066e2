package datapath

// The service IPs and the node's CIDRs, what decides about a packet that
// no frontend serves (bpf/tc.c lb4_no_service, bpf/sock.c) and about
// which clients are internal. The reconciler orders the service-IP writes
// around the masters (pkg/reconciler, serviceips.go); here each is one
// idempotent update or delete. The node's CIDRs are per-node settings,
// written at Open from Config.

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"
)

// UpsertServiceIP adds a to the service IPs: a packet to it that no
// frontend serves is rejected.
func (m *Maps) UpsertServiceIP(a netip.Addr) error {
	a = a.Unmap()
	if !a.Is4() {
		return fmt.Errorf("upsert service IP %s: not an IPv4 address", a)
	}
	one := uint8(1)
	if err := m.serviceIPs.Put(be32(a), &one); err != nil {
		return fmt.Errorf("upsert service IP %s: %w", a, err)
	}
	return nil
}

// DeleteServiceIP removes a from the service IPs; removing a missing one
// succeeds.
func (m *Maps) DeleteServiceIP(a netip.Addr) error {
	a = a.Unmap()
	if !a.Is4() {
		return fmt.Errorf("delete service IP %s: not an IPv4 address", a)
	}
	if err := deleteIgnoringMissing(m.serviceIPs, be32(a)); err != nil {
		return fmt.Errorf("delete service IP %s: %w", a, err)
	}
	return nil
}

// dumpServiceIPs reads sluice_service_ips back, sorted.
func dumpServiceIPs(serviceIPs *ebpf.Map) ([]netip.Addr, error) {
	var out []netip.Addr
	var k uint32
	var v uint8
	it := serviceIPs.Iterate()
	for it.Next(&k, &v) {
		out = append(out, addrFromBE32(k))
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("dump %s: %w", mapServiceIPs, err)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out, nil
}

// NodeCIDR is one of the node's CIDRs as sluice_node_cidrs holds it.
type NodeCIDR struct {
	Kind   uint32 // nodeCIDRCluster or nodeCIDRService
	Prefix netip.Prefix
}

func nodeCIDRKey(c NodeCIDR) sockNodeCidrKey {
	p := c.Prefix.Masked()
	return sockNodeCidrKey{Prefixlen: 32 + uint32(p.Bits()), Kind: c.Kind, Addr: be32(p.Addr())}
}

// wantNodeCIDRs returns the entries cfg asks for, checked.
func wantNodeCIDRs(cfg Config) ([]NodeCIDR, error) {
	var out []NodeCIDR
	for _, x := range []struct {
		kind  uint32
		flag  string
		cidrs []netip.Prefix
	}{{nodeCIDRCluster, "cluster", cfg.ClusterCIDRs}, {nodeCIDRService, "service", cfg.ServiceCIDRs}} {
		for _, p := range x.cidrs {
			if !p.IsValid() || !p.Addr().Unmap().Is4() {
				return nil, fmt.Errorf("%s CIDR %s: not an IPv4 prefix", x.flag, p)
			}
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()).Masked()
			out = append(out, NodeCIDR{x.kind, p})
		}
	}
	return out, nil
}

// setNodeCIDRs makes sluice_node_cidrs hold exactly want: the new entries
// first, then the stale ones go (an agent restarted with other CIDRs).
func (m *Maps) setNodeCIDRs(want []NodeCIDR) error {
	one := uint8(1)
	keep := map[sockNodeCidrKey]bool{}
	for _, c := range want {
		k := nodeCIDRKey(c)
		keep[k] = true
		if err := m.nodeCIDRs.Put(&k, &one); err != nil {
			return fmt.Errorf("write node CIDR %s: %w", c.Prefix, err)
		}
	}
	var stale []sockNodeCidrKey
	var k sockNodeCidrKey
	var v uint8
	it := m.nodeCIDRs.Iterate()
	for it.Next(&k, &v) {
		if !keep[k] {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read %s: %w", mapNodeCIDRs, err)
	}
	for _, k := range stale {
		if err := deleteIgnoringMissing(m.nodeCIDRs, &k); err != nil {
			return fmt.Errorf("delete stale node CIDR: %w", err)
		}
	}
	return nil
}

// NodeCIDRs reads sluice_node_cidrs back.
func (m *Maps) NodeCIDRs() ([]NodeCIDR, error) {
	var out []NodeCIDR
	var k sockNodeCidrKey
	var v uint8
	it := m.nodeCIDRs.Iterate()
	for it.Next(&k, &v) {
		out = append(out, NodeCIDR{k.Kind, netip.PrefixFrom(addrFromBE32(k.Addr), int(k.Prefixlen)-32)})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", mapNodeCIDRs, err)
	}
	return out, nil
}
