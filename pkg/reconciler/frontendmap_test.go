package reconciler

import (
	"maps"
	"net/netip"
	"testing"

	"github.com/sluice-lb/sluice/pkg/model"
)

// frontendMapEqual fails t unless m holds exactly want: by Get, by All
// (each frontend once) and by Len.
func frontendMapEqual(t *testing.T, what string, m *FrontendMap[int], want map[Frontend]int) {
	t.Helper()
	for fe, v := range want {
		if got, ok := m.Get(fe); !ok || got != v {
			t.Fatalf("%s: Get %s (scope %d) = %d %v, want %d", what, fe, fe.Scope, got, ok, v)
		}
	}
	got := map[Frontend]int{}
	for fe, v := range m.All() {
		if _, dup := got[fe]; dup {
			t.Fatalf("%s: All yields %s twice", what, fe)
		}
		got[fe] = v
	}
	if !maps.Equal(got, want) || m.Len() != len(want) {
		t.Fatalf("%s: All yields %d frontends (Len %d), want %d", what, len(got), m.Len(), len(want))
	}
}

// TestFrontendMapRoundTrip: every field of a frontend (address, port,
// protocol, scope) comes back from a FrontendMap as it went in, IPv4
// (packed) and IPv6 (the Go map) alike, and frontends that differ in one
// field only are different keys, an IPv4-mapped IPv6 address another
// than its IPv4 one. Grows from the zero value; delete and put again.
// Fails with a packing that drops the scope, or the port's high byte,
// and with a Delete that forgets nothing.
func TestFrontendMapRoundTrip(t *testing.T) {
	var fes []Frontend
	for _, a := range []string{"0.0.0.0", "255.255.255.255", "10.96.0.1", "1.2.3.4", "128.0.0.1",
		"::", "::1", "fd00::10:96:0:1", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "::ffff:10.96.0.1", "fe80::1%eth0"} {
		for _, port := range []uint16{0, 1, 80, 256, 0x8000, 65535} {
			for _, proto := range []model.Protocol{model.TCP, model.UDP, 0, 255} {
				for _, scope := range []Scope{ScopeDefault, ScopeInternal, 255} {
					fes = append(fes, Frontend{L4Addr: model.L4Addr{Addr: netip.MustParseAddr(a), Port: port, Proto: proto}, Scope: scope})
				}
			}
		}
	}
	var m FrontendMap[int]
	want := map[Frontend]int{}
	for i, fe := range fes {
		m.Put(fe, i)
		want[fe] = i
	}
	if len(want) != len(fes) {
		t.Fatalf("the test's frontends are not all different")
	}
	frontendMapEqual(t, "filled", &m, want)
	n4 := 0
	for fe := range want {
		if fe.Addr.Is4() {
			n4++
		}
	}
	if m.m.packed.n != n4 || len(m.m.other) != len(want)-n4 {
		t.Errorf("%d packed, %d in the Go map; want the %d IPv4 ones packed, %d", m.m.packed.n, len(m.m.other), n4, len(want)-n4)
	}
	for i, fe := range fes {
		if i%3 == 0 {
			m.Delete(fe)
			delete(want, fe)
		}
	}
	m.Delete(Frontend{L4Addr: model.L4Addr{Addr: netip.MustParseAddr("192.0.2.1"), Port: 9}}) // not there
	frontendMapEqual(t, "a third deleted", &m, want)
	for i, fe := range fes {
		if _, ok := m.Get(fe); ok != (i%3 != 0) {
			t.Fatalf("Get %s after the deletes: %v", fe, ok)
		}
		if i%2 == 0 {
			m.Put(fe, -i)
			want[fe] = -i
		}
	}
	frontendMapEqual(t, "put again", &m, want)
	// Deleting what the walk yields empties it.
	for fe := range m.All() {
		m.Delete(fe)
	}
	frontendMapEqual(t, "emptied", &m, map[Frontend]int{})
}

// TestFrontendMapGrowth: 40,000 IPv4 frontends that differ in the low
// bits only (ports, scopes: crowded homes) in a map presized for 10 and
// one presized for them all, deleted while walked, a half at a time.
func TestFrontendMapGrowth(t *testing.T) {
	for _, n := range []int{10, 40000} {
		m := MakeFrontendMap[int](n, 0)
		want := map[Frontend]int{}
		for i := range 40000 {
			fe := Frontend{L4Addr: model.L4Addr{Addr: netip.AddrFrom4([4]byte{10, 96, 0, byte(i >> 15)}),
				Port: uint16(i >> 1), Proto: model.TCP}, Scope: Scope(i & 1)}
			m.Put(fe, i)
			want[fe] = i
		}
		frontendMapEqual(t, "grown", &m, want)
		i := 0
		for fe := range m.All() {
			if i++; i%2 == 0 {
				m.Delete(fe)
				delete(want, fe)
			}
		}
		frontendMapEqual(t, "half deleted in a walk", &m, want)
	}
}
