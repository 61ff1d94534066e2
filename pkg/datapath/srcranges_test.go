package datapath

import (
	"errors"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
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

// TestSourceRangesSizedByConfig (C5): sluice_src_ranges has the size of
// Config.MaxSourceRanges (--max-source-ranges), and when it is full only
// the frontend that needs more is refused (named); the others are
// programmed.
func TestSourceRangesSizedByConfig(t *testing.T) {
	d := openTestWith(t, smallConfig, func(cfg *Config) {
		cfg.MaxSourceRanges = 3
	})
	if n := d.Maps().SourceRangeCapacity(); n != 3 {
		t.Fatalf("SourceRangeCapacity() = %d, want 3", n)
	}
	lbSvc := func(x byte, name string, ranges ...string) *model.Service {
		fe := model.L4Addr{Addr: netip.AddrFrom4([4]byte{192, 168, 9, x}), Port: 80, Proto: model.TCP}
		s := clusterIP(fe, l4("10.9.0.1", 8080, model.TCP))
		s.Name.Name, s.Kind = name, model.LoadBalancer
		for _, r := range ranges {
			s.SourceRanges = append(s.SourceRanges, netip.MustParsePrefix(r))
		}
		return s
	}
	a := lbSvc(1, "a", "10.0.0.0/8", "172.16.0.0/12")
	b := lbSvc(2, "b", "10.0.0.0/8", "192.168.0.0/16")
	c := clusterIP(l4("10.96.9.3", 80, model.TCP), l4("10.9.0.3", 8080, model.TCP))
	st := model.NewState()
	for _, s := range []*model.Service{a, b, c} {
		st.Services[s.Frontend] = s
	}
	err := reconciler.New(d.Maps(), nil).Apply(st)
	if !errors.Is(err, reconciler.ErrCapacity) || strings.Count(err.Error(), "test/") != 1 {
		t.Fatalf("Apply = %v, want a capacity error naming one of a and b", err)
	}
	ks, err := d.Maps().Dump()
	if err != nil {
		t.Fatal(err)
	}
	_, okA := ks.Masters[reconciler.DefaultScope(a.Frontend)]
	_, okB := ks.Masters[reconciler.DefaultScope(b.Frontend)]
	_, okC := ks.Masters[reconciler.DefaultScope(c.Frontend)]
	if okA == okB || !okC {
		t.Errorf("programmed: a %v, b %v, c %v; want exactly one of a and b, and c", okA, okB, okC)
	}
}
