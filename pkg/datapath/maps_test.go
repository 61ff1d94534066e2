package datapath

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// TestMapsDumpRoundTrip: what the reconciler writes, Dump reads back, and
// a new Open over the same pins sees the same state; over IPv6, from the
// sluice6_* maps, with the addresses printed as the dump of sluicectl
// services --raw shows them.
func TestMapsDumpRoundTrip(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		a := twinOf(v6)
		d, bpffs := newTestDatapathAt(t)
		m := d.Maps()
		fe := l4(a("10.96.1.1"), 443, model.TCP)
		feU := l4(a("10.96.1.1"), 443, model.UDP)
		b1, b2 := testBackend{7, l4(a("10.2.0.1"), 8443, model.TCP)}, testBackend{8, l4(a("10.2.0.2"), 8443, model.TCP)}
		addService(t, m, 5, fe, b1, b2)
		addService(t, m, 6, feU)
		// A reverse-NAT entry no master names (yet) keeps its protocol too.
		orphan := l4(a("10.96.1.2"), 53, model.UDP)
		if err := m.UpsertRevNat(9, reconciler.DefaultScope(orphan)); err != nil {
			t.Fatal(err)
		}

		// A frontend's internal scope and its rev_nat scope, and a service IP,
		// read back as written.
		in := reconciler.Frontend{L4Addr: fe, Scope: reconciler.ScopeInternal}
		if err := m.UpsertRevNat(10, in); err != nil {
			t.Fatal(err)
		}
		if err := m.UpsertSlot(in, 1, b2.id); err != nil {
			t.Fatal(err)
		}
		if err := m.UpsertMaster(in, reconciler.Master{ID: 10, Count: 1, Flags: reconciler.FlagExternal}); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if err := m.UpsertServiceIP(fe.Addr); err != nil {
				t.Fatal(err)
			}
		}

		dfe, dfeU := reconciler.DefaultScope(fe), reconciler.DefaultScope(feU)
		want := &reconciler.KernelState{
			Masters: map[reconciler.Frontend]reconciler.Master{
				dfe:  {ID: 5, Count: 2},
				dfeU: {ID: 6, Count: 0},
				in:   {ID: 10, Count: 1, Flags: reconciler.FlagExternal},
			},
			Slots:      map[reconciler.Frontend]map[uint32]reconciler.BackendID{dfe: {1: 7, 2: 8}, in: {1: 8}},
			Backends:   map[reconciler.BackendID]model.L4Addr{7: b1.addr, 8: b2.addr},
			RevNat:     map[reconciler.ServiceID]reconciler.Frontend{5: dfe, 6: dfeU, 9: reconciler.DefaultScope(orphan), 10: in},
			ServiceIPs: []netip.Addr{fe.Addr},
		}
		got := mustDump(t, m)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("Dump\n got %+v\nwant %+v", got, want)
		}
		// Every entry is in its family's maps, none in the other's.
		type familyMap struct {
			name string
			m    *ebpf.Map
		}
		ms := []familyMap{{mapServices, m.services}, {mapBackends, m.backends}, {mapRevNat, m.revNat}, {mapServiceIPs, m.serviceIPs}}
		others := []familyMap{{mapServices6, m.services6}, {mapBackends6, m.backends6}, {mapRevNat6, m.revNat6}, {mapServiceIPs6, m.serviceIPs6}}
		if v6 {
			ms, others = others, ms
		}
		for i, n := range []int{6, 2, 4, 1} {
			count := countEntries
			if i == 0 { // masters and slots
				count = func(s *ebpf.Map) (int, error) { return serviceEntries(m, s) }
			}
			if got, err := count(ms[i].m); got != n || err != nil {
				t.Errorf("%s holds %d entries (%v), want %d", ms[i].name, got, err, n)
			}
			if got, err := count(others[i].m); got != 0 || err != nil {
				t.Errorf("%s holds %d entries (%v), want none", others[i].name, got, err)
			}
		}
		// The dump (sluicectl services --raw) names the addresses as
		// they are written, an IPv6 one in brackets.
		line := map[bool]string{false: "10.96.1.1:443/TCP [1] backend=7 10.2.0.1:8443/TCP",
			true: "[2001:db8:a:60:1::1]:443/TCP [1] backend=7 [2001:db8:a:2::1]:8443/TCP"}[v6]
		if !strings.Contains(got.String(), "\n  "+line+"\n") {
			t.Errorf("dump without %q:\n%s", line, got)
		}

		// Idempotent deletes, including of things that are not there.
		for range 2 {
			if err := m.DeleteSlot(reconciler.DefaultScope(fe), 2); err != nil {
				t.Fatal(err)
			}
			if err := m.DeleteBackend(8); err != nil {
				t.Fatal(err)
			}
			if err := m.DeleteRevNat(99); err != nil {
				t.Fatal(err)
			}
		}
		if err := m.UpsertMaster(reconciler.DefaultScope(fe), reconciler.Master{ID: 5, Count: 1}); err != nil {
			t.Fatal(err)
		}
		if err := m.DeleteSlot(in, 1); err != nil {
			t.Fatal(err)
		}
		if err := m.DeleteSlot(in, 0); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if err := m.DeleteServiceIP(fe.Addr); err != nil {
				t.Fatal(err)
			}
		}
		delete(want.Slots[dfe], 2)
		delete(want.Slots, in)
		delete(want.Masters, in)
		delete(want.Backends, 8)
		want.Masters[dfe] = reconciler.Master{ID: 5, Count: 1}
		want.ServiceIPs = nil

		// A restarted agent finds the same state in the pinned maps.
		d2 := openTest(t, smallConfig(bpffs))
		got = mustDump(t, d2.Maps())
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("Dump after re-Open\n got %+v\nwant %+v", got, want)
		}

		s, b, e := m.Capacity()
		if s != 256 || b != 1024 || e != 4096 {
			t.Errorf("Capacity() = %d, %d, %d; want 256, 1024, 4096", s, b, e)
		}
		// The family's maps have those sizes (services, backends, rev_nat):
		// the services hash a master for every service id, the backends
		// and rev_nat arrays an entry for every id (backendSlots,
		// serviceSlots).
		for i, n := range []int{s, reconciler.BackendIDSlots(b), s + reconciler.ServiceIDQuarantine + 1} {
			if got := int(ms[i].m.MaxEntries()); got != n {
				t.Errorf("%s has room for %d entries, want %d", ms[i].name, got, n)
			}
		}
	})
}

func TestMapsRejectInvalid(t *testing.T) {
	d := newTestDatapath(t)
	m := d.Maps()
	v6 := model.L4Addr{Addr: l4("10.0.0.1", 1, model.TCP).Addr, Port: 1, Proto: 1}
	for name, err := range map[string]error{
		"zoned backend":  m.UpsertBackend(1, l4("fe80::1%eth0", 80, model.TCP)),
		"icmp frontend":  m.UpsertMaster(reconciler.DefaultScope(v6), reconciler.Master{ID: 1}),
		"backend id 0":   m.UpsertBackend(0, l4("10.0.0.1", 80, model.TCP)),
		"service id 0":   m.UpsertRevNat(0, reconciler.DefaultScope(l4("10.0.0.1", 80, model.TCP))),
		"slot 0 as slot": m.UpsertSlot(reconciler.DefaultScope(l4("10.0.0.1", 80, model.TCP)), 0, 1),
		"slot too large": m.UpsertSlot(reconciler.DefaultScope(l4("10.0.0.1", 80, model.TCP)), 1<<16, 1),
	} {
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// An IPv4-mapped IPv6 address is an IPv4 address.
	if err := m.UpsertBackend(1, l4("::ffff:10.0.0.1", 80, model.TCP)); err != nil {
		t.Errorf("IPv4-mapped backend: %v", err)
	}
}

// BenchmarkMapsApply programs n services x 10 backends from empty maps
// through the production reconciler (the agent's first apply), and then
// changes one endpoint of one service.
func BenchmarkMapsApply(b *testing.B) {
	testutil.Privileged(b)
	for _, n := range []int{1000, 10000, 30000} {
		st := model.NewState()
		for i := range n {
			fe := model.L4Addr{Addr: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Port: 80, Proto: model.TCP}
			s := &model.Service{Name: model.ServicePortName{Namespace: "bench", Name: fmt.Sprint("svc-", i)}, Frontend: fe}
			for j := range 10 {
				s.Backends = append(s.Backends, model.Backend{L4Addr: model.L4Addr{
					Addr: netip.AddrFrom4([4]byte{10, byte(1 + i>>8), byte(i), byte(j + 1)}), Port: 8080, Proto: model.TCP}})
			}
			st.Services.Set(fe, s)
		}
		cfg := smallConfig(testPinDir(b))
		cfg.MaxServices, cfg.MaxBackends, cfg.MaxServiceEntries = n+n/4, 11*n+64, 12*n
		b.Run(fmt.Sprintf("initial-%dk", n/1000), func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				d := openTest(b, cfg)
				b.StartTimer()
				if err := reconciler.New(d.Maps(), nil).Apply(st); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				d.Close()
				if err := os.RemoveAll(filepath.Join(cfg.BPFFS, "sluice")); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}
