package reconciler_test

import (
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
