package datapath

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/pkg/model"
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
// name (see reconciler.AffinityFix), in one pass over the map per
// affFixBatch fixes.
func (m *Maps) FixAffinity(fixes []reconciler.AffinityFix) error {
	keys := make([]sockAffinityFixKey, 0, len(fixes))
	slots := make([]uint32, 0, len(fixes))
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
		keys = append(keys, sockAffinityFixKey{Master: k, BackendId: uint32(f.Backend)})
		slots = append(slots, f.Slot)
	}
	for i := 0; i < len(keys); i += affFixBatch {
		j := min(i+affFixBatch, len(keys))
		if err := m.fixAffinityBatch(keys[i:j], slots[i:j]); err != nil {
			return fmt.Errorf("fix session affinity (%d fixes): %w", len(fixes), err)
		}
	}
	return nil
}

func (m *Maps) fixAffinityBatch(keys []sockAffinityFixKey, slots []uint32) error {
	return runOverSet(m.affFix, mapAffFix, keys, slots, func() error {
		// The pass counts what it moved and deleted; nobody needs it
		// here.
		var out sockAffinityFixArgs
		if _, err := m.affFixProg.Run(&ebpf.RunOptions{Context: sockAffinityFixArgs{}, ContextOut: &out}); err != nil {
			return fmt.Errorf("run sluice_aff_fix: %w", err)
		}
		return nil
	})
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
	Expires     uint64         // bpf_ktime_get_ns() from which on it is dead
}

// Affinity returns the session affinity entries, sorted by frontend and
// client (for tests and inspection).
func (m *Maps) Affinity() ([]AffinityEntry, error) {
	var out []AffinityEntry
	var k sockLb4AffinityKey
	var v sockLb4Affinity
	it := m.affinity.Iterate()
	for it.Next(&k, &v) {
		e := AffinityEntry{
			Frontend: reconciler.Frontend{
				L4Addr: model.L4Addr{Addr: addrFromBE32(k.Master.Vip), Port: portFromBE16(k.Master.Port), Proto: model.Protocol(k.Master.Proto)},
				Scope:  reconciler.Scope(k.Master.Scope),
			},
			BackendID: reconciler.BackendID(v.BackendId),
			Slot:      v.Slot,
			Backend:   netip.AddrPortFrom(addrFromBE32(v.Addr), portFromBE16(v.Port)),
			Expires:   v.Expires,
		}
		if k.Kind == uint32(sockAffinityClientAFFINITY_CLIENT_NETNS) {
			e.NetnsCookie = k.Client
		} else {
			e.Client = addrFromBE32(uint32(k.Client))
		}
		out = append(out, e)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("dump %s: %w", mapAffinity, err)
	}
	slices.SortFunc(out, func(a, b AffinityEntry) int {
		return cmp.Or(a.Frontend.Compare(b.Frontend), cmp.Compare(a.NetnsCookie, b.NetnsCookie), a.Client.Compare(b.Client))
	})
	return out, nil
}
