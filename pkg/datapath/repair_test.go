package datapath

import (
	"net/netip"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// realDriftCases are pkg/reconciler's TestRecheckFindsDrift's 18 kinds of
// drift, made in the real maps of dualStackState with the maps' own
// writes, as bpftool would (ks is what the reconciler programmed).
func realDriftCases() []struct {
	name   string
	tamper func(m reconciler.Datapath, ks *reconciler.KernelState) error
} {
	fe := reconciler.DefaultScope(l4("10.96.0.10", 80, model.TCP))
	six := reconciler.DefaultScope(l4("2001:db8:96::10", 80, model.TCP))
	lb4 := l4("192.0.2.1", 443, model.TCP)
	other := reconciler.DefaultScope(l4("10.96.0.98", 80, model.TCP))
	stray := l4("10.9.9.9", 9, model.UDP)
	type dp = reconciler.Datapath
	type ks = reconciler.KernelState
	return []struct {
		name   string
		tamper func(m reconciler.Datapath, ks *reconciler.KernelState) error
	}{
		{"master changed", func(m dp, k *ks) error {
			x := k.Masters[fe]
			x.Flags ^= 0x80
			return m.UpsertMaster(fe, x)
		}},
		{"master removed", func(m dp, k *ks) error { return m.DeleteSlot(fe, 0) }},
		{"extra master", func(m dp, k *ks) error {
			return m.UpsertMaster(reconciler.DefaultScope(l4("10.96.0.99", 80, model.TCP)), k.Masters[fe])
		}},
		{"slot changed", func(m dp, k *ks) error {
			if err := m.UpsertSlot(fe, 1, k.Slots[fe][2]); err != nil {
				return err
			}
			return m.UpsertSlot(fe, 2, k.Slots[fe][1])
		}},
		{"slot removed", func(m dp, k *ks) error { return m.DeleteSlot(fe, 2) }},
		{"extra slot", func(m dp, k *ks) error { return m.UpsertSlot(fe, 3, k.Slots[fe][1]) }},
		{"backend changed", func(m dp, k *ks) error { return m.UpsertBackend(k.Slots[fe][1], stray) }},
		{"backend removed", func(m dp, k *ks) error { return m.DeleteBackend(k.Slots[fe][1]) }},
		{"extra backend", func(m dp, k *ks) error { return m.UpsertBackend(77, stray) }},
		{"rev_nat changed", func(m dp, k *ks) error { return m.UpsertRevNat(k.Masters[fe].ID, other) }},
		{"rev_nat removed", func(m dp, k *ks) error { return m.DeleteRevNat(k.Masters[fe].ID) }},
		{"extra rev_nat", func(m dp, k *ks) error { return m.UpsertRevNat(99, other) }},
		{"source range changed", func(m dp, k *ks) error {
			if err := m.UpsertSourceRange(lb4, netip.MustParsePrefix("203.0.113.0/24")); err != nil {
				return err
			}
			return m.DeleteSourceRange(lb4, netip.MustParsePrefix("198.51.100.0/24"))
		}},
		{"source range removed", func(m dp, k *ks) error {
			return m.DeleteSourceRange(lb4, netip.MustParsePrefix("198.51.100.0/24"))
		}},
		{"extra source range", func(m dp, k *ks) error {
			return m.UpsertSourceRange(fe.L4Addr, netip.MustParsePrefix("203.0.113.0/24"))
		}},
		{"service IP removed", func(m dp, k *ks) error { return m.DeleteServiceIP(fe.Addr) }},
		{"extra service IP", func(m dp, k *ks) error { return m.UpsertServiceIP(netip.MustParseAddr("10.96.200.1")) }},
		{"IPv6 master changed", func(m dp, k *ks) error {
			x := k.Masters[six]
			x.Count = 1
			return m.UpsertMaster(six, x)
		}},
	}
}

// TestRepairOnRealMaps: each of the 18 kinds of drift, made in real maps
// (both families) behind a reconciler's back, is repaired by its next
// re-read entry by entry (no dump: the refresh hook is not called), and
// the maps come out exactly as those of a reconciler that rebuilt its
// view from a dump (other maps, drifted the same; its walk fails, so its
// re-read rebuilds, as every re-read that found drift did before); a
// re-read after that finds nothing to write, nor does a restarted
// reconciler.
func TestRepairOnRealMaps(t *testing.T) {
	maps := [2]reconciler.Datapath{newTestDatapath(t).Maps(), noWalk{newTestDatapath(t).Maps()}}
	st := dualStackState()
	for _, c := range realDriftCases() {
		t.Run(c.name, func(t *testing.T) {
			var after [2]string
			for i, m := range maps {
				// Empty maps, then st programmed afresh: the same
				// ids in both.
				clear := reconciler.New(m, nil)
				if err := clear.Restore(); err != nil {
					t.Fatal(err)
				}
				if err := clear.Apply(model.NewState()); err != nil {
					t.Fatal(err)
				}
				r := reconciler.New(m, nil)
				dumps := 0
				r.SetRefreshHook(func() { dumps++ })
				if err := r.Apply(st); err != nil {
					t.Fatal(err)
				}
				ks := mustDump(t, m)
				if err := c.tamper(m, ks); err != nil {
					t.Fatal(err)
				}
				if tampered, err := m.Dump(); err != nil || tampered.String() == ks.String() {
					t.Fatalf("the maps did not drift (%v):\n%s", err, ks)
				}
				r.SetRefreshInterval(time.Nanosecond)
				time.Sleep(time.Millisecond)
				if err := r.Apply(st); err != nil {
					t.Fatal(err)
				}
				if i == 0 && dumps != 0 {
					t.Errorf("the re-read that repaired the drift called the refresh hook %d times, want none (no dump)", dumps)
				}
				if i == 1 && dumps != 2 {
					t.Errorf("the reference's re-read called the refresh hook %d times, want 2 (around a dump)", dumps)
				}
				got := mustDump(t, m)
				after[i] = got.String()
				if i == 0 {
					time.Sleep(time.Millisecond)
					w := r.Stats().Writes
					if err := r.Apply(st); err != nil {
						t.Fatal(err)
					}
					if n := r.Stats().Writes - w; n != 0 || dumps != 0 {
						t.Errorf("a re-read after the repair wrote %d entries (hook called %d times), want none", n, dumps)
					}
					if _, n := restarted(t, m, st); n != 0 {
						t.Errorf("a restarted reconciler wrote %d entries after the repair, want none", n)
					}
				}
			}
			if after[0] != after[1] {
				t.Errorf("maps after the repair:\n%s\nafter a rebuild from a dump:\n%s", after[0], after[1])
			}
		})
	}
}

// restarted returns a reconciler restarted over m (its view restored
// from the maps) that programmed st, and how many writes that took.
func restarted(t *testing.T, m reconciler.Datapath, st *model.State) (*reconciler.Reconciler, uint64) {
	t.Helper()
	r := reconciler.New(m, nil)
	if err := r.Restore(); err != nil {
		t.Fatal(err)
	}
	if err := r.Apply(st); err != nil {
		t.Fatal(err)
	}
	return r, r.Stats().Writes
}
