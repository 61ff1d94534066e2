package fakedp

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/model/modeltest"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

func TestFakeDetectsViolations(t *testing.T) {
	l4 := modeltest.L4("10.96.0.1", 80, model.TCP)
	fe := reconciler.DefaultScope(l4)
	in := reconciler.Frontend{L4Addr: l4, Scope: reconciler.ScopeInternal}
	l4b := modeltest.L4("10.96.0.1", 81, model.TCP)
	feb := reconciler.DefaultScope(l4b)
	b := modeltest.L4("10.0.0.1", 8080, model.TCP)
	ext := reconciler.FlagExternal
	// The writes most sequences start with: backend 5 in slot 1 of at, and
	// a master of at with its rev_nat entry (the order that is right).
	backend5In := func(f *Fake, at reconciler.Frontend) error {
		return errors.Join(f.UpsertBackend(5, b), f.UpsertSlot(at, 1, 5))
	}
	master := func(f *Fake, at reconciler.Frontend, m reconciler.Master) error {
		return errors.Join(f.UpsertRevNat(m.ID, at), f.UpsertMaster(at, m))
	}
	tests := []struct {
		name string
		ops  func(f *Fake) error
		want string
	}{
		{"slot before backend", func(f *Fake) error { return f.UpsertSlot(fe, 1, 5) }, "names backend 5, which does not exist"},
		{"master before slots", func(f *Fake) error {
			return master(f, fe, reconciler.Master{ID: 1, Count: 1})
		}, "master count 1 but slot 1 does not exist"},
		{"master before rev_nat", func(f *Fake) error { return f.UpsertMaster(fe, reconciler.Master{ID: 1}) }, "no rev_nat entry"},
		{"backend deleted while named", func(f *Fake) error {
			return errors.Join(
				backend5In(f, fe),
				f.DeleteBackend(5),
			)
		}, "backend 5 deleted while 1 slots name it"},
		{"slot deleted under the master", func(f *Fake) error {
			return errors.Join(
				backend5In(f, fe),
				master(f, fe, reconciler.Master{ID: 1, Count: 1}),
				f.DeleteSlot(fe, 1),
			)
		}, "slot 1 deleted while the master counts 1"},
		{"rev_nat deleted under the master", func(f *Fake) error {
			return errors.Join(
				master(f, fe, reconciler.Master{ID: 1}),
				f.DeleteRevNat(1),
			)
		}, "rev_nat 1 deleted while a master names it"},
		{"master checks ranges before they exist", func(f *Fake) error {
			return master(f, fe, reconciler.Master{ID: 1, Flags: reconciler.FlagSourceRanges})
		}, "master checks source ranges but its frontend has none"},
		{"last range deleted under the master", func(f *Fake) error {
			return errors.Join(
				f.UpsertRevNat(1, fe),
				f.UpsertSourceRange(l4, netip.MustParsePrefix("10.0.0.0/8")),
				f.UpsertMaster(fe, reconciler.Master{ID: 1, Flags: reconciler.FlagSourceRanges}),
				f.DeleteSourceRange(l4, netip.MustParsePrefix("10.0.0.0/8")),
			)
		}, "last source range deleted while the master checks them"},
		{"range with host bits", func(f *Fake) error { return f.UpsertSourceRange(l4, netip.MustParsePrefix("10.0.0.1/8")) }, "host bits"},
		{"two scopes before the internal scope", func(f *Fake) error {
			return master(f, fe, reconciler.Master{ID: 1, Flags: ext | reconciler.FlagTwoScopes})
		}, "master says two scopes but the internal scope has no master"},
		{"internal scope deleted under two scopes", func(f *Fake) error {
			return errors.Join(
				f.UpsertRevNat(1, fe),
				master(f, in, reconciler.Master{ID: 2, Flags: ext}),
				f.UpsertMaster(fe, reconciler.Master{ID: 1, Flags: ext | reconciler.FlagTwoScopes}),
				f.DeleteSlot(in, 0),
			)
		}, "internal scope deleted while the default scope's master says two scopes"},
		{"internal slot deleted under two scopes", func(f *Fake) error {
			return errors.Join(
				backend5In(f, in),
				f.UpsertRevNat(1, fe),
				master(f, in, reconciler.Master{ID: 2, Count: 1, Flags: ext}),
				f.UpsertMaster(fe, reconciler.Master{ID: 1, Flags: ext | reconciler.FlagTwoScopes}),
				f.DeleteSlot(in, 1),
			)
		}, "slot 1 deleted while the master counts 1"},
		{"service IP before its ClusterIP master", func(f *Fake) error { return f.UpsertServiceIP(fe.Addr) }, "service IP 10.96.0.1 added while no ClusterIP master is at it"},
		{"service IP of an external frontend", func(f *Fake) error {
			return errors.Join(
				master(f, fe, reconciler.Master{ID: 1, Flags: ext}),
				f.UpsertServiceIP(fe.Addr),
			)
		}, "service IP 10.96.0.1 added while no ClusterIP master is at it"},
		{"last ClusterIP master deleted under its service IP", func(f *Fake) error {
			return errors.Join(
				f.UpsertRevNat(1, fe),
				f.UpsertRevNat(2, feb),
				f.UpsertMaster(fe, reconciler.Master{ID: 1}),
				f.UpsertMaster(feb, reconciler.Master{ID: 2}),
				f.UpsertServiceIP(fe.Addr),
				f.DeleteSlot(fe, 0),
				f.DeleteSlot(feb, 0),
			)
		}, "the last ClusterIP master at 10.96.0.1 deleted while it is a service IP"},
		{"last ClusterIP master turned external under its service IP", func(f *Fake) error {
			return errors.Join(
				master(f, fe, reconciler.Master{ID: 1}),
				f.UpsertServiceIP(fe.Addr),
				f.UpsertMaster(fe, reconciler.Master{ID: 1, Flags: ext}),
			)
		}, "the last ClusterIP master at 10.96.0.1 stopped being one while it is a service IP"},
		{"session affinity moved to a slot not holding its backend", func(f *Fake) error {
			return errors.Join(
				backend5In(f, fe),
				f.FixAffinity([]reconciler.AffinityFix{{Frontend: fe, Backend: 6, Slot: 1}}),
			)
		}, "moves backend 6 to slot 1, which names 5"},
		{"session affinity moved to the other scope's slot", func(f *Fake) error {
			return errors.Join(
				backend5In(f, in),
				f.FixAffinity([]reconciler.AffinityFix{{Frontend: fe, Backend: 5, Slot: 1}}),
			)
		}, "moves backend 5 to slot 1, which names 0"},
		{"every backend's session affinity moved", func(f *Fake) error {
			return f.FixAffinity([]reconciler.AffinityFix{{Frontend: fe, Slot: 1}})
		}, "moves every backend to slot 1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := New(10, 10, 10)
			// The kernel takes each of these writes; the fake
			// records what is wrong with the order instead.
			if err := tc.ops(f); err != nil {
				t.Fatalf("a write failed: %v", err)
			}
			v := f.Violations()
			if len(v) == 0 || !strings.Contains(strings.Join(v, "\n"), tc.want) {
				t.Errorf("violations %q, want %q", v, tc.want)
			}
			if n := strings.Count(strings.Join(v, "\n"), "after "); n != 1 {
				t.Errorf("%d violations, want exactly the one: %q", n, v)
			}
		})
	}
}

func TestFakeCapacityAndFailures(t *testing.T) {
	f := New(1, 1, 1)
	b := modeltest.L4("10.0.0.1", 8080, model.TCP)
	if err := f.UpsertBackend(1, b); err != nil {
		t.Fatal(err)
	}
	if err := f.UpsertBackend(1, b); err != nil {
		t.Fatalf("upsert of an existing key: %v", err)
	}
	if err := f.UpsertBackend(2, b); !errors.Is(err, ErrFull) {
		t.Fatalf("err = %v, want ErrFull", err)
	}
	f.Fail = func(op Op) error {
		if op.Kind == OpDeleteBackend {
			return errors.New("injected")
		}
		return nil
	}
	if err := f.DeleteBackend(1); err == nil {
		t.Fatal("no injected error")
	}
	if _, bk, _ := f.Sizes(); bk != 1 {
		t.Fatal("a failed delete deleted")
	}
	if n := f.Count(OpUpsertBackend); n != 2 {
		t.Errorf("counted %d upserts", n)
	}
}

// TestFakeIDBound: the backends and rev_nat maps are arrays indexed by
// the id, of BackendIDSlots and ServiceIDSlots entries: the fake refuses
// a write beyond, as the kernel does, and records it, as the reconciler
// must never hand such an id out.
func TestFakeIDBound(t *testing.T) {
	b := modeltest.L4("10.0.0.1", 8080, model.TCP)
	fe := reconciler.DefaultScope(modeltest.L4("10.96.0.1", 80, model.TCP))
	for _, c := range []struct {
		kind  string
		slots int
		put   func(f *Fake, id uint32) error
	}{
		{"backend", reconciler.BackendIDSlots(1), func(f *Fake, id uint32) error { return f.UpsertBackend(reconciler.BackendID(id), b) }},
		{"service", reconciler.ServiceIDSlots(1), func(f *Fake, id uint32) error { return f.UpsertRevNat(reconciler.ServiceID(id), fe) }},
	} {
		t.Run(c.kind, func(t *testing.T) {
			f := New(1, 1, 1)
			last := uint32(c.slots - 1)
			mustWriteClean(t, f, c.put(f, last))
			if err := c.put(f, last+1); err == nil {
				t.Fatalf("%s id %d written, beyond the %d entries", c.kind, last+1, last+1)
			}
			if v := f.Violations(); len(v) != 1 || !strings.Contains(v[0], "beyond the") {
				t.Errorf("violations %q, want the id beyond the arrays", v)
			}
		})
	}
}

// mustWriteClean fails t unless every write in errs succeeded and left f
// with neither a violation nor a leftover.
func mustWriteClean(t *testing.T, f *Fake, errs ...error) {
	t.Helper()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if v := append(f.Violations(), f.Check()...); len(v) > 0 {
		t.Fatalf("violations: %v", v)
	}
}

// TestFakeCheckSourceRanges: between Applies, a range whose frontend's
// master does not check ranges is a leftover; replacing one range by
// another under a checking master is not a violation.
func TestFakeCheckSourceRanges(t *testing.T) {
	l4 := modeltest.L4("192.168.1.200", 80, model.TCP)
	fe := reconciler.DefaultScope(l4)
	p1, p2 := netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("172.16.0.0/12")
	f := New(10, 10, 10)
	f.CheckAll = true
	mustWriteClean(t, f,
		f.UpsertSourceRange(l4, p1),
		f.UpsertRevNat(1, fe),
		f.UpsertMaster(fe, reconciler.Master{ID: 1, Flags: reconciler.FlagExternal | reconciler.FlagSourceRanges}),
		f.UpsertSourceRange(l4, p2),
		f.DeleteSourceRange(l4, p1),
	)
	if err := f.UpsertMaster(fe, reconciler.Master{ID: 1, Flags: reconciler.FlagExternal}); err != nil {
		t.Fatal(err)
	}
	if v := f.Check(); len(v) != 1 || !strings.Contains(v[0], "source range 172.16.0.0/12, but no master checks it") {
		t.Errorf("Check() = %q, want the leftover range", v)
	}
	if v := f.Violations(); len(v) > 0 {
		t.Errorf("a range left for a moment is not a violation: %v", v)
	}

	// Capacity: a new range beyond it is refused, an existing one is not.
	f.SetSourceRangeCapacity(1)
	if err := f.UpsertSourceRange(l4, p1); !errors.Is(err, ErrFull) {
		t.Errorf("err = %v, want ErrFull", err)
	}
	if err := f.UpsertSourceRange(l4, p2); err != nil {
		t.Errorf("upsert of an existing range: %v", err)
	}
}

// TestFakeCheckBetweenApplies: once an Apply succeeded, an internal scope
// without a master that says two scopes is a leftover, and the service IPs
// are exactly the ClusterIP masters' addresses.
func TestFakeCheckBetweenApplies(t *testing.T) {
	l4 := modeltest.L4("192.168.1.200", 80, model.TCP)
	fe, in := reconciler.DefaultScope(l4), reconciler.Frontend{L4Addr: l4, Scope: reconciler.ScopeInternal}
	cip := reconciler.DefaultScope(modeltest.L4("10.96.0.1", 80, model.TCP))
	f := New(10, 10, 10)
	f.CheckAll = true
	mustWriteClean(t, f,
		f.UpsertRevNat(1, fe), f.UpsertRevNat(2, in), f.UpsertRevNat(3, cip),
		f.UpsertMaster(in, reconciler.Master{ID: 2, Flags: reconciler.FlagExternal}),
		f.UpsertMaster(fe, reconciler.Master{ID: 1, Flags: reconciler.FlagExternal | reconciler.FlagTwoScopes}),
		f.UpsertMaster(cip, reconciler.Master{ID: 3}),
		f.UpsertServiceIP(cip.Addr),
	)
	if err := f.UpsertMaster(fe, reconciler.Master{ID: 1, Flags: reconciler.FlagExternal}); err != nil {
		t.Fatal(err)
	}
	if err := f.DeleteServiceIP(cip.Addr); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"10.96.0.1:80/TCP: ClusterIP master, but its address is not a service IP",
		"192.168.1.200:80/TCP internal: internal scope, but no master says two scopes",
	}
	if v := f.Check(); strings.Join(v, "\n") != strings.Join(want, "\n") {
		t.Errorf("Check() = %q, want %q", v, want)
	}
	if v := f.Violations(); len(v) > 0 {
		t.Errorf("leftovers for a moment are not violations: %v", v)
	}
	if ks, _ := f.Dump(); len(ks.ServiceIPs) != 0 {
		t.Errorf("dump: service IPs %v", ks.ServiceIPs)
	}
}

// TestBatchStopsAtFailure: a batch applies its entries in order, checks
// each, and stops at the first that fails, saying how many it applied.
func TestBatchStopsAtFailure(t *testing.T) {
	f := New(16, 16, 64)
	f.CheckAll = true
	fe := reconciler.DefaultScope(modeltest.L4("10.96.0.1", 80, model.TCP))
	f.Fail = func(op Op) error {
		if op.Batch && op.Kind == OpUpsertBackend && op.Backend == 3 {
			return errors.New("injected")
		}
		return nil
	}
	var bes []reconciler.BackendEntry
	for id := range reconciler.BackendID(5) {
		bes = append(bes, reconciler.BackendEntry{ID: id + 1, Addr: model.L4Addr{Addr: netip.AddrFrom4([4]byte{10, 0, 0, byte(id + 1)}), Port: 8080, Proto: model.TCP}})
	}
	if n, err := f.UpsertBackends(bes); n != 2 || err == nil {
		t.Fatalf("UpsertBackends = %d, %v; want 2 and the injected error", n, err)
	}
	if _, nb, _ := f.Sizes(); nb != 2 {
		t.Fatalf("%d backends after the failed batch, want 2", nb)
	}
	// A slot batch naming a backend the failed batch did not write is
	// a violation, seen at that entry.
	if _, err := f.UpsertSlots([]reconciler.SlotRun{{Frontend: fe, First: 1, IDs: []reconciler.BackendID{1, 3}}}); err != nil {
		t.Fatal(err)
	}
	v := f.Violations()
	if len(v) == 0 || !strings.Contains(v[0], "UpsertSlot 10.96.0.1:80/TCP[2]=3") {
		t.Errorf("violations = %q, want one after the slot naming backend 3", v)
	}
	if n := f.Batches(); n != 2 {
		t.Errorf("%d batches, want 2", n)
	}
}
