package datapath

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// Session affinity upkeep: the agent's side of bpf/lib/affinity.h.
//
// The datapath keeps a client on its backend only while the slot its
// entry was chosen from still names that backend, so an endpoint that
// leaves ends the affinity to it at once. Two things the datapath cannot
// see are done here, by the reconciler's order (reconciler.AffinityFix):
// entries of a backend that left are deleted, so that the backend, should
// it come back into the same slot, starts without clients; and entries of
// a backend that moves to another slot (its frontend shrank) follow it,
// so that its clients keep it. Both run in one pass of a BPF program
// (bpf/ctgc.c sluice_aff_fix) over sluice_session_affinity, next to the
// entries, like the conntrack flush.

// affFixBatch is how many fixes one pass takes (the size of
// sluice_aff_fix_v1 in bpf/lib/maps.h).
const affFixBatch = 4096

// FixAffinity moves or deletes the session affinity entries that fixes
// name (see reconciler.AffinityFix), in one pass over each family's map
// per affFixBatch fixes of that family.
func (m *Maps) FixAffinity(fixes []reconciler.AffinityFix) error {
	f4 := affFixes[sockAffinityFixKey]{keys: make([]sockAffinityFixKey, 0, len(fixes)), slots: make([]uint32, 0, len(fixes))}
	var f6 affFixes[sockAffinityFix6Key]
	for _, f := range fixes {
		k, err := serviceKey(f.Frontend, 0)
		if err != nil {
			return fmt.Errorf("fix session affinity: %w", err)
		}
		if f.Backend == 0 && f.Slot != 0 {
			return fmt.Errorf("fix session affinity of %s: every backend cannot move to slot %d", f.Frontend, f.Slot)
		}
		if f.Slot > 0xffff {
			return fmt.Errorf("fix session affinity of %s: slot %d out of range", f.Frontend, f.Slot)
		}
		if is6(f.Frontend.Addr) {
			f6.keys = append(f6.keys, sockAffinityFix6Key{Master: lb6Key(k, f.Frontend.Addr), BackendId: uint32(f.Backend)})
			f6.slots = append(f6.slots, f.Slot)
			continue
		}
		f4.keys = append(f4.keys, sockAffinityFixKey{Master: k, BackendId: uint32(f.Backend)})
		f4.slots = append(f4.slots, f.Slot)
	}
	err := f4.run(m.affFix, mapAffFix, m.affFixProg)
	if err == nil && len(f6.keys) > 0 {
		err = f6.run(m.affFix6, mapAffFix6, m.affFixProg6)
	}
	if err != nil {
		return fmt.Errorf("fix session affinity (%d fixes): %w", len(fixes), err)
	}
	return nil
}

// affFixes are the fixes of one family: the keys of its fix map
// (sluice_aff_fix or sluice6_aff_fix) and the slot of each.
type affFixes[K any] struct {
	keys  []K
	slots []uint32
}

// run applies the fixes with prog (sluice_aff_fix, sluice_aff_fix6) over
// its fix map set, affFixBatch at a time.
func (f affFixes[K]) run(set *ebpf.Map, name string, prog *ebpf.Program) error {
	if set == nil || prog == nil {
		return fmt.Errorf("%s: not loaded", name)
	}
	for keys, slots := range chunks(f.keys, f.slots, affFixBatch) {
		err := runOverSet(set, name, keys, slots, func() error {
			// The pass counts what it moved and deleted; nobody
			// needs it here.
			var out sockAffinityFixArgs
			if _, err := prog.Run(&ebpf.RunOptions{Context: sockAffinityFixArgs{}, ContextOut: &out}); err != nil {
				return fmt.Errorf("run %s: %w", prog, err)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// chunks yields keys and values n at a time.
func chunks[K, V any](keys []K, values []V, n int) func(yield func([]K, []V) bool) {
	return func(yield func([]K, []V) bool) {
		for i := 0; i < len(keys); i += n {
			j := min(i+n, len(keys))
			if !yield(keys[i:j], values[i:j]) {
				return
			}
		}
	}
}

// AffinityEntry is one session affinity entry, as Affinity lists them.
type AffinityEntry struct {
	Frontend reconciler.Frontend // the scope whose master served the client
	// Client is the client's address (the packet paths); NetnsCookie
	// its network namespace's cookie instead (the socket path).
	Client      netip.Addr
	NetnsCookie uint64
	BackendID   reconciler.BackendID
	Slot        uint16
	Backend     netip.AddrPort // the backend's address when the entry was made
	Expires     uint64         // now_ns() (bpf/lib/consts.h) from which on it is dead
}

// Affinity returns the session affinity entries of both families,
// sorted by frontend and client (for tests and inspection).
func (m *Maps) Affinity() ([]AffinityEntry, error) {
	var out []AffinityEntry
	add := func(fe reconciler.Frontend, kind uint32, cookie uint64, client netip.Addr, id uint32, slot uint16, be netip.AddrPort, expires uint64) {
		e := AffinityEntry{Frontend: fe, BackendID: reconciler.BackendID(id), Slot: slot, Backend: be, Expires: expires}
		if kind == uint32(sockAffinityClientAFFINITY_CLIENT_NETNS) {
			e.NetnsCookie = cookie
		} else {
			e.Client = client
		}
		out = append(out, e)
	}
	err := errors.Join(
		eachEntry(m.affinity, mapAffinity, func(k *sockLb4AffinityKey, v *sockLb4Affinity) {
			add(frontendOf(addrFromBE32(k.Master.Vip), k.Master.Port, k.Master.Proto, k.Master.Scope), k.Kind, k.Client,
				addrFromBE32(uint32(k.Client)), v.BackendId, v.Slot, netip.AddrPortFrom(addrFromBE32(v.Addr), portFromBE16(v.Port)), v.Expires)
		}),
		eachEntry(m.affinity6, mapAffinity6, func(k *sockLb6AffinityKey, v *sockLb6Affinity) {
			// A network namespace's cookie is in the first 8 bytes.
			add(frontendOf(addrFrom16(k.Master.Vip), k.Master.Port, k.Master.Proto, k.Master.Scope), k.Kind,
				binary.NativeEndian.Uint64(k.Client.Addr[:8]), addrFrom16(k.Client), v.BackendId, v.Slot,
				netip.AddrPortFrom(addrFrom16(v.Addr), portFromBE16(v.Port)), v.Expires)
		}),
	)
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b AffinityEntry) int {
		return cmp.Or(a.Frontend.Compare(b.Frontend), cmp.Compare(a.NetnsCookie, b.NetnsCookie), a.Client.Compare(b.Client))
	})
	return out, nil
}
