package reconciler_test

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
	"github.com/sluice-lb/sluice/pkg/reconciler/fakedp"
)

// The reserve (capacity.go): new frontends may fill each map of 1,024
// entries or more only up to its size less a 32nd; the rest is for
// changes of programmed frontends, so that a flood of new Services
// (audit11 H1) cannot take the backends and slots a programmed Service's
// rollout needs before its old ones go. Sizes here (but where a test
// says): 2,048 services, 2,048 backends, 8,192 service entries per
// family: reserves of 64, 64 and 256.

const (
	reserveServices = 2048
	reserveBackends = 2048
	reserveEntries  = 8192
	reserveNote     = "kept for changes of programmed frontends"
)

// rolledOut returns s with its first n backends replaced by new pods'
// (10.200.i.j, same port): a rollout's new endpoints.
func rolledOut(s *model.Service, i, n int) *model.Service {
	out := *s
	out.Backends = nil
	for j, b := range s.Backends {
		if j < n {
			b.Addr = netip.AddrFrom4([4]byte{10, 200, byte(i), byte(j + 1)})
		}
		out.Backends = append(out.Backends, b)
	}
	out.Backends = model.SortBackends(out.Backends)
	return &out
}

// grown returns s with n more backends (10.201.i.j): a scale-up.
func grown(s *model.Service, i, n int) *model.Service {
	out := *s
	out.Backends = append([]model.Backend(nil), s.Backends...)
	for j := range n {
		a := netip.AddrFrom4([4]byte{10, 201, byte(i), byte(j + 1)})
		out.Backends = append(out.Backends, model.Backend{L4Addr: model.L4Addr{Addr: a, Port: 8080, Proto: model.TCP}})
	}
	out.Backends = model.SortBackends(out.Backends)
	return &out
}

// flood returns Services 2..n+1 of k backends each: vip(i), be(i, j).
func flood(n, k int) []*model.Service {
	var out []*model.Service
	for i := 2; i <= n+1; i++ {
		var bs []model.Backend
		for j := range k {
			bs = append(bs, be(i, j+1, model.TCP))
		}
		out = append(out, svc(vip(i), fmt.Sprintf("svc-%d", i), bs...))
	}
	return out
}

// setBatch makes r program new frontends batched (programFresh) when
// batch is set, else a frontend at a time (programFrontend).
func setBatch(r *reconciler.Reconciler, batch bool) {
	if batch {
		reconciler.SetBatchMin(r, 1)
	} else {
		reconciler.SetBatchMin(r, 0)
	}
}

// tcpBackends returns n TCP backends, be(1, 1) to be(1, n).
func tcpBackends(n int) []model.Backend {
	var bs []model.Backend
	for j := range n {
		bs = append(bs, be(1, j+1, model.TCP))
	}
	return bs
}

// fillers returns n ClusterIP Services of one backend each (2 map
// entries each: a master and a slot), fill-0 at vip(2) on.
func fillers(n int) []*model.Service {
	var fl []*model.Service
	for i := range n {
		fl = append(fl, svc(vip(2+i), fmt.Sprintf("fill-%d", i), be(2, 1, model.TCP)))
	}
	return fl
}

// failDefaultMaster is a fake datapath's Fail that refuses every write of
// the master of fe's default scope (a transient error), and nothing else.
func failDefaultMaster(fe model.L4Addr) func(fakedp.Op) error {
	return func(op fakedp.Op) error {
		if op.Kind == fakedp.OpUpsertMaster && op.Frontend == reconciler.DefaultScope(fe) {
			return errors.New("injected")
		}
		return nil
	}
}

// applyFlood applies a, then a with the flood in one Apply, batched
// when batch is set (programFresh) or a frontend at a time
// (programFrontend), and returns the frontends refused, each checked to
// be a capacity error.
func applyFlood(t *testing.T, r *reconciler.Reconciler, a *model.Service, fl []*model.Service, batch bool) map[model.L4Addr]bool {
	t.Helper()
	setBatch(r, batch)
	mustApply(t, r, state(a))
	refused := map[model.L4Addr]bool{}
	for fe, err := range frontendErrors(t, r.Apply(state(append([]*model.Service{a}, fl...)...))) {
		if !errors.Is(err, reconciler.ErrCapacity) {
			t.Fatalf("%s: error %v, want a capacity error", fe, err)
		}
		refused[fe] = true
	}
	return refused
}

// checkRefusedFlood checks that the flood's Services from the index fit
// on were refused, and no other.
func checkRefusedFlood(t *testing.T, refused map[model.L4Addr]bool, fl []*model.Service, fit int) {
	t.Helper()
	for i, s := range fl {
		if refused[s.Frontend] != (i >= fit) {
			t.Errorf("flood Service %d (%s): refused %v, want %v (the first %d fit)", i, s.Frontend, refused[s.Frontend], i >= fit, fit)
		}
	}
}

// TestReserveKeepsRolloutsWorking: Service a (8 backends) is programmed,
// then a flood of new Services of 8 backends each fills the backends:
// it stops at 1,984 of 2,048 (a and 247 of them), the others refused as not
// fitting. a's rollout (all 8 endpoints replaced, or 2 of them) then
// needs 8 (2) new backends before its old ones go, and gets them from
// the reserve; a new Service still finds no room. The same with the
// service entries full (a scales up by 4: 4 more slots) and with the
// services full (a new frontend refused, a's change still made).
func TestReserveKeepsRolloutsWorking(t *testing.T) {
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("backends/batch=%v", batch), func(t *testing.T) {
			f := newFakeSized(t, reserveServices, reserveBackends, reserveEntries)
			r := reconciler.New(f, nil)
			a := famService(false, 1, 8)
			fl := flood(260, 8)
			refused := applyFlood(t, r, a, fl, batch)
			checkRefusedFlood(t, refused, fl, 247)
			st := state(append([]*model.Service{a}, fl...)...)
			errs := frontendErrors(t, r.Apply(st))
			for fe, err := range errs {
				if !strings.Contains(err.Error(), "8 new IPv4 backends: 1984 in use of 2048 in sluice_backends (--max-backends; 64 of them "+reserveNote+"; refused only for them: --max-backends=2056 or more fits it)") {
					t.Errorf("%s: error %q, want it to name the 1,984 in use and the reserve", fe, err)
				}
			}
			checkProgrammed(t, f, state(append([]*model.Service{a}, fl[:247]...)...))
			for _, n := range []int{8, 2} {
				a2 := rolledOut(a, 1, n)
				errs := frontendErrors(t, r.Apply(state(append([]*model.Service{a2}, fl...)...)))
				if errs[a.Frontend] != nil {
					t.Errorf("a's rollout of %d endpoints: %v, want it programmed from the reserve", n, errs[a.Frontend])
				}
				checkProgrammed(t, f, state(append([]*model.Service{a2}, fl[:247]...)...))
				mustApply(t, r, state(append([]*model.Service{a}, fl[:247]...)...)) // back, for the next
			}
			// A new Service of one backend: no room for it.
			b := svc(vip(1000), "b", be(1000, 1, model.TCP))
			checkRefused(t, f, r, append([]*model.Service{a}, fl[:247]...), b, "1 new IPv4 backends: 1984 in use of 2048",
				"naming the backends in use, the reserve left to changes")
		})
		t.Run(fmt.Sprintf("entries/batch=%v", batch), func(t *testing.T) {
			// Services of one backend: 2 entries each, 1,024 less 32
			// for new ones: a (9) and 491 of them (507 without the
			// reserve).
			f := newFakeSized(t, 4096, 4096, 1024)
			r := reconciler.New(f, nil)
			a := famService(false, 1, 8)
			fl := make([]*model.Service, 0, 520)
			for i := range 520 {
				fl = append(fl, svc(vip(2+i), fmt.Sprintf("flood-%d", i), be(2, 1, model.TCP)))
			}
			checkRefusedFlood(t, applyFlood(t, r, a, fl, batch), fl, 491)
			a2 := grown(a, 1, 4)
			errs := frontendErrors(t, r.Apply(state(append([]*model.Service{a2}, fl...)...)))
			if errs[a.Frontend] != nil {
				t.Errorf("a scaled up by 4: %v, want it programmed from the reserve", errs[a.Frontend])
			}
			checkProgrammed(t, f, state(append([]*model.Service{a2}, fl[:491]...)...))
		})
		t.Run(fmt.Sprintf("services/batch=%v", batch), func(t *testing.T) {
			// a, a NodePort of one scope, turns externalTrafficPolicy
			// Local: its address's internal scope is a frontend more,
			// a service id more, for a programmed Service.
			f := newFakeSized(t, 1024, 256, 4096)
			r := reconciler.New(f, nil)
			bs := tcpBackends(8)
			a := twoScopes(bs, bs)
			a.ExternalLocal, a.TwoScopes, a.InternalBackends = false, false, nil
			fl := make([]*model.Service, 0, 1030)
			for i := range 1030 {
				fl = append(fl, svc(vip(2+i), fmt.Sprintf("flood-%d", i), be(2, 1, model.TCP)))
			}
			// 992 of 1,024 services for new frontends: a and 991
			// (1,023 without the reserve).
			checkRefusedFlood(t, applyFlood(t, r, a, fl, batch), fl, 991)
			a2 := twoScopes(bs, bs[:4])
			errs := frontendErrors(t, r.Apply(state(append([]*model.Service{a2}, fl...)...)))
			if errs[a.Frontend] != nil {
				t.Errorf("a turned Local: %v, want its internal scope programmed from the reserve", errs[a.Frontend])
			}
			checkProgrammed(t, f, state(append([]*model.Service{a2}, fl[:991]...)...))
		})
	}
}

// TestReserveRefusesNothingAboveIt: new Services fill the maps up to
// their size less the reserve, to the last entry, none refused: a (8
// backends) and 247 Services of 8 take 1,984 of 2,048 backends, in one Apply
// and one at a time.
func TestReserveRefusesNothingAboveIt(t *testing.T) {
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			f := newFakeSized(t, reserveServices, reserveBackends, reserveEntries)
			r := reconciler.New(f, nil)
			a := famService(false, 1, 8)
			fl := flood(247, 8)
			if refused := applyFlood(t, r, a, fl, batch); len(refused) != 0 {
				t.Errorf("refused %v, want none: 1,984 backends, the reserve's 64 left", refused)
			}
			checkProgrammed(t, f, state(append([]*model.Service{a}, fl...)...))
			if s := r.Stats(); s.Backends != 1984 {
				t.Errorf("%d backends in use, want 1984", s.Backends)
			}
		})
	}
}

// TestReserveAfterRestart: maps filled into the reserve (a scaled up
// after the flood stopped: 1,986 of 2,048 backends, above the 1,984 new
// Services may fill) are read back by a restarted reconciler (Restore),
// and its first Apply keeps every programmed Service, refuses the flood's
// others, and a's rollout of 6 endpoints then takes the reserve's last.
func TestReserveAfterRestart(t *testing.T) {
	f := newFakeSized(t, reserveServices, reserveBackends, reserveEntries)
	r := reconciler.New(f, nil)
	a := famService(false, 1, 8)
	fl := flood(260, 8)
	checkRefusedFlood(t, applyFlood(t, r, a, fl, true), fl, 247)
	a2 := grown(a, 1, 2)
	all := func(a *model.Service) *model.State { return state(append([]*model.Service{a}, fl...)...) }
	if errs := frontendErrors(t, r.Apply(all(a2))); errs[a.Frontend] != nil {
		t.Fatalf("a scaled up by 2: %v", errs[a.Frontend])
	}
	kept := func(a *model.Service) *model.State { return state(append([]*model.Service{a}, fl[:247]...)...) }
	checkProgrammed(t, f, kept(a2))

	r = reconciler.New(f, nil) // a restart
	if err := r.Restore(); err != nil {
		t.Fatal(err)
	}
	errs := frontendErrors(t, r.Apply(all(a2)))
	for i, s := range fl {
		if (errs[s.Frontend] != nil) != (i >= 247) {
			t.Errorf("after the restart, flood Service %d: error %v, want one only from the 248th", i, errs[s.Frontend])
		}
	}
	if errs[a.Frontend] != nil {
		t.Errorf("after the restart, a: %v", errs[a.Frontend])
	}
	checkProgrammed(t, f, kept(a2))
	if s := r.Stats(); s.Backends != 1986 {
		t.Errorf("%d backends in use after the restart, want 1986", s.Backends)
	}
	a3 := rolledOut(a2, 1, 6)
	if errs := frontendErrors(t, r.Apply(all(a3))); errs[a.Frontend] != nil {
		t.Errorf("a's rollout of 6 after the restart: %v, want it programmed from the reserve", errs[a.Frontend])
	}
	checkProgrammed(t, f, kept(a3))
}

// TestTwoScopesAllOrNothing: a new NodePort of externalTrafficPolicy
// Local (two scopes, 20 endpoints: 21 service entries each) whose
// internal scope fits but whose default scope does not is refused whole:
// its internal scope is not written (no master would name it), and the
// next Apply refuses it the same (its default scope is no change of a
// programmed frontend). With the reserve: 960 of 1,024 entries in use,
// the internal scope would fit under the 992 new ones may fill, the
// default scope not. Without it (a map of 512): 490 in use, the internal
// scope would take the last 21 entries but one.
func TestTwoScopesAllOrNothing(t *testing.T) {
	for _, tc := range []struct {
		name            string
		entries, filled int
		want            string
	}{
		{"reserve", 1024, 960, "42 new IPv4 service entries: 960 in use of 1024 (--max-service-entries; 32 of them " + reserveNote + "; refused only for them: --max-service-entries=1034 or more fits it)"},
		{"capacity", 512, 490, "42 new IPv4 service entries: 490 in use of 512 (--max-service-entries)"},
	} {
		for _, batch := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/batch=%v", tc.name, batch), func(t *testing.T) {
				f := newFakeSized(t, 4096, 4096, tc.entries)
				r := reconciler.New(f, nil)
				setBatch(r, batch)
				fl := fillers(tc.filled / 2) // 2 entries each
				mustApply(t, r, state(fl...))
				bs := tcpBackends(20)
				n := twoScopes(bs, bs)
				for _, try := range []string{"first Apply", "resync"} {
					errs := frontendErrors(t, r.Apply(state(append([]*model.Service{n}, fl...)...)))
					if err := errs[n.Frontend]; len(errs) != 1 || !errors.Is(err, reconciler.ErrCapacity) || !strings.Contains(err.Error(), tc.want) {
						t.Errorf("%s: errors %v, want one for %s naming %q", try, errs, n.Frontend, tc.want)
					}
					for _, v := range f.Check() {
						t.Errorf("%s: %s", try, v)
					}
					checkProgrammed(t, f, state(fl...))
				}
			})
		}
	}
}

// TestTwoScopesOrphanNotProgrammed: a new NodePort of two scopes whose
// default scope's master fails to be written (a transient error) is left
// with its internal scope alone; the next Apply, the maps filled since
// to the reserve's edge, refuses its default scope as a new frontend
// (not as a change of one programmed through its internal scope) and
// removes the internal scope no master names.
func TestTwoScopesOrphanNotProgrammed(t *testing.T) {
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			f := newFakeSized(t, 4096, 4096, 1024)
			r := reconciler.New(f, nil)
			setBatch(r, batch)
			bs := tcpBackends(20)
			n := twoScopes(bs, bs)
			f.Fail = failDefaultMaster(n.Frontend)
			errs := frontendErrors(t, r.Apply(state(n)))
			if err := errs[n.Frontend]; err == nil || err.Permanent() {
				t.Fatalf("errors %v, want a write error for %s", errs, n.Frontend)
			}
			f.Fail = nil
			if len(programmed(t, f)) != 1 {
				t.Fatalf("programmed %v, want the internal scope alone", programmed(t, f))
			}
			// The internal scope's 21 entries and the default scope's
			// 20 slots (written before its master failed) in use, and
			// 951 more: 992, all new ones may fill. The default scope's
			// master would fit only into the reserve.
			fl := fillers(474)
			fl = append(fl, svc(vip(1000), "fill-two", be(2, 1, model.TCP), be(2, 2, model.TCP)))
			errs = frontendErrors(t, r.Apply(state(append([]*model.Service{n}, fl...)...)))
			if err := errs[n.Frontend]; len(errs) != 1 || !errors.Is(err, reconciler.ErrCapacity) || !strings.Contains(err.Error(), reserveNote) {
				t.Errorf("errors %v, want one for %s naming the reserve", errs, n.Frontend)
			}
			for _, v := range f.Check() {
				t.Error(v)
			}
			// (Not checkProgrammed: the rev_nat entries and the default
			// scope's slots the failed write left stay for the Service,
			// which is still wanted.)
			got := programmed(t, f)
			for _, scope := range []reconciler.Scope{reconciler.ScopeDefault, reconciler.ScopeInternal} {
				if bs, ok := got[reconciler.Frontend{L4Addr: n.Frontend, Scope: scope}]; ok {
					t.Errorf("%s scope %d programmed with %v, want neither scope", n.Frontend, scope, bs)
				}
			}
			if len(got) != len(fl) {
				t.Errorf("%d frontends programmed, want the %d filling", len(got), len(fl))
			}
		})
	}
}

// TestTwoScopesTurnLocalRefusedAsPair: a programmed NodePort (one scope,
// externalTrafficPolicy Cluster) turned Local when its new internal
// scope does not fit is refused as a pair (checkPair): one capacity
// error, the default scope keeps its previous programming, and no
// internal scope is left behind.
func TestTwoScopesTurnLocalRefusedAsPair(t *testing.T) {
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			f := newFakeSized(t, 4096, 4096, 512)
			r := reconciler.New(f, nil)
			setBatch(r, batch)
			bs := tcpBackends(20)
			local := twoScopes(bs, bs)
			cluster := svc(local.Frontend, "web", bs...)
			cluster.Kind = model.NodePort
			fl := fillers(240) // 480 entries, and cluster's 21: 501 of 512
			before := state(append([]*model.Service{cluster}, fl...)...)
			mustApply(t, r, before)
			errs := frontendErrors(t, r.Apply(state(append([]*model.Service{local}, fl...)...)))
			if err := errs[local.Frontend]; len(errs) != 1 || !errors.Is(err, reconciler.ErrCapacity) {
				t.Errorf("errors %v, want one capacity error for %s", errs, local.Frontend)
			}
			for _, v := range f.Check() {
				t.Error(v)
			}
			checkProgrammed(t, f, before)
		})
	}
}

// TestTwoScopesPairRefusedDropsOrphan: a programmed NodePort
// (externalTrafficPolicy Cluster) turned Local whose default scope's
// master fails to be written (a transient error) is left with an orphan
// internal scope that no master names; the next Apply changes that
// internal scope too (more local endpoints), the pair no longer fits, and
// checkPair refuses it: the orphan is removed there (dropOrphan), the
// default scope keeps its Cluster programming, and every other frontend
// its own.
func TestTwoScopesPairRefusedDropsOrphan(t *testing.T) {
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			f := newFakeSized(t, 4096, 4096, 512)
			r := reconciler.New(f, nil)
			setBatch(r, batch)
			bs := tcpBackends(20)
			cluster := svc(twoScopes(bs, bs).Frontend, "web", bs...)
			cluster.Kind = model.NodePort
			fl := fillers(240) // 480 entries, and cluster's 21: 501 of 512
			before := state(append([]*model.Service{cluster}, fl...)...)
			mustApply(t, r, before)
			checkProgrammed(t, f, before)
			want := programmed(t, f)

			// Turned Local with 10 local endpoints: the internal scope's
			// 11 entries fit (512 of 512), the default scope's master
			// fails to be written.
			in := reconciler.Frontend{L4Addr: cluster.Frontend, Scope: reconciler.ScopeInternal}
			f.Fail = failDefaultMaster(cluster.Frontend)
			errs := frontendErrors(t, r.Apply(state(append([]*model.Service{twoScopes(bs, bs[:10])}, fl...)...)))
			f.Fail = nil
			if err := errs[cluster.Frontend]; len(errs) != 1 || err == nil || err.Permanent() {
				t.Fatalf("errors %v, want one write error for %s", errs, cluster.Frontend)
			}
			if got := programmed(t, f)[in]; len(got) != 10 {
				t.Fatalf("internal scope programmed with %v, want the orphan of 10 backends", got)
			}
			if m, _ := masterOf(t, f, cluster.Frontend); m.Flags&reconciler.FlagTwoScopes != 0 {
				t.Fatalf("default scope's master %+v names the internal scope", m)
			}

			// Its 20 local endpoints: the internal scope's 10 new slots
			// do not fit in the full map; refused as a pair.
			errs = frontendErrors(t, r.Apply(state(append([]*model.Service{twoScopes(bs, bs)}, fl...)...)))
			if err := errs[cluster.Frontend]; len(errs) != 1 || !errors.Is(err, reconciler.ErrCapacity) {
				t.Errorf("errors %v, want one capacity error for %s", errs, cluster.Frontend)
			}
			for _, v := range f.Check() {
				t.Error(v)
			}
			got := programmed(t, f)
			if bs, ok := got[in]; ok {
				t.Errorf("orphan internal scope still programmed with %v", bs)
			}
			// (Not checkProgrammed: the internal scope's rev_nat entry
			// stays for the Service, which is still wanted, as in
			// TestTwoScopesOrphanNotProgrammed.)
			for fe := range got {
				if _, ok := want[fe]; !ok && fe != in {
					t.Errorf("%s programmed with %v, not before the turn", fe, got[fe])
				}
			}
			for fe, bs := range want {
				if !slices.Equal(got[fe], bs) {
					t.Errorf("%s programmed with %v, want %v as before the turn", fe, got[fe], bs)
				}
			}
		})
	}
}
