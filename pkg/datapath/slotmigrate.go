package datapath

// Converting the services maps of the previous layout (v1: masters and
// slots in one hash) into v2's masters and slots array (pins.go).

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"path/filepath"

	"github.com/cilium/ebpf"
)

// lb4ServiceV1 is the value of sluice_services_v1 and its IPv6 twin:
// struct lb4_service before slots_base (a master's backend_id is its
// affinity timeout, a slot's its backend).
type lb4ServiceV1 struct {
	BackendId uint32
	Count     uint32
	RevNatId  uint32
	Flags     uint8
	Scope     uint8
	Pad       [2]uint8
}

// isServicesV1 says whether m is a services map of the previous layout.
func isServicesV1(m *ebpf.Map) bool {
	return m != nil && m.ValueSize() == uint32(binary.Size(lb4ServiceV1{}))
}

func convertServices4(old, cur *ebpf.Map, spec *ebpf.CollectionSpec, dir string, j *pinJournal) error {
	return convertServices(old, cur, spec, dir, j, mapSlots, func(k sockLb4Key) sockLb4Key { return k })
}

func convertServices6(old, cur *ebpf.Map, spec *ebpf.CollectionSpec, dir string, j *pinJournal) error {
	return convertServices(old, cur, spec, dir, j, mapSlots6, func(k sockLb6Key) sockLb6Key { return k })
}

// frontendSlots are a frontend's entries of a v1 services map.
type frontendSlots[K any] struct {
	key    K // its master's
	master *lb4ServiceV1
	slots  map[uint16]uint32
	top    uint16
}

// convertServices copies the masters of the v1 services map old into
// cur, each with the base of a range of a new slots array (pinned as
// slots in dir, noted in j first) that holds its slots. A frontend's
// range holds its count and every slot it has (those above the count
// the reconciler deletes as ever); slots without a master (a frontend
// whose master the previous agent had not written yet) are dropped: the
// reconciler writes them again. A slots array too small for them all is
// an error: a larger --max-service-entries keeps them.
func convertServices[K comparable](old, cur *ebpf.Map, spec *ebpf.CollectionSpec, dir string, j *pinJournal,
	slots string, master func(K) K) error {
	ms := spec.Maps[slots]
	if ms == nil {
		return fmt.Errorf("map %s missing from BPF object", slots)
	}
	fes := map[K]*frontendSlots[K]{}
	var order []K
	var k K
	var v lb4ServiceV1
	it := old.Iterate()
	for it.Next(&k, &v) {
		slot := slotOfKey(&k)
		mk := k
		setSlotOfKey(&mk, 0)
		f := fes[mk]
		if f == nil {
			f = &frontendSlots[K]{key: master(mk), slots: map[uint16]uint32{}}
			fes[mk] = f
			order = append(order, mk)
		}
		if slot == 0 {
			vv := v
			f.master = &vv
			continue
		}
		f.slots[slot] = v.BackendId
		f.top = max(f.top, slot)
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read services: %w", err)
	}
	alloc := newSlotAlloc(ms.MaxEntries)
	var keys []K
	var masters []sockLb4Service
	var idx, ids []uint32
	for _, mk := range order {
		f := fes[mk]
		if f.master == nil {
			continue
		}
		m := f.master
		n := max(m.Count, uint32(f.top))
		var base uint32
		if n > 0 {
			r, err := alloc.alloc(min(n, math.MaxUint16))
			if err != nil {
				return fmt.Errorf("slots of frontend %v (%d): %s of %d entries: %w", mk, n, slots, ms.MaxEntries, err)
			}
			base = r.base
			for s, id := range f.slots {
				idx, ids = append(idx, base+uint32(s)-1), append(ids, id)
			}
		}
		keys = append(keys, f.key)
		masters = append(masters, sockLb4Service{BackendId: m.BackendId, Count: m.Count, RevNatId: m.RevNatId,
			Flags: m.Flags, Scope: m.Scope, SlotsBase: base})
	}
	path := filepath.Join(dir, slots)
	if err := j.keep(path); err != nil {
		return err
	}
	err := replacePin(path, "_migrating", ms, func(arr *ebpf.Map) error {
		if n, err := putBatch(arr, idx, ids); err != nil {
			return fmt.Errorf("write slot %d of %d: %w", n, len(idx), err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%s: %w", slots, err)
	}
	if n, err := putBatch(cur, keys, masters); err != nil {
		return fmt.Errorf("write master %d of %d: %w", n, len(keys), err)
	}
	return nil
}

// slotOfKey and setSlotOfKey read and set the slot of a services key of
// either family.
func slotOfKey(k any) uint16 {
	switch k := k.(type) {
	case *sockLb4Key:
		return k.Slot
	case *sockLb6Key:
		return k.Slot
	}
	panic(errors.New("not a services key"))
}

func setSlotOfKey(k any, slot uint16) {
	switch k := k.(type) {
	case *sockLb4Key:
		k.Slot = slot
	case *sockLb6Key:
		k.Slot = slot
	}
}
