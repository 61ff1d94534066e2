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
