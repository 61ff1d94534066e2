package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// TestSourceRangesRoundTrip: the ranges the reconciler writes, Dump reads
// back per frontend (what Restore rebuilds its view from), deletes are
// idempotent, the trie matches a source by its longest prefix, and what
// it cannot hold is refused: a prefix of the other family, or none. Over
// IPv6, in sluice6_src_ranges: prefixes of the same shapes (one not on a
// group boundary, as /12 is not on an octet's) and a host's /128.
func TestSourceRangesRoundTrip(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		testutil.Privileged(t)
		m := newTestDatapath(t).Maps()
		lb := l4(twinAddr(v6, "192.168.1.200"), 80, model.TCP)
		lbU := l4(twinAddr(v6, "192.168.1.200"), 80, model.UDP)
		// The IPv4 address or prefix, or its IPv6 counterpart.
		pick := func(s4, s6 string) string { return map[bool]string{false: s4, true: s6}[v6] }
		p := func(p4, p6 string) netip.Prefix { return netip.MustParsePrefix(pick(p4, p6)) }
		r1, r2, h := p("10.0.0.0/24", "2001:db8:10::/48"), p("172.16.0.0/12", "2001:db8:ac20::/43"), p("192.0.2.7/32", "2001:db8::7/128")
		for _, x := range []struct {
			fe model.L4Addr
			p  netip.Prefix
		}{{lb, r1}, {lb, r2}, {lb, r1}, {lbU, h}} {
			if err := m.UpsertSourceRange(x.fe, x.p); err != nil {
				t.Fatal(err)
			}
		}
		ks := mustDump(t, m)
		want := map[model.L4Addr][]netip.Prefix{lb: {r1, r2}, lbU: {h}}
		got := ks.SourceRanges
		for _, ps := range got {
			slices.SortFunc(ps, netip.Prefix.Compare)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("Dump().SourceRanges = %v, want %v", got, want)
		}
		ranges, other := m.srcRanges, m.srcRanges6
		if v6 {
			ranges, other = other, ranges
		}
		if n, err := countEntries(other); n != 0 || err != nil {
			t.Errorf("the other family's source ranges hold %d entries (%v)", n, err)
		}

		for range 2 {
			if err := m.DeleteSourceRange(lb, r1); err != nil {
				t.Fatal(err)
			}
		}
		if err := m.DeleteSourceRange(lbU, h); err != nil {
			t.Fatal(err)
		}
		ks = mustDump(t, m)
		if want := map[model.L4Addr][]netip.Prefix{lb: {r2}}; !reflect.DeepEqual(ks.SourceRanges, want) {
			t.Fatalf("after deletes: %v, want %v", ks.SourceRanges, want)
		}
		// The datapath's lookup: a source's whole address under the
		// frontend.
		for src, want := range map[string]bool{
			pick("10.0.0.1", "2001:db8:10::1"):            false, // in r1, deleted
			pick("172.31.255.1", "2001:db8:ac3f:ffff::1"): true,  // at r2's end
			pick("172.32.0.1", "2001:db8:ac40::1"):        false, // just after r2
		} {
			sp := netip.PrefixFrom(addr(src), addr(src).BitLen())
			k, v := srcRangeKey(lb, sp), uint8(0)
			err := ranges.Lookup(&k, &v)
			if v6 {
				k6 := srcRange6Key(k, lb.Addr, sp)
				err = ranges.Lookup(&k6, &v)
			}
			if got := err == nil; got != want {
				t.Errorf("source %s of %s: allowed %v (%v), want %v", src, lb, got, err, want)
			}
		}

		otherFamily := map[bool]string{false: "2001:db8::/32", true: "10.0.0.0/8"}[v6]
		for _, bad := range []netip.Prefix{netip.MustParsePrefix(otherFamily), {}} {
			if err := m.UpsertSourceRange(lb, bad); err == nil {
				t.Errorf("UpsertSourceRange(%s) succeeded", bad)
			}
		}
		if n := m.SourceRangeCapacity(); n != 16384 || int(ranges.MaxEntries()) != n {
			t.Errorf("SourceRangeCapacity() = %d, the family's map holds %d; want 16384 (sluice_src_ranges)", n, ranges.MaxEntries())
		}
	})
}

// TestSourceRangesSizedByConfig (C5): sluice_src_ranges has the size of
// Config.MaxSourceRanges (--max-source-ranges), and when it is full only
// the frontend that needs more is refused (named); the others are
// programmed. Over IPv6, sluice6_src_ranges, of the same size.
func TestSourceRangesSizedByConfig(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		tw := twinOf(v6)
		d := openTestWith(t, smallConfig, func(cfg *Config) {
			cfg.MaxSourceRanges = 3
		})
		ranges := map[bool]*ebpf.Map{false: d.Maps().srcRanges, true: d.Maps().srcRanges6}[v6]
		if n := d.Maps().SourceRangeCapacity(); n != 3 || ranges.MaxEntries() != 3 {
			t.Fatalf("SourceRangeCapacity() = %d, the family's map holds %d; want 3", n, ranges.MaxEntries())
		}
		lbSvc := func(x byte, name string, ranges ...string) *model.Service {
			fe := l4(tw(fmt.Sprint("192.168.9.", x)), 80, model.TCP)
			s := clusterIP(fe, l4(tw("10.9.0.1"), 8080, model.TCP))
			s.Name.Name, s.Kind = name, model.LoadBalancer
			for _, r := range ranges {
				s.SourceRanges = append(s.SourceRanges, twinPrefix(v6, r))
			}
			return s
		}
		a := lbSvc(1, "a", "10.0.0.0/8", "172.16.0.0/16")
		b := lbSvc(2, "b", "10.0.0.0/8", "192.168.0.0/16")
		c := clusterIP(l4(tw("10.96.9.3"), 80, model.TCP), l4(tw("10.9.0.3"), 8080, model.TCP))
		st := model.NewState()
		for _, s := range []*model.Service{a, b, c} {
			st.Services.Set(s.Frontend, s)
		}
		err := reconciler.New(d.Maps(), nil).Apply(st)
		if !errors.Is(err, reconciler.ErrCapacity) || strings.Count(err.Error(), "test/") != 1 {
			t.Fatalf("Apply = %v, want a capacity error naming one of a and b", err)
		}
		ks := mustDump(t, d.Maps())
		_, okA := ks.Masters[reconciler.DefaultScope(a.Frontend)]
		_, okB := ks.Masters[reconciler.DefaultScope(b.Frontend)]
		_, okC := ks.Masters[reconciler.DefaultScope(c.Frontend)]
		if okA == okB || !okC {
			t.Errorf("programmed: a %v, b %v, c %v; want exactly one of a and b, and c", okA, okB, okC)
		}
		if n, err := countEntries(ranges); n != 2 || err != nil {
			t.Errorf("the family's source ranges hold %d entries (%v), want the 2 of a or b", n, err)
		}
	})
}
