package datapath

// The reverse-NAT entries written as memory (issue 14, forty-ninth pass).
// Each family's reverse-NAT map (sluice_rev_nat_v2, sluice6_rev_nat_v2) is
// an array indexed by the service id, BPF_F_MMAPABLE, and the agent writes
// an entry with stores into its memory, as it writes the backends
// (bemem.go, whose beTable serves both: each value ends in a flags byte
// whose present bit is the same), instead of a hash insert per service:
// 30,000 of the 90,000 inserts a first program of 30,000 Services made.
// Only the agent reads them (the programs reverse-NAT a reply from its
// conntrack entry): the entries say which frontend a service id is, for
// the agent's restart (Dump), the per-Service counters and sluicectl.
//
// The windows an operation maps are released when it ends (a batch of
// entries written or cleared: arraymem.go), so the arrays do not stay in
// the agent's RSS. An array that cannot be mapped keeps the system calls.

import (
	"errors"
	"net/netip"
	"unsafe"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// openRevNatTables maps both families' reverse-NAT arrays (Open).
func (m *Maps) openRevNatTables() error {
	var err4, err6 error
	m.rn4, err4 = openBeTable(m.revNat, int(unsafe.Sizeof(sockLb4RevNat{})))
	m.rn6, err6 = openBeTable(m.revNat6, int(unsafe.Sizeof(sockLb6RevNat{})))
	return errors.Join(err4, err6)
}

func (m *Maps) rnArrays() idArrays {
	return idArrays{m.revNat, m.revNat6, mapRevNat, mapRevNat6, m.rn4, m.rn6}
}

func (m *Maps) closeRevNatTables() error {
	err := errors.Join(m.rn4.close(), m.rn6.close())
	m.rn4, m.rn6 = nil, nil
	return err
}

// rnMapped says that the reverse-NAT entries are written as memory: each
// family's array the Maps has is mapped.
func (m *Maps) rnMapped() bool { return m.rnArrays().mapped() }

// upsertRevNatsMem writes es into the mapped arrays, in order (upsertMem).
func (m *Maps) upsertRevNatsMem(es []reconciler.RevNatEntry) (int, error) {
	return upsertMem(m.rnArrays(), es, func(e reconciler.RevNatEntry) (uint32, sockLb4RevNat, netip.Addr, error) {
		k, v, err := revNatEntry(e.ID, e.Frontend)
		return k, v, e.Frontend.Addr, err
	}, lb6RevNat)
}

// eachRevNatWhile calls f with the service id and frontend of every entry
// of the reverse-NAT maps of both families (nil: none) until f returns
// false: the present entries of the arrays, or every entry of the
// previous release's hashes (lb4RevNatV1, read by OpenPinned while that
// agent runs).
func eachRevNatWhile(m4, m6 *ebpf.Map, f func(reconciler.ServiceID, reconciler.Frontend) bool) error {
	more := true
	v4 := func(id uint32, vip uint32, port uint16, proto, scope uint8) bool {
		more = f(reconciler.ServiceID(id), frontendOf(addrFromBE32(vip), port, proto, scope))
		return more
	}
	v6 := func(id uint32, vip sockV6addr, port uint16, proto, scope uint8) bool {
		more = f(reconciler.ServiceID(id), frontendOf(addrFrom16(vip), port, proto, scope))
		return more
	}
	var err error
	if isRevNatV1(m4) {
		err = eachEntryWhile(m4, mapRevNat, func(k *uint32, rn *lb4RevNatV1) bool { return v4(*k, rn.Vip, rn.Port, rn.Proto, rn.Scope) })
	} else {
		err = eachBackendWhile(m4, mapRevNat, func(k *uint32, rn *sockLb4RevNat) bool { return v4(*k, rn.Vip, rn.Port, rn.Proto, rn.Scope) })
	}
	if err != nil || !more {
		return err
	}
	if isRevNatV1(m6) {
		return eachEntryWhile(m6, mapRevNat6, func(k *uint32, rn *lb6RevNatV1) bool { return v6(*k, rn.Vip, rn.Port, rn.Proto, rn.Scope) })
	}
	return eachBackendWhile(m6, mapRevNat6, func(k *uint32, rn *sockLb6RevNat) bool { return v6(*k, rn.Vip, rn.Port, rn.Proto, rn.Scope) })
}

// isRevNatV1 says whether m is a reverse-NAT map of the previous layout,
// a hash of values without flags.
func isRevNatV1(m *ebpf.Map) bool {
	return m != nil && m.Type() == ebpf.Hash
}
