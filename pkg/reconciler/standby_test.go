package reconciler_test

import (
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
	"github.com/sluice-lb/sluice/pkg/reconciler/fakedp"
)

// hasBackendEntry says whether the backend map holds a.
func hasBackendEntry(t *testing.T, f *fakedp.Fake, a model.L4Addr) bool {
	t.Helper()
	ks, err := f.Dump()
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range ks.Backends {
		if b == a {
			return true
		}
	}
	return false
}

// A UDP backend that leaves the slots while its Service port still
// serves it (serving and terminating while others are ready: standby)
// keeps its flows, as kube-proxy's conntrack cleanup keeps them: no
// flush, and its backend entry, which its flows name, stays. Once it no
// longer serves, its flows go.
func TestUDPFlushSparesServingBackends(t *testing.T) {
	u := model.L4Addr{Addr: netip.MustParseAddr("10.96.0.10"), Port: 53, Proto: model.UDP}
	b1, b2, b3 := be(5, 1, model.UDP), be(5, 2, model.UDP), be(5, 3, model.UDP)
	terminating := func() *model.Service {
		s := svc(u, "dns", b2, b3)
		s.Standby = []model.L4Addr{b1.L4Addr}
		return s
	}

	t.Run("StandbyThenGone", func(t *testing.T) {
		f := newFake(t)
		r := reconciler.New(f, nil)
		mustApply(t, r, state(svc(u, "dns", b1, b2, b3)))
		mustApply(t, r, state(terminating()))
		if fl := f.Flushed(); len(fl) != 0 {
			t.Fatalf("flushed %v: the terminating backend still serves", fl)
		}
		if !hasBackendEntry(t, f, b1.L4Addr) {
			t.Fatalf("backend %v deleted while in standby: its flows re-balance", b1)
		}
		// Still in standby, another change of the Service: nothing.
		mustApply(t, r, state(terminating(), svc(vip(1), "other", be(1, 1, model.TCP))))
		if fl := f.Flushed(); len(fl) != 0 || !hasBackendEntry(t, f, b1.L4Addr) {
			t.Fatalf("flushed %v, entry kept %v", fl, hasBackendEntry(t, f, b1.L4Addr))
		}
		// The pod goes: its flows go, and its entry.
		mustApply(t, r, state(svc(u, "dns", b2, b3)))
		if fl := f.Flushed(); !slices.Equal(fl, []model.L4Addr{b1.L4Addr}) {
			t.Fatalf("flushed %v, want %v", fl, b1.L4Addr)
		}
		if hasBackendEntry(t, f, b1.L4Addr) {
			t.Fatalf("backend %v kept after it stopped serving", b1)
		}
	})

	// An agent restart, and a re-read of the maps, keep a standby
	// backend's entry: the restored view has it without a slot.
	t.Run("RestartAndRefresh", func(t *testing.T) {
		f := newFake(t)
		r := reconciler.New(f, nil)
		mustApply(t, r, state(svc(u, "dns", b1, b2, b3)))
		mustApply(t, r, state(terminating()))
		f.ResetCounts()
		r2 := reconciler.New(f, nil)
		if err := r2.Restore(); err != nil {
			t.Fatal(err)
		}
		mustApply(t, r2, state(terminating()))
		if n, fl := f.Writes(), f.Flushed(); n != 0 || len(fl) != 0 || !hasBackendEntry(t, f, b1.L4Addr) {
			t.Fatalf("after a restart: %d writes, flushed %v, entry kept %v", n, fl, hasBackendEntry(t, f, b1.L4Addr))
		}
		r2.SetRefreshInterval(time.Nanosecond)
		time.Sleep(time.Millisecond)
		mustApply(t, r2, state(terminating()))
		if n, fl := f.Writes(), f.Flushed(); n != 0 || len(fl) != 0 || !hasBackendEntry(t, f, b1.L4Addr) {
			t.Fatalf("after a refresh: %d writes, flushed %v, entry kept %v", n, fl, hasBackendEntry(t, f, b1.L4Addr))
		}
		mustApply(t, r2, state(svc(u, "dns", b2, b3)))
		if fl := f.Flushed(); !slices.Equal(fl, []model.L4Addr{b1.L4Addr}) || hasBackendEntry(t, f, b1.L4Addr) {
			t.Fatalf("flushed %v, want %v, and its entry deleted", fl, b1.L4Addr)
		}
	})

	t.Run("StopsServing", func(t *testing.T) {
		f := newFake(t)
		r := reconciler.New(f, nil)
		mustApply(t, r, state(svc(u, "dns", b1, b2, b3)))
		mustApply(t, r, state(svc(u, "dns", b2, b3))) // b1 neither in the slots nor in standby
		if fl := f.Flushed(); !slices.Equal(fl, []model.L4Addr{b1.L4Addr}) {
			t.Fatalf("flushed %v, want %v", fl, b1.L4Addr)
		}
	})

	// externalTrafficPolicy Local: a local endpoint that leaves the
	// external scope (another local one became ready, this one
	// terminates) but stays in the internal one is still serving.
	t.Run("OtherScope", func(t *testing.T) {
		f := newFake(t)
		r := reconciler.New(f, nil)
		np := model.L4Addr{Addr: netip.MustParseAddr("192.0.2.1"), Port: 30053, Proto: model.UDP}
		local := func(ext []model.Backend, internal ...model.Backend) *model.Service {
			s := svc(np, "dns", ext...)
			s.Kind, s.ExternalLocal, s.TwoScopes = model.NodePort, true, true
			s.InternalBackends = model.SortBackends(slices.Clone(internal))
			return s
		}
		mustApply(t, r, state(local([]model.Backend{b1}, b1, b2)))
		mustApply(t, r, state(local([]model.Backend{b3}, b1, b2, b3)))
		if fl := f.Flushed(); len(fl) != 0 {
			t.Fatalf("flushed %v: it still serves the internal scope", fl)
		}
		// externalTrafficPolicy Local to Cluster: the internal scope
		// goes, its backends stay.
		cluster := svc(np, "dns", b1, b2, b3)
		cluster.Kind = model.NodePort
		mustApply(t, r, state(cluster))
		if fl := f.Flushed(); len(fl) != 0 {
			t.Fatalf("flushed %v when the internal scope went: they still serve", fl)
		}
	})
}

// What keeps a standby backend's entry, and what flushes it, besides a
// frontend's programming: an agent restart or a rebuild of the view (which
// count no standby backends until the frontends are programmed), a
// programming that fails half-way, a Service deleted, a frontend taken
// over by another Service port.
func TestUDPStandbyEntryLifetime(t *testing.T) {
	u := model.L4Addr{Addr: netip.MustParseAddr("10.96.0.10"), Port: 53, Proto: model.UDP}
	b1, b2, b3, b4, b5 := be(5, 1, model.UDP), be(5, 2, model.UDP), be(5, 3, model.UDP), be(5, 4, model.UDP), be(5, 5, model.UDP)
	withStandby := func(bs ...model.Backend) *model.Service {
		s := svc(u, "dns", bs...)
		s.Standby = []model.L4Addr{b1.L4Addr}
		return s
	}
	// standbyThenRestart leaves b1 in standby, seen by a new reconciler
	// (restarted, or rebuilt from a dump) that has applied nothing yet.
	standbyThenRestart := func(t *testing.T, rebuild bool) (*fakedp.Fake, *reconciler.Reconciler) {
		f := newFake(t)
		w := &walkHook{Datapath: f, before: func(int) {}}
		r := reconciler.New(w, nil)
		mustApply(t, r, state(svc(u, "dns", b1, b2, b3)))
		mustApply(t, r, state(withStandby(b2, b3)))
		if rebuild {
			// A re-read whose walk fails rebuilds the view from a dump.
			w.fail = true
			refreshNow(r)
		} else {
			r = reconciler.New(f, nil)
			if err := r.Restore(); err != nil {
				t.Fatal(err)
			}
		}
		f.ResetCounts()
		return f, r
	}
	checkRebuilt := func(t *testing.T, r *reconciler.Reconciler, rebuild bool) {
		t.Helper()
		if n := r.Drift().Rebuilt; rebuild && n != 1 {
			t.Fatalf("%d rebuilds, want 1: the test tests nothing", n)
		}
	}

	// Its frontend changes in the first Apply after the restart: b1's
	// entry, which has no slot, stays, and its flows.
	for _, rebuild := range []bool{false, true} {
		name := map[bool]string{false: "RestartThenChange", true: "RebuildThenChange"}[rebuild]
		t.Run(name, func(t *testing.T) {
			f, r := standbyThenRestart(t, rebuild)
			mustApply(t, r, state(withStandby(b2, b3, b4)))
			checkRebuilt(t, r, rebuild)
			if fl := f.Flushed(); len(fl) != 0 || !hasBackendEntry(t, f, b1.L4Addr) {
				t.Fatalf("flushed %v, entry of %v kept %v: it still serves", fl, b1, hasBackendEntry(t, f, b1.L4Addr))
			}
			// And it is counted: its Service letting it go flushes it.
			mustApply(t, r, state(svc(u, "dns", b2, b3, b4)))
			if fl := f.Flushed(); !slices.Equal(fl, []model.L4Addr{b1.L4Addr}) || hasBackendEntry(t, f, b1.L4Addr) {
				t.Fatalf("flushed %v, want %v, and its entry deleted", fl, b1)
			}
		})
	}

	// Its pod went while the agent was down: its entry goes, and so do
	// its flows (and its connected sockets).
	t.Run("RestartWithPodGone", func(t *testing.T) {
		f, r := standbyThenRestart(t, false)
		mustApply(t, r, state(svc(u, "dns", b2)))
		if fl := f.Flushed(); !slices.Equal(fl, []model.L4Addr{b1.L4Addr, b3.L4Addr}) || hasBackendEntry(t, f, b1.L4Addr) {
			t.Fatalf("flushed %v, want %v and %v, and the entry of %v deleted", fl, b1, b3, b1)
		}
	})

	// The programming that takes b1's slot away fails after that (b4 in
	// b1's slot, b5's slot or the master's count failing): b1 keeps its
	// entry all the same, and its flows.
	t.Run("ProgramFails", func(t *testing.T) {
		f := newFake(t)
		r := reconciler.New(f, nil)
		mustApply(t, r, state(svc(u, "dns", b1, b2, b3)))
		ks, err := f.Dump()
		if err != nil {
			t.Fatal(err)
		}
		var id1 reconciler.BackendID
		for id, a := range ks.Backends {
			if a == b1.L4Addr {
				id1 = id
			}
		}
		slot1 := false // b1's slot has gone
		f.Fail = func(op fakedp.Op) error {
			if (op.Kind == fakedp.OpUpsertSlot || op.Kind == fakedp.OpDeleteSlot) && ks.Slots[op.Frontend][op.Slot] == id1 {
				slot1 = true
				return nil
			}
			if slot1 && op.Kind != fakedp.OpDeleteBackend && op.Kind != fakedp.OpFlushConntrack {
				return errors.New("injected")
			}
			return nil
		}
		if err := r.Apply(state(withStandby(b2, b3, b4, b5))); err == nil || !slot1 {
			t.Fatalf("Apply = %v, b1's slot rewritten %v: the test tests nothing", err, slot1)
		}
		if fl := f.Flushed(); len(fl) != 0 || !hasBackendEntry(t, f, b1.L4Addr) {
			t.Fatalf("flushed %v, entry of %v kept %v after a failure", fl, b1, hasBackendEntry(t, f, b1.L4Addr))
		}
		f.Fail = nil
		mustApply(t, r, state(withStandby(b2, b3, b4, b5)))
		if fl := f.Flushed(); len(fl) != 0 || !hasBackendEntry(t, f, b1.L4Addr) {
			t.Fatalf("flushed %v, entry of %v kept %v after the retry", fl, b1, hasBackendEntry(t, f, b1.L4Addr))
		}
	})

	// The Service goes: all its backends' flows go, the standby one's too.
	t.Run("ServiceDeleted", func(t *testing.T) {
		f := newFake(t)
		r := reconciler.New(f, nil)
		mustApply(t, r, state(svc(u, "dns", b1, b2, b3)))
		mustApply(t, r, state(withStandby(b2, b3)))
		mustApply(t, r, state(svc(vip(1), "other", be(1, 1, model.TCP))))
		if fl := f.Flushed(); !slices.Equal(fl, []model.L4Addr{b1.L4Addr, b2.L4Addr, b3.L4Addr}) || hasBackendEntry(t, f, b1.L4Addr) {
			t.Fatalf("flushed %v, want b1-b3, and the entry of %v deleted", fl, b1)
		}
	})

	// Another Service port takes the address, with the same backends in
	// its slots and none in standby: b1 no longer serves.
	t.Run("PortRenamed", func(t *testing.T) {
		f := newFake(t)
		r := reconciler.New(f, nil)
		mustApply(t, r, state(svc(u, "dns", b1, b2, b3)))
		mustApply(t, r, state(withStandby(b2, b3)))
		mustApply(t, r, state(svc(u, "dns-renamed", b2, b3)))
		if fl := f.Flushed(); !slices.Equal(fl, []model.L4Addr{b1.L4Addr}) || hasBackendEntry(t, f, b1.L4Addr) {
			t.Fatalf("flushed %v, want %v, and its entry deleted", fl, b1)
		}
	})
}

// A standby backend's entry is held, not scanned again: once kept, it
// leaves the deletion candidates, which every Apply sorts and scans (at
// 30,000 UDP Services with six standby backends each, an Apply of one
// change took 172 ms instead of 0.1). Letting it go makes it one again.
func TestUDPStandbyNotACandidate(t *testing.T) {
	u := model.L4Addr{Addr: netip.MustParseAddr("10.96.0.10"), Port: 53, Proto: model.UDP}
	b1, b2, b3 := be(5, 1, model.UDP), be(5, 2, model.UDP), be(5, 3, model.UDP)
	f := newFake(t)
	r := reconciler.New(f, nil)
	mustApply(t, r, state(svc(u, "dns", b1, b2, b3)))
	s := svc(u, "dns", b2, b3)
	s.Standby = []model.L4Addr{b1.L4Addr}
	mustApply(t, r, state(s))
	mustApply(t, r, state(s, svc(vip(1), "other", be(1, 1, model.TCP))))
	if n := reconciler.BackendCandidates(r); n != 0 || !hasBackendEntry(t, f, b1.L4Addr) {
		t.Fatalf("%d deletion candidates, entry of %v kept %v: want none and kept", n, b1, hasBackendEntry(t, f, b1.L4Addr))
	}
	mustApply(t, r, state(svc(u, "dns", b2, b3), svc(vip(1), "other", be(1, 1, model.TCP))))
	if fl := f.Flushed(); !slices.Equal(fl, []model.L4Addr{b1.L4Addr}) || hasBackendEntry(t, f, b1.L4Addr) {
		t.Fatalf("flushed %v, want %v, and its entry deleted", fl, b1)
	}
}

// A stray second entry of a UDP backend that is still in a slot (a failed
// delete, a crash) goes without a flush: the flows name the address,
// which its own entry still serves.
func TestUDPStrayDuplicateNotFlushed(t *testing.T) {
	u := model.L4Addr{Addr: netip.MustParseAddr("10.96.0.10"), Port: 53, Proto: model.UDP}
	b1, b2 := be(5, 1, model.UDP), be(5, 2, model.UDP)
	f := newFake(t)
	mustApply(t, reconciler.New(f, nil), state(svc(u, "dns", b1, b2)))
	if err := f.UpsertBackend(777, b1.L4Addr); err != nil {
		t.Fatal(err)
	}
	r := reconciler.New(f, nil)
	if err := r.Restore(); err != nil {
		t.Fatal(err)
	}
	f.ResetCounts()
	mustApply(t, r, state(svc(u, "dns", b1, b2)))
	ks, err := f.Dump()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := ks.Backends[777]; ok {
		t.Fatal("the stray entry 777 was kept")
	}
	if fl := f.Flushed(); len(fl) != 0 {
		t.Fatalf("flushed %v: %v is still in a slot", fl, b1)
	}
}
