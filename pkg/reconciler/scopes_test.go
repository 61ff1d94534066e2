package reconciler_test

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
	"github.com/sluice-lb/sluice/pkg/reconciler/fakedp"
)

// twoScopes returns an externalTrafficPolicy Local NodePort frontend with
// backends for external clients and internal ones.
func twoScopes(external, internal []model.Backend) *model.Service {
	fe := model.L4Addr{Addr: netip.MustParseAddr("192.168.1.1"), Port: 30080, Proto: model.TCP}
	s := svc(fe, "web", external...)
	s.Kind = model.NodePort
	s.ExternalLocal, s.TwoScopes = true, true
	s.InternalBackends = model.SortBackends(internal)
	return s
}

// TestTwoScopesOrder: an internal scope is written before the default
// scope's master names it, and goes only after that master stopped
// naming it or is gone.
func TestTwoScopesOrder(t *testing.T) {
	f := newRecordingFake(t)
	r := reconciler.New(f, nil)
	local, remote := be(1, 1, model.TCP), be(1, 2, model.TCP)
	s := twoScopes([]model.Backend{local}, []model.Backend{local, remote})
	mustApply(t, r, state(s))
	// A new frontend's two scopes are written map by map, in batches
	// (batch.go): the internal scope's master still comes before the
	// default scope's.
	want := `ResetServiceStats 1
ResetServiceStats 2
UpsertBackend 1 10.1.1.1:8080/TCP
UpsertBackend 2 10.1.1.2:8080/TCP
UpsertRevNat 1 192.168.1.1:30080/TCP internal
UpsertRevNat 2 192.168.1.1:30080/TCP
UpsertSlot 192.168.1.1:30080/TCP internal[1]=1
UpsertSlot 192.168.1.1:30080/TCP internal[2]=2
UpsertSlot 192.168.1.1:30080/TCP[1]=1
UpsertMaster 192.168.1.1:30080/TCP internal id=1 count=2 flags=0x3
UpsertMaster 192.168.1.1:30080/TCP id=2 count=1 flags=0xb
`
	if got := opsString(f.Ops); got != want {
		t.Errorf("add ops:\n%s\nwant:\n%s", got, want)
	}

	// The local endpoint goes: external clients are dropped (the
	// Service has an endpoint elsewhere), internal ones go on.
	f.ResetCounts()
	s = twoScopes(nil, []model.Backend{remote})
	s.DropWhenEmpty = true
	mustApply(t, r, state(s))
	want = `UpsertSlot 192.168.1.1:30080/TCP internal[1]=2
UpsertMaster 192.168.1.1:30080/TCP internal id=1 count=1 flags=0x3
DeleteSlot 192.168.1.1:30080/TCP internal[2]
UpsertMaster 192.168.1.1:30080/TCP id=2 count=0 flags=0x1b
DeleteSlot 192.168.1.1:30080/TCP[1]
DeleteBackend 1
`
	if got := opsString(f.Ops); got != want {
		t.Errorf("drop ops:\n%s\nwant:\n%s", got, want)
	}

	// externalTrafficPolicy Cluster: the master stops naming the
	// internal scope, which goes after it.
	f.ResetCounts()
	s = twoScopes([]model.Backend{remote}, nil)
	s.ExternalLocal, s.TwoScopes = false, false
	mustApply(t, r, state(s))
	want = `UpsertSlot 192.168.1.1:30080/TCP[1]=2
UpsertMaster 192.168.1.1:30080/TCP id=2 count=1 flags=0x1
DeleteSlot 192.168.1.1:30080/TCP internal[0]
DeleteSlot 192.168.1.1:30080/TCP internal[1]
DeleteRevNat 1
`
	if got := opsString(f.Ops); got != want {
		t.Errorf("one scope ops:\n%s\nwant:\n%s", got, want)
	}

	// Local again, then gone: the default scope's master first.
	mustApply(t, r, state(twoScopes([]model.Backend{remote}, []model.Backend{remote})))
	f.ResetCounts()
	mustApply(t, r, state())
	want = `DeleteSlot 192.168.1.1:30080/TCP[0]
DeleteSlot 192.168.1.1:30080/TCP[1]
DeleteSlot 192.168.1.1:30080/TCP internal[0]
DeleteSlot 192.168.1.1:30080/TCP internal[1]
DeleteBackend 2
DeleteRevNat 2
DeleteRevNat 3
`
	if got := opsString(f.Ops); got != want {
		t.Errorf("remove ops:\n%s\nwant:\n%s", got, want)
	}
}

// TestTwoScopesFailures: a failure to program the internal scope keeps the
// default scope's previous programming (never naming a missing scope), and
// a failure to rewrite the default scope keeps the internal scope it names.
func TestTwoScopesFailures(t *testing.T) {
	f := newFake(t)
	r := reconciler.New(f, nil)
	local, remote := be(1, 1, model.TCP), be(1, 2, model.TCP)
	one := twoScopes([]model.Backend{local, remote}, nil)
	one.ExternalLocal, one.TwoScopes = false, false
	mustApply(t, r, state(one))
	before := f.String()

	two := twoScopes([]model.Backend{local}, []model.Backend{local, remote})
	f.Fail = func(op fakedp.Op) error {
		if op.Frontend.Scope == reconciler.ScopeInternal && op.Kind == fakedp.OpUpsertMaster {
			return errors.New("injected")
		}
		return nil
	}
	err := r.Apply(state(two))
	if err == nil || !strings.Contains(err.Error(), "internal scope not programmed") {
		t.Fatalf("err = %v, want the default scope refused", err)
	}
	if after := f.String(); !strings.Contains(after, "192.168.1.1:30080/TCP [0] id=1 count=2 flags=0x1\n") {
		t.Errorf("default scope changed without its internal scope:\n%s\nbefore:\n%s", after, before)
	}
	f.Fail = nil
	mustApply(t, r, state(two))
	checkProgrammed(t, f, state(two))

	// Back to one scope, the master's rewrite failing: the internal
	// scope stays while the master names it.
	f.Fail = func(op fakedp.Op) error {
		if op.Frontend.Scope == reconciler.ScopeDefault && op.Kind == fakedp.OpUpsertMaster {
			return errors.New("injected")
		}
		return nil
	}
	if err := r.Apply(state(one)); err == nil {
		t.Fatal("no error")
	}
	if ks, _ := f.Dump(); len(ks.Masters) != 2 {
		t.Errorf("internal scope removed under its master:\n%s", f)
	}
	f.Fail = nil
	mustApply(t, r, state(one))
	checkProgrammed(t, f, state(one))
}

// TestServiceIPs: a ClusterIP's address is a service IP while one of its
// frontends is programmed: added after the first master, removed before
// the last goes; a failed write is repaired by the next Apply; a restart
// keeps the set and drops strays.
func TestServiceIPs(t *testing.T) {
	f := newRecordingFake(t)
	r := reconciler.New(f, nil)
	http := svc(vip(1), "a", be(1, 1, model.TCP))
	dns := svc(model.L4Addr{Addr: vip(1).Addr, Port: 53, Proto: model.UDP}, "a", be(1, 1, model.UDP))
	ext := svc(model.L4Addr{Addr: netip.MustParseAddr("203.0.113.7"), Port: 80, Proto: model.TCP}, "a", be(1, 1, model.TCP))
	ext.Kind = model.ExternalIP
	// Stats counts the addresses the map holds.
	counted := func() {
		t.Helper()
		if ks, _ := f.Dump(); r.Stats().ServiceIPs != len(ks.ServiceIPs) {
			t.Errorf("Stats: %d service IPs, the map holds %d", r.Stats().ServiceIPs, len(ks.ServiceIPs))
		}
	}
	mustApply(t, r, state(http, dns, ext))
	counted()
	if ks, _ := f.Dump(); len(ks.ServiceIPs) != 1 || ks.ServiceIPs[0] != vip(1).Addr {
		t.Fatalf("service IPs %v, want only the ClusterIP", ks.ServiceIPs)
	}
	if n := f.Count(fakedp.OpUpsertServiceIP); n != 1 {
		t.Errorf("%d service IP writes for one address", n)
	}

	// One port goes: the address stays.
	f.ResetCounts()
	mustApply(t, r, state(http, ext))
	counted()
	if n := f.Count(fakedp.OpDeleteServiceIP); n != 0 {
		t.Errorf("service IP deleted while a port of it is left")
	}

	// A failed add is repaired by the next Apply.
	mustApply(t, r, state(ext))
	counted()
	f.Fail = func(op fakedp.Op) error {
		if op.Kind == fakedp.OpUpsertServiceIP {
			return errors.New("injected")
		}
		return nil
	}
	if err := r.Apply(state(http, ext)); err == nil {
		t.Fatal("no error")
	}
	counted()
	f.Fail = nil
	mustApply(t, r, state(http, ext))
	counted()
	if v := f.Check(); len(v) > 0 {
		t.Fatalf("not repaired: %v", v)
	}

	// A restart keeps the set and writes nothing.
	restartWritesNothing(t, f, state(http, ext))
}
