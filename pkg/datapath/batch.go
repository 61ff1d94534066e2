package datapath

// Batched map writes (BPF_MAP_UPDATE_BATCH, BPF_MAP_DELETE_BATCH, Linux
// 5.6): one system call for many entries of one map, which the kernel
// applies one after the other and stops at the first that fails
// (reconciler.BatchDatapath). A kernel without batch operations for a map
// gets the entries one by one, with the same result.

import (
	"errors"
	"fmt"
	"math"
	"net/netip"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// putBatch writes keys[i] -> values[i], in order, and returns how many
// were written.
func putBatch[K, V any](m *ebpf.Map, keys []K, values []V) (int, error) {
	if len(keys) == 0 {
		return 0, nil
	}
	n, err := m.BatchUpdate(keys, values, nil)
	if errors.Is(err, ebpf.ErrNotSupported) {
		for i := range keys {
			if err := m.Put(&keys[i], &values[i]); err != nil {
				return i, err
			}
		}
		return len(keys), nil
	}
	return n, err
}

// encodeChunk is how many entries upsertBatch encodes and writes at
// once. Its keys and values are copies of the reconciler's entries, which
// the collector must catch up with: encoded all at once, a first program
// of 30,000 Services x 10 made about 13 MB of them. A system call per 1024
// entries costs nothing beside the kernel's work on each.
const encodeChunk = 1024

// upsertBatch encodes entries with enc and writes them, in order, in
// batches of encodeChunk. An entry enc refuses ends the batch there:
// those before it are written, and its error returned. es are entries
// first.. of a batch of total (upsertTwin's runs of one family), which a
// failed write's error names.
func upsertBatch[E, K, V any](m *ebpf.Map, what string, first, total int, es []E, enc func(E) (K, V, error)) (int, error) {
	keys := make([]K, 0, min(len(es), encodeChunk))
	values := make([]V, 0, cap(keys))
	done := 0
	for done < len(es) {
		keys, values = keys[:0], values[:0]
		var encErr error
		for _, e := range es[done:min(len(es), done+encodeChunk)] {
			k, v, err := enc(e)
			if err != nil {
				encErr = err
				break
			}
			keys = append(keys, k)
			values = append(values, v)
		}
		n, err := putBatch(m, keys, values)
		done += n
		if err != nil {
			return done, fmt.Errorf("upsert %s (entry %d of %d): %w", what, first+done, total, whenFull(m, err))
		}
		if encErr != nil {
			return done, encErr
		}
	}
	return done, nil
}

// whenFull says that m is full where err is a hash map's E2BIG, which
// cilium/ebpf words "key too big for map".
func whenFull(m *ebpf.Map, err error) error {
	if errors.Is(err, unix.E2BIG) {
		return fmt.Errorf("full (%d entries): %w", m.MaxEntries(), err)
	}
	return err
}

// UpsertBackends writes backends, in order.
func (m *Maps) UpsertBackends(es []reconciler.BackendEntry) (int, error) {
	return upsertTwin(m.backendMaps(), es, func(e reconciler.BackendEntry) netip.Addr { return e.Addr.Addr },
		func(e reconciler.BackendEntry) (uint32, sockLb4Backend, error) { return backendEntry(e.ID, e.Addr) })
}

// UpsertRevNats writes reverse-NAT entries, in order.
func (m *Maps) UpsertRevNats(es []reconciler.RevNatEntry) (int, error) {
	return upsertTwin(m.revNatMaps(), es, func(e reconciler.RevNatEntry) netip.Addr { return e.Frontend.Addr },
		func(e reconciler.RevNatEntry) (uint32, sockLb4RevNat, error) { return revNatEntry(e.ID, e.Frontend) })
}

// UpsertSlots writes the slots of runs, in order. Each run's key is
// checked and encoded once, as UpsertSlot encodes it (slotEntry), and its
// slots take it with their own numbers straight into the system calls'
// buffers (a first program writes 300,000 slots of 30,000 frontends): no
// entry per slot is made to be read back.
func (m *Maps) UpsertSlots(runs []reconciler.SlotRun) (int, error) {
	w := slotWriter{t: m.serviceMaps()}
	for _, run := range runs {
		w.total += len(run.IDs)
	}
	for _, run := range runs {
		if err := w.add(run); err != nil {
			return w.done, err
		}
	}
	return w.done, w.flush()
}

// slotWriter gathers slots of one family, up to encodeChunk, and writes
// them in one batch (putBatch) when the family changes, the buffers are
// full, or a slot is refused.
type slotWriter struct {
	t      twin[sockLb4Key, sockLb4Service, sockLb6Key, sockLb4Service]
	keys4  []sockLb4Key
	keys6  []sockLb6Key
	values []sockLb4Service
	v6     bool // the family of what the buffers hold
	// done slots written, of total.
	done, total int
}

// add buffers the slots of run, writing the buffers as they fill. A slot
// that slotEntry refuses writes what came before it and returns its
// error.
func (w *slotWriter) add(run reconciler.SlotRun) error {
	if len(run.IDs) == 0 {
		return nil
	}
	k, _, err := slotEntry(run.Frontend, run.First, run.IDs[0])
	if err != nil {
		return w.refused(err)
	}
	if v6 := is6(run.Frontend.Addr); v6 != w.v6 {
		if err := w.flush(); err != nil {
			return err
		}
		w.v6 = v6
	}
	// Room for a system call's worth, made once (a family's keys when
	// it comes).
	n := min(w.total, encodeChunk)
	if w.values == nil {
		w.values = make([]sockLb4Service, 0, n)
	}
	var k6 sockLb6Key
	switch {
	case w.v6:
		k6 = lb6Key(k, run.Frontend.Addr)
		if w.keys6 == nil {
			w.keys6 = make([]sockLb6Key, 0, n)
		}
	case w.keys4 == nil:
		w.keys4 = make([]sockLb4Key, 0, n)
	}
	for j, id := range run.IDs {
		slot := uint64(run.First) + uint64(j)
		if slot > 0xffff || id == 0 {
			_, _, err := slotEntry(run.Frontend, uint32(min(slot, math.MaxUint32)), id)
			return w.refused(err)
		}
		if len(w.values) == encodeChunk {
			if err := w.flush(); err != nil {
				return err
			}
		}
		if w.v6 {
			k6.Slot = uint16(slot)
			w.keys6 = append(w.keys6, k6)
		} else {
			k.Slot = uint16(slot)
			w.keys4 = append(w.keys4, k)
		}
		w.values = append(w.values, sockLb4Service{BackendId: uint32(id)})
	}
	return nil
}

// refused writes what the buffers hold and returns err, a refused
// slot's, unless the write failed first.
func (w *slotWriter) refused(err error) error {
	if ferr := w.flush(); ferr != nil {
		return ferr
	}
	return err
}

// flush writes the buffers, emptied for the next slots.
func (w *slotWriter) flush() error {
	if len(w.values) == 0 {
		return nil
	}
	m, name := w.t.m4, w.t.name4
	var n int
	var err error
	if w.v6 {
		m, name = w.t.m6, w.t.name6
		n, err = putBatch(m, w.keys6, w.values)
	} else {
		n, err = putBatch(m, w.keys4, w.values)
	}
	w.done += n
	w.keys4, w.keys6, w.values = w.keys4[:0], w.keys6[:0], w.values[:0]
	if err != nil {
		return fmt.Errorf("upsert %s (entry %d of %d): %w", name, w.done, w.total, whenFull(m, err))
	}
	return nil
}

// UpsertMasters writes masters, in order.
func (m *Maps) UpsertMasters(es []reconciler.MasterEntry) (int, error) {
	return upsertTwin(m.serviceMaps(), es, func(e reconciler.MasterEntry) netip.Addr { return e.Frontend.Addr },
		func(e reconciler.MasterEntry) (sockLb4Key, sockLb4Service, error) {
			return masterEntry(e.Frontend, e.Master)
		})
}

// UpsertServiceIPs adds addresses to the service IPs, in order.
func (m *Maps) UpsertServiceIPs(as []netip.Addr) (int, error) {
	return upsertTwin(m.serviceIPMaps(), as, func(a netip.Addr) netip.Addr { return a },
		func(a netip.Addr) (uint32, uint8, error) {
			k, err := serviceIPKey(a)
			if err != nil {
				return 0, 0, fmt.Errorf("upsert service IP %s: %w", a, err)
			}
			return k, 1, nil
		})
}

// DeleteBackends deletes backends, of either family; deleting a missing
// one succeeds. An array has no deletes: each id's entry is made absent
// (BE_F_PRESENT cleared) in both families' arrays, as ids are one space
// over both, in batches.
func (m *Maps) DeleteBackends(ids []reconciler.BackendID) (int, error) {
	if err := clearIDs(m.backends, mapBackends, ids, func(v *sockLb4Backend) { v.Flags &^= bePresent }); err != nil {
		return 0, err
	}
	if err := clearIDs(m.backends6, mapBackends6, ids, func(v *sockLb6Backend) { v.Flags &^= bePresent }); err != nil {
		return 0, err
	}
	return len(ids), nil
}

// clearIDs makes each of ids absent in the array m, in one batch: its
// entry is written back as it is with absent applied (BE_F_PRESENT
// cleared), its address kept. An array's update copies the value into the
// entry in place (not the swap of a hash's element), so a program reading
// the entry meanwhile may read it half old, half new: with only the flags'
// byte different, it reads the backend present or absent, never half an
// address (TestOpenResizesBackendsArrays). An id beyond the array holds
// nothing to clear.
func clearIDs[V any](m *ebpf.Map, name string, ids []reconciler.BackendID, absent func(*V)) error {
	if m == nil {
		return nil
	}
	keys := make([]uint32, 0, len(ids))
	for _, id := range ids {
		if uint32(id) < m.MaxEntries() {
			keys = append(keys, uint32(id))
		}
	}
	values := make([]V, len(keys))
	if err := arrayValues(m, keys, values); err != nil {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	for i := range values {
		absent(&values[i])
	}
	if n, err := putBatch(m, keys, values); err != nil {
		return fmt.Errorf("delete %s (entry %d of %d): %w", name, n, len(keys), err)
	}
	return nil
}

// DeleteRevNats deletes reverse-NAT entries, of either family; deleting a
// missing one succeeds.
func (m *Maps) DeleteRevNats(ids []reconciler.ServiceID) (int, error) {
	return deleteIDs([]*ebpf.Map{m.revNat, m.revNat6}, mapRevNat, idKeys(ids))
}

// idKeys returns ids as the maps' uint32 keys.
func idKeys[ID ~uint32](ids []ID) []uint32 {
	keys := make([]uint32, len(ids))
	for i, id := range ids {
		keys[i] = uint32(id)
	}
	return keys
}

var _ reconciler.BatchDatapath = (*Maps)(nil)
