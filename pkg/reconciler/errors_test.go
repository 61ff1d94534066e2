package reconciler_test

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
	"github.com/sluice-lb/sluice/pkg/reconciler/fakedp"
)

// frontendErrors returns the *FrontendError of each frontend in err (a
// joined error of Apply), by frontend, and fails if err holds anything
// else.
func frontendErrors(t *testing.T, err error) map[model.L4Addr]*reconciler.FrontendError {
	t.Helper()
	out := map[model.L4Addr]*reconciler.FrontendError{}
	if err == nil {
		return out
	}
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok {
		t.Fatalf("Apply error %v is not a joined error", err)
	}
	for _, e := range joined.Unwrap() {
		var fe *reconciler.FrontendError
		if !errors.As(e, &fe) {
			t.Fatalf("Apply error %q names no frontend", e)
		}
		out[fe.Frontend] = fe
	}
	return out
}

// checkRefused applies the Services programmed and over, which does not
// fit: the Apply fails for over alone, with a capacity error containing
// want (what says how, for the failure's message), and f holds the
// Services programmed, as they were.
func checkRefused(t *testing.T, f *fakedp.Fake, r *reconciler.Reconciler, programmed []*model.Service, over *model.Service, want, what string) {
	t.Helper()
	errs := frontendErrors(t, r.Apply(state(append(slices.Clone(programmed), over)...)))
	if err := errs[over.Frontend]; len(errs) != 1 || !errors.Is(err, reconciler.ErrCapacity) ||
		!strings.Contains(err.Error(), want) {
		t.Errorf("errors %v, want one for %s %s", errs, over.Frontend, what)
	}
	checkProgrammed(t, f, state(programmed...))
}

// Apply's errors say which frontend failed, for which Service, and
// whether trying again can help: a frontend that does not fit or cannot
// be represented is permanent (checked before any write: the others and
// its previous programming stay), a failed write is not.
func TestApplyErrorsPerFrontend(t *testing.T) {
	f := fakedp.New(16, 8, 64)
	r := reconciler.New(f, nil)
	good, big, v6, flaky := vip(1), vip(2), vip(3), vip(4)
	var many []model.Backend
	for j := range 9 { // one more than the backends map holds
		many = append(many, be(2, j+1, model.TCP))
	}
	bad6 := model.Backend{L4Addr: model.L4Addr{Addr: netip.MustParseAddr("fd00::1"), Port: 80, Proto: model.TCP}}
	f.Fail = func(op fakedp.Op) error {
		if op.Frontend.L4Addr == flaky && op.Kind == fakedp.OpUpsertMaster {
			return errors.New("EIO")
		}
		return nil
	}
	st := state(svc(good, "good", be(1, 1, model.TCP)), svc(big, "big", many...),
		svc(v6, "v6", bad6), svc(flaky, "flaky", be(4, 1, model.TCP)))
	errs := frontendErrors(t, r.Apply(st))
	if len(errs) != 3 {
		t.Fatalf("errors for %d frontends, want 3 (big, v6, flaky): %v", len(errs), errs)
	}
	for _, c := range []struct {
		fe        model.L4Addr
		name      string
		reason    string
		permanent bool
	}{
		{big, "big", "capacity", true},
		{v6, "v6", "invalid", true},
		{flaky, "flaky", "write", false},
	} {
		e := errs[c.fe]
		if e == nil {
			t.Errorf("no error for %s", c.name)
			continue
		}
		if e.Service.Name != c.name || e.Reason() != c.reason || e.Permanent() != c.permanent {
			t.Errorf("%s: service %s, reason %s, permanent %v; want %s, %s, %v (%v)",
				c.fe, e.Service, e.Reason(), e.Permanent(), c.name, c.reason, c.permanent, e)
		}
	}
	if errors.Is(errs[v6], reconciler.ErrCapacity) || !errors.Is(errs[v6], reconciler.ErrInvalid) {
		t.Errorf("the IPv6 backend's error %v is not ErrInvalid alone", errs[v6])
	}
	ks, _ := f.Dump()
	if _, ok := ks.Masters[reconciler.DefaultScope(good)]; !ok {
		t.Errorf("the good frontend is not programmed:\n%s", f)
	}
	for _, fe := range []model.L4Addr{big, v6} {
		if _, ok := ks.Slots[reconciler.DefaultScope(fe)]; ok {
			t.Errorf("%s: a permanent failure wrote slots:\n%s", fe, f)
		}
	}
}

// More backends than a frontend has slots is invalid, found before any
// write (the datapath would refuse slot 65536 after writing 65535).
func TestApplyTooManyBackendsForSlots(t *testing.T) {
	f := fakedp.New(16, 1<<17, 1<<17)
	r := reconciler.New(f, nil)
	bs := make([]model.Backend, reconciler.MaxSlots+1)
	for j := range bs {
		bs[j] = model.Backend{L4Addr: model.L4Addr{Addr: netip.AddrFrom4([4]byte{10, 2, byte(j >> 8), byte(j)}), Port: 8080, Proto: model.TCP}}
	}
	errs := frontendErrors(t, r.Apply(state(svc(vip(1), "huge", bs...))))
	e := errs[vip(1)]
	if e == nil || !e.Permanent() || e.Reason() != "invalid" {
		t.Fatalf("error %v, want a permanent invalid error for the frontend", e)
	}
	if n := f.Writes(); n != 0 {
		t.Errorf("%d writes before the slot limit was found, want 0", n)
	}
}

// Holds says whether a frontend is programmed exactly as a Service asks,
// restored maps included: what the tracker keeps a contested frontend by
// after a restart.
func TestHolds(t *testing.T) {
	f := fakedp.New(16, 16, 64)
	a := svc(vip(1), "a", be(1, 1, model.TCP), be(1, 2, model.TCP))
	b := svc(vip(1), "b", be(1, 3, model.TCP))
	if err := reconciler.New(f, nil).Apply(state(a)); err != nil {
		t.Fatal(err)
	}
	r := reconciler.New(f, nil) // a restart
	if err := r.Restore(); err != nil {
		t.Fatal(err)
	}
	if !r.Holds(a) || r.Holds(b) || r.Holds(svc(vip(2), "c")) || r.Holds(nil) {
		t.Errorf("Holds: a %v (want true), b %v, c %v (want false)", r.Holds(a), r.Holds(b), r.Holds(svc(vip(2), "c")))
	}
}

// A frontend the datapath cannot hold because of its addresses is refused
// by name, before any write: backends or source ranges of the other family
// (no NAT46/64), an IPv4-mapped IPv6 address (the maps would hold it as
// its IPv4 address and read back another frontend), an address with a
// zone. The frontend keeps its previous programming, the others are
// programmed.
func TestApplyRefusesAddressMixups(t *testing.T) {
	l4 := func(a string, port uint16) model.L4Addr {
		return model.L4Addr{Addr: netip.MustParseAddr(a), Port: port, Proto: model.TCP}
	}
	fe6, fe4 := l4("2001:db8::10", 80), l4("10.96.0.10", 80)
	good6 := []model.Backend{{L4Addr: l4("2001:db8:1::1", 8080)}}
	for _, c := range []struct {
		name string
		fe   model.L4Addr
		svc  func(s *model.Service)
		want string
	}{
		{"v6 frontend, v4 backend", fe6, func(s *model.Service) { s.Backends = append(s.Backends, model.Backend{L4Addr: l4("10.1.0.1", 8080)}) },
			"backend 10.1.0.1:8080/TCP: not of the frontend's address family"},
		{"v4 frontend, v6 backend", fe4, func(s *model.Service) { s.Backends = append(s.Backends, good6...) },
			"backend [2001:db8:1::1]:8080/TCP: not of the frontend's address family"},
		{"v4-mapped backend", fe4, func(s *model.Service) {
			s.Backends = append(s.Backends, model.Backend{L4Addr: l4("::ffff:10.1.0.2", 8080)})
		},
			"IPv4-mapped"},
		{"zoned backend", fe6, func(s *model.Service) {
			s.Backends = append(s.Backends, model.Backend{L4Addr: l4("fe80::1%eth0", 8080)})
		},
			"zone"},
		{"v6 frontend, v4 source range", fe6, func(s *model.Service) {
			s.Kind, s.SourceRanges = model.LoadBalancer, []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
		}, "source range 192.0.2.0/24"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := fakedp.New(16, 16, 64)
			r := reconciler.New(f, nil)
			other := l4("2001:db8::20", 80)
			first := svc(c.fe, "mixed", be(1, 1, model.TCP))
			if c.fe.Addr.Is6() {
				first = svc(c.fe, "mixed", good6...)
			}
			if err := r.Apply(state(first)); err != nil {
				t.Fatal(err)
			}
			before, _ := f.Dump()
			bad := *first
			bad.Backends = slices.Clone(first.Backends)
			c.svc(&bad)
			bad.Backends = model.SortBackends(bad.Backends)
			errs := frontendErrors(t, r.Apply(state(&bad, svc(other, "other", good6...))))
			e := errs[c.fe]
			if len(errs) != 1 || e == nil || e.Reason() != "invalid" || !strings.Contains(e.Error(), "default/mixed") ||
				!strings.Contains(e.Error(), c.want) {
				t.Fatalf("errors %v, want one for default/mixed saying %q", errs, c.want)
			}
			after, _ := f.Dump()
			if _, ok := after.Masters[reconciler.DefaultScope(other)]; !ok {
				t.Errorf("the other frontend was not programmed:\n%s", after)
			}
			delete(after.Masters, reconciler.DefaultScope(other))
			if before.Masters[reconciler.DefaultScope(c.fe)] != after.Masters[reconciler.DefaultScope(c.fe)] ||
				len(before.Masters) != len(after.Masters) {
				t.Errorf("previous programming not kept:\n%s\nwas\n%s", after, before)
			}
			if v := f.Check(); len(v) > 0 {
				t.Error(v)
			}
		})
	}
}
