package datapath

// IPv6 (issue 10). Each family has its own maps (bpf/lib/maps.h): an IPv6
// frontend, backend, source range or service IP lives in the sluice6_*
// twin of its IPv4 map, so an IPv4 packet pays nothing for IPv6. Service
// and backend ids are one space over both families (the reconciler hands
// them out), so a delete by id looks in both maps.
//
// The encoders in maps.go build an entry of the IPv4 map with the address
// left zero for an IPv6 one; a twin converts it into the IPv6 map's entry
// by adding the address. So the family-independent fields are encoded,
// and checked, once, and an IPv4 write costs what it did.

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"reflect"
	"slices"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// is6 reports whether a belongs in the IPv6 maps: an IPv4-mapped IPv6
// address is its IPv4 address (checkL4).
func is6(a netip.Addr) bool { return a.Is6() && !a.Is4In6() }

// addr4 returns a in network order, or 0 for an address of the IPv6 maps.
func addr4(a netip.Addr) uint32 {
	if a.Is4() {
		return be32(a)
	}
	return 0
}

func v6addr(a netip.Addr) sockV6addr { return sockV6addr{Addr: a.As16()} }

func addrFrom16(a sockV6addr) netip.Addr { return netip.AddrFrom16(a.Addr) }

// The IPv6 twins of the IPv4 entries, for address a.
func lb6Key(k sockLb4Key, a netip.Addr) sockLb6Key {
	return sockLb6Key{Vip: v6addr(a), Port: k.Port, Proto: k.Proto, Scope: k.Scope, Slot: k.Slot}
}

func lb6Backend(b sockLb4Backend, a netip.Addr) sockLb6Backend {
	return sockLb6Backend{Addr: v6addr(a), Port: b.Port, Proto: b.Proto, Flags: b.Flags}
}

func lb6RevNat(r sockLb4RevNat, a netip.Addr) sockLb6RevNat {
	return sockLb6RevNat{Vip: v6addr(a), Port: r.Port, Proto: r.Proto, Scope: r.Scope, Flags: r.Flags}
}

func srcRange6Key(k sockSrcRangeKey, fe netip.Addr, p netip.Prefix) sockSrcRange6Key {
	return sockSrcRange6Key{Prefixlen: 160 + uint32(p.Bits()), Vip: v6addr(fe), Port: k.Port, Proto: k.Proto, Saddr: v6addr(p.Addr())}
}

// twin is an IPv4 map and its IPv6 twin: an entry goes to one or the
// other by the family of its address. to6 converts an IPv4 map's entry,
// encoded without the address, into the twin's.
type twin[K4, V4, K6, V6 any] struct {
	m4, m6       *ebpf.Map
	name4, name6 string
	to6          func(k K4, v V4, a netip.Addr) (K6, V6)
}

// put writes k -> v, for address a, into its family's map; an error
// names the map.
func (t twin[K4, V4, K6, V6]) put(a netip.Addr, k K4, v V4) error {
	m, name := t.m4, t.name4
	var err error
	if is6(a) {
		m, name = t.m6, t.name6
		k6, v6 := t.to6(k, v, a)
		err = m.Put(&k6, &v6)
	} else {
		err = m.Put(&k, &v)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", name, whenFull(m, err))
	}
	return nil
}

// del deletes k, for address a, from its family's map; deleting a
// missing entry succeeds.
func (t twin[K4, V4, K6, V6]) del(a netip.Addr, k K4) error {
	if is6(a) {
		var v V4
		k6, _ := t.to6(k, v, a)
		return deleteIgnoringMissing(t.m6, &k6)
	}
	return deleteIgnoringMissing(t.m4, &k)
}

// upsert encodes entries with enc and writes them in order, each run of
// entries of one family in one batch into its map (upsertBatch). addr
// gives an entry's address.
func upsertTwin[E, K4, V4, K6, V6 any](t twin[K4, V4, K6, V6], es []E, addr func(E) netip.Addr, enc func(E) (K4, V4, error)) (int, error) {
	done := 0
	for done < len(es) {
		v6 := is6(addr(es[done]))
		end := done + 1
		for end < len(es) && is6(addr(es[end])) == v6 {
			end++
		}
		var n int
		var err error
		if v6 {
			n, err = upsertBatch(t.m6, t.name6, done, len(es), es[done:end], func(e E) (K6, V6, error) {
				k, v, err := enc(e)
				k6, v6 := t.to6(k, v, addr(e))
				return k6, v6, err
			})
		} else {
			n, err = upsertBatch(t.m4, t.name4, done, len(es), es[done:end], enc)
		}
		done += n
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

// eachBackend calls f with every backend of the backends map m of a
// family (nil: none): the present entries of the array (eachArrayEntry,
// presentEntry), or every entry of the previous release's hash.
func eachBackend[V any](m *ebpf.Map, name string, f func(id *uint32, v *V)) error {
	return eachBackendWhile(m, name, func(id *uint32, v *V) bool { f(id, v); return true })
}

// eachBackendWhile is eachBackend until f returns false.
func eachBackendWhile[V any](m *ebpf.Map, name string, f func(id *uint32, v *V) bool) error {
	if m == nil || m.Type() != ebpf.Array {
		return eachEntryWhile(m, name, f)
	}
	var key uint32 // outside the closure: &id would be made anew for each entry
	var v V
	err := eachArrayEntry(m, func(id uint32, b []byte) error {
		if !presentEntry(b) {
			return nil
		}
		if _, err := binary.Decode(b, binary.NativeEndian, &v); err != nil {
			return fmt.Errorf("entry %d: %w", id, err)
		}
		key = id
		if !f(&key, &v) {
			return errStopWalk
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStopWalk) {
		return fmt.Errorf("dump %s: %w", name, err)
	}
	return nil
}

// errStopWalk stops eachArrayEntry when its caller has read enough.
var errStopWalk = errors.New("walk stopped")

// eachArrayEntry calls f with the value of every entry of the array m
// (BPF_F_MMAPABLE) that is not all zero, read through read-only mappings
// of its memory: a scan, where batch lookups of the two backends arrays
// of the default size (525,313 entries each) take 0.3-0.4 s. A map opened
// read-only (OpenPinned) cannot be mapped (the kernel wants a shared
// mapping, which a read-only descriptor does not give): it is read with
// batch lookups. An entry that a write changes meanwhile may be read half
// old, half new, as by any reader.
//
// The array is mapped a window (arrayWindow) at a time: every page read
// through a mapping counts in the agent's RSS for as long as it is mapped,
// and a scan reads them all (4 and 12 MiB for the two backends arrays at
// the default size, 76 MiB together at 1,000,000 backends), at each
// scrape of the metrics (countPresent) as at the refresh of the view. So
// a scan adds at most a window (1 MiB) to the RSS, not the array (issue
// 14).
func eachArrayEntry(m *ebpf.Map, f func(k uint32, v []byte) error) error {
	a := layoutOf(m)
	zero := make([]byte, a.size)
	mapped, err := eachArrayWindow(m, func(mem []byte, first, count int) error {
		return eachWindowEntry(mem, first, count, a.stride, a.size, zero, f)
	})
	if !mapped {
		return eachArrayBatch(m, f)
	}
	return err
}

// eachArrayWindow gives f each window of the array m (arrayLayout.window,
// read-only; the entries first to first+count-1), one after another,
// unmapping each before the next is mapped, until f fails. It says false,
// having called nothing, for an array whose first window cannot be mapped
// (not BPF_F_MMAPABLE): the caller reads it otherwise.
func eachArrayWindow(m *ebpf.Map, f func(mem []byte, first, count int) error) (bool, error) {
	a := layoutOf(m)
	for first := 0; first < a.n; first += a.per {
		count := min(a.per, a.n-first)
		mem, err := a.window(m, first/a.per)
		if err != nil {
			if first == 0 {
				return false, nil
			}
			return true, fmt.Errorf("map entries %d-%d: %w", first, first+count-1, err)
		}
		err = f(mem, first, count)
		_ = unix.Munmap(mem) // only fails for a bad range
		if err != nil {
			return true, err
		}
	}
	return true, nil
}

// eachWindowEntry calls f with the entries first to first+count-1, not all
// zero, of mem, their window (arrayLayout.window).
func eachWindowEntry(mem []byte, first, count, stride, size int, zero []byte, f func(k uint32, v []byte) error) error {
	for i := range count {
		v := mem[i*stride : i*stride+size]
		if bytes.Equal(v, zero) {
			continue
		}
		if err := f(uint32(first+i), v); err != nil {
			return err
		}
	}
	return nil
}

// arrayWindow is about how many bytes of an array eachArrayEntry maps at
// a time: 16 mappings for the two backends arrays at the default size (a
// 64 KiB window, 256 of them, made a scrape's count of them 1.3-2 times
// as long on a loaded machine).
const arrayWindow = 1 << 20

// windowEntries returns how many entries of stride bytes a window holds:
// a multiple of the entries of a whole number of pages (a mapping starts
// at a page), about arrayWindow bytes.
func windowEntries(stride int) int {
	page := os.Getpagesize()
	unit := page / gcd(page, stride) // entries that fill whole pages
	return unit * max(1, arrayWindow/(unit*stride))
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// arrayLayout is how an array's values lie in its memory, and the windows
// it is mapped in: n entries of size bytes, each at a stride of size
// rounded up to 8, per entries a window (windowEntries).
type arrayLayout struct{ n, size, stride, per int }

func layoutOf(m *ebpf.Map) arrayLayout {
	size := int(m.ValueSize())
	stride := (size + 7) &^ 7
	return arrayLayout{n: int(m.MaxEntries()), size: size, stride: stride, per: windowEntries(stride)}
}

// window maps window w of the array m (its entries w*per on, per of them
// or to the end), read-only; it starts at a page.
func (a arrayLayout) window(m *ebpf.Map, w int) ([]byte, error) {
	page := os.Getpagesize()
	count := min(a.per, a.n-w*a.per)
	return mmapArray(m.FD(), int64(w*a.per*a.stride), (count*a.stride+page-1)&^(page-1), unix.PROT_READ, unix.MAP_SHARED)
}

// mmapArray is unix.Mmap; tests see the mappings through it.
var mmapArray = unix.Mmap

// arrayValues reads the entries of keys of the array m into values,
// through mappings of its memory (BPF_F_MMAPABLE), or with lookups where
// it cannot be mapped. The keys are read in order, each window
// (arrayWindow) that holds some mapped once: a mapping of the whole array
// would put all of it in the RSS (its pages are mapped when it is), for
// the few entries a delete of backends clears in each family's array.
func arrayValues[V any](m *ebpf.Map, keys []uint32, values []V) error {
	if len(keys) == 0 {
		return nil
	}
	a := layoutOf(m)
	order := make([]int, len(keys))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(keys[a], keys[b]) })
	var mem []byte
	defer func() {
		if mem != nil {
			_ = unix.Munmap(mem) // only fails for a bad range
		}
	}()
	window := -1
	for _, i := range order {
		k := int(keys[i])
		if k >= a.n {
			return fmt.Errorf("entry %d: beyond the array's %d", k, a.n)
		}
		if w := k / a.per; w != window {
			if mem != nil {
				_ = unix.Munmap(mem)
				mem = nil
			}
			var err error
			if mem, err = a.window(m, w); err != nil {
				if window < 0 {
					return lookupValues(m, keys, values)
				}
				return fmt.Errorf("map entry %d: %w", k, err)
			}
			window = w
		}
		off := (k - window*a.per) * a.stride
		if _, err := binary.Decode(mem[off:off+a.size], binary.NativeEndian, &values[i]); err != nil {
			return fmt.Errorf("entry %d: %w", k, err)
		}
	}
	return nil
}

// lookupValues is arrayValues with lookups.
func lookupValues[V any](m *ebpf.Map, keys []uint32, values []V) error {
	for i, k := range keys {
		if err := m.Lookup(k, &values[i]); err != nil {
			return fmt.Errorf("entry %d: %w", k, err)
		}
	}
	return nil
}

// eachArrayBatch is eachArrayEntry with batch lookups.
func eachArrayBatch(m *ebpf.Map, f func(k uint32, v []byte) error) error {
	const batch = 4096
	// Values as a slice of byte arrays of the map's value size: the
	// batch API wants one element per entry.
	size := int(m.ValueSize())
	keys := make([]uint32, batch)
	values := reflect.MakeSlice(reflect.SliceOf(reflect.ArrayOf(size, reflect.TypeFor[byte]())), batch, batch)
	zero := make([]byte, size)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cursor, keys, values.Interface(), nil)
		for i := range n {
			v := values.Index(i).Bytes()
			if bytes.Equal(v, zero) {
				continue
			}
			if err := f(keys[i], v); err != nil {
				return err
			}
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read entries: %w", err)
		}
	}
}

// eachEntry calls f with every entry of m (nil: none, a map an older agent
// did not pin).
func eachEntry[K, V any](m *ebpf.Map, name string, f func(k *K, v *V)) error {
	return eachEntryWhile(m, name, func(k *K, v *V) bool { f(k, v); return true })
}

// eachEntryWhile is eachEntry until f returns false.
func eachEntryWhile[K, V any](m *ebpf.Map, name string, f func(k *K, v *V) bool) error {
	if m == nil {
		return nil
	}
	if m.Type() == ebpf.Hash || m.Type() == ebpf.LRUHash {
		done, err := eachBatchWhile(m, f)
		if done || err != nil {
			if err != nil {
				return fmt.Errorf("dump %s: %w", name, err)
			}
			return nil
		}
	}
	var k K
	var v V
	it := m.Iterate()
	for it.Next(&k, &v) {
		if !f(&k, &v) {
			return nil
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("dump %s: %w", name, err)
	}
	return nil
}

// entryBatch is how many entries eachBatchWhile reads at once.
const entryBatch = 4096

// eachBatchWhile is eachEntryWhile over a hash map, read with batch
// lookups (BPF_MAP_LOOKUP_BATCH) into buffers it reuses: a system call per
// entryBatch entries where an iteration makes two per entry (at 30,000
// Services x 10, the service map's 330,000 entries are most of the
// reconciler's periodic re-read). It reports false, with no error, if
// the kernel cannot read m in batches before it read anything: the caller
// iterates instead.
func eachBatchWhile[K, V any](m *ebpf.Map, f func(k *K, v *V) bool) (bool, error) {
	keys := make([]K, entryBatch)
	values := make([]V, entryBatch)
	var cursor ebpf.MapBatchCursor
	for first := true; ; first = false {
		n, err := m.BatchLookup(&cursor, keys, values, nil)
		if first && n == 0 && err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return false, nil
		}
		for i := range n {
			if !f(&keys[i], &values[i]) {
				return true, nil
			}
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return true, nil
		}
		if err != nil {
			return true, fmt.Errorf("read entries: %w", err)
		}
	}
}
