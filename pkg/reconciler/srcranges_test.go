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

// lb returns a LoadBalancer frontend 192.168.1.x:80/TCP with source
// ranges.
func lb(x byte, name string, ranges []string, bs ...model.Backend) *model.Service {
	fe := model.L4Addr{Addr: netip.AddrFrom4([4]byte{192, 168, 1, x}), Port: 80, Proto: model.TCP}
	s := svc(fe, name, bs...)
	s.Kind = model.LoadBalancer
	for _, r := range ranges {
		s.SourceRanges = append(s.SourceRanges, netip.MustParsePrefix(r))
	}
	return s
}

// restartWritesNothing checks that a restarted reconciler finds st fully
// programmed in f: Restore read back everything Apply wrote.
func restartWritesNothing(t *testing.T, f *fakedp.Fake, st *model.State) {
	t.Helper()
	f.ResetCounts()
	r := reconciler.New(f, nil)
	if err := r.Restore(); err != nil {
		t.Fatal(err)
	}
	mustApply(t, r, st)
	if f.Writes() != 0 {
		t.Errorf("re-apply after restore wrote: %v", f.Ops)
	}
}

// recoversAfterFailure checks r after an Apply of st failed on a write f
// was told to fail: r is not in sync; with the failure gone, Apply programs
// st; and the view is truthful: a fresh reconciler agrees, writing nothing.
func recoversAfterFailure(t *testing.T, f *fakedp.Fake, r *reconciler.Reconciler, st *model.State) {
	t.Helper()
	if r.InSync() {
		t.Error("InSync after a failed write")
	}
	f.Fail = nil
	mustApply(t, r, st)
	checkProgrammed(t, f, st)
	restartWritesNothing(t, f, st)
}

// TestSourceRangeOrder: ranges are written before the master that checks
// them, and deleted after the master stopped checking them or is gone;
// when they change, the new ones come before the old ones go.
func TestSourceRangeOrder(t *testing.T) {
	f := newRecordingFake(t)
	r := reconciler.New(f, nil)
	b := be(1, 1, model.TCP)
	steps := []struct {
		name string
		st   *model.State
		want string
	}{
		{"add", state(lb(200, "web", []string{"172.16.0.0/12", "10.0.0.0/24"}, b)), `ResetServiceStats 1
UpsertBackend 1 10.1.1.1:8080/TCP
UpsertRevNat 1 192.168.1.200:80/TCP
UpsertSlot 192.168.1.200:80/TCP[1]=1
UpsertSourceRange 192.168.1.200:80/TCP 10.0.0.0/24
UpsertSourceRange 192.168.1.200:80/TCP 172.16.0.0/12
UpsertMaster 192.168.1.200:80/TCP id=1 count=1 flags=0x5
`},
		{"change", state(lb(200, "web", []string{"10.0.0.0/24", "192.168.0.0/16"}, b)), `UpsertSourceRange 192.168.1.200:80/TCP 192.168.0.0/16
DeleteSourceRange 192.168.1.200:80/TCP 172.16.0.0/12
`},
		// Host bits are masked: the same ranges, nothing to write.
		{"host bits", state(lb(200, "web", []string{"192.168.7.7/16", "10.0.0.1/24"}, b)), ``},
		{"no ranges", state(lb(200, "web", nil, b)), `UpsertMaster 192.168.1.200:80/TCP id=1 count=1 flags=0x1
DeleteSourceRange 192.168.1.200:80/TCP 10.0.0.0/24
DeleteSourceRange 192.168.1.200:80/TCP 192.168.0.0/16
`},
		{"ranges again", state(lb(200, "web", []string{"10.0.0.0/24"}, b)), `UpsertSourceRange 192.168.1.200:80/TCP 10.0.0.0/24
UpsertMaster 192.168.1.200:80/TCP id=1 count=1 flags=0x5
`},
		{"remove", state(), `DeleteSlot 192.168.1.200:80/TCP[0]
DeleteSlot 192.168.1.200:80/TCP[1]
DeleteSourceRange 192.168.1.200:80/TCP 10.0.0.0/24
DeleteBackend 1
DeleteRevNat 1
`},
	}
	for _, s := range steps {
		f.ResetCounts()
		mustApply(t, r, s.st)
		if got := opsString(f.Ops); got != s.want {
			t.Errorf("%s: ops:\n%s\nwant:\n%s", s.name, got, s.want)
		}
		checkProgrammed(t, f, s.st)
		restartWritesNothing(t, f, s.st)
		if t.Failed() {
			t.Fatalf("after step %q:\n%s", s.name, f)
		}
	}
	// ClusterIP frontends never check ranges, whatever the Service says.
	c := svc(vip(1), "c", b)
	c.SourceRanges = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	mustApply(t, r, state(c))
	if ks, _ := f.Dump(); len(ks.SourceRanges) != 0 || ks.Masters[reconciler.DefaultScope(vip(1))].Flags != 0 {
		t.Errorf("ClusterIP frontend got ranges %v, flags %#x", ks.SourceRanges, ks.Masters[reconciler.DefaultScope(vip(1))].Flags)
	}
}

// TestSourceRangesFull: a full source-range map fails only the frontend
// that needs more, naming its service and keeping its previous
// programming; the others are programmed.
func TestSourceRangesFull(t *testing.T) {
	f := newFake(t)
	f.SetSourceRangeCapacity(3)
	r := reconciler.New(f, nil)
	a := lb(1, "a", []string{"10.0.0.0/8", "172.16.0.0/12"}, be(1, 1, model.TCP))
	mustApply(t, r, state(a))
	before := f.String()

	// b needs 2 ranges, 1 is free; c, a ClusterIP, is programmed anyway.
	b := lb(2, "b", []string{"10.0.0.0/8", "192.168.0.0/16"}, be(2, 1, model.TCP))
	c := svc(vip(3), "c", be(3, 1, model.TCP))
	err := r.Apply(state(a, b, c))
	if !errors.Is(err, reconciler.ErrCapacity) || !strings.Contains(err.Error(), "default/b") || !strings.Contains(err.Error(), "source ranges") {
		t.Fatalf("err = %v, want a source-range capacity error naming default/b", err)
	}
	if strings.Contains(err.Error(), "default/a") || strings.Contains(err.Error(), "default/c") {
		t.Errorf("error names other services: %v", err)
	}
	ks, _ := f.Dump()
	if _, ok := ks.Masters[reconciler.DefaultScope(b.Frontend)]; ok {
		t.Errorf("b programmed without its ranges:\n%s", f)
	}
	if _, ok := ks.Masters[reconciler.DefaultScope(c.Frontend)]; !ok {
		t.Errorf("c not programmed:\n%s", f)
	}

	// Changing a's two ranges for two others needs four at the peak:
	// refused, a keeps its old ranges.
	a2 := lb(1, "a", []string{"192.0.2.0/24", "198.51.100.0/24"}, be(1, 1, model.TCP))
	if err := r.Apply(state(a2)); !errors.Is(err, reconciler.ErrCapacity) || !strings.Contains(err.Error(), "default/a") {
		t.Fatalf("err = %v, want a capacity error naming default/a", err)
	}
	if got := f.String(); got != before {
		t.Errorf("a's programming changed:\n%s\nwant\n%s", got, before)
	}

	// Without a, b fits.
	mustApply(t, r, state(b, c))
	checkProgrammed(t, f, state(b, c))
	if s := r.Stats(); s.SourceRanges != 2 || s.MaxSourceRanges != 3 {
		t.Errorf("stats = %+v", s)
	}
}

// TestSourceRangeWriteFailures: a range write that fails (the kernel's
// E2BIG when the map is fuller than the reconciler knows, say) fails that
// frontend only, leaves no master checking missing ranges, and the next
// Apply finishes the job.
func TestSourceRangeWriteFailures(t *testing.T) {
	for _, kind := range []fakedp.OpKind{fakedp.OpUpsertSourceRange, fakedp.OpDeleteSourceRange} {
		t.Run(string(kind), func(t *testing.T) {
			f := newFake(t)
			r := reconciler.New(f, nil)
			other := svc(vip(1), "other", be(1, 1, model.TCP))
			st1 := state(lb(1, "a", []string{"10.0.0.0/8"}, be(2, 1, model.TCP)), other)
			mustApply(t, r, st1)
			st2 := state(lb(1, "a", []string{"172.16.0.0/12"}, be(2, 1, model.TCP)), lb(2, "b", []string{"10.0.0.0/8"}), other)
			f.Fail = func(op fakedp.Op) error {
				if op.Kind == kind {
					return fakedp.ErrFull
				}
				return nil
			}
			err := r.Apply(st2)
			if err == nil || !strings.Contains(err.Error(), "service default/a") {
				t.Fatalf("err = %v, want an error naming default/a", err)
			}
			recoversAfterFailure(t, f, r, st2)
		})
	}
}

// TestRestoreRemovesStrayRanges: ranges found in the maps for a frontend
// nobody wants, for a frontend that does not check ranges, or that its
// Service no longer lists, are deleted; the wanted ones are kept.
func TestRestoreRemovesStrayRanges(t *testing.T) {
	f := newFake(t)
	a := lb(1, "a", []string{"10.0.0.0/8"}, be(1, 1, model.TCP))
	c := svc(vip(1), "c", be(2, 1, model.TCP))
	p := netip.MustParsePrefix
	gone := model.L4Addr{Addr: netip.MustParseAddr("192.168.1.9"), Port: 80, Proto: model.TCP}
	mustApply(t, reconciler.New(f, nil), state(a, c))
	ks, _ := f.Dump()
	ks.SourceRanges = map[model.L4Addr][]netip.Prefix{
		a.Frontend: {p("10.0.0.0/8"), p("172.16.0.0/12")},
		c.Frontend: {p("10.0.0.0/8")},
		gone:       {p("10.0.0.0/8")},
	}
	f.Seed(ks)

	r := reconciler.New(f, nil)
	if err := r.Restore(); err != nil {
		t.Fatal(err)
	}
	f.Record = true
	mustApply(t, r, state(a, c))
	checkProgrammed(t, f, state(a, c))
	want := `DeleteSourceRange 192.168.1.9:80/TCP 10.0.0.0/8
DeleteSourceRange 10.96.0.1:80/TCP 10.0.0.0/8
DeleteSourceRange 192.168.1.1:80/TCP 172.16.0.0/12
`
	if got := opsString(f.Ops); got != want {
		t.Errorf("ops:\n%s\nwant:\n%s", got, want)
	}
}
