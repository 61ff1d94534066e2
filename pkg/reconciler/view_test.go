package reconciler

import (
	"net/netip"
	"slices"
	"testing"
	"unsafe"

	"github.com/sluice-lb/sluice/pkg/model"
)

// TestIDTable: the dense id table behaves as the map it replaces, with
// its users counted beside, whatever the ids: growing past its size a
// step at a time and at once, ids far above it (restored strays, kept in
// high until the dense range reaches them), users of ids without a value,
// and values that do not pack (IPv6).
func TestIDTable(t *testing.T) {
	addr := func(s string) model.L4Addr {
		return model.L4Addr{Addr: netip.MustParseAddr(s), Port: 80, Proto: model.TCP}
	}
	var tab idTable[model.L4Addr, backendKeys]
	want := map[uint32]model.L4Addr{}
	refs := map[uint32]int32{}
	check := func(step string) {
		t.Helper()
		if tab.len() != len(want) {
			t.Fatalf("%s: len %d, want %d", step, tab.len(), len(want))
		}
		var ids []uint32
		for id, a := range want {
			ids = append(ids, id)
			if got, ok := tab.get(id); !ok || got != a || !tab.has(id) {
				t.Fatalf("%s: id %d holds %v %v, want %v", step, id, got, ok, a)
			}
		}
		slices.Sort(ids)
		if got := tab.ids(); !slices.Equal(got, ids) {
			t.Fatalf("%s: ids %v, want %v", step, got, ids)
		}
		for id, n := range refs {
			if got := tab.refs(id); got != n {
				t.Fatalf("%s: id %d has %d users, want %d", step, id, got, n)
			}
		}
		for id := range tab.high {
			if int64(id) < int64(len(tab.dense)) {
				t.Fatalf("%s: id %d in high, below the dense range (%d)", step, id, len(tab.dense))
			}
		}
	}
	put := func(id uint32, a model.L4Addr) {
		tab.put(id, a)
		want[id] = a
	}
	del := func(id uint32) {
		tab.del(id)
		delete(want, id)
	}

	// Dense, one at a time past the initial size, IPv4 and IPv6.
	for id := uint32(1); id <= 3000; id++ {
		a := addr("10.1.0.1")
		if id%7 == 0 {
			a = addr("2001:db8::1")
		}
		a.Port = uint16(id)
		put(id, a)
	}
	check("dense")
	if len(tab.high) != 0 {
		t.Errorf("%d ids of a dense range in high", len(tab.high))
	}
	// Far above: in high, with users and without a value.
	far := uint32(1 << 20) // above 2*len(dense)+idTableSlack, yet cheap to grow over
	put(far, addr("10.9.9.9"))
	put(far+1, addr("2001:db8::9"))
	refs[far+2] = tab.addRefs(far+2, 2)
	refs[far] = tab.addRefs(far, 1)
	check("far")
	if len(tab.high) != 3 {
		t.Errorf("high holds %d ids, want 3", len(tab.high))
	}
	// A value replaced: IPv6 by IPv4 and back; deletes.
	put(7, addr("10.7.7.7"))
	put(14, addr("2001:db8::14"))
	if old, had := tab.put(14, addr("10.14.14.14")); !had || old != addr("2001:db8::14") {
		t.Errorf("put returned %v %v, want the IPv6 address it replaced", old, had)
	}
	want[14] = addr("10.14.14.14")
	if _, ok := tab.wide[14]; ok {
		t.Error("id 14 still holds an IPv6 value beside its IPv4 one")
	}
	del(21)
	del(far + 1)
	check("replaced and deleted")
	// Users gone and no value: the far id leaves high.
	tab.clearRefs(far + 2)
	delete(refs, far+2)
	if _, ok := tab.high[far+2]; ok {
		t.Error("an id with neither value nor users stays in high")
	}
	// The dense range reaching the far ids moves them out of high.
	tab.grow(int(far) + 3)
	check("grown over the far ids")
	if len(tab.high) != 0 {
		t.Errorf("%d ids left in high after the dense range grew over them", len(tab.high))
	}
}

// TestKeyMapPacking: keys that pack and keys that do not (IPv6, IPv4
// mapped into IPv6, with a zone) are told apart, and all yields them back
// exactly.
func TestKeyMapPacking(t *testing.T) {
	m := makeKeyMap[Frontend, int, frontendKeys](0)
	fes := []Frontend{
		{L4Addr: model.L4Addr{Addr: netip.MustParseAddr("10.96.0.1"), Port: 80, Proto: model.TCP}},
		{L4Addr: model.L4Addr{Addr: netip.MustParseAddr("10.96.0.1"), Port: 80, Proto: model.TCP}, Scope: ScopeInternal},
		{L4Addr: model.L4Addr{Addr: netip.MustParseAddr("10.96.0.1"), Port: 80, Proto: model.UDP}},
		{L4Addr: model.L4Addr{Addr: netip.MustParseAddr("255.255.255.255"), Port: 65535, Proto: 255}, Scope: 255},
		{L4Addr: model.L4Addr{Addr: netip.MustParseAddr("::ffff:10.96.0.1"), Port: 80, Proto: model.TCP}},
		{L4Addr: model.L4Addr{Addr: netip.MustParseAddr("fe80::1%eth0"), Port: 80, Proto: model.TCP}},
		{L4Addr: model.L4Addr{Addr: netip.MustParseAddr("2001:db8::1"), Port: 80, Proto: model.TCP}},
	}
	for i, fe := range fes {
		m.put(fe, i)
	}
	if m.len() != len(fes) || m.packed.n != 4 {
		t.Fatalf("%d keys, %d packed; want %d, 4", m.len(), m.packed.n, len(fes))
	}
	got := map[Frontend]int{}
	for fe, i := range m.all() {
		got[fe] = i
	}
	for i, fe := range fes {
		if v, ok := m.get(fe); !ok || v != i || got[fe] != i {
			t.Errorf("%v: get %d %v, all %d; want %d", fe, v, ok, got[fe], i)
		}
	}
	for _, fe := range fes {
		m.del(fe)
	}
	if m.len() != 0 {
		t.Errorf("%d keys left after deleting them all", m.len())
	}
}

// TestFrontendViewSize: the view holds one per frontend; its layout keeps
// it in the 112-byte size class.
func TestFrontendViewSize(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("sizes of a 64-bit platform")
	}
	if n := unsafe.Sizeof(frontendView{}); n > 112 {
		t.Errorf("frontendView is %d bytes, want at most 112", n)
	}
}

// TestFrontendViewKeepsRangesApart: the source ranges, which few
// frontends have, are not in every frontend's view: it fits the 80-byte
// size class (the two slices made it 112).
func TestFrontendViewKeepsRangesApart(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("sizes of a 64-bit platform")
	}
	if n := unsafe.Sizeof(frontendView{}); n > 80 {
		t.Errorf("frontendView is %d bytes, want at most 80", n)
	}
}

// A desired frontend reads the backends of its Service where they are
// sorted and unique, as the translation makes them, and copies them only
// to sort them, never changing the Service's.
func TestDesiredSharesSortedBackends(t *testing.T) {
	be := func(addr string, terminating bool) model.Backend {
		return model.Backend{L4Addr: model.L4Addr{Addr: netip.MustParseAddr(addr), Port: 8080, Proto: model.TCP}, Terminating: terminating}
	}
	fe := Frontend{L4Addr: model.L4Addr{Addr: netip.MustParseAddr("10.96.0.10"), Port: 80, Proto: model.TCP}}
	sorted := &model.Service{Frontend: fe.L4Addr, Backends: []model.Backend{be("10.0.0.1", false), be("10.0.0.2", true), be("10.0.0.3", false)}}
	d := newDesired(fe, sorted)
	if len(d.backends) != 3 || &d.backends[0] != &sorted.Backends[0] {
		t.Errorf("sorted backends: %v, want the Service's own", d.backends)
	}
	if allocs := testing.AllocsPerRun(100, func() { newDesired(fe, sorted) }); allocs != 1 {
		t.Errorf("a desired frontend of sorted backends: %v allocations, want 1 (itself)", allocs)
	}

	unsorted := []model.Backend{be("10.0.0.3", false), be("10.0.0.1", false), be("10.0.0.3", true), be("10.0.0.2", false)}
	svc := &model.Service{Frontend: fe.L4Addr, Backends: slices.Clone(unsorted)}
	d = newDesired(fe, svc)
	var got []string
	for _, b := range d.backends {
		got = append(got, b.Addr.String())
	}
	if want := []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"}; !slices.Equal(got, want) {
		t.Errorf("unsorted backends, with one twice: %v, want %v", got, want)
	}
	if !slices.Equal(svc.Backends, unsorted) {
		t.Errorf("the Service's backends changed: %v, want %v", svc.Backends, unsorted)
	}
}
