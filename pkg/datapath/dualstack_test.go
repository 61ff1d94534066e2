package datapath

import (
	"errors"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
	"github.com/sluice-lb/sluice/pkg/reconciler/fakedp"
)

// dualStackState is a dual-stack Service's two ClusterIP frontends, an
// IPv6-only LoadBalancer with source ranges, and an IPv4 one.
func dualStackState() *model.State {
	st := model.NewState()
	for _, s := range []*model.Service{
		clusterIP(l4("10.96.0.10", 80, model.TCP), l4("10.1.0.1", 8080, model.TCP), l4("10.1.0.2", 8080, model.TCP)),
		clusterIP(l4("2001:db8:96::10", 80, model.TCP), l4("2001:db8:1::1", 8080, model.TCP), l4("2001:db8:1::2", 8080, model.TCP)),
		clusterIP(l4("2001:db8:96::11", 53, model.UDP), l4("2001:db8:1::3", 5353, model.UDP)),
		{Name: model.ServicePortName{Namespace: "test", Name: "lb6"}, Kind: model.LoadBalancer, Frontend: l4("2001:db8:200::1", 443, model.TCP),
			Backends:     []model.Backend{{L4Addr: l4("2001:db8:1::1", 8443, model.TCP)}},
			SourceRanges: []netip.Prefix{netip.MustParsePrefix("2001:db8:77::/48")}},
		{Name: model.ServicePortName{Namespace: "test", Name: "lb4"}, Kind: model.LoadBalancer, Frontend: l4("192.0.2.1", 443, model.TCP),
			Backends:     []model.Backend{{L4Addr: l4("10.1.0.1", 8443, model.TCP)}},
			SourceRanges: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}},
	} {
		s.Backends = model.SortBackends(s.Backends)
		st.Services.Set(s.Frontend, s)
	}
	return st
}

// withoutIPv6 is st without its IPv6 frontends.
func withoutIPv6(st *model.State) *model.State {
	out := model.NewState()
	for a, s := range st.Services.All() {
		if a.Addr.Is4() {
			out.Services.Set(a, s)
		}
	}
	return out
}

// TestDualStackApply: the reconciler programs IPv4 and IPv6 frontends into
// their families' maps, exactly as into the fake (in batches and one
// frontend at a time), under ids no two families share; Dump reads both
// back, so a restarted agent keeps every id and writes nothing; removing
// the IPv6 frontends leaves the IPv4 ones; and a frontend with backends of
// the other family is refused, by name, keeping what was programmed.
func TestDualStackApply(t *testing.T) {
	d, bpffs := newTestDatapathAt(t)
	m := d.Maps()
	st := dualStackState()

	// The batch path (a first program of many frontends) and the
	// single one (one new frontend per Apply), each against the fake.
	for _, oneByOne := range []bool{false, true} {
		f := fakedp.New(256, 1024, 4096)
		rm, rf := reconciler.New(m, nil), reconciler.New(f, nil)
		states := []*model.State{st}
		if oneByOne {
			states = nil
			acc := model.NewState()
			for _, a := range []string{"10.96.0.10", "2001:db8:96::10", "2001:db8:96::11", "2001:db8:200::1", "192.0.2.1"} {
				for fe, s := range st.Services.All() {
					if fe.Addr == addr(a) {
						acc.Services.Set(fe, s)
					}
				}
				next := model.NewState()
				for fe, s := range acc.Services.All() {
					next.Services.Set(fe, s)
				}
				states = append(states, next)
			}
		}
		for _, s := range states {
			if err := rm.Apply(s); err != nil {
				t.Fatalf("Apply to the maps: %v", err)
			}
			if err := rf.Apply(s); err != nil {
				t.Fatalf("Apply to the fake: %v", err)
			}
		}
		got := mustDump(t, m)
		want, _ := f.Dump()
		if got.String() != want.String() {
			t.Errorf("one by one %v: maps\n%s\nwant (fake)\n%s", oneByOne, got, want)
		}
		if v := f.Check(); len(v) > 0 {
			t.Errorf("violations: %v", v)
		}
		if err := rm.Apply(model.NewState()); err != nil {
			t.Fatal(err)
		}
	}

	r := reconciler.New(m, nil)
	if err := r.Apply(st); err != nil {
		t.Fatal(err)
	}
	ks := mustDump(t, m)

	// The exact entries of the IPv6 maps, and none in the IPv4 maps.
	fe6 := reconciler.DefaultScope(l4("2001:db8:96::10", 80, model.TCP))
	ms := ks.Masters[fe6]
	var master sockLb4Service
	if err := m.services6.Lookup(&sockLb6Key{Vip: v6addr(fe6.Addr), Port: be16(80), Proto: uint8(model.TCP)}, &master); err != nil {
		t.Fatalf("master of %s in %s: %v", fe6, mapServices6, err)
	}
	if master.RevNatId != uint32(ms.ID) || master.Count != 2 {
		t.Errorf("master of %s = %+v, want id %d count 2", fe6, master, ms.ID)
	}
	slot := sockLb4Service{BackendId: slotOf(t, m.services6, m.slots6.arr, &sockLb6Key{Vip: v6addr(fe6.Addr), Port: be16(80), Proto: uint8(model.TCP)}, 1)}
	var be sockLb6Backend
	if err := m.backends6.Lookup(slot.BackendId, &be); err != nil {
		t.Fatalf("backend %d: %v", slot.BackendId, err)
	}
	if want := (sockLb6Backend{Addr: v6addr(addr("2001:db8:1::1")), Port: be16(8080), Proto: uint8(model.TCP), Flags: bePresent}); be != want {
		t.Errorf("backend %d = %+v, want %+v", slot.BackendId, be, want)
	}
	var rn sockLb6RevNat
	if err := m.revNat6.Lookup(uint32(ms.ID), &rn); err != nil || rn != (sockLb6RevNat{Vip: v6addr(fe6.Addr), Port: be16(80), Proto: uint8(model.TCP), Flags: rnPresent}) {
		t.Errorf("rev_nat %d = %+v, %v", ms.ID, rn, err)
	}
	var one uint8
	for _, a := range []string{"2001:db8:96::10", "2001:db8:96::11"} {
		if err := m.serviceIPs6.Lookup(v6addr(addr(a)), &one); err != nil {
			t.Errorf("service IP %s: %v", a, err)
		}
	}
	// 2001:db8:77::/48 of [2001:db8:200::1]:443/TCP.
	rk := sockSrcRange6Key{Prefixlen: 160 + 48, Vip: v6addr(addr("2001:db8:200::1")), Port: be16(443), Proto: uint8(model.TCP),
		Saddr: v6addr(addr("2001:db8:77::"))}
	if err := m.srcRanges6.Lookup(&rk, &one); err != nil {
		t.Errorf("source range: %v", err)
	}
	for _, c := range []struct {
		m    *ebpf.Map
		want int
	}{
		{m.services, 3 + 2}, {m.services6, 3 + 2 + 2}, {m.backends, 3}, {m.backends6, 4}, {m.revNat, 2}, {m.revNat6, 3},
		{m.serviceIPs, 1}, {m.serviceIPs6, 2}, {m.srcRanges, 1}, {m.srcRanges6, 1},
	} {
		count := countEntries
		if c.m == m.services || c.m == m.services6 {
			count = func(s *ebpf.Map) (int, error) { return serviceEntries(m, s) }
		}
		if n, err := count(c.m); err != nil || n != c.want {
			t.Errorf("%s: %d entries (%v), want %d", c.m, n, err, c.want)
		}
	}

	// One id space: no id present in both families' arrays (which have
	// every id).
	must(t, eachBackend(m.revNat, mapRevNat, func(k *uint32, _ *sockLb4RevNat) {
		var v sockLb6RevNat
		if m.revNat6.Lookup(k, &v) == nil && v.Flags&rnPresent != 0 {
			t.Errorf("id %d in both families' maps (%s)", *k, m.revNat6)
		}
	}))
	must(t, eachBackend(m.backends, mapBackends, func(k *uint32, _ *sockLb4Backend) {
		var v sockLb6Backend
		if m.backends6.Lookup(k, &v) == nil && v.Flags&bePresent != 0 {
			t.Errorf("id %d in both families' maps (%s)", *k, m.backends6)
		}
	}))

	// The per-Service counters name the frontends of both families.
	stats, err := m.ServiceStats()
	if err != nil || len(stats) != st.Services.Len() || stats[len(stats)-1].Frontend != l4("2001:db8:200::1", 443, model.TCP) {
		t.Errorf("ServiceStats: %d rows (%v), want one per frontend, IPv6 last: %+v", len(stats), err, stats)
	}

	// sluicectl explain's candidates of an IPv6 frontend, in slot order.
	pinned, err := OpenPinned(bpffs)
	if err != nil {
		t.Fatal(err)
	}
	cands, err := pinned.Candidates(netip.AddrPortFrom(fe6.Addr, 80), uint8(model.TCP), 0)
	pinned.Close()
	if err != nil || len(cands) != 2 || cands[0].Slot != 1 || cands[0].BackendID != slot.BackendId ||
		cands[0].Addr != netip.MustParseAddrPort("[2001:db8:1::1]:8080") {
		t.Errorf("Candidates of %s = %+v, %v", fe6, cands, err)
	}

	// A restarted agent keeps every id and writes nothing.
	d2 := openTest(t, smallConfig(bpffs))
	r2, w := restarted(t, d2.Maps(), st)
	if w != 0 {
		t.Errorf("restarted agent wrote %d times", w)
	}
	if again, _ := d2.Maps().Dump(); !reflect.DeepEqual(again, ks) {
		t.Errorf("after restart\n%s\nwant\n%s", again, ks)
	}

	// A frontend with a backend of the other family fails by name and
	// keeps its programming; the others are programmed regardless.
	bad := dualStackState()
	svc := *bad.Services.Get(fe6.L4Addr)
	svc.Backends = append([]model.Backend{{L4Addr: l4("10.1.0.9", 8080, model.TCP)}}, svc.Backends...)
	bad.Services.Set(fe6.L4Addr, &svc)
	err = r2.Apply(bad)
	var fe *reconciler.FrontendError
	if !errors.As(err, &fe) || !errors.Is(err, reconciler.ErrInvalid) || !strings.Contains(err.Error(), svc.Name.String()) ||
		!strings.Contains(err.Error(), "10.1.0.9") {
		t.Errorf("Apply of a mixed-family frontend: %v", err)
	}
	if again, _ := m.Dump(); !reflect.DeepEqual(again, ks) {
		t.Errorf("after a refused frontend\n%s\nwant\n%s", again, ks)
	}

	// Removing the IPv6 frontends leaves the IPv4 ones as they were.
	if err := r2.Apply(withoutIPv6(st)); err != nil {
		t.Fatal(err)
	}
	after := mustDump(t, m)
	for fe, ms := range ks.Masters {
		if got, ok := after.Masters[fe]; fe.Addr.Is4() != ok || ok && got != ms {
			t.Errorf("after removing IPv6: master of %s = %+v, %v", fe, got, ok)
		}
	}
	for _, m6 := range []*ebpf.Map{m.services6, m.backends6, m.srcRanges6, m.serviceIPs6} {
		count := countEntries
		if m6 == m.services6 {
			count = func(s *ebpf.Map) (int, error) { return serviceEntries(m, s) }
		}
		if n, err := count(m6); err != nil || n != 0 {
			t.Errorf("%s: %d entries left (%v)", m6, n, err)
		}
	}
}

// TestBatchDualStack: batches that mix the families write each entry into
// its family's map, as single writes do, and batched deletes by id find
// either family's entries.
func TestBatchDualStack(t *testing.T) {
	testutil.Privileged(t)
	batched := openTest(t, smallConfig(testPinDir(t))).Maps()
	single := openTest(t, smallConfig(testPinDir(t))).Maps()
	fe4, fe6 := reconciler.DefaultScope(l4("10.96.0.1", 80, model.TCP)), reconciler.DefaultScope(l4("2001:db8::1", 80, model.TCP))
	b := batches{
		bes: []reconciler.BackendEntry{{ID: 1, Addr: l4("10.1.0.1", 80, model.TCP)}, {ID: 2, Addr: l4("2001:db8:1::1", 80, model.TCP)},
			{ID: 3, Addr: l4("2001:db8:1::2", 80, model.TCP)}, {ID: 4, Addr: l4("10.1.0.2", 80, model.TCP)}},
		rns: []reconciler.RevNatEntry{{ID: 2, Frontend: fe6}, {ID: 1, Frontend: fe4}},
		sls: []reconciler.SlotRun{{Frontend: fe4, First: 1, IDs: []reconciler.BackendID{1}}, {Frontend: fe6, First: 1, IDs: []reconciler.BackendID{2, 3}},
			{Frontend: fe4, First: 2, IDs: []reconciler.BackendID{4}}},
		ms:  []reconciler.MasterEntry{{Frontend: fe6, Master: reconciler.Master{ID: 2, Count: 2}}, {Frontend: fe4, Master: reconciler.Master{ID: 1, Count: 2}}},
		ips: []netip.Addr{fe6.Addr, fe4.Addr},
	}
	// Every batch writes all its entries: 4 backends and slots, 2 of the
	// rest.
	if ns, err := b.upsert(batched); err != nil || !reflect.DeepEqual(ns, []int{4, 2, 4, 2, 2}) {
		t.Fatalf("batches wrote %v, %v", ns, err)
	}
	for _, e := range b.bes {
		must(t, single.UpsertBackend(e.ID, e.Addr))
	}
	for _, e := range b.rns {
		must(t, single.UpsertRevNat(e.ID, e.Frontend))
	}
	for _, run := range b.sls {
		for j, id := range run.IDs {
			must(t, single.UpsertSlot(run.Frontend, run.First+uint32(j), id))
		}
	}
	for _, e := range b.ms {
		must(t, single.UpsertMaster(e.Frontend, e.Master))
	}
	for _, a := range b.ips {
		must(t, single.UpsertServiceIP(a))
	}
	got := mustDump(t, batched)
	want := mustDump(t, single)
	if got.String() != want.String() || !strings.Contains(got.String(), "[2001:db8::1]:80/TCP") {
		t.Errorf("batched\n%s\nsingle\n%s", got, want)
	}

	// An IPv6 frontend's entry the encoder refuses ends the batch there.
	n, err := batched.UpsertSlots([]reconciler.SlotRun{{Frontend: fe6, First: 3, IDs: []reconciler.BackendID{1}}, {Frontend: fe6, First: 1 << 16, IDs: []reconciler.BackendID{1}}})
	if n != 1 || err == nil {
		t.Errorf("UpsertSlots with a bad slot = %d, %v", n, err)
	}

	// Deletes by id, of both families and missing ones.
	if n, err := batched.DeleteBackends([]reconciler.BackendID{2, 9, 1, 3}); n != 4 || err != nil {
		t.Fatalf("DeleteBackends = %d, %v", n, err)
	}
	if n, err := batched.DeleteRevNats([]reconciler.ServiceID{2, 7}); n != 2 || err != nil {
		t.Fatalf("DeleteRevNats = %d, %v", n, err)
	}
	must(t, single.DeleteBackend(2))
	must(t, single.DeleteBackend(9))
	for _, id := range []reconciler.BackendID{1, 3} {
		must(t, single.DeleteBackend(id))
	}
	must(t, single.DeleteRevNat(2))
	ks, _ := batched.Dump()
	if want := map[reconciler.BackendID]model.L4Addr{4: b.bes[3].Addr}; !reflect.DeepEqual(ks.Backends, want) {
		t.Errorf("backends = %v, want %v", ks.Backends, want)
	}
	if want := map[reconciler.ServiceID]reconciler.Frontend{1: fe4}; !reflect.DeepEqual(ks.RevNat, want) {
		t.Errorf("rev_nat = %v, want %v", ks.RevNat, want)
	}
	ks2, _ := single.Dump()
	if !reflect.DeepEqual(ks.Backends, ks2.Backends) || !reflect.DeepEqual(ks.RevNat, ks2.RevNat) {
		t.Errorf("single deletes leave %v %v", ks2.Backends, ks2.RevNat)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestDualStackCapacity: the reconciler counts both families against one
// size (Maps.Capacity): with room for 4 services, 3 IPv4 and 2 IPv6
// frontends program 4, and the fifth fails as a capacity error, not as a
// failed write, although its family's map has room.
func TestDualStackCapacity(t *testing.T) {
	testutil.Privileged(t)
	d := openTestWith(t, smallConfig, func(c *Config) { c.MaxServices = 4 })
	m := d.Maps()
	st := model.NewState()
	for _, a := range []string{"10.96.0.1", "10.96.0.2", "10.96.0.3", "2001:db8::1", "2001:db8::2"} {
		fe := l4(a, 80, model.TCP)
		b := l4("10.1.0.1", 8080, model.TCP)
		if fe.Addr.Is6() {
			b = l4("2001:db8:1::1", 8080, model.TCP)
		}
		st.Services.Set(fe, clusterIP(fe, b))
	}
	err := reconciler.New(m, nil).Apply(st)
	var fe *reconciler.FrontendError
	if !errors.As(err, &fe) || fe.Reason() != "capacity" || fe.Frontend != l4("2001:db8::2", 80, model.TCP) {
		t.Fatalf("Apply of 5 services with room for 4: %v", err)
	}
	n4, err4 := countEntries(m.revNat)
	n6, err6 := countEntries(m.revNat6)
	if n4 != 3 || n6 != 1 || err4 != nil || err6 != nil {
		t.Errorf("rev_nat: %d IPv4 (%v), %d IPv6 (%v) entries; want 3 and 1", n4, err4, n6, err6)
	}
}

// TestNodeConfigDualStack: the node's CIDRs of each family go to that
// family's map, an agent restarted without the IPv6 ones drops them, and
// node_ip6 / have_cluster_cidr6 are the IPv6 family's node_ip4 /
// have_cluster_cidr.
func TestNodeConfigDualStack(t *testing.T) {
	testutil.Privileged(t)
	bpffs := testPinDir(t)
	p := netip.MustParsePrefix
	cfg := smallConfig(bpffs)
	cfg.NodeIPs = []netip.Addr{addr("192.0.2.1"), addr("2001:db8::2")}
	cfg.ClusterCIDRs = []netip.Prefix{p("10.0.0.0/8"), p("2001:db8:42::/56")}
	cfg.ServiceCIDRs = []netip.Prefix{p("10.96.0.0/12"), p("2001:db8:96::/112")}
	d := openTest(t, cfg)
	got, err := d.Maps().NodeCIDRs()
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(got, func(a, b NodeCIDR) int { return a.Prefix.Addr().Compare(b.Prefix.Addr()) })
	want := []NodeCIDR{{nodeCIDRCluster, p("10.0.0.0/8")}, {nodeCIDRService, p("10.96.0.0/12")},
		{nodeCIDRCluster, p("2001:db8:42::/56")}, {nodeCIDRService, p("2001:db8:96::/112")}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("NodeCIDRs = %v, want %v", got, want)
	}
	// The datapath's lookup: an address in the CIDR.
	var one uint8
	k := sockNodeCidr6Key{Prefixlen: 32 + 128, Kind: nodeCIDRCluster, Addr: v6addr(addr("2001:db8:42:ff::5"))}
	if err := d.Maps().nodeCIDRs6.Lookup(&k, &one); err != nil {
		t.Errorf("2001:db8:42:ff::5 not in the IPv6 cluster CIDR: %v", err)
	}
	var ip6 sockV6addr
	var have, have6 uint8
	if err := errors.Join(d.tc.NodeIp6.Get(&ip6), d.tc.HaveClusterCidr.Get(&have), d.tc.HaveClusterCidr6.Get(&have6)); err != nil {
		t.Fatal(err)
	}
	if ip6 != v6addr(addr("2001:db8::2")) || have != 1 || have6 != 1 {
		t.Errorf("node_ip6 %v, have_cluster_cidr %d, have_cluster_cidr6 %d", addrFrom16(ip6), have, have6)
	}
	d.Close()

	cfg.ClusterCIDRs, cfg.ServiceCIDRs = cfg.ClusterCIDRs[:1], cfg.ServiceCIDRs[:1]
	d = openTest(t, cfg)
	if got, err := d.Maps().NodeCIDRs(); err != nil || len(got) != 2 || got[0].Prefix.Addr().Is6() || got[1].Prefix.Addr().Is6() {
		t.Errorf("NodeCIDRs after a restart without IPv6 CIDRs = %v, %v", got, err)
	}
	if err := d.tc.HaveClusterCidr6.Get(&have6); err != nil || have6 != 0 {
		t.Errorf("have_cluster_cidr6 = %d, %v", have6, err)
	}
}

// TestDualStackRandomAgainstFake applies random dual-stack states (kinds,
// two scopes, source ranges, session affinity, frontends and backends
// that come and go, both families sharing ports) to the real maps and to
// the fake, with an agent restart now and then, and expects the same maps
// after every Apply: the IPv6 maps are written, read back and deleted
// from as the reconciler's model says.
func TestDualStackRandomAgainstFake(t *testing.T) {
	d, bpffs := newTestDatapathAt(t)
	f := fakedp.New(256, 1024, 4096)
	rm, rf := reconciler.New(d.Maps(), nil), reconciler.New(f, nil)
	rng := rand.New(rand.NewPCG(10, 6))
	fes := []model.L4Addr{
		l4("10.96.0.1", 80, model.TCP), l4("10.96.0.1", 53, model.UDP), l4("192.0.2.1", 443, model.TCP),
		l4("2001:db8:96::1", 80, model.TCP), l4("2001:db8:96::1", 53, model.UDP), l4("2001:db8:200::1", 443, model.TCP),
	}
	backends := func(fe model.L4Addr) []model.Backend {
		var bs []model.Backend
		for range rng.IntN(5) {
			a := netip.AddrFrom4([4]byte{10, 1, 0, byte(1 + rng.IntN(6))})
			if fe.Addr.Is6() {
				a = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 1, 15: byte(1 + rng.IntN(6))})
			}
			bs = append(bs, model.Backend{L4Addr: model.L4Addr{Addr: a, Port: 8000 + fe.Port, Proto: fe.Proto}})
		}
		return model.SortBackends(bs)
	}
	for round := range 40 {
		st := model.NewState()
		for i, fe := range fes {
			if rng.IntN(4) == 0 {
				continue
			}
			s := clusterIP(fe)
			s.Backends = backends(fe)
			if i%3 == 2 {
				s.Kind = model.LoadBalancer
				r := netip.MustParsePrefix("198.51.100.0/24")
				if fe.Addr.Is6() {
					r = netip.MustParsePrefix("2001:db8:77::/48")
				}
				if rng.IntN(2) == 0 {
					s.SourceRanges = []netip.Prefix{r}
				}
				if rng.IntN(2) == 0 {
					s.ExternalLocal, s.TwoScopes, s.InternalBackends = true, true, backends(fe)
				}
			}
			if rng.IntN(3) == 0 {
				s.AffinityTimeout = time.Hour
			}
			st.Services.Set(fe, s)
		}
		if rng.IntN(8) == 0 { // both agents restart: ids come from the maps
			rm, rf = reconciler.New(d.Maps(), nil), reconciler.New(f, nil)
			if err := errors.Join(rm.Restore(), rf.Restore()); err != nil {
				t.Fatal(err)
			}
		}
		if err := errors.Join(rm.Apply(st), rf.Apply(st)); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		got := mustDump(t, d.Maps())
		if want, _ := f.Dump(); got.String() != want.String() {
			t.Fatalf("round %d: maps\n%s\nwant (fake)\n%s", round, got, want)
		}
	}
	if v := f.Check(); len(v) > 0 {
		t.Error(v)
	}
	// What the pins hold reads back the same through OpenPinned.
	p, err := OpenPinned(bpffs)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	got, err := p.Dump()
	if want, _ := f.Dump(); err != nil || got.String() != want.String() {
		t.Errorf("OpenPinned Dump\n%s\nwant\n%s (%v)", got, want, err)
	}
}
