package fakedp

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

func TestFakeDetectsViolations(t *testing.T) {
	fe := model.L4Addr{Addr: netip.MustParseAddr("10.96.0.1"), Port: 80, Proto: model.TCP}
	b := model.L4Addr{Addr: netip.MustParseAddr("10.0.0.1"), Port: 8080, Proto: model.TCP}
	tests := []struct {
		name string
		ops  func(f *Fake)
		want string
	}{
		{"slot before backend", func(f *Fake) { f.UpsertSlot(fe, 1, 5) }, "names backend 5, which does not exist"},
		{"master before slots", func(f *Fake) {
			f.UpsertRevNat(1, fe)
			f.UpsertMaster(fe, reconciler.Master{ID: 1, Count: 1})
		}, "master count 1 but slot 1 does not exist"},
		{"master before rev_nat", func(f *Fake) { f.UpsertMaster(fe, reconciler.Master{ID: 1}) }, "no rev_nat entry"},
		{"backend deleted while named", func(f *Fake) {
			f.UpsertBackend(5, b)
			f.UpsertSlot(fe, 1, 5)
			f.DeleteBackend(5)
		}, "backend 5 deleted while 1 slots name it"},
		{"slot deleted under the master", func(f *Fake) {
			f.UpsertBackend(5, b)
			f.UpsertSlot(fe, 1, 5)
			f.UpsertRevNat(1, fe)
			f.UpsertMaster(fe, reconciler.Master{ID: 1, Count: 1})
			f.DeleteSlot(fe, 1)
		}, "slot 1 deleted while the master counts 1"},
		{"rev_nat deleted under the master", func(f *Fake) {
			f.UpsertRevNat(1, fe)
			f.UpsertMaster(fe, reconciler.Master{ID: 1})
			f.DeleteRevNat(1)
		}, "rev_nat 1 deleted while a master names it"},
		{"master checks ranges before they exist", func(f *Fake) {
			f.UpsertRevNat(1, fe)
			f.UpsertMaster(fe, reconciler.Master{ID: 1, Flags: reconciler.FlagSourceRanges})
		}, "master checks source ranges but its frontend has none"},
		{"last range deleted under the master", func(f *Fake) {
			f.UpsertRevNat(1, fe)
			f.UpsertSourceRange(fe, netip.MustParsePrefix("10.0.0.0/8"))
			f.UpsertMaster(fe, reconciler.Master{ID: 1, Flags: reconciler.FlagSourceRanges})
			f.DeleteSourceRange(fe, netip.MustParsePrefix("10.0.0.0/8"))
		}, "last source range deleted while the master checks them"},
		{"range with host bits", func(f *Fake) { f.UpsertSourceRange(fe, netip.MustParsePrefix("10.0.0.1/8")) }, "host bits"},
		{"session affinity moved to a slot not holding its backend", func(f *Fake) {
			f.UpsertBackend(5, b)
			f.UpsertSlot(fe, 1, 5)
			f.FixAffinity([]reconciler.AffinityFix{{Frontend: fe, Backend: 6, Slot: 1}})
		}, "moves backend 6 to slot 1, which names 5"},
		{"every backend's session affinity moved", func(f *Fake) {
			f.FixAffinity([]reconciler.AffinityFix{{Frontend: fe, Slot: 1}})
		}, "moves every backend to slot 1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := New(10, 10, 10)
			tc.ops(f)
			v := f.Violations()
			if len(v) == 0 || !strings.Contains(strings.Join(v, "\n"), tc.want) {
				t.Errorf("violations %q, want %q", v, tc.want)
			}
		})
	}
}

func TestFakeCapacityAndFailures(t *testing.T) {
	f := New(1, 1, 1)
	b := model.L4Addr{Addr: netip.MustParseAddr("10.0.0.1"), Port: 8080, Proto: model.TCP}
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

// TestFakeCheckSourceRanges: between Applies, a range whose frontend's
// master does not check ranges is a leftover; replacing one range by
// another under a checking master is not a violation.
func TestFakeCheckSourceRanges(t *testing.T) {
	fe := model.L4Addr{Addr: netip.MustParseAddr("192.168.1.200"), Port: 80, Proto: model.TCP}
	p1, p2 := netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("172.16.0.0/12")
	f := New(10, 10, 10)
	f.CheckAll = true
	for _, err := range []error{
		f.UpsertSourceRange(fe, p1),
		f.UpsertRevNat(1, fe),
		f.UpsertMaster(fe, reconciler.Master{ID: 1, Flags: reconciler.FlagExternal | reconciler.FlagSourceRanges}),
		f.UpsertSourceRange(fe, p2),
		f.DeleteSourceRange(fe, p1),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if v := append(f.Violations(), f.Check()...); len(v) > 0 {
		t.Fatalf("violations: %v", v)
	}
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
	if err := f.UpsertSourceRange(fe, p1); !errors.Is(err, ErrFull) {
		t.Errorf("err = %v, want ErrFull", err)
	}
	if err := f.UpsertSourceRange(fe, p2); err != nil {
		t.Errorf("upsert of an existing range: %v", err)
	}
}
