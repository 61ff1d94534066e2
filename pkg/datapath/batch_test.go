package datapath

import (
	"errors"
	"net/netip"
	"reflect"
	"testing"

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
	sls []reconciler.SlotEntry
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
// time), and batched deletes of missing entries succeed.
func TestBatchWritesAsSingle(t *testing.T) {
	testutil.Privileged(t)
	m := openTest(t, smallConfig(testPinDir(t))).Maps()
	f := fakedp.New(256, 1024, 4096)
	fe := reconciler.DefaultScope(l4("10.96.0.1", 80, model.TCP))
	in := reconciler.Frontend{L4Addr: fe.L4Addr, Scope: reconciler.ScopeInternal}
	b := batches{
		bes: []reconciler.BackendEntry{{ID: 1, Addr: l4("10.1.0.1", 8080, model.TCP)}, {ID: 2, Addr: l4("10.1.0.2", 8080, model.TCP)}},
		rns: []reconciler.RevNatEntry{{ID: 1, Frontend: in}, {ID: 2, Frontend: fe}},
		sls: []reconciler.SlotEntry{{Frontend: in, Slot: 1, Backend: 2}, {Frontend: fe, Slot: 1, Backend: 1}, {Frontend: fe, Slot: 2, Backend: 2}},
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
	if got.String() != want.String() {
		t.Errorf("maps after batches:\n%s\nwant:\n%s", got, want)
	}
	if v := f.Check(); len(v) > 0 {
		t.Errorf("the batches leave violations: %v", v)
	}

	// Deletes: the second and a missing one (batches stop at ENOENT).
	if n, err := m.DeleteRevNats([]reconciler.ServiceID{7, 1, 8}); n != 3 || err != nil {
		t.Fatalf("DeleteRevNats = %d, %v", n, err)
	}
	if n, err := m.DeleteBackends([]reconciler.BackendID{9, 2}); n != 2 || err != nil {
		t.Fatalf("DeleteBackends = %d, %v", n, err)
	}
	ks, err := m.Dump()
	if err != nil {
		t.Fatal(err)
	}
	if want := map[reconciler.BackendID]model.L4Addr{1: b.bes[0].Addr}; !reflect.DeepEqual(ks.Backends, want) {
		t.Errorf("backends = %v, want %v", ks.Backends, want)
	}
	if want := map[reconciler.ServiceID]reconciler.Frontend{2: fe}; !reflect.DeepEqual(ks.RevNat, want) {
		t.Errorf("rev_nat = %v, want %v", ks.RevNat, want)
	}
}

// TestBatchStopsWhenFull: a batch that does not fit writes a prefix and
// says how long it is, and an entry the encoder refuses ends the batch
// there.
func TestBatchStopsWhenFull(t *testing.T) {
	testutil.Privileged(t)
	cfg := smallConfig(testPinDir(t))
	m := openTest(t, cfg).Maps()
	var bes []reconciler.BackendEntry
	for i := range cfg.MaxBackends + 5 {
		bes = append(bes, reconciler.BackendEntry{ID: reconciler.BackendID(i + 1), Addr: model.L4Addr{
			Addr: netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), Port: 8080, Proto: model.TCP}})
	}
	n, err := m.UpsertBackends(bes)
	if n != cfg.MaxBackends || err == nil {
		t.Fatalf("UpsertBackends of %d into %d = %d, %v", len(bes), cfg.MaxBackends, n, err)
	}
	if !errors.Is(err, ebpf.ErrNotSupported) {
		if ks, _ := m.Dump(); len(ks.Backends) != n {
			t.Errorf("%d backends written, the batch said %d", len(ks.Backends), n)
		}
	}
	bad := []reconciler.RevNatEntry{{ID: 1, Frontend: reconciler.DefaultScope(l4("10.96.0.1", 80, model.TCP))}, {ID: 0}}
	if n, err := m.UpsertRevNats(bad); n != 1 || err == nil {
		t.Errorf("UpsertRevNats with id 0 second = %d, %v; want 1 and an error", n, err)
	}
}
