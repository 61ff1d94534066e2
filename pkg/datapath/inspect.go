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
	return mapFill(maps)
}

// ConntrackEntry is one entry of the per-packet conntrack tables.
type ConntrackEntry struct {
	// Established is true for sluice_conntrack (flows that have seen a
	// reply, SNAT port reservations), false for sluice_ct_new (flows not
	// answered yet).
	Established bool
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
	RawExpires uint64        // bpf_ktime_get_ns at which it expires (0: claimed for deletion)
}

// Conntrack lists the entries of both conntrack tables, established
// first. Entries change under the walk; a list is a snapshot of each
// entry, not of the table.
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
	for _, t := range []struct {
		name        string
		established bool
	}{{mapConntrack, true}, {mapCTNew, false}} {
		m, err := openPinnedMap(p.dir, t.name, spec.Maps[t.name])
		if errors.Is(err, os.ErrNotExist) && !t.established {
			continue // pinned by an agent without the table of new flows
		}
		if err != nil {
			return nil, err
		}
		var k sockCt4Key
		var v sockCt4Entry
		it := m.Iterate()
		for it.Next(&k, &v) {
			out = append(out, conntrackEntry(t.established, k, v, now))
		}
		err = it.Err()
		m.Close()
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", t.name, err)
		}
	}
	return out, nil
}

func conntrackEntry(established bool, k sockCt4Key, v sockCt4Entry, now uint64) ConntrackEntry {
	ap := func(a uint32, port uint16) netip.AddrPort {
		return netip.AddrPortFrom(addrFromBE32(a), portFromBE16(port))
	}
	e := ConntrackEntry{
		Established: established,
		Reverse:     k.Dir == ctReverse,
		Proto:       model.Protocol(k.Proto),
		Src:         ap(k.Saddr, k.Sport),
		Dst:         ap(k.Daddr, k.Dport),
		NAT:         ap(v.NatAddr, v.NatPort),
		BackendID:   v.BackendId,
		ServiceID:   v.RevNatId,
		ExpiresIn:   time.Duration(int64(v.Expires - now)),
		RawExpires:  v.Expires,
	}
	if v.Flags&ctFlagSNAT != 0 {
		e.SNAT = ap(v.SnatAddr, v.SnatPort)
	}
	for _, f := range []struct {
		bit  uint32
		name string
	}{{ctFlagSNAT, "snat"}, {ctFlagReplied, "replied"}, {ctFlagFinFwd, "fin-client"}, {ctFlagFinRev, "fin-backend"}, {ctFlagRST, "rst"}} {
		if v.Flags&f.bit != 0 {
			e.Flags = append(e.Flags, f.name)
		}
	}
	return e
}
