package datapath

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"unsafe"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// TestBeTableFlagsWordLast: what a program can read of an entry at each
// of the agent's stores (the words as they are just before it, and after
// the last) is absent, or present and whole: the old value or the new
// one, never a present entry of mixed words. A new entry's flags word is
// its last store; a present entry given another value is made absent
// first; the same value again stores nothing; a delete stores the flags
// word only, the rest kept. Per family (lb4_backend in 2 words,
// lb6_backend in 5 of a 6-word stride). Fails with the flags word stored
// first, or with a present entry rewritten without being made absent.
func TestBeTableFlagsWordLast(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		size, stride := int(unsafe.Sizeof(sockLb4Backend{})), 8
		if v6 {
			size, stride = int(unsafe.Sizeof(sockLb6Backend{})), 24
		}
		const n, id = 8, 5
		tbl := newBeTable(mappedMemory(make([]byte, n*stride)), size, n)
		entry := func() []uint32 {
			return slices.Clone(tbl.words[id*tbl.stride : id*tbl.stride+tbl.last+1])
		}
		enc := func(a string, port uint16) []uint32 {
			_, v, err := backendEntry(id, l4(twinAddr(v6, a), port, model.TCP))
			if err != nil {
				t.Fatal(err)
			}
			if v6 {
				v6v := lb6Backend(v, addr(twinAddr(v6, a)))
				return slices.Clone(valueWords(&v6v))
			}
			return slices.Clone(valueWords(&v))
		}
		present := func(w []uint32) bool { return w[len(w)-1]&bePresentWord != 0 }
		// write runs f and checks every state a reader may see.
		write := func(what string, old, want []uint32, f func()) (stores []int) {
			t.Helper()
			check := func(at string) {
				got := entry()
				if present(got) && !slices.Equal(got, want) && !(old != nil && slices.Equal(got, old)) {
					t.Errorf("%s, %s: a reader sees a present entry %x, neither the old %x nor the new %x", what, at, got, old, want)
				}
			}
			tbl.onStore = func(w int) {
				check(fmt.Sprintf("before store %d (word %d)", len(stores)+1, w-id*tbl.stride))
				stores = append(stores, w-id*tbl.stride)
			}
			f()
			tbl.onStore = nil
			check("after")
			return stores
		}

		a := enc("10.1.2.3", 8080)
		stores := write("new entry", nil, a, func() { must(t, tbl.put(id, a)) })
		if len(stores) != tbl.last+1 || stores[len(stores)-1] != tbl.last {
			t.Errorf("new entry: stores to words %v, want each word once, the flags word (%d) last", stores, tbl.last)
		}
		if got := entry(); !slices.Equal(got, a) {
			t.Fatalf("new entry: %x, want %x", got, a)
		}
		if stores := write("same entry again", a, a, func() { must(t, tbl.put(id, a)) }); len(stores) != 0 {
			t.Errorf("the same entry again stored words %v, want none", stores)
		}
		b := enc("10.9.8.7", 9090)
		stores = write("another address", a, b, func() { must(t, tbl.put(id, b)) })
		if len(stores) == 0 || stores[0] != tbl.last || stores[len(stores)-1] != tbl.last {
			t.Errorf("another address: stores to words %v, want the flags word first (made absent) and last", stores)
		}
		gone := slices.Clone(b)
		gone[tbl.last] &^= bePresentWord
		stores = write("delete", b, gone, func() { must(t, tbl.clear(id)) })
		if !slices.Equal(stores, []int{tbl.last}) || !slices.Equal(entry(), gone) {
			t.Errorf("delete: stores %v, entry %x; want the flags word only, entry %x", stores, entry(), gone)
		}
		if stores := write("delete again", nil, gone, func() { must(t, tbl.clear(id)) }); len(stores) != 0 {
			t.Errorf("deleting an absent entry stored words %v", stores)
		}
		must(t, tbl.clear(n+3)) // beyond the array: nothing
	})
}

// TestBackendsWrittenAsMemory: the backends arrays are mapped and a
// backend written (batch and single) goes into the array's memory, not
// through a system call, and the programs read it: new flows of a
// frontend reach its backends. A deleted backend is absent to them (a
// new flow that picks its slot is dropped, the others reach the other
// backend) while its entry keeps its address with BE_F_PRESENT cleared.
// Per family. Fails without the mapping (no store seen), or with stores
// the programs do not read (a wrong stride).
func TestBackendsWrittenAsMemory(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		d := newTestDatapath(t)
		m := d.Maps()
		tbl := m.beTableOf(v6)
		if !m.beMapped() || tbl == nil {
			t.Fatalf("backends arrays not mapped: %v %v", m.be4, m.be6)
		}
		stores := 0
		tbl.onStore = func(int) { stores++ }
		fe := twinL4(v6, vipTCP)
		b1 := testBackend{701, l4(twinAddr(v6, "10.1.7.1"), 8080, model.TCP)}
		b2 := testBackend{702, l4(twinAddr(v6, "10.1.7.2"), 8080, model.TCP)}
		if n, err := m.UpsertBackends([]reconciler.BackendEntry{{ID: b1.id, Addr: b1.addr}}); n != 1 || err != nil {
			t.Fatalf("UpsertBackends: %d, %v", n, err)
		}
		addService(t, m, 7, fe, b1, b2) // UpsertBackend for each
		if want := 2 * (tbl.last + 1); stores != want {
			t.Errorf("%d stores into the mapped array, want %d (two new entries; b1 again: none)", stores, want)
		}
		var sport uint16 = 31000
		newFlows(t, d, v6, fe, &sport, 16, map[string]bool{b1.addr.Addr.String(): true, b2.addr.Addr.String(): true}, "both written")
		seen := map[string]bool{}
		for range 32 {
			sport++
			_, out := runProg(t, d.TCIngress(), tcpSYN(twinAddr(v6, "10.0.0.2"), sport, fe.Addr.String(), fe.Port).Bytes())
			seen[outDst(out)] = true
		}
		if !seen[b1.addr.Addr.String()] || !seen[b2.addr.Addr.String()] {
			t.Errorf("32 new flows reached %v, want both backends", seen)
		}

		stores = 0
		must(t, m.DeleteBackend(b1.id))
		if stores != 1 {
			t.Errorf("delete: %d stores, want 1 (the flags word)", stores)
		}
		// The slot still names b1 (the reconciler empties it first): a
		// new flow that picks it finds no backend and is dropped.
		verdicts := map[uint32]int{}
		seen = map[string]bool{}
		for range 32 {
			sport++
			v, out := runProg(t, d.TCIngress(), tcpSYN(twinAddr(v6, "10.0.0.2"), sport, fe.Addr.String(), fe.Port).Bytes())
			verdicts[v]++
			if v == tcActOK {
				seen[outDst(out)] = true
			}
		}
		if seen[b1.addr.Addr.String()] || !seen[b2.addr.Addr.String()] || verdicts[tcActOK] == 32 {
			t.Errorf("after b1's delete 32 new flows: verdicts %v, reached %v; want b2 only, b1's dropped", verdicts, seen)
		}
		var flags uint8
		var got netip.Addr
		var port uint16
		if v6 {
			var v sockLb6Backend
			must(t, m.backends6.Lookup(uint32(b1.id), &v))
			got, port, flags = netip.AddrFrom16(v.Addr.Addr), v.Port, v.Flags
		} else {
			var v sockLb4Backend
			must(t, m.backends.Lookup(uint32(b1.id), &v))
			got, port, flags = addrFromBE32(v.Addr), v.Port, v.Flags
		}
		if got != b1.addr.Addr || port != be16(8080) || flags != 0 {
			t.Errorf("deleted entry: %s port %d flags %d; want %s, %d kept, flags 0", got, portFromBE16(port), flags, b1.addr.Addr, 8080)
		}
		ks := mustDump(t, m)
		if _, ok := ks.Backends[b1.id]; ok || len(ks.Backends) != 1 {
			t.Errorf("after the delete Dump has backends %v, want %d only", ks.Backends, b2.id)
		}
	})
}

// TestBackendsUnmappableArray: an array without BPF_F_MMAPABLE (pins
// of an older agent) is not mapped, and its backends are written and
// deleted with system calls as before. Fails without the check (the
// mapping fails and Open with it).
func TestBackendsUnmappableArray(t *testing.T) {
	testutil.Privileged(t)
	arr, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 64})
	must(t, err)
	defer arr.Close()
	m := &Maps{backends: arr}
	must(t, m.openBeTables())
	t.Cleanup(func() { must(t, m.closeBeTables()) })
	if m.be4 != nil || m.beMapped() {
		t.Fatal("an array without BPF_F_MMAPABLE was mapped")
	}
	b := testBackend{9, l4("10.1.9.9", 8080, model.TCP)}
	if n, err := m.UpsertBackends([]reconciler.BackendEntry{{ID: b.id, Addr: b.addr}}); n != 1 || err != nil {
		t.Fatalf("UpsertBackends: %d, %v", n, err)
	}
	var v sockLb4Backend
	must(t, arr.Lookup(uint32(b.id), &v))
	if v.Addr != be32(b.addr.Addr) || v.Flags != bePresent {
		t.Fatalf("entry %+v, want %s present", v, b.addr)
	}
	must(t, m.DeleteBackend(b.id))
	must(t, arr.Lookup(uint32(b.id), &v))
	if v.Addr != be32(b.addr.Addr) || v.Flags != 0 {
		t.Fatalf("deleted entry %+v, want %s kept, absent", v, b.addr)
	}
}

// TestUpsertBackendsMemAllocatesNothing: writing backends into a mapped
// array allocates nothing per backend, either family (a first program
// writes 300,000). Fails with the system call's fallback in the loop
// itself: the key and value it takes the address of went to the heap
// for every backend, mapped or not.
func TestUpsertBackendsMemAllocatesNothing(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		size, stride := int(unsafe.Sizeof(sockLb4Backend{})), 8
		if v6 {
			size, stride = int(unsafe.Sizeof(sockLb6Backend{})), 24
		}
		const n = 64
		tbl := newBeTable(mappedMemory(make([]byte, n*stride)), size, n)
		m := &Maps{be4: tbl}
		if v6 {
			m.be4, m.be6 = nil, tbl
		}
		// Two sets of the same ids, told apart by their port, written
		// in turn: every run rewrites every entry.
		var es [2][]reconciler.BackendEntry
		for s := range es {
			for i := range n - 1 {
				es[s] = append(es[s], reconciler.BackendEntry{ID: reconciler.BackendID(i + 1),
					Addr: l4(twinAddr(v6, fmt.Sprintf("10.1.0.%d", i+1)), 8080+uint16(s), model.TCP)})
			}
		}
		run := 0
		allocs := testing.AllocsPerRun(20, func() {
			if k, err := m.upsertBackendsMem(es[run%2]); err != nil || k != n-1 {
				t.Fatalf("upsertBackendsMem: %d of %d, %v", k, n-1, err)
			}
			run++
		})
		if allocs != 0 {
			t.Errorf("upsertBackendsMem of %d backends: %.0f allocations, want none", n-1, allocs)
		}
		want := es[(run-1)%2][n-2]
		_, v, err := backendEntry(want.ID, want.Addr)
		if err != nil {
			t.Fatal(err)
		}
		w := valueWords(&v)
		if v6 {
			v6v := lb6Backend(v, want.Addr.Addr)
			w = valueWords(&v6v)
		}
		if got := tbl.words[int(want.ID)*tbl.stride : int(want.ID)*tbl.stride+tbl.last+1]; !slices.Equal(got, w) {
			t.Errorf("entry %d: %x, want %x", want.ID, got, w)
		}
	})
}

// beTableOf is the backends table of IPv6's family if v6, else IPv4's.
func (m *Maps) beTableOf(v6 bool) *beTable {
	if v6 {
		return m.be6
	}
	return m.be4
}
