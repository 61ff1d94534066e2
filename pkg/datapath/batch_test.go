package datapath

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
	"github.com/sluice-lb/sluice/pkg/reconciler/fakedp"
)

// batches is one batch of each kind of entry.
type batches struct {
	bes []reconciler.BackendEntry
	rns []reconciler.RevNatEntry
	sls []reconciler.SlotRun
	ms  []reconciler.MasterEntry
	ips []netip.Addr
}

// upsert writes b into dp a batch at a time, backends first, as the
// reconciler orders them, and returns how many entries each batch wrote,
// up to the first that failed.
func (b batches) upsert(dp reconciler.Datapath) ([]int, error) {
	var ns []int
	for _, w := range []func() (int, error){
		func() (int, error) { return dp.UpsertBackends(b.bes) },
		func() (int, error) { return dp.UpsertRevNats(b.rns) },
		func() (int, error) { return dp.UpsertSlots(b.sls) },
		func() (int, error) { return dp.UpsertMasters(b.ms) },
		func() (int, error) { return dp.UpsertServiceIPs(b.ips) },
	} {
		n, err := w()
		ns = append(ns, n)
		if err != nil {
			return ns, err
		}
	}
	return ns, nil
}

// TestBatchWritesAsSingle: the batch writes leave the maps as the single
// writes of the same entries do (the fake applies batches one entry at a
// time), and batched deletes of missing entries succeed; over IPv6, in
// the sluice6_* maps.
func TestBatchWritesAsSingle(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		testutil.Privileged(t)
		tw := twinOf(v6)
		m := openTest(t, smallConfig(testPinDir(t))).Maps()
		f := fakedp.New(256, 1024, 4096)
		fe := reconciler.DefaultScope(l4(tw("10.96.0.1"), 80, model.TCP))
		in := reconciler.Frontend{L4Addr: fe.L4Addr, Scope: reconciler.ScopeInternal}
		b := batches{
			bes: []reconciler.BackendEntry{{ID: 1, Addr: l4(tw("10.1.0.1"), 8080, model.TCP)}, {ID: 2, Addr: l4(tw("10.1.0.2"), 8080, model.TCP)}},
			rns: []reconciler.RevNatEntry{{ID: 1, Frontend: in}, {ID: 2, Frontend: fe}},
			sls: []reconciler.SlotRun{{Frontend: in, First: 1, IDs: []reconciler.BackendID{2}}, {Frontend: fe, First: 1, IDs: []reconciler.BackendID{1, 2}}},
			ms: []reconciler.MasterEntry{
				{Frontend: in, Master: reconciler.Master{ID: 1, Count: 1}},
				{Frontend: fe, Master: reconciler.Master{ID: 2, Count: 2, Flags: reconciler.FlagTwoScopes, AffinityTimeout: 30}},
			},
			ips: []netip.Addr{fe.Addr},
		}
		for _, dp := range []reconciler.Datapath{m, f} {
			if _, err := b.upsert(dp); err != nil {
				t.Fatalf("%T: %v", dp, err)
			}
		}
		got, _ := m.Dump()
		want, _ := f.Dump()
		if got.String() != want.String() || !strings.Contains(got.String(), fe.String()) {
			t.Errorf("maps after batches:\n%s\nwant:\n%s", got, want)
		}
		if v := f.Check(); len(v) > 0 {
			t.Errorf("the batches leave violations: %v", v)
		}
		// The entries are in the family's maps (services: 2 masters, 3
		// slots).
		for name, x := range map[string]struct {
			m4, m6 *ebpf.Map
			n      int
		}{"services": {m.services, m.services6, 5}, "backends": {m.backends, m.backends6, 2}, "rev_nat": {m.revNat, m.revNat6, 2}} {
			count := countEntries
			if name == "services" { // masters and slots
				count = func(s *ebpf.Map) (int, error) { return serviceEntries(m, s) }
			}
			if n, err := count(map[bool]*ebpf.Map{false: x.m4, true: x.m6}[v6]); n != x.n || err != nil {
				t.Errorf("the family's %s map holds %d entries (%v), want %d", name, n, err, x.n)
			}
		}

		// Deletes: the second and a missing one (batches stop at ENOENT).
		if n, err := m.DeleteRevNats([]reconciler.ServiceID{7, 1, 8}); n != 3 || err != nil {
			t.Fatalf("DeleteRevNats = %d, %v", n, err)
		}
		if n, err := m.DeleteBackends([]reconciler.BackendID{9, 2}); n != 2 || err != nil {
			t.Fatalf("DeleteBackends = %d, %v", n, err)
		}
		ks := mustDump(t, m)
		if want := map[reconciler.BackendID]model.L4Addr{1: b.bes[0].Addr}; !reflect.DeepEqual(ks.Backends, want) {
			t.Errorf("backends = %v, want %v", ks.Backends, want)
		}
		if want := map[reconciler.ServiceID]reconciler.Frontend{2: fe}; !reflect.DeepEqual(ks.RevNat, want) {
			t.Errorf("rev_nat = %v, want %v", ks.RevNat, want)
		}
	})
}

// TestBatchStopsWhenFull: a batch that does not fit writes a prefix and
// says how long it is, in an error that names the full map and the entry
// it stopped at; what it wrote stays programmed. An entry the encoder
// refuses ends the batch there. Over IPv6, sluice6_backends fills. (The
// backends maps are arrays indexed by the id: what does not fit is an id
// beyond them; the batch's ids end there.)
func TestBatchStopsWhenFull(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		testutil.Privileged(t)
		cfg := smallConfig(testPinDir(t))
		m := openTest(t, cfg).Maps()
		slots := backendSlots(cfg.withDefaults())
		// One backend of the other family first, then more than the
		// family's map holds: MaxBackends ids up to its last entry,
		// five beyond.
		bes := []reconciler.BackendEntry{{ID: 1, Addr: l4(twinAddr(!v6, "10.2.0.1"), 8080, model.TCP)}}
		for i := range cfg.MaxBackends + 5 {
			a := netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})
			id := reconciler.BackendID(slots - cfg.MaxBackends + i)
			bes = append(bes, reconciler.BackendEntry{ID: id, Addr: l4(twinAddr(v6, a.String()), 8080, model.TCP)})
		}
		n, err := m.UpsertBackends(bes)
		if n != 1+cfg.MaxBackends || err == nil {
			t.Fatalf("UpsertBackends of %d into %d = %d, %v", len(bes), cfg.MaxBackends, n, err)
		}
		name := map[bool]string{false: mapBackends, true: mapBackends6}[v6]
		what := fmt.Sprintf("upsert %s (entry %d of %d): full (%d entries)", name, n, len(bes), slots)
		if !strings.Contains(err.Error(), what) {
			t.Errorf("UpsertBackends: %v; want it to say %q", err, what)
		}
		// A single write into the full map says so too.
		last := bes[len(bes)-1]
		what = fmt.Sprintf("%s: full (%d entries)", name, slots)
		if err := m.UpsertBackend(last.ID, last.Addr); err == nil || !strings.Contains(err.Error(), what) {
			t.Errorf("UpsertBackend into the full map: %v; want it to say %q", err, what)
		}
		if !errors.Is(err, ebpf.ErrNotSupported) {
			ks, _ := m.Dump()
			want := map[reconciler.BackendID]model.L4Addr{}
			for _, e := range bes[:n] {
				want[e.ID] = e.Addr
			}
			if !reflect.DeepEqual(ks.Backends, want) {
				t.Errorf("%d backends programmed, want the batch's first %d as written", len(ks.Backends), n)
			}
		}
		fe := reconciler.DefaultScope(l4(twinAddr(v6, "10.96.0.1"), 80, model.TCP))
		bad := []reconciler.RevNatEntry{{ID: 1, Frontend: fe}, {ID: 0, Frontend: fe}}
		if n, err := m.UpsertRevNats(bad); n != 1 || err == nil {
			t.Errorf("UpsertRevNats with id 0 second = %d, %v; want 1 and an error", n, err)
		}
	})
}

// TestSlotBatchKeysEachFrontend: a batch of slots encodes a frontend's key
// once for the slots that follow it, and each slot still lands under its
// own frontend: frontends that differ only in scope, a frontend that
// comes back after another, and a slot 0 (the master's, refused) after
// them, which ends the batch there; over IPv6 too.
func TestSlotBatchKeysEachFrontend(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		testutil.Privileged(t)
		tw := twinOf(v6)
		m := openTest(t, smallConfig(testPinDir(t))).Maps()
		a := reconciler.DefaultScope(l4(tw("10.96.0.1"), 80, model.TCP))
		b := reconciler.Frontend{L4Addr: a.L4Addr, Scope: reconciler.ScopeInternal}
		c := reconciler.DefaultScope(l4(tw("10.96.0.2"), 80, model.TCP))
		if _, err := m.UpsertBackends([]reconciler.BackendEntry{{ID: 1, Addr: l4(tw("10.1.0.1"), 8080, model.TCP)}}); err != nil {
			t.Fatal(err)
		}
		one := []reconciler.BackendID{1}
		sls := []reconciler.SlotRun{
			{Frontend: a, First: 1, IDs: []reconciler.BackendID{1, 1}}, {Frontend: b, First: 1, IDs: one},
			{Frontend: a, First: 3, IDs: one}, {Frontend: c, First: 7, IDs: one}, {Frontend: c, First: 0, IDs: one},
			{Frontend: c, First: 8, IDs: one},
		}
		n, err := m.UpsertSlots(sls)
		if n != 5 || err == nil || !strings.Contains(err.Error(), "slot 0") {
			t.Fatalf("UpsertSlots = %d, %v; want 5 and the error of slot 0", n, err)
		}
		ks := mustDump(t, m)
		want := map[reconciler.Frontend]map[uint32]reconciler.BackendID{a: {1: 1, 2: 1, 3: 1}, b: {1: 1}, c: {7: 1}}
		if !reflect.DeepEqual(ks.Slots, want) {
			t.Errorf("slots = %v, want %v", ks.Slots, want)
		}
	})
}

// TestSlotRunsAsSingleSlots: slot runs written in batches leave the
// service maps byte for byte as UpsertSlot leaves them, slot by slot, for
// random runs of both families and both scopes (long stretches of one
// family, so that batches fill up, and frontends that come back with
// other slots); and a run's slot that UpsertSlot refuses (slot 0, backend
// 0, a slot past 65535 within a run) ends the batch just before it.
func TestSlotRunsAsSingleSlots(t *testing.T) {
	testutil.Privileged(t)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	var fes []reconciler.Frontend
	for i := range 64 {
		a := netip.AddrFrom4([4]byte{10, 96, byte(i / 16), byte(i)})
		if i%2 == 1 {
			a = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: byte(i)})
		}
		fe := reconciler.DefaultScope(model.L4Addr{Addr: a, Port: uint16(80 + i%3), Proto: []model.Protocol{model.TCP, model.UDP}[i/2%2]})
		fes = append(fes, fe, reconciler.Frontend{L4Addr: fe.L4Addr, Scope: reconciler.ScopeInternal})
	}
	var runs []reconciler.SlotRun
	total := 0
	for i := range 400 {
		fe := fes[rng.IntN(len(fes))]
		if i < 160 { // an IPv4 stretch of more than a batch
			fe = fes[4*rng.IntN(len(fes)/4)+rng.IntN(2)]
		}
		run := reconciler.SlotRun{Frontend: fe, First: 1 + rng.Uint32N(20)}
		for range 1 + rng.IntN(12) {
			run.IDs = append(run.IDs, reconciler.BackendID(1+rng.IntN(1000)))
		}
		runs = append(runs, run)
		total += len(run.IDs)
	}

	// Slots up to 65535 of a frontend take a range of 65536 in its
	// family's slots array (slots.go).
	cfg := func() Config {
		c := smallConfig(testPinDir(t))
		c.MaxServiceEntries = 1 << 16
		return c
	}
	batched := openTest(t, cfg()).Maps()
	single := openTest(t, cfg()).Maps()
	if n, err := batched.UpsertSlots(runs); n != total || err != nil {
		t.Fatalf("UpsertSlots = %d, %v; want %d", n, err, total)
	}
	for _, run := range runs {
		for j, id := range run.IDs {
			must(t, single.UpsertSlot(run.Frontend, run.First+uint32(j), id))
		}
	}
	rawEqual := func(what string) {
		t.Helper()
		// The slots of each family, as the maps hold them (slots
		// moved to an array: their ranges may differ, not what they
		// hold).
		gotKS := mustDump(t, batched)
		wantKS := mustDump(t, single)
		for _, v6 := range []bool{false, true} {
			got, want := map[reconciler.Frontend]map[uint32]reconciler.BackendID{}, map[reconciler.Frontend]map[uint32]reconciler.BackendID{}
			for fe, s := range gotKS.Slots {
				if is6(fe.Addr) == v6 {
					got[fe] = s
				}
			}
			for fe, s := range wantKS.Slots {
				if is6(fe.Addr) == v6 {
					want[fe] = s
				}
			}
			if len(want) == 0 || !reflect.DeepEqual(got, want) {
				t.Errorf("%s: IPv6 %v: the slots hold %d frontends, UpsertSlot's %d; they differ: %v", what, v6, len(got), len(want), !reflect.DeepEqual(got, want))
			}
		}
	}
	rawEqual("random runs")

	// A refused slot ends the batch just before it; what follows is not
	// written.
	fe4, fe6 := fes[0], fes[3]
	for _, c := range []struct {
		name string
		runs []reconciler.SlotRun
		n    int
		err  string
	}{
		{"slot 0", []reconciler.SlotRun{{Frontend: fe4, First: 30, IDs: []reconciler.BackendID{1, 2}}, {Frontend: fe6, First: 0, IDs: []reconciler.BackendID{3}}, {Frontend: fe4, First: 40, IDs: []reconciler.BackendID{4}}}, 2, "slot 0"},
		{"backend 0", []reconciler.SlotRun{{Frontend: fe6, First: 50, IDs: []reconciler.BackendID{1, 0, 2}}}, 1, "backend id 0"},
		{"past 65535", []reconciler.SlotRun{{Frontend: fe4, First: 0xfffe, IDs: []reconciler.BackendID{1, 2, 3}}}, 2, "slot 65536 out of range"},
	} {
		n, err := batched.UpsertSlots(c.runs)
		if n != c.n || err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("%s: UpsertSlots = %d, %v; want %d and %q", c.name, n, err, c.n, c.err)
		}
		k := 0
	written:
		for _, run := range c.runs {
			for j, id := range run.IDs {
				if k == c.n {
					break written
				}
				must(t, single.UpsertSlot(run.Frontend, run.First+uint32(j), id))
				k++
			}
		}
		rawEqual(c.name)
	}
}
