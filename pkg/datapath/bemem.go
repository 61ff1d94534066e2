package datapath

// The backends written as memory (issue 14, forty-fourth pass; the
// reverse-NAT entries are written alike, rnmem.go). Each
// family's backends array (sluice_backends_v2, sluice6_backends_v2:
// BPF_F_MMAPABLE, bpf/lib/maps.h) is mapped into the agent read-write, as
// the slots arrays are (slots.go), and a backend is written with stores
// into its entry instead of a batch or single map update: 0.1 s of the
// kernel's time for the 300,000 backends of a first program of 30,000
// Services x 10.
//
// The make-before-break contract of bpf/lib/structs.h holds: an entry is
// present only with BE_F_PRESENT, and a program never reads a torn
// present entry. The flags byte is the last of the value, in the 32-bit
// word that also holds port and protocol (the flags word); so
//   - a new entry (absent) gets its other words first, then its flags
//     word in one atomic store, present (a reader sees it absent until
//     then, then whole);
//   - a present entry is never rewritten field by field: the same value
//     again writes nothing; another value (a backend id names one address
//     for its life; only a repair of drift, an entry changed behind the
//     agent's back, writes another) is first made absent by one atomic
//     store, then written as a new entry;
//   - a delete is one atomic store of the flags word with BE_F_PRESENT
//     cleared, port and protocol kept, as are the other words.
// A map that cannot be mapped (opened without BPF_F_MMAPABLE: pins of an
// older agent before a migration, or a hash) keeps the system calls
// (UpsertBackends' batches, clearIDs).
//
// A table also counts its present entries (issue 14, sixty-sixth pass):
// walked once when it is opened (what a restart finds), then kept by put
// and clear, which see each entry go absent -> present and back, so that
// a scrape's fill of the arrays (sluice_bpf_map_entries, mapFill) reads
// the count instead of walking every entry of both families' arrays,
// sized by --max-backends and --max-services. A write that goes around
// the table (a system call: a window that could not be mapped, a family
// written by system calls) makes the count unknown, and the scrape walks
// again, until the reconciler's next re-read of the maps (Maps.Walk,
// --map-refresh-interval) counts anew; so does an entry changed behind
// the agent's back, which that re-read finds and repairs.

import (
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// bePresentWord is BE_F_PRESENT in the flags word: flags is its last
// byte (little-endian, as the generated types are: *_bpfel.go).
const bePresentWord = uint32(bePresent) << 24

// beTable is a family's backends array, mapped read-write a window at a
// time (arraymem.go).
type beTable struct {
	a      *lazyArray
	words  []uint32 // a's words
	n      uint32   // entries
	stride int      // words an entry takes (the kernel rounds values up to 8 bytes)
	last   int      // the flags word's index in an entry
	// onStore, for tests, hears each store: the word's index in words.
	onStore func(word int)
	// present is the entries present as counted when the table was
	// opened or by the last recount, and kept by put and clear since;
	// exact says no write went around the table since (bypass). Both
	// are the writer's; published is present for a scrape, or -1 when
	// not exact, stored when an operation ends (publish).
	present   int
	exact     bool
	published atomic.Int64
}

// openBeTable maps the backends array arr of valueSize-byte values
// read-write; nil (and no error) for an array that cannot be mapped,
// whose backends the system calls write.
func openBeTable(arr *ebpf.Map, valueSize int) (*beTable, error) {
	if arr == nil || arr.Type() != ebpf.Array || arr.Flags()&unix.BPF_F_MMAPABLE == 0 {
		return nil, nil
	}
	if int(arr.ValueSize()) != valueSize {
		return nil, fmt.Errorf("%s: %d-byte values, want %d", arr, arr.ValueSize(), valueSize)
	}
	stride := (valueSize + 7) &^ 7
	a, err := mapLazy(arr, int(arr.MaxEntries())*stride)
	if err != nil {
		return nil, err
	}
	t := newBeTable(a, valueSize, arr.MaxEntries())
	t.recount(arr)
	return t, nil
}

// newBeTable is the table of n entries of valueSize bytes in a, its
// count of present entries unknown (recount).
func newBeTable(a *lazyArray, valueSize int, n uint32) *beTable {
	stride := (valueSize + 7) &^ 7
	t := &beTable{a: a, words: a.words(), n: n, stride: stride / 4, last: valueSize/4 - 1}
	t.published.Store(-1)
	return t
}

// recount counts the present entries of arr, the table's array, by
// walking it (countPresent), and publishes the count; a walk that fails
// leaves it unknown. The writer's: no write may run meanwhile.
func (t *beTable) recount(arr *ebpf.Map) {
	if t == nil {
		return
	}
	n, err := countPresent(arr)
	t.present, t.exact = n, err == nil
	t.publish()
}

// bypass says that a write went around the table (a system call into
// its array): its count is unknown until the next recount.
func (t *beTable) bypass() {
	if t != nil {
		t.exact = false
		t.published.Store(-1)
	}
}

// publish makes the count of present entries the scrape's (presentCount).
func (t *beTable) publish() {
	if t.exact {
		t.published.Store(int64(t.present))
	} else {
		t.published.Store(-1)
	}
}

// presentCount returns the present entries as of the end of the last
// operation, and false where the table does not know them (no table, or
// a write went around it since its last count).
func (t *beTable) presentCount() (int, bool) {
	if t == nil {
		return 0, false
	}
	n := t.published.Load()
	return int(n), n >= 0
}

func (t *beTable) close() error {
	if t == nil {
		return nil
	}
	return closeWords(t.a, &t.words)
}

func (t *beTable) store(w int, v uint32) {
	if t.onStore != nil {
		t.onStore(w)
	}
	atomic.StoreUint32(&t.words[w], v)
}

// storeAbsent writes word w of an absent entry, not its flags word: a
// plain store, which no program reads but as part of an absent entry (the
// atomic store of the flags word that makes it present comes after, and
// orders it before), where an atomic one is an XCHG on amd64, 300,000 of
// them in a first program of 30,000 Services x 10 (fifty-first pass).
func (t *beTable) storeAbsent(w int, v uint32) {
	if t.onStore != nil {
		t.onStore(w)
	}
	t.words[w] = v
}

// put writes entry id as v (its words, flags word last, present):
// nothing if it is present with v already; else, if present, it is made
// absent first; then v's words, the flags word last. It fails, having
// written nothing, only if the entry's window cannot be mapped.
func (t *beTable) put(id uint32, v []uint32) error {
	base := int(id) * t.stride
	fw := base + t.last
	if err := t.a.ensure(base, fw); err != nil {
		return err
	}
	if cur := atomic.LoadUint32(&t.words[fw]); cur&bePresentWord != 0 {
		same := cur == v[t.last]
		for j := 0; same && j < t.last; j++ {
			same = atomic.LoadUint32(&t.words[base+j]) == v[j]
		}
		if same {
			return nil
		}
		t.store(fw, cur&^bePresentWord)
		t.present--
	}
	for j := range t.last {
		t.storeAbsent(base+j, v[j])
	}
	t.store(fw, v[t.last])
	if v[t.last]&bePresentWord != 0 {
		t.present++
	}
	return nil
}

// clear makes entry id absent, the rest of it kept; an id beyond the
// array, or absent, is left alone, and so is a nil table (an array not
// mapped, or none). It fails, having done nothing, only if the entry's
// window cannot be mapped.
func (t *beTable) clear(id uint32) error {
	if t == nil || id >= t.n {
		return nil
	}
	fw := int(id)*t.stride + t.last
	if err := t.a.ensure(fw, fw); err != nil {
		return err
	}
	if cur := atomic.LoadUint32(&t.words[fw]); cur&bePresentWord != 0 {
		t.store(fw, cur&^bePresentWord)
		t.present--
	}
	return nil
}

// clearAll clears ids of table t (clear) and returns those it could not,
// whose window could not be mapped, for the system call; then it releases
// the windows it mapped. None for a nil table (no array, or one the
// system calls write: the caller's clearIDs is then for all of ids).
func clearAll[ID ~uint32](t *beTable, ids []ID) []ID {
	if t == nil {
		return nil
	}
	var left []ID
	for _, id := range ids {
		if t.clear(uint32(id)) != nil {
			left = append(left, id)
		}
	}
	_ = t.a.release() // a window left mapped only counts in the RSS
	t.publish()
	return left
}

// valueWords is v's bytes as words (V of a size a multiple of 4).
func valueWords[V any](v *V) []uint32 {
	return unsafe.Slice((*uint32)(unsafe.Pointer(v)), unsafe.Sizeof(*v)/4)
}

// openBeTables maps both families' backends arrays, and their
// reverse-NAT arrays (rnmem.go) (Open).
func (m *Maps) openBeTables() error {
	var err4, err6 error
	m.be4, err4 = openBeTable(m.backends, int(unsafe.Sizeof(sockLb4Backend{})))
	m.be6, err6 = openBeTable(m.backends6, int(unsafe.Sizeof(sockLb6Backend{})))
	return errors.Join(err4, err6, m.openRevNatTables())
}

// releaseBeTables unmaps the windows of the backends arrays that a
// batch mapped (arraymem.go).
func (m *Maps) releaseBeTables() { m.beArrays().release() }

func (m *Maps) closeBeTables() error {
	err := errors.Join(m.be4.close(), m.be6.close(), m.closeRevNatTables())
	m.be4, m.be6 = nil, nil
	return err
}

// upsertBackendsMem writes es into the mapped arrays, in order. An entry
// whose id is beyond its array goes to the system call, which refuses it
// as before (E2BIG). upsertMem's loop, written out for the backends: its
// calls through enc and to6, not inlined, made a first apply of 30,000
// Services x 10 (300,000 backends) ~3% slower (4 interleaved rounds).
func (m *Maps) upsertBackendsMem(es []reconciler.BackendEntry) (int, error) {
	defer m.releaseBeTables()
	for i, e := range es {
		k, v, err := backendEntry(e.ID, e.Addr)
		if err != nil {
			return i, err
		}
		if m.putBackendMem(k, v, e.Addr.Addr) {
			continue
		}
		if name, err := putSyscall(m.beArrays(), k, v, e.Addr.Addr, lb6Backend); err != nil {
			return i, fmt.Errorf("upsert %s (entry %d of %d): %w", name, i, len(es), err)
		}
	}
	return len(es), nil
}

// upsertMem writes es, each encoded by enc (its id, its IPv4 value, its
// address; to6 makes the IPv6 value), into the mapped arrays a, in order,
// and releases the windows it mapped. An entry whose id is beyond its
// array goes to the system call, which refuses it as before (E2BIG).
func upsertMem[E, V4, V6 any](a idArrays, es []E, enc func(E) (uint32, V4, netip.Addr, error),
	to6 func(V4, netip.Addr) V6) (int, error) {
	defer a.release()
	for i, e := range es {
		k, v, addr, err := enc(e)
		if err != nil {
			return i, err
		}
		if putMem(a, k, v, addr, to6) {
			continue
		}
		if name, err := putSyscall(a, k, v, addr, to6); err != nil {
			return i, fmt.Errorf("upsert %s (entry %d of %d): %w", name, i, len(es), err)
		}
	}
	return len(es), nil
}

// putSyscall writes entry k -> v (of address addr's family) with a system
// call, upsertMem's way for an id beyond its array, and names the map.
// Apart from it, and not inlined, as k and v go to the heap for the call:
// in upsertMem's loop they did so for every entry (300,000 allocations in
// a first program of 30,000 Services x 10, a sixth of its heap).
//
//go:noinline
func putSyscall[V4, V6 any](a idArrays, k uint32, v V4, addr netip.Addr, to6 func(V4, netip.Addr) V6) (string, error) {
	// A write that succeeds goes around the family's table (an array's
	// update that fails writes nothing).
	if is6(addr) {
		v6 := to6(v, addr)
		err := a.m6.Put(&k, &v6)
		if err == nil {
			a.t6.bypass()
		}
		return a.name6, whenFull(a.m6, err)
	}
	err := a.m4.Put(&k, &v)
	if err == nil {
		a.t4.bypass()
	}
	return a.name4, whenFull(a.m4, err)
}

// putBackendMem writes backend k -> v (of address a's family) into its
// mapped array, and says whether it did (putMem).
func (m *Maps) putBackendMem(k uint32, v sockLb4Backend, a netip.Addr) bool {
	return putMem(m.beArrays(), k, v, a, lb6Backend)
}

// beMapped says that the backends are written as memory: each family's
// array the Maps has is mapped.
func (m *Maps) beMapped() bool { return m.beArrays().mapped() }

// idArrays are an array of each family indexed by an id of one space
// over both, of values whose flags byte is the last (the backends arrays,
// the reverse-NAT arrays), and their tables where they are mapped (nil
// where not).
type idArrays struct {
	m4, m6       *ebpf.Map
	name4, name6 string
	t4, t6       *beTable
}

func (m *Maps) beArrays() idArrays {
	return idArrays{m.backends, m.backends6, mapBackends, mapBackends6, m.be4, m.be6}
}

// mapped says that the entries are written as memory: each family's
// array there is, is mapped.
func (a idArrays) mapped() bool {
	return (a.t4 != nil || a.m4 == nil) && (a.t6 != nil || a.m6 == nil) && (a.t4 != nil || a.t6 != nil)
}

// release unmaps the windows of the arrays that an operation mapped
// (arraymem.go), and publishes the tables' counts.
func (a idArrays) release() {
	for _, t := range []*beTable{a.t4, a.t6} {
		if t != nil {
			_ = t.a.release() // a window left mapped only counts in the RSS
			t.publish()
		}
	}
}

// bypass says that a write went around both tables (bypass).
func (a idArrays) bypass() {
	a.t4.bypass()
	a.t6.bypass()
}

// recount counts both tables' present entries anew (beTable.recount).
func (a idArrays) recount() {
	a.t4.recount(a.m4)
	a.t6.recount(a.m6)
}

// putMem writes entry k -> v, of address addr's family (to6 makes the
// IPv6 value), into its mapped array, and says whether it did: not for an
// id beyond the array, a family not mapped, or an entry whose window
// cannot be mapped.
func putMem[V4, V6 any](a idArrays, k uint32, v V4, addr netip.Addr, to6 func(V4, netip.Addr) V6) bool {
	if is6(addr) {
		if a.t6 == nil || k >= a.t6.n {
			return false
		}
		v6 := to6(v, addr)
		return a.t6.put(k, valueWords(&v6)) == nil
	}
	if a.t4 == nil || k >= a.t4.n {
		return false
	}
	return a.t4.put(k, valueWords(&v)) == nil
}

// putOne writes one entry k -> v, of address addr's family, as memory
// where the arrays a are mapped (putMem, releasing the window), else with
// a system call (putSyscall); an error names the map.
func putOne[V4, V6 any](a idArrays, k uint32, v V4, addr netip.Addr, to6 func(V4, netip.Addr) V6) error {
	if a.mapped() {
		ok := putMem(a, k, v, addr, to6)
		a.release()
		if ok {
			return nil
		}
	}
	if name, err := putSyscall(a, k, v, addr, to6); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// clearTwin makes each of ids absent in both families' arrays (ids are
// one space over both; absent4 and absent6 clear a value's present flag):
// as memory where they are mapped, else, and for the ids whose window
// cannot be mapped, with system calls in batches (clearIDs). It returns
// what a BatchDatapath delete does: len(ids), or 0 and the error.
func clearTwin[ID ~uint32, V4, V6 comparable](a idArrays, ids []ID, absent4 func(*V4), absent6 func(*V6)) (int, error) {
	ids4, ids6 := ids, ids
	if a.mapped() {
		ids4, ids6 = clearAll(a.t4, ids), clearAll(a.t6, ids)
	}
	// What the system calls clear goes around the tables.
	if len(ids4) > 0 {
		a.t4.bypass()
	}
	if len(ids6) > 0 {
		a.t6.bypass()
	}
	if err := clearIDs(a.m4, a.name4, ids4, absent4); err != nil {
		return 0, err
	}
	if err := clearIDs(a.m6, a.name6, ids6, absent6); err != nil {
		return 0, err
	}
	return len(ids), nil
}
