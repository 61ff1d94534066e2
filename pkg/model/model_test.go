package model

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"unsafe"
)

func addr(s string, port uint16, p Protocol) L4Addr {
	return L4Addr{Addr: netip.MustParseAddr(s), Port: port, Proto: p}
}

func TestL4AddrLessAndString(t *testing.T) {
	ordered := []L4Addr{
		addr("10.0.0.1", 53, TCP),
		addr("10.0.0.1", 53, UDP),
		addr("10.0.0.1", 80, TCP),
		addr("10.0.0.2", 1, TCP),
		addr("10.0.1.0", 1, TCP),
	}
	for i := range ordered {
		for j := range ordered {
			if got := ordered[i].Less(ordered[j]); got != (i < j) {
				t.Errorf("%s < %s = %v", ordered[i], ordered[j], got)
			}
			if got, want := ordered[i].Compare(ordered[j]), cmp.Compare(i, j); got != want {
				t.Errorf("%s.Compare(%s) = %d, want %d", ordered[i], ordered[j], got, want)
			}
		}
	}
	if s := addr("10.0.0.1", 53, UDP).String(); s != "10.0.0.1:53/UDP" {
		t.Errorf("String = %q", s)
	}
	if s := Protocol(132).String(); s != "proto(132)" {
		t.Errorf("String = %q", s)
	}
}

func TestSortBackends(t *testing.T) {
	bs := []Backend{
		{L4Addr: addr("10.0.0.3", 80, TCP)},
		{L4Addr: addr("10.0.0.1", 80, TCP), Terminating: true},
		{L4Addr: addr("10.0.0.2", 80, TCP)},
		{L4Addr: addr("10.0.0.1", 80, TCP)},
	}
	got := SortBackends(bs)
	want := []Backend{
		{L4Addr: addr("10.0.0.1", 80, TCP), Terminating: true},
		{L4Addr: addr("10.0.0.2", 80, TCP)},
		{L4Addr: addr("10.0.0.3", 80, TCP)},
	}
	if !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if got := SortBackends(nil); len(got) != 0 {
		t.Errorf("nil: %v", got)
	}
}

func TestServicePortName(t *testing.T) {
	if s := (ServicePortName{Namespace: "ns", Name: "web", Port: "http"}).String(); s != "ns/web:http" {
		t.Error(s)
	}
	if s := (ServicePortName{Namespace: "ns", Name: "web"}).String(); s != "ns/web" {
		t.Error(s)
	}
	if st := NewState(); st.Services.Len() != 0 {
		t.Error("NewState")
	}
}

// A Service and a Backend stay as small as the field order makes them:
// the state holds one per frontend and one per endpoint and port.
func TestSizes(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("sizes of a 64-bit platform")
	}
	if n := unsafe.Sizeof(Service{}); n != 216 {
		t.Errorf("Service is %d bytes, want 216", n)
	}
	if n := unsafe.Sizeof(Backend{}); n != 40 {
		t.Errorf("Backend is %d bytes, want 40", n)
	}
}

// L4Addr's and ServicePortName's String spell what their AppendTo
// appends (the names file's encoder), as they were spelled before it: the
// formulas below.
func TestStringsAsAppendTo(t *testing.T) {
	for _, a := range []L4Addr{
		{},
		{Addr: netip.MustParseAddr("10.96.0.1"), Port: 443, Proto: TCP},
		{Addr: netip.MustParseAddr("2001:db8::a"), Port: 53, Proto: UDP},
		{Addr: netip.MustParseAddr("fe80::1%eth0"), Port: 80, Proto: Protocol(99)},
	} {
		want := fmt.Sprintf("%s/%s", netip.AddrPortFrom(a.Addr, a.Port), a.Proto)
		if got := a.String(); got != want {
			t.Errorf("String of %#v = %q, want %q", a, got, want)
		}
		if got := string(a.AppendTo([]byte("x"))); got != "x"+want {
			t.Errorf("AppendTo of %#v = %q, want %q", a, got, "x"+want)
		}
	}
	for _, n := range []ServicePortName{{}, {Namespace: "ns", Name: "a"}, {Namespace: "ns", Name: "a", Port: "http"}} {
		want := n.Namespace + "/" + n.Name
		if n.Port != "" {
			want += ":" + n.Port
		}
		if got := n.String(); got != want {
			t.Errorf("String of %#v = %q, want %q", n, got, want)
		}
	}
}

// ServicePortName.Compare is the order of the spellings, for every pair of
// names, including those where one part is a prefix of the other's.
func TestServicePortNameCompareAsSpelled(t *testing.T) {
	parts := []string{"", "a", "a-b", "a0", "ab", "a/b", "b", "z"}
	ports := []string{"", "p", "p-1", "0", "a"}
	var names []ServicePortName
	for _, ns := range parts {
		for _, name := range parts {
			for _, port := range ports {
				names = append(names, ServicePortName{Namespace: ns, Name: name, Port: port})
			}
		}
	}
	for _, n := range names {
		for _, m := range names {
			if got, want := n.Compare(m), strings.Compare(n.String(), m.String()); got != want {
				t.Errorf("%q.Compare(%q) = %d, want %d", n, m, got, want)
			}
		}
	}
}

// TestNormalPrefix: the one form CIDRs are kept in, and what it refuses.
func TestNormalPrefix(t *testing.T) {
	for in, want := range map[string]string{
		"10.244.1.7/16":       "10.244.0.0/16",
		"::ffff:10.1.2.3/120": "10.1.2.0/24",
		"::ffff:10.1.2.3/128": "10.1.2.3/32",
		"fd00::1:2/64":        "fd00::/64",
		"::ffff:10.0.0.0/95":  "",
		"":                    "",
	} {
		var p netip.Prefix // "": the zero Prefix, invalid
		if in != "" {
			p = netip.MustParsePrefix(in)
		}
		got, err := NormalPrefix(p)
		switch {
		case want == "" && err == nil:
			t.Errorf("%q: %v, want an error", in, got)
		case want != "" && (err != nil || got.String() != want):
			t.Errorf("%q: %v, %v; want %s", in, got, err, want)
		}
	}
}
