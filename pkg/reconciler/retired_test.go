package reconciler_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
	"github.com/sluice-lb/sluice/pkg/reconciler/fakedp"
)

// retiredClock is a clock a test moves by hand.
type retiredClock struct{ t time.Time }

func (c *retiredClock) now() time.Time { return c.t }

// newRetiring returns a reconciler over f that retires removed TCP
// masters for an hour, on clock c.
func newRetiring(f *fakedp.Fake, c *retiredClock) *reconciler.Reconciler {
	r := reconciler.New(f, nil)
	r.SetRetireTimeout(time.Hour)
	reconciler.SetClock(r, c.now)
	return r
}

// masterOf returns fe's master in f, if any.
func masterOf(t *testing.T, f *fakedp.Fake, fe model.L4Addr) (reconciler.Master, bool) {
	t.Helper()
	ks, err := f.Dump()
	if err != nil {
		t.Fatal(err)
	}
	m, ok := ks.Masters[reconciler.DefaultScope(fe)]
	return m, ok
}

// hasRevNat reports whether f holds a rev_nat entry of id.
func hasRevNat(t *testing.T, f *fakedp.Fake, id reconciler.ServiceID) bool {
	t.Helper()
	ks, err := f.Dump()
	if err != nil {
		t.Fatal(err)
	}
	_, ok := ks.RevNat[id]
	return ok
}

// TestRetiredLifecycle: a removed TCP frontend's master is retired in
// place (count 0, FlagRetired, FlagExternal kept, its id and rev_nat entry
// kept, its slots gone), a ClusterIP's address leaves the service IPs; the
// frontend added again overwrites it under the same id; removed again and
// left past the timeout, the next Apply deletes it and its rev_nat entry.
// The fake checks every write's invariants (a retired master's count,
// flags and scope among them).
func TestRetiredLifecycle(t *testing.T) {
	for name, kind := range map[string]model.FrontendKind{"ClusterIP": model.ClusterIP, "NodePort": model.NodePort} {
		t.Run(name, func(t *testing.T) {
			f, c := newFake(t), &retiredClock{t: time.Unix(1e9, 0)}
			r := newRetiring(f, c)
			fe, other := vip(1), vip(2)
			s := svc(fe, "web", be(1, 1, model.TCP), be(1, 2, model.TCP))
			s.Kind = kind
			keep := svc(other, "other", be(2, 1, model.TCP))
			mustApply(t, r, state(s, keep))
			live, ok := masterOf(t, f, fe)
			if !ok {
				t.Fatal("no master after the first Apply")
			}

			mustApply(t, r, state(keep))
			m, ok := masterOf(t, f, fe)
			wantFlags := reconciler.FlagRetired
			if kind != model.ClusterIP {
				wantFlags |= reconciler.FlagExternal
			}
			if !ok || m != (reconciler.Master{ID: live.ID, Flags: wantFlags}) {
				t.Fatalf("after the removal: master %+v (present %v), want retired %+v", m, ok, reconciler.Master{ID: live.ID, Flags: wantFlags})
			}
			if got := programmed(t, f)[reconciler.DefaultScope(fe)]; len(got) != 0 {
				t.Errorf("retired master names backends %v", got)
			}
			if !hasRevNat(t, f, live.ID) {
				t.Errorf("service %d's rev_nat entry deleted with the master retired", live.ID)
			}
			if _, ok := r.Retired()[reconciler.DefaultScope(fe)]; !ok {
				t.Errorf("Retired() = %v, want %s", r.Retired(), fe)
			}
			// Another Apply before the timeout keeps it (full and again).
			c.t = c.t.Add(59 * time.Minute)
			mustApply(t, r, state(keep))
			if m, ok := masterOf(t, f, fe); !ok || m.Flags&reconciler.FlagRetired == 0 {
				t.Fatalf("before the timeout: master %+v (present %v), want it retired", m, ok)
			}

			// Added again: overwritten in place, under the same id.
			mustApply(t, r, state(s, keep))
			if m, ok := masterOf(t, f, fe); !ok || m != live {
				t.Fatalf("added again: master %+v (present %v), want %+v", m, ok, live)
			}
			if _, ok := r.Retired()[reconciler.DefaultScope(fe)]; ok {
				t.Error("added again, still listed as retired")
			}
			checkProgrammed(t, f, state(s, keep))

			// Removed again, then past the timeout: deleted.
			mustApply(t, r, state(keep))
			if m, ok := masterOf(t, f, fe); !ok || m.Flags&reconciler.FlagRetired == 0 {
				t.Fatalf("removed again: master %+v (present %v), want it retired", m, ok)
			}
			c.t = c.t.Add(time.Hour)
			mustApply(t, r, state(keep))
			if m, ok := masterOf(t, f, fe); ok {
				t.Fatalf("past the timeout: master %+v still there", m)
			}
			if hasRevNat(t, f, live.ID) {
				t.Errorf("past the timeout: service %d's rev_nat entry still there", live.ID)
			}
			if len(r.Retired()) != 0 {
				t.Errorf("past the timeout: Retired() = %v", r.Retired())
			}
			checkProgrammed(t, f, state(keep))
		})
	}
}

// TestRetiredExpiresIncremental: an incremental Apply (of a state that
// changed another frontend, or of the same state again) deletes a retired
// master past its timeout too: the agent's periodic sync is one.
func TestRetiredExpiresIncremental(t *testing.T) {
	f, c := newFake(t), &retiredClock{t: time.Unix(1e9, 0)}
	r := newRetiring(f, c)
	fe, other := vip(1), vip(2)
	st := state(svc(fe, "web", be(1, 1, model.TCP)), svc(other, "other", be(2, 1, model.TCP)))
	st.Gen = 1
	mustApply(t, r, st)
	next := state(svc(other, "other", be(2, 1, model.TCP)))
	next.Gen, next.BaseGen, next.Changed = 2, 1, []model.L4Addr{fe}
	mustApply(t, r, next)
	if m, ok := masterOf(t, f, fe); !ok || m.Flags&reconciler.FlagRetired == 0 {
		t.Fatalf("master %+v (present %v), want it retired", m, ok)
	}
	c.t = c.t.Add(time.Hour)
	mustApply(t, r, next) // the same state again
	if reconciler.IncrementalApplies(r) != 2 {
		t.Fatalf("%d incremental Applies, want 2", reconciler.IncrementalApplies(r))
	}
	if m, ok := masterOf(t, f, fe); ok {
		t.Fatalf("past the timeout: master %+v still there", m)
	}
}

// TestRetiredNotUDPNorOff: a UDP frontend is deleted at once when only
// TCP's retirement is on (SetUDPRetireTimeout unset: udpretire_test.go
// has it set), and so is every frontend with retirement off (the
// default).
func TestRetiredNotUDPNorOff(t *testing.T) {
	udp := model.L4Addr{Addr: netip.MustParseAddr("10.96.0.53"), Port: 53, Proto: model.UDP}
	tcp := vip(1)
	for _, c := range []struct {
		name   string
		retire bool
		fe     model.L4Addr
		b      model.Backend
	}{
		{"UDP", true, udp, be(1, 1, model.UDP)},
		{"off", false, tcp, be(1, 1, model.TCP)},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFake(t)
			r := reconciler.New(f, nil)
			if c.retire {
				r.SetRetireTimeout(time.Hour)
			}
			mustApply(t, r, state(svc(c.fe, "x", c.b)))
			mustApply(t, r, state())
			if m, ok := masterOf(t, f, c.fe); ok {
				t.Errorf("master %+v kept, want it deleted", m)
			}
		})
	}
}

// TestRetiredCap: at most 1/16 of --max-services (here 32 of 512) masters
// are retired at once; past that a removed frontend's master is deleted at
// once.
func TestRetiredCap(t *testing.T) {
	f, c := newFakeSized(t, 512, 1<<12, 1<<12), &retiredClock{t: time.Unix(1e9, 0)}
	r := newRetiring(f, c)
	var svcs []*model.Service
	for i := range 40 {
		svcs = append(svcs, svc(vip(i), "s", be(i, 1, model.TCP)))
	}
	mustApply(t, r, state(svcs...))
	mustApply(t, r, state())
	if n := len(r.Retired()); n != 32 {
		t.Errorf("%d retired masters, want 32", n)
	}
	ks, _ := f.Dump()
	if len(ks.Masters) != 32 {
		t.Errorf("%d masters in the maps, want the 32 retired", len(ks.Masters))
	}
}

// TestRetiredRestored: a restarted agent reads a retired master back as
// one (no ClusterIP, its address no service IP), times it from the
// restore, and overwrites or expires it as its own.
func TestRetiredRestored(t *testing.T) {
	f, c := newFake(t), &retiredClock{t: time.Unix(1e9, 0)}
	r := newRetiring(f, c)
	fe := vip(1)
	mustApply(t, r, state(svc(fe, "web", be(1, 1, model.TCP))))
	mustApply(t, r, state())

	c.t = c.t.Add(30 * time.Minute)
	r2 := newRetiring(f, c)
	if err := r2.Restore(); err != nil {
		t.Fatal(err)
	}
	if at, ok := r2.Retired()[reconciler.DefaultScope(fe)]; !ok || !at.Equal(c.t) {
		t.Fatalf("restored: Retired() = %v, want %s at %v", r2.Retired(), fe, c.t)
	}
	c.t = c.t.Add(59 * time.Minute) // 89 since the retirement, 59 since the restore
	mustApply(t, r2, state())
	if m, ok := masterOf(t, f, fe); !ok || m.Flags&reconciler.FlagRetired == 0 {
		t.Fatalf("restored, before its timeout: master %+v (present %v), want it retired", m, ok)
	}
	if !reconciler.MapsMatchView(r2) {
		t.Error("the maps do not match the restored view")
	}
	c.t = c.t.Add(time.Minute)
	mustApply(t, r2, state())
	if m, ok := masterOf(t, f, fe); ok {
		t.Fatalf("restored, past its timeout: master %+v still there", m)
	}
}
