package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/pkg/model"
)

// The operators' read-only views beyond the service maps (pinned.go): how
// full each pin is, and the per-packet conntrack entries. Like OpenPinned,
// they load nothing and change nothing.

// MapFill counts the entries of every hash-like map pinned under the
// directory, whatever its size, sorted by name (see Datapath.MapFill).
func (p *Pinned) MapFill() ([]MapFill, error) {
	entries, err := os.ReadDir(p.dir)
	if err != nil {
		return nil, fmt.Errorf("list pins: %w", err)
	}
	maps := map[string]*ebpf.Map{}
	defer func() {
		for _, m := range maps {
			m.Close()
		}
	}()
	for _, e := range entries {
		if e.IsDir() {
			continue // links/
		}
		m, err := ebpf.LoadPinnedMap(filepath.Join(p.dir, e.Name()), &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			return nil, fmt.Errorf("open pinned map %s: %w", e.Name(), err)
		}
		maps[e.Name()] = m
	}
	return mapFill(maps, nil, nil)
}

// ConntrackEntry is one entry of the per-packet conntrack tables.
type ConntrackEntry struct {
	// Established is true for the entries of sluice_conntrack that are
	// not half-open: flows that have seen a reply, SNAT port
	// reservations. It is false for sluice_ct_new and for the half-open
	// flows (not answered yet) sluice_conntrack holds within its
	// half-open share (bpf/lib/conntrack.h), and for Unassured ones.
	Established bool
	// Unassured is true for the entries of a TCP flow answered whose
	// client has not acknowledged the answer yet (netfilter's SYN_RECV):
	// counted in the half-open share, living the SYN timeout idle, in
	// either table (conntrack.h, ct_assure).
	Unassured bool
	// Reverse says the key is a reply's tuple (the backend's side), not
	// the client's.
	Reverse  bool
	Proto    model.Protocol
	Src, Dst netip.AddrPort // the key: the tuple of the packets it matches
	// NAT is what they are translated to: the backend (a forward entry)
	// or the frontend (a reverse one).
	NAT netip.AddrPort
	// SNAT, if valid, is the source-NAT of the flow: the node's address
	// and port (forward), or the client's (reverse).
	SNAT       netip.AddrPort
	BackendID  uint32
	ServiceID  uint32 // the frontend's reverse-NAT id
	Flags      []string
	ExpiresIn  time.Duration // from now; negative: expired, waiting for the GC
	RawExpires uint64        // now_ns (bpf/lib/consts.h) at which it expires (0: claimed for deletion)
}

// Conntrack lists the entries of both conntrack tables, established
// first, IPv4's and then IPv6's. Entries change under the walk; a list
// is a snapshot of each entry, not of the table.
func (p *Pinned) Conntrack() ([]ConntrackEntry, error) {
	spec, err := loadSock()
	if err != nil {
		return nil, err
	}
	now, err := monotonicNow()
	if err != nil {
		return nil, fmt.Errorf("read the clock: %w", err)
	}
	var out []ConntrackEntry
	for _, t := range ctTables {
		m, err := openPinnedMap(p.dir, t.name, spec.Maps[t.name])
		if errors.Is(err, os.ErrNotExist) && t.optional {
			continue // pinned by an agent without this table
		}
		if err != nil {
			return nil, err
		}
		if t.v6 {
			out, err = listCT[tcCt6Key, tcCt6Entry](m, t.established, now, out)
		} else {
			out, err = listCT[sockCt4Key, sockCt4Entry](m, t.established, now, out)
		}
		m.Close()
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", t.name, err)
		}
	}
	return out, nil
}

// ctTables are the conntrack tables Conntrack lists and DeleteConntrack
// deletes from; optional: an older agent may not have pinned it.
var ctTables = []struct {
	name                      string
	established, optional, v6 bool
}{
	{mapConntrack, true, false, false}, {mapCTNew, false, true, false},
	{mapConntrack6, true, true, true}, {mapCTNew6, false, true, true},
}

// listCT appends the entries of the conntrack table m, of key type K and
// value type V, to out; not an entry DeleteConntrack lapsed (ctLapsed),
// deleted as far as the operator is concerned.
func listCT[K ctKey, V ctValue](m *ebpf.Map, established bool, now uint64, out []ConntrackEntry) ([]ConntrackEntry, error) {
	var k K
	var v V
	it := m.Iterate()
	for it.Next(&k, &v) {
		if v.view().expires == ctLapsed {
			continue
		}
		out = append(out, conntrackEntry(established, k, v, now))
	}
	return out, it.Err()
}

// ctKey is a conntrack key of either family: sockCt4Key or tcCt6Key.
type ctKey interface {
	comparable
	tuple() (src, dst netip.AddrPort, proto uint8, dir uint8)
}

// ctValue is a conntrack entry of either family: sockCt4Entry or
// tcCt6Entry.
type ctValue interface {
	view() ctView
}

// ctView is what a conntrack entry of either family holds.
type ctView struct {
	nat, snat                   netip.AddrPort
	flags, backendID, serviceID uint32
	expires                     uint64
}

func ap4(a uint32, port uint16) netip.AddrPort {
	return netip.AddrPortFrom(addrFromBE32(a), portFromBE16(port))
}

func ap6(a tcV6addr, port uint16) netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom16(a.Addr), portFromBE16(port))
}

func (k sockCt4Key) tuple() (src, dst netip.AddrPort, proto, dir uint8) {
	return ap4(k.Saddr, k.Sport), ap4(k.Daddr, k.Dport), k.Proto, k.Dir
}

func (k tcCt6Key) tuple() (src, dst netip.AddrPort, proto, dir uint8) {
	return ap6(k.Saddr, k.Sport), ap6(k.Daddr, k.Dport), k.Proto, k.Dir
}

func (v sockCt4Entry) view() ctView {
	return ctView{nat: ap4(v.NatAddr, v.NatPort), snat: ap4(v.SnatAddr, v.SnatPort),
		flags: v.Flags, backendID: v.BackendId, serviceID: v.RevNatId, expires: v.Expires}
}

func (v tcCt6Entry) view() ctView {
	return ctView{nat: ap6(v.NatAddr, v.NatPort), snat: ap6(v.SnatAddr, v.SnatPort),
		flags: v.Flags, backendID: v.BackendId, serviceID: v.RevNatId, expires: v.Expires}
}

func conntrackEntry[K ctKey, V ctValue](established bool, k K, v V, now uint64) ConntrackEntry {
	src, dst, proto, dir := k.tuple()
	w := v.view()
	e := ConntrackEntry{
		Established: established && w.flags&(ctFlagReplied|ctFlagSNAT) != 0 && !ctAwaiting(w.flags),
		Unassured:   ctAwaiting(w.flags),
		Reverse:     dir == ctReverse,
		Proto:       model.Protocol(proto),
		Src:         src,
		Dst:         dst,
		NAT:         w.nat,
		BackendID:   w.backendID,
		ServiceID:   w.serviceID,
		ExpiresIn:   time.Duration(int64(w.expires - now)),
		RawExpires:  w.expires,
	}
	if w.flags&ctFlagSNAT != 0 {
		e.SNAT = w.snat
	}
	for _, f := range []struct {
		bit  uint32
		name string
	}{{ctFlagSNAT, "snat"}, {ctFlagReplied, "replied"}, {ctFlagAssured, "assured"}, {ctFlagFinFwd, "fin-client"}, {ctFlagFinRev, "fin-backend"}, {ctFlagRSTFwd, "rst-client"}, {ctFlagRSTRev, "rst-backend"}, {ctFlagChalFwd, "rst-client-challenged"}, {ctFlagChalRev, "rst-backend-challenged"}} {
		if w.flags&f.bit != 0 {
			e.Flags = append(e.Flags, f.name)
		}
	}
	return e
}
