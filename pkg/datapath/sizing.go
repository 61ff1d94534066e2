package datapath

// Sizing the flow tables from the node's memory, as Cilium's
// --bpf-map-dynamic-size-ratio does: the tables that grow with traffic,
// not with Services (conntrack, the half-open flows, the translated
// sockets, session affinity's clients), share ratio of the node's memory,
// each in proportion to what its default size costs. A node with 4 GiB
// and one with 256 GiB then keep flows in proportion to what they can
// carry, where fixed defaults are too small for one and waste the other's
// memory. The service maps are sized by what the cluster holds
// (--max-services and the others) and stay out of it.
//
// What an entry costs is the kernel's hash element: 48 bytes of header
// and the key and value, each rounded up to 8 bytes (kernel/bpf/hashtab.c);
// a table counts once per map it sizes (an IPv6 twin, sock_rev's
// udp_stick). The buckets (8 bytes per entry, rounded up to a power of
// two) and per-CPU free lists are left out, as Cilium leaves them out.

import (
	"fmt"
	"math"
)

// FlowTables are the sizes of the tables that grow with traffic.
type FlowTables struct {
	Conntrack, ConntrackNew, SockRev, Affinity int
}

// The bounds of a table sized from memory: small enough a node still keeps
// a few thousand flows, and no larger than a table the kernel allocates
// in one go comfortably.
const (
	minFlowTable = 1 << 12
	maxFlowTable = 1 << 24
)

// DefaultFlowTables are the flow tables' default sizes.
var DefaultFlowTables = FlowTables{
	Conntrack: DefaultMaxConntrack, ConntrackNew: DefaultMaxConntrackNew,
	SockRev: DefaultMaxSockRev, Affinity: DefaultMaxAffinity,
}

// flowTableMaps are the maps each flow table sizes (Config.maxEntries).
var flowTableMaps = [4][]string{
	{mapConntrack, mapConntrack6},
	{mapCTNew, mapCTNew6},
	{mapSockRev, mapUDPStick, mapSockRev6, mapUDPStick6},
	{mapAffinity, mapAffinity6},
}

func (f *FlowTables) fields() [4]*int {
	return [4]*int{&f.Conntrack, &f.ConntrackNew, &f.SockRev, &f.Affinity}
}

// FlowTableEntryBytes returns what one entry of each flow table costs,
// summed over the maps it sizes.
func FlowTableEntryBytes() (FlowTables, error) {
	spec, err := loadTc()
	if err != nil {
		return FlowTables{}, err
	}
	var out FlowTables
	for i, f := range out.fields() {
		for _, name := range flowTableMaps[i] {
			m := spec.Maps[name]
			if m == nil {
				return FlowTables{}, fmt.Errorf("map %s missing from the tc object", name)
			}
			*f += 48 + roundUp8(int(m.KeySize)) + roundUp8(int(m.ValueSize))
		}
	}
	return out, nil
}

func roundUp8(n int) int { return (n + 7) &^ 7 }

// DynamicFlowTables returns the flow tables' sizes that together cost
// ratio of memTotal bytes (entryBytes: FlowTableEntryBytes), each the
// same multiple of its default, within [4096, 16777216] entries.
func DynamicFlowTables(memTotal uint64, ratio float64, entryBytes FlowTables) (FlowTables, error) {
	if !(ratio > 0 && ratio <= 1) {
		return FlowTables{}, fmt.Errorf("ratio %v out of range (0, 1]", ratio)
	}
	def := DefaultFlowTables
	defaultBytes := 0.0
	for i, n := range def.fields() {
		defaultBytes += float64(*n) * float64(*entryBytes.fields()[i])
	}
	if defaultBytes <= 0 {
		return FlowTables{}, fmt.Errorf("entry sizes %+v: no memory to scale", entryBytes)
	}
	scale := float64(memTotal) * ratio / defaultBytes
	var out FlowTables
	for i, f := range out.fields() {
		n := math.Round(float64(*def.fields()[i]) * scale)
		*f = int(min(max(n, minFlowTable), maxFlowTable))
	}
	return out, nil
}

// Bytes is what the flow tables of sizes f cost at entryBytes per entry.
func (f FlowTables) Bytes(entryBytes FlowTables) uint64 {
	var b uint64
	for i, n := range f.fields() {
		b += uint64(*n) * uint64(*entryBytes.fields()[i])
	}
	return b
}
