package datapath

import (
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// What an operator asks of the loaded datapath besides its counters: how
// full each pinned map is and what each program costs. Both are read when
// asked (a Prometheus scrape, sluicectl status), never polled.
//
// The programs and maps are found by reflection over the bpf2go objects
// (their `ebpf:"name"` tags), so a program or map added in C is measured
// and counted with no change here, like a new counter reason (abi.go).

// EnableStats turns on the kernel's run count and run time accounting of
// every BPF program (BPF_ENABLE_STATS with BPF_STATS_RUN_TIME) for as long
// as the returned Closer is open; the agent holds it for its life. The
// accounting is system wide and costs two clock reads per program run,
// which is why the kernel leaves it off until someone asks.
func EnableStats() (io.Closer, error) {
	c, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		return nil, fmt.Errorf("enable BPF program statistics: %w", err)
	}
	return c, nil
}

// ProgramStats is what one program has cost since it was loaded (by this
// agent: a restart loads new programs and their counts start at zero).
// Both are zero while statistics are off (EnableStats).
type ProgramStats struct {
	Name    string        // its name in the BPF object (the C function), e.g. sluice_ingress
	Runs    uint64        // run_cnt: times it ran
	RunTime time.Duration // run_time_ns: time spent running it, summed over CPUs
}

// ProgramStats returns the run count and run time of every program the
// datapath loaded, sorted by name.
func (d *Datapath) ProgramStats() ([]ProgramStats, error) {
	progs := objectsOf[*ebpf.Program](&d.sock, &d.tc, &d.xdp, &d.gc)
	out := make([]ProgramStats, 0, len(progs))
	for _, name := range sortedKeys(progs) {
		st, err := progs[name].Stats()
		if err != nil {
			return nil, fmt.Errorf("statistics of program %s: %w", name, err)
		}
		out = append(out, ProgramStats{Name: name, Runs: st.RunCount, RunTime: st.Runtime})
	}
	return out, nil
}

// MapFill is how full one pinned map is.
type MapFill struct {
	// Name is the map's name without the sluice_ prefix and the layout
	// version (conntrack for sluice_conntrack_v2), as sluice_map_fill_ratio
	// names them; Pin is its pin's file name.
	Name, Pin string
	Type      string // the kernel's map type: Hash, LRUHash, LPMTrie, ...
	Entries   int    // entries now
	Capacity  int    // max_entries
	// Bytes is the kernel's estimate of the memory the map holds (its
	// memlock): for a preallocated map (the service maps too with
	// Config.PreallocateMaps), its buckets and what max_entries cost;
	// for one that allocates as it grows (BPF_F_NO_PREALLOC: the service
	// maps by default), its buckets and what its entries cost now
	// (TestPreallocatedMapsMemory). Kernels before 6.4 estimate every
	// map from max_entries, preallocated or not.
	Bytes uint64
}

// MapFill counts the entries of every hash-like map the datapath shares
// (arrays are always full and have no fill, but for the backends arrays,
// whose fill is their present entries of MaxBackends, and the reverse-NAT
// arrays, theirs of MaxServices, both counted by the agent's tables as
// it writes them: knownEntries), sorted by name. The hash
// maps' counts are the kernel's own, read by one run of a map iterator
// (mapcount.go, Features.MapCount) whatever the maps hold; the LPM tries
// (source ranges, CIDRs: small), and every map on a kernel without the
// kfunc, are walked with batch lookups, a few thousand entries per system
// call, at a cost in proportion to the entries: 115 ms for a full
// conntrack table of 262144 entries (BenchmarkCountFullConntrack, on a
// 2-core VM).
func (d *Datapath) MapFill() ([]MapFill, error) {
	var counts map[ebpf.MapID]int
	if d.counter != nil {
		var err error
		if counts, err = d.counter.counts(); err != nil {
			return nil, err
		}
	}
	return mapFill(objectsOf[*ebpf.Map](&d.sock, &d.tc, &d.xdp, &d.gc), counts, d.knownEntries())
}

// knownEntries returns the entries the agent's tables know of the arrays
// it writes (by pin name), which a scrape then need not walk:
//   - of each slots array, the slots in use, the sum of its masters'
//     counts, which its table keeps (slotTable.inUse), where counting the
//     entries not empty read every mapped window of both arrays, 12-15 ms
//     of a scrape at the default sizes (fifty-first pass);
//   - of each backends and reverse-NAT array, its present entries, which
//     its table counts as it writes them (beTable.presentCount), where
//     the walk read every entry of arrays sized by --max-backends and
//     --max-services (sixty-sixth pass); not where a write went around
//     the table since its last count.
func (d *Datapath) knownEntries() map[string]int {
	if d.maps == nil {
		return nil
	}
	out := map[string]int{}
	for pin, t := range map[string]*slotTable{mapSlots: d.maps.slots4, mapSlots6: d.maps.slots6} {
		if n, ok := t.inUse(); ok {
			out[pin] = n
		}
	}
	for pin, t := range map[string]*beTable{mapBackends: d.maps.be4, mapBackends6: d.maps.be6,
		mapRevNat: d.maps.rn4, mapRevNat6: d.maps.rn6} {
		if n, ok := t.presentCount(); ok {
			out[pin] = n
		}
	}
	return out
}

// mapFill counts the entries of the hash-like maps of maps (by pin name):
// from counts (the kernel's, by map id) where it has the map, else by
// walking it; a slots, backends or reverse-NAT array's from known (by pin
// name) where it has it, else its entries not empty or present.
func mapFill(maps map[string]*ebpf.Map, counts map[ebpf.MapID]int, known map[string]int) ([]MapFill, error) {
	var out []MapFill
	for _, pin := range sortedKeys(maps) {
		m := maps[pin]
		backends := pin == mapBackends || pin == mapBackends6
		revNat := pin == mapRevNat || pin == mapRevNat6
		isSlots := pin == mapSlots || pin == mapSlots6
		if !countable(m.Type()) && !backends && !revNat && !isSlots {
			continue
		}
		info, err := m.Info()
		if err != nil {
			return nil, fmt.Errorf("information of map %s: %w", pin, err)
		}
		n, ok := known[pin]
		capacity := int(m.MaxEntries())
		if backends {
			if !ok {
				n, err = countEntries(m)
			}
			// Its entries are every id; a family holds fewer.
			capacity = (capacity - reconciler.BackendIDQuarantine - 1) / 2
		} else if revNat {
			// Its entries are every service id (serviceSlots): the
			// services it holds, of the --max-services of both
			// families.
			if !ok {
				n, err = countEntries(m)
			}
			capacity -= reconciler.ServiceIDQuarantine + 1
		} else if isSlots {
			// The slots in use: the masters' counts (or the entries
			// not empty), of the --max-service-entries the array is
			// twice the size of (slotEntries), so that its fill
			// ratio says how near the reconciler's bound the slots
			// are.
			if !ok {
				n, err = countSlots(m)
			}
			capacity /= 2
		} else {
			n, err = countFrom(m, info, counts)
		}
		if err != nil {
			return nil, fmt.Errorf("count entries of %s: %w", pin, err)
		}
		bytes, _ := info.Memlock() // 0: the kernel does not say
		out = append(out, MapFill{Name: shortMapName(pin), Pin: pin, Type: m.Type().String(),
			Entries: n, Capacity: capacity, Bytes: bytes})
	}
	return out, nil
}

// countable says whether a map of type t has a fill: the hash maps do;
// arrays always hold max_entries entries.
func countable(t ebpf.MapType) bool {
	switch t {
	case ebpf.Hash, ebpf.LRUHash, ebpf.PerCPUHash, ebpf.LRUCPUHash, ebpf.LPMTrie:
		return true
	}
	return false
}

// countFrom returns the number of entries in m (described by info): the
// kernel's count of it in counts, if m is a hash map (hasElemCount) and
// counts has it, else walking it.
func countFrom(m *ebpf.Map, info *ebpf.MapInfo, counts map[ebpf.MapID]int) (int, error) {
	if counts != nil && hasElemCount(m.Type()) {
		if id, ok := info.ID(); ok {
			if n, ok := counts[id]; ok {
				return n, nil
			}
		}
	}
	return countEntries(m)
}

// countBatch is how many entries one batch lookup returns at most. A hash
// bucket bigger than this would fail the batch with ENOSPC; buckets hold a
// handful.
const countBatch = 4096

// countEntries returns the number of entries in m: batch lookups where the
// kernel has them for the map's type (hashes), else one key at a time
// (LPM tries, whose keys only are read). Of an array (Sluice's only ones,
// the backends maps), the present entries.
func countEntries(m *ebpf.Map) (int, error) {
	switch m.Type() {
	case ebpf.Array:
		return countPresent(m)
	case ebpf.LPMTrie:
		return countByKey(m)
	case ebpf.PerCPUHash, ebpf.LRUCPUHash:
		// Their values are per CPU; none of Sluice's maps is one.
		return countByKey(m)
	}
	// Keys and values as slices of byte arrays of the map's sizes: the
	// batch API wants slices with one element per entry.
	byteArray := func(n uint32) reflect.Type { return reflect.ArrayOf(int(n), reflect.TypeFor[byte]()) }
	batch := min(countBatch, int(m.MaxEntries()))
	keys := reflect.MakeSlice(reflect.SliceOf(byteArray(m.KeySize())), batch, batch).Interface()
	values := reflect.MakeSlice(reflect.SliceOf(byteArray(m.ValueSize())), batch, batch).Interface()
	var cursor ebpf.MapBatchCursor
	total := 0
	for {
		n, err := m.BatchLookup(&cursor, keys, values, nil)
		total += n
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return total, nil
		}
		if err != nil {
			return 0, err
		}
	}
}

// countPresent counts the present entries (BE_F_PRESENT, RN_F_PRESENT) of a
// backends or reverse-NAT array.
func countPresent(m *ebpf.Map) (int, error) {
	flags := int(m.ValueSize()) - 1 // the flags byte (presentEntry)
	return countArray(m, func(v []byte) bool { return presentEntry(v) }, func(win []byte, stride, count int) int {
		n := 0
		for i := range count {
			if win[i*stride+flags]&bePresent != 0 {
				n++
			}
		}
		return n
	})
}

// countSlots counts the entries of a slots array that name a backend.
func countSlots(m *ebpf.Map) (int, error) {
	return countArray(m, func([]byte) bool { return true }, func(win []byte, stride, count int) int {
		// The __u32 of each 8-byte entry, as a word in native order.
		words := unsafe.Slice((*uint32)(unsafe.Pointer(unsafe.SliceData(win))), len(win)/4)
		n := 0
		for i := range count {
			if words[i*stride/4] != 0 {
				n++
			}
		}
		return n
	})
}

// countArray counts the entries of the array m that count says are in
// use, a window of its mapped memory at a time (eachArrayWindow), each
// entry's value at a stride in it: a loop over the memory, where
// eachArrayEntry's call per entry and comparison with zero made a scrape
// of the metrics at 30,000 Services x 10 cost 32 ms of CPU against 12
// before the slots arrays (issue 14). An array that cannot be mapped is
// read in batches (eachArrayBatch), each value not all zero given to
// inUse.
func countArray(m *ebpf.Map, inUse func(v []byte) bool, count func(win []byte, stride, count int) int) (int, error) {
	stride := layoutOf(m).stride
	n := 0
	mapped, err := eachArrayWindow(m, func(mem []byte, _, c int) error {
		n += count(mem, stride, c)
		return nil
	})
	if !mapped {
		err = eachArrayBatch(m, func(_ uint32, v []byte) error {
			if inUse(v) {
				n++
			}
			return nil
		})
	}
	if err != nil {
		return 0, err
	}
	return n, nil
}

// presentEntry says whether v, the value of a backends or reverse-NAT
// array's entry, is held (BE_F_PRESENT, RN_F_PRESENT: the same bit):
// flags is the value's last byte in both families (structs.h).
func presentEntry(v []byte) bool { return v[len(v)-1]&bePresent != 0 }

// The build fails if Flags stops being the last byte of any of the values.
var (
	_ = [1]struct{}{}[unsafe.Sizeof(sockLb4Backend{})-1-unsafe.Offsetof(sockLb4Backend{}.Flags)]
	_ = [1]struct{}{}[unsafe.Sizeof(sockLb6Backend{})-1-unsafe.Offsetof(sockLb6Backend{}.Flags)]
	_ = [1]struct{}{}[unsafe.Sizeof(sockLb4RevNat{})-1-unsafe.Offsetof(sockLb4RevNat{}.Flags)]
	_ = [1]struct{}{}[unsafe.Sizeof(sockLb6RevNat{})-1-unsafe.Offsetof(sockLb6RevNat{}.Flags)]
)

// countByKey counts m's entries by walking its keys.
func countByKey(m *ebpf.Map) (int, error) {
	key := make([]byte, m.KeySize())
	next := make([]byte, m.KeySize())
	n := 0
	var prev any // nil: the first key
	for {
		err := m.NextKey(prev, &next)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return n, nil
		}
		if err != nil {
			return 0, err
		}
		n++
		copy(key, next)
		prev = key
	}
}

// shortMapName is a pin name without the sluice_ prefix and the _vN layout
// version: sluice_conntrack_v2 is conntrack. An IPv6 twin's name ends in
// 6: sluice6_services_v1 is services6.
func shortMapName(pin string) string {
	s, v6 := strings.CutPrefix(pin, "sluice6_")
	if !v6 {
		s = strings.TrimPrefix(pin, "sluice_")
	}
	if i := strings.LastIndex(s, "_v"); i > 0 && i+2 < len(s) && strings.Trim(s[i+2:], "0123456789") == "" {
		s = s[:i]
	}
	if v6 {
		s += "6"
	}
	return s
}

// objectsOf collects the fields of type T (*ebpf.Map or *ebpf.Program) of
// bpf2go objects, by their `ebpf` tag: the name in the BPF object, and for
// a map its pin's name. The objects declare the maps they share alike
// (TestObjectsShareMaps), so a map named twice is one map; the first
// object's handle is kept.
func objectsOf[T any](objs ...any) map[string]T {
	out := map[string]T{}
	var walk func(v reflect.Value)
	walk = func(v reflect.Value) {
		t := v.Type()
		for i := range t.NumField() {
			f, fv := t.Field(i), v.Field(i)
			if f.Anonymous && fv.Kind() == reflect.Struct {
				walk(fv)
				continue
			}
			name := f.Tag.Get("ebpf")
			x, ok := fv.Interface().(T)
			if !ok || name == "" || fv.IsNil() {
				continue
			}
			if _, seen := out[name]; !seen {
				out[name] = x
			}
		}
	}
	for _, o := range objs {
		walk(reflect.ValueOf(o).Elem())
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
