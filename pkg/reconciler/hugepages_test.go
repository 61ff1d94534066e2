package reconciler

import (
	"runtime"
	"testing"
	"unsafe"
)

// TestPackedMapHugeArrays: a table of at least 2 MiB an array (the
// backends' at 30,000 Services x 10) has its keys and values on 2 MiB
// boundaries (hugepages_linux.go), zeroed, as long as asked; a table
// grown into that size from a small one, and one of pointer values
// through a collection, hold what a Go map does.
func TestPackedMapHugeArrays(t *testing.T) {
	const n = 300_000 // 450,000 slots: 3.6 MB of keys, 1.8 MB of values
	m := makePackedMap[uint32](n)
	aligned := func(p unsafe.Pointer) bool { return uintptr(p)%hugePage == 0 }
	if runtime.GOOS == "linux" && (!aligned(unsafe.Pointer(&m.keys[0])) || !aligned(unsafe.Pointer(&m.vals[0]))) {
		t.Fatalf("keys at %p, values at %p: not on 2 MiB boundaries", &m.keys[0], &m.vals[0])
	}
	if len(m.keys) != n+n/2 || cap(m.keys) != len(m.keys) || len(m.vals) != len(m.keys) || cap(m.vals) != len(m.vals) {
		t.Fatalf("keys %d/%d, values %d/%d, want %d", len(m.keys), cap(m.keys), len(m.vals), cap(m.vals), n+n/2)
	}
	for i := range m.keys {
		if m.keys[i] != 0 || m.vals[i] != 0 || m.used(i) {
			t.Fatalf("slot %d not empty: %d %d", i, m.keys[i], m.vals[i])
		}
	}

	key := func(i int) uint64 { return uint64(i)*0x9e3779b97f4a7c15 | 1 }
	grown := makePackedMap[uint32](0) // grown into the huge size by its puts
	ptrs := makePackedMap[*int](n)
	for i := range n {
		if v, ok := m.getOrPut(key(i), func() uint32 { return uint32(i) }); ok || v != uint32(i) {
			t.Fatalf("getOrPut %d: %d %v", i, v, ok)
		}
		grown.put(key(i), uint32(i))
		ptrs.put(key(i), &[]int{i}[0])
	}
	runtime.GC() // the pointers are found where they were put
	for i := range n {
		v, ok := m.get(key(i))
		g, gok := grown.get(key(i))
		p, pok := ptrs.get(key(i))
		if !ok || v != uint32(i) || !gok || g != uint32(i) || !pok || *p != i {
			t.Fatalf("key %d: %d %v, grown %d %v, pointer %v", i, v, ok, g, gok, pok)
		}
	}
	if len(grown.keys) < hugePage/8 || m.n != n || grown.n != n || ptrs.n != n {
		t.Fatalf("grown to %d slots; %d, %d, %d entries", len(grown.keys), m.n, grown.n, ptrs.n)
	}
}
