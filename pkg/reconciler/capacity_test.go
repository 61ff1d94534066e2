package reconciler_test

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// famFrontend returns frontend i of a family: 10.96.0.i:80/TCP, or
// [2001:db8:96::i]:80/TCP.
func famFrontend(v6 bool, i int) model.L4Addr {
	a := netip.AddrFrom4([4]byte{10, 96, 0, byte(i)})
	if v6 {
		a = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 0x96, 15: byte(i)})
	}
	return model.L4Addr{Addr: a, Port: 80, Proto: model.TCP}
}

// famService returns a Service at famFrontend(v6, i) with n backends of
// its family.
func famService(v6 bool, i, n int) *model.Service {
	var bs []model.Backend
	for j := range n {
		a := netip.AddrFrom4([4]byte{10, 1, byte(i), byte(j + 1)})
		if v6 {
			a = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 1, 0, byte(i), 15: byte(j + 1)})
		}
		bs = append(bs, model.Backend{L4Addr: model.L4Addr{Addr: a, Port: 8080, Proto: model.TCP}})
	}
	return svc(famFrontend(v6, i), fmt.Sprintf("svc-%d", i), bs...)
}

// TestCapacityPerFamily: each address family has its own service,
// backend and source-range maps, as large as the datapath's capacity
// says, so a family whose maps are full refuses nothing of the other
// family; what does not fit in its own family's maps is refused, naming
// the family and the map. Programmed frontend by frontend and all at
// once (in batches).
func TestCapacityPerFamily(t *testing.T) {
	for _, full6 := range []bool{false, true} {
		for _, batch := range []bool{false, true} {
			t.Run(fmt.Sprintf("full6=%v/batch=%v", full6, batch), func(t *testing.T) {
				// 7 backends and 8 service entries per family's maps.
				f := newFakeSized(t, 16, 7, 8)
				r := reconciler.New(f, nil)
				other := !full6
				full := famService(full6, 1, 7) // fills both its family's maps
				fits := famService(other, 2, 3) // 3 backends, 4 entries
				over := famService(other, 3, 5) // 5 backends, 6 entries: 8 and 10 with fits
				if !batch {
					mustApply(t, r, state(full))
					mustApply(t, r, state(full, fits))
				}
				st := state(full, fits, over)
				errs := frontendErrors(t, r.Apply(st))
				if len(errs) != 1 || errs[over.Frontend] == nil {
					t.Fatalf("errors %v, want one, for %s", errs, over.Frontend)
				}
				err := errs[over.Frontend]
				fam, prefix := "IPv4", "sluice_"
				if other {
					fam, prefix = "IPv6", "sluice6_"
				}
				wants := []string{"default/svc-3", " " + fam + " backends: ", " of 7 in " + prefix + "backends",
					" " + fam + " service entries: ", " of 8 (--max-service-entries)", " in " + prefix + "backends (--max-backends)"}
				// A batch names what the frontend needs itself, what
				// the ones before it in the batch take counted in use,
				// as programmed frontend by frontend.
				wants = append(wants, "5 new "+fam+" backends: 3 in use of 7 in "+prefix+"backends",
					"6 new "+fam+" service entries: 4 in use of 8 (--max-service-entries)")
				for _, want := range wants {
					if !errors.Is(err, reconciler.ErrCapacity) || !strings.Contains(err.Error(), want) {
						t.Errorf("error %q: not a capacity error saying %q", err, want)
					}
				}
				checkProgrammed(t, f, state(full, fits))
				s := r.Stats()
				want6 := 4
				if full6 {
					want6 = 8
				}
				if s.ServiceEntries != 12 || s.ServiceEntries6 != want6 || s.Backends != 10 || s.MaxServiceEntries != 8 {
					t.Errorf("stats %+v: want 12 service entries (%d IPv6), 10 backends, 8 entries in each family's map", s, want6)
				}
			})
		}
	}
}

// TestCapacityServicesBothFamilies: services (rev_nat entries) are
// counted over both families together: service ids are one space (the
// per-Service counters are indexed by them).
func TestCapacityServicesBothFamilies(t *testing.T) {
	f := newFakeSized(t, 2, 16, 16)
	r := reconciler.New(f, nil)
	a, b, c := famService(false, 1, 1), famService(true, 2, 1), famService(true, 3, 1)
	mustApply(t, r, state(a, b))
	checkRefused(t, f, r, []*model.Service{a, b}, c, "services, of both families: 2 in use of 2",
		"saying 2 services of both families are in use of 2")
}

// TestCapacitySourceRangesPerFamily: each family's source ranges have
// their own map.
func TestCapacitySourceRangesPerFamily(t *testing.T) {
	f := newFake(t)
	f.SetSourceRangeCapacity(1)
	r := reconciler.New(f, nil)
	withRange := func(s *model.Service, p string) *model.Service {
		s.Kind, s.SourceRanges = model.LoadBalancer, []netip.Prefix{netip.MustParsePrefix(p)}
		return s
	}
	a := withRange(famService(false, 1, 1), "192.0.2.0/24")
	b := withRange(famService(true, 2, 1), "2001:db8:2::/48")
	mustApply(t, r, state(a))
	mustApply(t, r, state(a, b))
	c := withRange(famService(true, 3, 1), "2001:db8:3::/48")
	checkRefused(t, f, r, []*model.Service{a, b}, c, "1 new IPv6 source ranges: 1 in use of 1 in sluice6_src_ranges",
		"naming the full sluice6_src_ranges")
}

// TestCapacityErrorSameEveryApply: a frontend that does not fit is
// refused with the same error by the first apply (all frontends in a
// batch) and by the next ones (frontend by frontend): the error is what
// the Kubernetes source puts in a Service's event, and an error that
// changed would be news to report again.
func TestCapacityErrorSameEveryApply(t *testing.T) {
	f := newFakeSized(t, 16, 25, 100)
	r := reconciler.New(f, nil)
	var svcs []*model.Service
	for i := 1; i <= 5; i++ {
		svcs = append(svcs, famService(false, i, 10))
	}
	st := state(svcs...)
	first := frontendErrors(t, r.Apply(st))
	again := frontendErrors(t, r.Apply(st))
	if len(first) != 3 || len(again) != 3 {
		t.Fatalf("errors %v then %v, want 3 Services of 10 backends refused by 25 backends", first, again)
	}
	for fe, err := range first {
		if again[fe] == nil || err.Error() != again[fe].Error() {
			t.Errorf("%s: error %q on the first apply, %v on the next", fe, err, again[fe])
		}
		if !strings.Contains(err.Error(), "10 new IPv4 backends: 20 in use of 25 in sluice_backends") {
			t.Errorf("%s: error %q, want the 10 backends it needs and the 20 in use", fe, err)
		}
	}
	checkProgrammed(t, f, state(svcs[:2]...))
}
