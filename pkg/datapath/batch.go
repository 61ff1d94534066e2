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
	if m.beMapped() {
		return m.upsertBackendsMem(es)
	}
	m.beArrays().bypass()
	return upsertTwin(m.backendMaps(), es, func(e reconciler.BackendEntry) netip.Addr { return e.Addr.Addr },
		func(e reconciler.BackendEntry) (uint32, sockLb4Backend, error) { return backendEntry(e.ID, e.Addr) })
}

// UpsertRevNats writes reverse-NAT entries, in order: into the mapped
// arrays' memory (rnmem.go), or with system calls where they cannot be
// mapped.
func (m *Maps) UpsertRevNats(es []reconciler.RevNatEntry) (int, error) {
	if m.rnMapped() {
		return m.upsertRevNatsMem(es)
	}
	m.rnArrays().bypass()
	return upsertTwin(m.revNatMaps(), es, func(e reconciler.RevNatEntry) netip.Addr { return e.Frontend.Addr },
		func(e reconciler.RevNatEntry) (uint32, sockLb4RevNat, error) { return revNatEntry(e.ID, e.Frontend) })
}

// UpsertSlots writes the slots of runs, in order, into the frontends'
// ranges of the slots arrays (slots.go): stores into the arrays' memory,
// no system call but where a frontend that has a master moves to a larger
// range. It returns how many slots were written; a slot refused (slot 0
// or beyond 65535, backend id 0) or a frontend that finds no room ends it
// there.
func (m *Maps) UpsertSlots(runs []reconciler.SlotRun) (int, error) {
	done := 0
	var locked *slotTable
	defer func() {
		if locked != nil {
			locked.unlock()
		}
	}()
	for _, run := range runs {
		if len(run.IDs) == 0 {
			continue
		}
		// The run's frontend is checked once, with its first slot;
		// the other slots' numbers and ids each.
		if err := checkSlot(run.Frontend, run.First, run.IDs[0]); err != nil {
			return done, err
		}
		n := len(run.IDs)
		var refused error
		for j, id := range run.IDs {
			if slot := uint64(run.First) + uint64(j); slot > 0xffff || id == 0 {
				n, refused = j, checkSlot(run.Frontend, uint32(min(slot, math.MaxUint32)), id)
				break
			}
		}
		if n > 0 {
			if err := m.writeRun(&locked, run.Frontend, run.First, run.IDs[:n]); err != nil {
				return done, err
			}
			done += n
		}
		if refused != nil {
			return done, refused
		}
	}
	return done, nil
}

// writeRun writes ids into slots first.. of fe, with fe's family's table
// locked (held in *locked across runs of one family).
func (m *Maps) writeRun(locked **slotTable, fe reconciler.Frontend, first uint32, ids []reconciler.BackendID) error {
	fe = frontendKey(fe)
	t := m.slotTableOf(fe)
	if t == nil {
		return fmt.Errorf("upsert slots of %s: no slots array", fe)
	}
	if *locked != t {
		if *locked != nil {
			(*locked).unlock()
		}
		t.mu.Lock()
		*locked = t
	}
	if err := t.write(fe, first, ids, m.rebaseMaster); err != nil {
		return fmt.Errorf("upsert slots %d-%d of %s: %w", first, first+uint32(len(ids))-1, fe, err)
	}
	return nil
}

// UpsertMasters writes masters, in order.
func (m *Maps) UpsertMasters(es []reconciler.MasterEntry) (int, error) {
	return upsertTwin(m.serviceMaps(), es, func(e reconciler.MasterEntry) netip.Addr { return e.Frontend.Addr },
		func(e reconciler.MasterEntry) (sockLb4Key, sockLb4Service, error) {
			return m.masterWithBase(e.Frontend, e.Master)
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
	return clearTwin(m.beArrays(), ids, func(v *sockLb4Backend) { v.Flags &^= bePresent },
		func(v *sockLb6Backend) { v.Flags &^= bePresent })
}

// clearIDs makes each of ids absent in the array m, in one batch: its
// entry is written back as it is with absent applied (BE_F_PRESENT
// cleared), its address kept. An array's update copies the value into the
// entry in place (not the swap of a hash's element), so a program reading
// the entry meanwhile may read it half old, half new: with only the flags'
// byte different, it reads the backend present or absent, never half an
// address (TestOpenResizesBackendsArrays). An id beyond the array holds
// nothing to clear, and an entry absent already is not written.
func clearIDs[V comparable, ID ~uint32](m *ebpf.Map, name string, ids []ID, absent func(*V)) error {
	if m == nil || len(ids) == 0 {
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
	kept := 0
	for i := range values {
		v := values[i]
		if absent(&v); v != values[i] {
			keys[kept], values[kept] = keys[i], v
			kept++
		}
	}
	keys, values = keys[:kept], values[:kept]
	if n, err := putBatch(m, keys, values); err != nil {
		return fmt.Errorf("delete %s (entry %d of %d): %w", name, n, len(keys), err)
	}
	return nil
}

// DeleteRevNats deletes reverse-NAT entries, of either family; deleting a
// missing one succeeds. As DeleteBackends: an array has no deletes, each
// id's entry is made absent (RN_F_PRESENT cleared) in both families'
// arrays, ids being one space over both.
func (m *Maps) DeleteRevNats(ids []reconciler.ServiceID) (int, error) {
	return clearTwin(m.rnArrays(), ids, func(v *sockLb4RevNat) { v.Flags &^= rnPresent },
		func(v *sockLb6RevNat) { v.Flags &^= rnPresent })
}

var _ reconciler.BatchDatapath = (*Maps)(nil)
