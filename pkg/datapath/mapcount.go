package datapath

// Counting the entries of the hash maps without walking them: the iterator
// of bpf/mapcount.c reads the kernel's own per-CPU element count of every
// map of the node (bpf_map_sum_elem_count, Linux 6.6+), so a scrape of
// sluice_map_fill_ratio costs one small record per map instead of copying
// every key and value out (countEntries). Without the kfunc the maps are
// walked as before (Features.MapCount says which).

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// mapCounter runs the map iterator of bpf/mapcount.c.
type mapCounter struct {
	prog *ebpf.Program // sluice_map_count
	iter *link.Iter
}

func loadMapCounter() (*mapCounter, error) {
	var objs mapcountObjects
	if err := loadMapcountObjects(&objs, nil); err != nil {
		return nil, fmt.Errorf("load map count iterator: %w", verifierDetail(err))
	}
	it, err := link.AttachIter(link.IterOptions{Program: objs.SluiceMapCount})
	if err != nil {
		_ = objs.Close() // BPF descriptors only; err says why
		return nil, fmt.Errorf("attach map count iterator: %w", err)
	}
	return &mapCounter{prog: objs.SluiceMapCount, iter: it}, nil
}

func (c *mapCounter) Close() error {
	if c == nil {
		return nil
	}
	return errors.Join(c.iter.Close(), c.prog.Close())
}

// The iterator's records (struct map_count_rec), in the host's byte order.
var (
	mapCountRecSize = int(unsafe.Sizeof(mapcountMapCountRec{}))
	mapCountIDAt    = int(unsafe.Offsetof(mapcountMapCountRec{}.Id))
	mapCountCountAt = int(unsafe.Offsetof(mapcountMapCountRec{}.Count))
)

// counts returns the element count of every map of the node, by map id.
func (c *mapCounter) counts() (map[ebpf.MapID]int, error) {
	r, err := c.iter.Open()
	if err != nil {
		return nil, fmt.Errorf("open map count iterator: %w", err)
	}
	defer func() { _ = r.Close() }() // read to its end below, or failed already
	out, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("read map count iterator: %w", err)
	}
	return mapCountRecords(out)
}

// mapCountRecords decodes the iterator's output: struct map_count_rec
// after struct map_count_rec.
func mapCountRecords(out []byte) (map[ebpf.MapID]int, error) {
	if len(out)%mapCountRecSize != 0 {
		return nil, fmt.Errorf("map count iterator wrote %d bytes, not a whole number of %d-byte records", len(out), mapCountRecSize)
	}
	counts := make(map[ebpf.MapID]int, len(out)/mapCountRecSize)
	for ; len(out) > 0; out = out[mapCountRecSize:] {
		id := binary.NativeEndian.Uint32(out[mapCountIDAt:])
		n := int64(binary.NativeEndian.Uint64(out[mapCountCountAt:]))
		counts[ebpf.MapID(id)] = int(max(n, 0)) // per-CPU sums may dip below 0 in a race
	}
	return counts, nil
}

// hasElemCount says whether the kernel counts the elements of a map of
// type t (the hash maps, LRU and per-CPU ones included; not LPM tries).
func hasElemCount(t ebpf.MapType) bool {
	switch t {
	case ebpf.Hash, ebpf.LRUHash, ebpf.PerCPUHash, ebpf.LRUCPUHash:
		return true
	}
	return false
}
