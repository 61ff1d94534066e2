package reconciler_test

import (
	"net/netip"
	"testing"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// TestMasterFlags: the north-south settings of a Service reach its master
// entry (its internal scope's: external, and Local, never the checks of
// the default scope), and changing only them rewrites the master.
func TestMasterFlags(t *testing.T) {
	f := newFake(t)
	r := reconciler.New(f, nil)
	np := model.L4Addr{Addr: netip.MustParseAddr("192.168.1.1"), Port: 30080, Proto: model.TCP}
	s := svc(np, "web", be(1, 1, model.TCP))
	s.Kind = model.NodePort
	cip := svc(vip(1), "web", be(1, 1, model.TCP))

	for _, c := range []struct {
		name  string
		set   func()
		flags uint8
	}{
		{"NodePort", func() {}, reconciler.FlagExternal},
		{"Local", func() { s.ExternalLocal = true }, reconciler.FlagExternal | reconciler.FlagLocal},
		{"source ranges", func() {
			s.Kind = model.LoadBalancer
			s.SourceRanges = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
		}, reconciler.FlagExternal | reconciler.FlagLocal | reconciler.FlagSourceRanges},
		{"two scopes", func() { s.TwoScopes, s.InternalBackends = true, s.Backends },
			reconciler.FlagExternal | reconciler.FlagLocal | reconciler.FlagSourceRanges | reconciler.FlagTwoScopes},
		{"drop when empty", func() { s.Backends, s.DropWhenEmpty = nil, true },
			reconciler.FlagExternal | reconciler.FlagLocal | reconciler.FlagSourceRanges | reconciler.FlagTwoScopes | reconciler.FlagDropEmpty},
		{"Cluster again", func() {
			s.ExternalLocal, s.SourceRanges, s.TwoScopes, s.InternalBackends = false, nil, false, nil
			s.Backends, s.DropWhenEmpty = []model.Backend{be(1, 1, model.TCP)}, false
		}, reconciler.FlagExternal},
	} {
		c.set()
		if err := r.Apply(state(s, cip)); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		ks, err := f.Dump()
		if err != nil {
			t.Fatal(err)
		}
		if got := ks.Masters[reconciler.DefaultScope(np)].Flags; got != c.flags {
			t.Errorf("%s: master flags %#x, want %#x", c.name, got, c.flags)
		}
		if got := ks.Masters[reconciler.DefaultScope(vip(1))].Flags; got != 0 {
			t.Errorf("%s: ClusterIP master flags %#x, want 0", c.name, got)
		}
		in, ok := ks.Masters[reconciler.Frontend{L4Addr: np, Scope: reconciler.ScopeInternal}]
		if want := c.flags&reconciler.FlagTwoScopes != 0; ok != want || ok && in.Flags != reconciler.FlagExternal|reconciler.FlagLocal {
			t.Errorf("%s: internal scope %v (flags %#x), want %v with %#x", c.name, ok, in.Flags, want, reconciler.FlagExternal|reconciler.FlagLocal)
		}
	}
}
