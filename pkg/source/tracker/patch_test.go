package tracker

import (
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// patched feeds n Services of one endpoint each, syncs, and returns the
// tracker, its first state, and the two versions of Service n/2's slice.
func patched(n int) (*Tracker, *model.State, [2]*discoveryv1.EndpointSlice) {
	tr := New(translate.Options{})
	var mid [2]*discoveryv1.EndpointSlice
	for i := range n {
		name := fmt.Sprintf("s%d", i)
		svc := service(name, fmt.Sprintf("10.%d.%d.%d", 96+i>>16, (i>>8)&0xff, i&0xff), 80)
		tr.SetService(nameOf(svc), svc)
		es := slice(name, name+"-a", 8080, fmt.Sprintf("10.%d.%d.%d", 128+i>>16, (i>>8)&0xff, i&0xff))
		tr.SetSlice(nameOf(es), es)
		if i == n/2 {
			mid = [2]*discoveryv1.EndpointSlice{es, slice(name, name+"-a", 8080, "10.250.250.250")}
		}
	}
	return tr, tr.Sync().State, mid
}

// A change makes the new state from the last one (issue 14): the last
// state is left exactly as it was (a consumer holding it keeps seeing
// it), and every frontend but the changed one maps to the very same
// *Service in both.
func TestTrackerPatchKeepsLastState(t *testing.T) {
	const n = 3000
	tr, first, mid := patched(n)
	before := first.Services.Map()
	tr.SetSlice(nameOf(mid[1]), mid[1])
	r := tr.Sync()
	fe := model.L4Addr{Addr: netip.MustParseAddr(fmt.Sprintf("10.96.%d.%d", (n/2)>>8, (n/2)&0xff)), Port: 80, Proto: model.TCP}
	if r.Changed != 1 || r.State.BaseGen != first.Gen || !slices.Equal(r.State.Changed, []model.L4Addr{fe}) {
		t.Fatalf("changed %d, BaseGen %d (first %d), Changed %v; want 1, a patch, [%v]", r.Changed, r.State.BaseGen, first.Gen, r.State.Changed, fe)
	}
	if first.Services.Len() != n {
		t.Fatalf("the first state has %d frontends, want %d", first.Services.Len(), n)
	}
	for a, s := range before {
		if first.Services.Get(a) != s {
			t.Fatalf("the first state changed at %v", a)
		}
		if got := r.State.Services.Get(a); (got == s) != (a != fe) {
			t.Errorf("%v: the new state's Service is the first state's: %v (want %v)", a, got == s, a != fe)
		}
	}
	if r.State.Services.Len() != n || r.State.Services.Get(fe).Backends[0].Addr != netip.MustParseAddr("10.250.250.250") {
		t.Errorf("new state: %d frontends, %v", r.State.Services.Len(), r.State.Services.Get(fe))
	}
}

// One endpoint changed among 30,000 Services allocates about what it does
// among 1,000 (issue 14: nothing may grow with N per change). A copy of
// every frontend (a map of 30,000) would allocate a megabyte more.
func TestTrackerPatchCostIndependentOfN(t *testing.T) {
	perChange := func(n int) float64 {
		tr, _, mid := patched(n)
		const runs = 20
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for i := range runs {
			es := mid[(i+1)%2]
			tr.SetSlice(nameOf(es), es)
			if r := tr.Sync(); r.Changed != 1 || r.State.BaseGen == 0 {
				t.Fatalf("%d: changed %d, BaseGen %d", n, r.Changed, r.State.BaseGen)
			}
		}
		runtime.ReadMemStats(&after)
		return float64(after.TotalAlloc-before.TotalAlloc) / runs
	}
	small, large := perChange(1000), perChange(30000)
	t.Logf("bytes allocated per change: %.0f at 1,000 Services, %.0f at 30,000", small, large)
	if large > 2*small+4096 {
		t.Errorf("one change allocates %.0f bytes at 30,000 Services, %.0f at 1,000: it grows with N", large, small)
	}
}
