package datapath

// Preallocated service maps (--preallocate-bpf-maps, as Cilium's): the
// hash maps the reconciler fills per Service and backend are
// BPF_F_NO_PREALLOC in bpf/lib/maps.h, so that a node holds the memory of
// the entries it has, not of max_entries. The price is the insert: the
// kernel allocates every element (about 0.9 us each, against 0.36-0.39 for
// one taken off a preallocated map's free list), which is most of a first
// apply at 30,000 Services x 10 endpoints (330,000 slots and masters,
// 30,000 reverse-NAT entries, 30,000 service IPs, before the slots and the
// reverse-NAT entries went into arrays, which are always preallocated).
// With PreallocateMaps the same maps are created without the flag, from
// Go (no second build of the objects): their max_entries' elements are
// allocated at creation and held for the map's life, and inserts and
// deletes neither allocate nor wait for RCU to free.
//
// The flag is part of a map's identity to the kernel (and to cilium/ebpf,
// which refuses a pin of other flags), so a pin made the other way is
// rebuilt at Open as a resize is: a new map, the entries copied, its pin
// renamed over the old one (resizePins). The programs still attached use
// the old map until they are replaced, and no agent writes it meanwhile.
//
// The conntrack and affinity tables are preallocated (or LRUs, always
// preallocated) already; the LPM tries cannot be; the other
// BPF_F_NO_PREALLOC hashes (the conntrack flush set, affinity's upkeep
// set) are small and written rarely.

import (
	"fmt"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// preallocatedMaps are the maps PreallocateMaps creates preallocated: the
// service maps the reconciler writes an entry of per frontend, slot or
// service, of both families.
var preallocatedMaps = []string{
	mapServices, mapServices6, mapServiceIPs, mapServiceIPs6,
}

// setPreallocation sets or clears BPF_F_NO_PREALLOC on the
// preallocatedMaps of spec (those it has).
func setPreallocation(spec *ebpf.CollectionSpec, prealloc bool) error {
	for _, name := range preallocatedMaps {
		ms, ok := spec.Maps[name]
		if !ok {
			return fmt.Errorf("map %s missing from BPF object", name)
		}
		if ms.Type != ebpf.Hash {
			return fmt.Errorf("map %s is %s, want a hash to choose its preallocation", name, ms.Type)
		}
		if prealloc {
			ms.Flags &^= unix.BPF_F_NO_PREALLOC
		} else {
			ms.Flags |= unix.BPF_F_NO_PREALLOC
		}
	}
	return nil
}

// preallocationDiffers says whether the map of info was created with
// another preallocation than ms asks for: the one difference of flags
// Open rebuilds a pin for.
func preallocationDiffers(info *ebpf.MapInfo, ms *ebpf.MapSpec) bool {
	return (info.Flags^ms.Flags)&unix.BPF_F_NO_PREALLOC != 0
}

// preallocation names a map's preallocation by its flags, for errors.
func preallocation(flags uint32) string {
	if flags&unix.BPF_F_NO_PREALLOC != 0 {
		return "not preallocated"
	}
	return "preallocated"
}

// PreallocatedBytes is the kernel's memory (memlock) the preallocatedMaps
// hold together. Preallocated, it is what their max_entries cost,
// whatever they hold; otherwise what their entries cost now.
func (d *Datapath) PreallocatedBytes() (uint64, error) {
	maps := objectsOf[*ebpf.Map](&d.tc)
	var total uint64
	for _, name := range preallocatedMaps {
		m := maps[name]
		if m == nil {
			return 0, fmt.Errorf("map %s not loaded", name)
		}
		info, err := m.Info()
		if err != nil {
			return 0, fmt.Errorf("information of map %s: %w", name, err)
		}
		b, _ := info.Memlock()
		total += b
	}
	return total, nil
}
