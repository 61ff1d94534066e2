package reconciler_test

import (
	"errors"
	"net/netip"
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
