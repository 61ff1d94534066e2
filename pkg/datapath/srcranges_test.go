package datapath

import (
	"net/netip"
	"reflect"
	"slices"
	"testing"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/model"
)

// TestSourceRangesRoundTrip: the ranges the reconciler writes, Dump reads
// back per frontend (what Restore rebuilds its view from), deletes are
// idempotent, and what the LPM trie cannot hold is refused.
func TestSourceRangesRoundTrip(t *testing.T) {
	testutil.Privileged(t)
	m := newTestDatapath(t).Maps()
	lb := l4("192.168.1.200", 80, model.TCP)
	lbU := l4("192.168.1.200", 80, model.UDP)
	p := netip.MustParsePrefix
	for _, x := range []struct {
		fe model.L4Addr
		p  netip.Prefix
	}{{lb, p("10.0.0.0/24")}, {lb, p("172.16.0.0/12")}, {lb, p("10.0.0.0/24")}, {lbU, p("192.0.2.7/32")}} {
		if err := m.UpsertSourceRange(x.fe, x.p); err != nil {
			t.Fatal(err)
		}
	}
	ks, err := m.Dump()
	if err != nil {
		t.Fatal(err)
	}
	want := map[model.L4Addr][]netip.Prefix{lb: {p("10.0.0.0/24"), p("172.16.0.0/12")}, lbU: {p("192.0.2.7/32")}}
	got := ks.SourceRanges
	for _, ps := range got {
		slices.SortFunc(ps, netip.Prefix.Compare)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Dump().SourceRanges = %v, want %v", got, want)
	}

	for range 2 {
		if err := m.DeleteSourceRange(lb, p("10.0.0.0/24")); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.DeleteSourceRange(lbU, p("192.0.2.7/32")); err != nil {
		t.Fatal(err)
	}
	if ks, err = m.Dump(); err != nil {
		t.Fatal(err)
	}
	if want := map[model.L4Addr][]netip.Prefix{lb: {p("172.16.0.0/12")}}; !reflect.DeepEqual(ks.SourceRanges, want) {
		t.Fatalf("after deletes: %v, want %v", ks.SourceRanges, want)
	}

	for _, bad := range []netip.Prefix{p("2001:db8::/32"), {}} {
		if err := m.UpsertSourceRange(lb, bad); err == nil {
			t.Errorf("UpsertSourceRange(%s) succeeded", bad)
		}
	}
	if n := m.SourceRangeCapacity(); n != 16384 {
		t.Errorf("SourceRangeCapacity() = %d, want 16384 (sluice_src_ranges)", n)
	}
}
