package reconciler_test

import (
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
	"weak"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
	"github.com/sluice-lb/sluice/pkg/reconciler/fakedp"
)

// vip returns frontend i: 10.96.x.y:80/TCP.
func vip(i int) model.L4Addr {
	return model.L4Addr{Addr: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Port: 80, Proto: model.TCP}
}

// be returns backend j of service i: 10.(i>>8).(i).j:8080/TCP.
func be(i, j int, proto model.Protocol) model.Backend {
	return model.Backend{L4Addr: model.L4Addr{Addr: netip.AddrFrom4([4]byte{10, byte(1 + i>>8), byte(i), byte(j)}), Port: 8080, Proto: proto}}
}

func svc(fe model.L4Addr, name string, bs ...model.Backend) *model.Service {
	return &model.Service{
		Name:     model.ServicePortName{Namespace: "default", Name: name},
		Frontend: fe, Backends: model.SortBackends(slices.Clone(bs)),
	}
}

func state(svcs ...*model.Service) *model.State {
	st := model.NewState()
	for _, s := range svcs {
		st.Services.Set(s.Frontend, s)
	}
	return st
}

// bigState is n services with k backends each.
func bigState(n, k int) *model.State {
	st := model.NewState()
	for i := range n {
		var bs []model.Backend
		for j := range k {
			bs = append(bs, be(i, j+1, model.TCP))
		}
		st.Services.Set(vip(i), svc(vip(i), fmt.Sprintf("svc-%d", i), bs...))
	}
	return st
}

// newFake returns a fake that checks the full invariants after every
// operation (turn CheckAll off for big states), and reports violations at
// the end of the test.
func newFake(t testing.TB) *fakedp.Fake {
	return newFakeSized(t, 1<<16, 1<<20, 1<<20)
}

// newFakeSized is newFake with the given capacities (fakedp.New).
func newFakeSized(t testing.TB, services, backends, serviceEntries int) *fakedp.Fake {
	f := fakedp.New(services, backends, serviceEntries)
	f.CheckAll = true
	t.Cleanup(func() {
		for _, v := range f.Violations() {
			t.Errorf("invariant violated: %s", v)
		}
		for _, v := range f.Check() {
			t.Errorf("final state: %s", v)
		}
	})
	return f
}

// newRecordingFake is newFake recording every operation in f.Ops, for
// tests of the order of writes.
func newRecordingFake(t testing.TB) *fakedp.Fake {
	f := newFake(t)
	f.Record = true
	return f
}

func mustApply(t testing.TB, r *reconciler.Reconciler, st *model.State) {
	t.Helper()
	if err := r.Apply(st); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	if !r.InSync() {
		t.Fatal("not in sync after a successful Apply")
	}
}

// programmed reads back what the fake holds as frontend (in each scope) ->
// sorted backends.
func programmed(t testing.TB, f *fakedp.Fake) map[reconciler.Frontend][]model.L4Addr {
	t.Helper()
	ks, _ := f.Dump()
	out := map[reconciler.Frontend][]model.L4Addr{}
	for fe, m := range ks.Masters {
		bs := []model.L4Addr{}
		for s := uint32(1); s <= m.Count; s++ {
			bs = append(bs, ks.Backends[ks.Slots[fe][s]])
		}
		slices.SortFunc(bs, model.L4Addr.Compare)
		out[fe] = bs
		if len(ks.Slots[fe]) != int(m.Count) {
			t.Errorf("%s: %d slots for count %d", fe, len(ks.Slots[fe]), m.Count)
		}
	}
	return out
}

// backendEntries returns the addresses the fake's backend map holds.
func backendEntries(t testing.TB, f *fakedp.Fake) map[model.L4Addr]bool {
	t.Helper()
	ks, err := f.Dump()
	if err != nil {
		t.Fatal(err)
	}
	out := map[model.L4Addr]bool{}
	for _, a := range ks.Backends {
		out[a] = true
	}
	return out
}

// checkKeptStandby checks that every backend st holds in standby that had
// an entry before (had) has one still: its flows name it (standby.go),
// whatever failed or restarted in between.
func checkKeptStandby(t testing.TB, f *fakedp.Fake, st *model.State, had map[model.L4Addr]bool) {
	t.Helper()
	now := backendEntries(t, f)
	for _, s := range st.Services.All() {
		for _, a := range s.Standby {
			if had[a] && !now[a] {
				t.Errorf("backend %s in standby lost its entry: its flows re-balance", a)
			}
		}
	}
}

func checkProgrammed(t testing.TB, f *fakedp.Fake, st *model.State) {
	t.Helper()
	got := programmed(t, f)
	n := 0
	for a, s := range st.Services.All() {
		scopes := map[reconciler.Scope][]model.Backend{reconciler.ScopeDefault: s.Backends}
		if s.TwoScopes && s.Kind != model.ClusterIP {
			scopes[reconciler.ScopeInternal] = s.InternalBackends
		}
		for scope, bs := range scopes {
			n++
			fe := reconciler.Frontend{L4Addr: a, Scope: scope}
			var want []model.L4Addr
			for _, b := range bs {
				want = append(want, b.L4Addr)
			}
			if !slices.Equal(got[fe], want) && !(len(got[fe]) == 0 && len(want) == 0) {
				t.Errorf("%s: programmed %v, want %v", fe, got[fe], want)
			}
		}
	}
	if len(got) != n {
		t.Errorf("%d frontends programmed, want %d", len(got), n)
	}
	ks, _ := f.Dump()
	// No unreferenced backends or rev_nat entries are left behind: the
	// backend entries are those slots name and those a Service holds in
	// standby (kept for their flows, if they had an entry: keptStandby).
	named := map[reconciler.BackendID]bool{}
	for _, s := range ks.Slots {
		for _, id := range s {
			named[id] = true
		}
	}
	standby := map[model.L4Addr]bool{}
	for _, s := range st.Services.All() {
		for _, a := range s.Standby {
			standby[a] = true
		}
	}
	for id := range ks.Backends {
		if !named[id] && !standby[ks.Backends[id]] {
			t.Errorf("backend %d (%s) left behind", id, ks.Backends[id])
		}
	}
	ids := map[reconciler.ServiceID]bool{}
	for _, m := range ks.Masters {
		ids[m.ID] = true
	}
	for id := range ks.RevNat {
		if !ids[id] {
			t.Errorf("rev_nat %d left behind", id)
		}
	}
	// Source ranges: exactly those of the frontends that check them.
	for fe, s := range st.Services.All() {
		var want []netip.Prefix
		if s.Kind != model.ClusterIP {
			for _, p := range s.SourceRanges {
				want = append(want, p.Masked())
			}
		}
		slices.SortFunc(want, netip.Prefix.Compare)
		want = slices.Compact(want)
		got := slices.SortedFunc(slices.Values(ks.SourceRanges[fe]), netip.Prefix.Compare)
		if !slices.Equal(got, want) {
			t.Errorf("%s: source ranges %v, want %v", fe, got, want)
		}
	}
	for fe, ps := range ks.SourceRanges {
		if st.Services.Get(fe) == nil && len(ps) > 0 {
			t.Errorf("%s: source ranges %v left behind", fe, ps)
		}
	}
}

func TestLifecycle(t *testing.T) {
	f := newRecordingFake(t)
	r := reconciler.New(f, nil)
	a, b := vip(1), vip(2)

	steps := []struct {
		name string
		st   *model.State
	}{
		{"add", state(svc(a, "a", be(1, 1, model.TCP), be(1, 2, model.TCP)), svc(b, "b", be(2, 1, model.TCP)))},
		{"grow", state(svc(a, "a", be(1, 1, model.TCP), be(1, 2, model.TCP), be(1, 3, model.TCP)), svc(b, "b", be(2, 1, model.TCP)))},
		{"shrink", state(svc(a, "a", be(1, 3, model.TCP)), svc(b, "b", be(2, 1, model.TCP)))},
		{"share backend", state(svc(a, "a", be(1, 3, model.TCP)), svc(b, "b", be(2, 1, model.TCP), be(1, 3, model.TCP)))},
		{"empty", state(svc(a, "a"), svc(b, "b", be(1, 3, model.TCP)))},
		{"remove", state(svc(b, "b", be(1, 3, model.TCP)))},
		{"remove all", state()},
	}
	for _, s := range steps {
		mustApply(t, r, s.st)
		checkProgrammed(t, f, s.st)
		if t.Failed() {
			t.Fatalf("after step %q:\n%s", s.name, f)
		}
		// Applying again writes nothing.
		f.ResetCounts()
		mustApply(t, r, s.st)
		if n := f.Writes(); n != 0 {
			t.Fatalf("step %q: re-apply wrote %d entries: %v", s.name, n, f.Ops)
		}
	}
	if s := f.String(); s != "services:\nbackends:\nrev_nat:\n" {
		t.Errorf("not empty at the end:\n%s", s)
	}
}

func TestEmptiedServiceKeepsMaster(t *testing.T) {
	f := newFake(t)
	r := reconciler.New(f, nil)
	a := vip(1)
	mustApply(t, r, state(svc(a, "a", be(1, 1, model.TCP))))
	mustApply(t, r, state(svc(a, "a")))
	ks, _ := f.Dump()
	m, ok := ks.Masters[reconciler.DefaultScope(a)]
	if !ok || m.Count != 0 {
		t.Fatalf("master = %+v, %v; want count 0", m, ok)
	}
	if _, ok := ks.RevNat[m.ID]; !ok {
		t.Fatal("rev_nat of emptied service deleted")
	}
	if len(ks.Backends) != 0 || len(ks.Slots[reconciler.DefaultScope(a)]) != 0 {
		t.Fatalf("leftovers:\n%s", f)
	}
}

func TestOrder(t *testing.T) {
	f := newRecordingFake(t)
	r := reconciler.New(f, nil)
	a := vip(1)
	mustApply(t, r, state(svc(a, "a", be(1, 1, model.TCP), be(1, 2, model.TCP))))
	got := opsString(f.Ops)
	want := `ResetServiceStats 1
UpsertBackend 1 10.1.1.1:8080/TCP
UpsertBackend 2 10.1.1.2:8080/TCP
UpsertRevNat 1 10.96.0.1:80/TCP
UpsertSlot 10.96.0.1:80/TCP[1]=1
UpsertSlot 10.96.0.1:80/TCP[2]=2
UpsertMaster 10.96.0.1:80/TCP id=1 count=2 flags=0x0
UpsertServiceIP 10.96.0.1
`
	if got != want {
		t.Errorf("add ops:\n%s\nwant:\n%s", got, want)
	}

	// Replace backend 1 by 3 and drop 2: new backend, slot, master, extra
	// slot, then the backends nobody names.
	f.ResetCounts()
	mustApply(t, r, state(svc(a, "a", be(1, 3, model.TCP))))
	got = opsString(f.Ops)
	want = `UpsertBackend 3 10.1.1.3:8080/TCP
UpsertSlot 10.96.0.1:80/TCP[1]=3
UpsertMaster 10.96.0.1:80/TCP id=1 count=1 flags=0x0
DeleteSlot 10.96.0.1:80/TCP[2]
DeleteBackend 1
DeleteBackend 2
`
	if got != want {
		t.Errorf("change ops:\n%s\nwant:\n%s", got, want)
	}

	// Remove: the service IP (its last ClusterIP), master, slots, then
	// backends and rev_nat.
	f.ResetCounts()
	mustApply(t, r, state())
	got = opsString(f.Ops)
	want = `DeleteServiceIP 10.96.0.1
DeleteSlot 10.96.0.1:80/TCP[0]
DeleteSlot 10.96.0.1:80/TCP[1]
DeleteBackend 3
DeleteRevNat 1
`
	if got != want {
		t.Errorf("remove ops:\n%s\nwant:\n%s", got, want)
	}
}

func opsString(ops []fakedp.Op) string {
	var sb strings.Builder
	for _, o := range ops {
		sb.WriteString(o.String() + "\n")
	}
	return sb.String()
}

func TestSlotsReusedInPlace(t *testing.T) {
	f := newRecordingFake(t)
	r := reconciler.New(f, nil)
	a := vip(1)
	var bs []model.Backend
	for j := 1; j <= 10; j++ {
		bs = append(bs, be(1, j, model.TCP))
	}
	mustApply(t, r, state(svc(a, "a", bs...)))
	// Drop backend 3: backend 10 moves from slot 10 into slot 3.
	f.ResetCounts()
	mustApply(t, r, state(svc(a, "a", slices.Delete(slices.Clone(bs), 2, 3)...)))
	want := `UpsertSlot 10.96.0.1:80/TCP[3]=10
UpsertMaster 10.96.0.1:80/TCP id=1 count=9 flags=0x0
DeleteSlot 10.96.0.1:80/TCP[10]
DeleteBackend 3
`
	if got := opsString(f.Ops); got != want {
		t.Errorf("ops:\n%s\nwant:\n%s", got, want)
	}
}

func TestMinimalWritesAtScale(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000 services")
	}
	f := newFake(t)
	f.CheckAll = false // incremental checks only: 110,000 entries
	r := reconciler.New(f, nil)
	st := bigState(10000, 10)
	mustApply(t, r, st)
	if sv, bk, en := f.Sizes(); sv != 10000 || bk != 100000 || en != 110000 {
		t.Fatalf("sizes %d %d %d", sv, bk, en)
	}

	// One more service: its 3 backends, rev_nat, 3 slots, master, its
	// service IP.
	f.ResetCounts()
	extra := vip(20000)
	st.Services.Set(extra, svc(extra, "extra", be(20000, 1, model.TCP), be(20000, 2, model.TCP), be(20000, 3, model.TCP)))
	mustApply(t, r, st)
	if n := f.Writes(); n != 9 {
		t.Errorf("adding one service wrote %d entries, want 9", n)
	}

	// One endpoint of one service replaced: backend, slot, delete backend.
	f.ResetCounts()
	s := st.Services.Get(vip(42))
	s.Backends = model.SortBackends(append(slices.Clone(s.Backends[1:]), be(42, 99, model.TCP)))
	mustApply(t, r, st)
	if n := f.Writes(); n != 3 {
		t.Errorf("replacing one endpoint wrote %d entries, want 3", n)
	}
	checkProgrammed(t, f, st)
}

func TestRestartRestore(t *testing.T) {
	f := newFake(t)
	r := reconciler.New(f, nil)
	st := bigState(50, 3)
	// Share a backend across two services, and leave some id holes.
	st.Services.Get(vip(1)).Backends = model.SortBackends(append(slices.Clone(st.Services.Get(vip(1)).Backends), be(2, 1, model.TCP)))
	mustApply(t, r, st)
	st.Services.Delete(vip(10))
	mustApply(t, r, st)
	before := f.String()

	f.ResetCounts()
	r2 := reconciler.New(f, nil)
	if err := r2.Restore(); err != nil {
		t.Fatal(err)
	}
	mustApply(t, r2, st)
	if n := f.Writes(); n != 0 {
		t.Fatalf("apply after restore wrote %d entries", n)
	}
	if after := f.String(); after != before {
		t.Fatalf("state changed across restart:\n%s\nvs\n%s", before, after)
	}
	// New ids never collide with restored ones, and the id freed just
	// before the restart is not handed out again at once.
	st.Services.Set(vip(10), svc(vip(10), "again", be(10, 1, model.TCP)))
	mustApply(t, r2, st)
	checkProgrammed(t, f, st)
	ks, _ := f.Dump()
	if id := ks.Masters[reconciler.DefaultScope(vip(10))].ID; id != 51 {
		t.Errorf("re-added service got id %d, want 51 (11 is in quarantine)", id)
	}
}

// TestRestoreOfEmptyMapsSweepsNothing: the agent's first start restores
// empty maps, and its first program then does not look at every id it
// just handed out for one to release (300,000 backend addresses at
// 30,000 Services); a restore that read entries leaves ids a stray may
// have reserved, and the Apply after it looks, once.
func TestRestoreOfEmptyMapsSweepsNothing(t *testing.T) {
	f := newFake(t)
	st := bigState(50, 3)
	r := reconciler.New(f, nil)
	if err := r.Restore(); err != nil {
		t.Fatal(err)
	}
	mustApply(t, r, st)
	if n := reconciler.ReservationSweeps(r); n != 0 {
		t.Errorf("first program after restoring empty maps swept %d times, want 0", n)
	}
	r2 := reconciler.New(f, nil)
	if err := r2.Restore(); err != nil {
		t.Fatal(err)
	}
	mustApply(t, r2, st)
	mustApply(t, r2, st)
	if n := reconciler.ReservationSweeps(r2); n != 1 {
		t.Errorf("two Applies after restoring programmed maps swept %d times, want 1", n)
	}
}

// TestFailedBackendKeepsItsID: a backend whose write failed keeps the id
// chosen for it while the desired state still wants it, and the retry
// writes it under that id: the sweep after the failure releases only the
// ids nobody wants.
func TestFailedBackendKeepsItsID(t *testing.T) {
	f := newFake(t)
	r := reconciler.New(f, nil)
	st := state(svc(vip(1), "a", be(1, 1, model.TCP)))
	var tried reconciler.BackendID
	f.Fail = func(op fakedp.Op) error {
		if op.Kind == fakedp.OpUpsertBackend {
			tried = op.Backend
			return errors.New("injected")
		}
		return nil
	}
	if err := r.Apply(st); err == nil || tried == 0 {
		t.Fatalf("Apply with the backend's write failing = %v (backend %d tried)", err, tried)
	}
	f.Fail = nil
	mustApply(t, r, st)
	ks, err := f.Dump()
	if err != nil {
		t.Fatal(err)
	}
	if got := ks.Slots[reconciler.DefaultScope(vip(1))][1]; got != tried {
		t.Errorf("retry programmed the backend as %d, want %d (the id its failed write had)", got, tried)
	}
}

func TestIDQuarantine(t *testing.T) {
	f := newFake(t)
	f.CheckAll = false
	r := reconciler.New(f, nil)
	// Churn one backend of one service many times: a freed id comes back
	// only after BackendIDQuarantine others were freed, and ids stay dense.
	a := vip(1)
	seen := map[reconciler.BackendID]int{}
	for i := range 3 * reconciler.BackendIDQuarantine {
		mustApply(t, r, state(svc(a, "a", be(1, 1+i%200, model.TCP))))
		ks, _ := f.Dump()
		id := ks.Slots[reconciler.DefaultScope(a)][1]
		if last, ok := seen[id]; ok && i-last < reconciler.BackendIDQuarantine {
			t.Fatalf("backend id %d reused after %d changes", id, i-last)
		}
		seen[id] = i
		if id > reconciler.BackendIDQuarantine+2 {
			t.Fatalf("backend id %d: ids not dense", id)
		}
	}
}

func TestRestoreRemovesStrays(t *testing.T) {
	f := newFake(t)
	a, b := vip(1), vip(2)
	ba, bb := be(1, 1, model.TCP).L4Addr, be(2, 1, model.TCP).L4Addr
	fa, fb, f3, f4 := reconciler.DefaultScope(a), reconciler.DefaultScope(b), reconciler.DefaultScope(vip(3)), reconciler.DefaultScope(vip(4))
	f.Seed(&reconciler.KernelState{
		Masters: map[reconciler.Frontend]reconciler.Master{
			fa: {ID: 7, Count: 1},
			fb: {ID: 8, Count: 2}, // stray: not wanted
		},
		Slots: map[reconciler.Frontend]map[uint32]reconciler.BackendID{
			fa: {1: 3, 5: 4}, // slot 5 above the count: stray
			fb: {1: 4, 2: 3},
			f3: {1: 3}, // slots without a master
		},
		Backends: map[reconciler.BackendID]model.L4Addr{3: ba, 4: bb, 9: bb},
		RevNat:   map[reconciler.ServiceID]reconciler.Frontend{7: fa, 8: fb, 12: f4},
		// A stray service IP (no master), and b's, which goes with it.
		ServiceIPs: []netip.Addr{b.Addr, vip(5).Addr},
	})
	r := reconciler.New(f, nil)
	if err := r.Restore(); err != nil {
		t.Fatal(err)
	}
	st := state(svc(a, "a", be(1, 1, model.TCP)))
	mustApply(t, r, st)
	want := `services:
  10.96.0.1:80/TCP [0] id=7 count=1 flags=0x0
  10.96.0.1:80/TCP [1] backend=3 10.1.1.1:8080/TCP
backends:
  3 10.1.1.1:8080/TCP
rev_nat:
  7 10.96.0.1:80/TCP
service_ips:
  10.96.0.1
`
	if got := f.String(); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

// TestRestoreFarIDs: ids restored from the kernel far above the ones the
// allocators hand out (the view keeps them outside its dense tables) keep
// their frontend programmed as it was; a stray backend entry is reused
// for its address, and new ids come after the highest restored one (the
// allocators skip holes that large).
func TestRestoreFarIDs(t *testing.T) {
	// Far, but within the arrays the datapath indexes by id (and the
	// fake refuses ids beyond): services and backends sized 1<<20.
	f := newFakeSized(t, 1<<20, 1<<20, 1<<20)
	a, b := vip(1), vip(2)
	ba, bb := be(1, 1, model.TCP).L4Addr, be(2, 1, model.TCP).L4Addr
	fa, f3 := reconciler.DefaultScope(a), reconciler.DefaultScope(vip(3))
	const sid, bid = 1 << 19, 1 << 20
	f.Seed(&reconciler.KernelState{
		Masters: map[reconciler.Frontend]reconciler.Master{fa: {ID: sid, Count: 1}},
		Slots: map[reconciler.Frontend]map[uint32]reconciler.BackendID{
			fa: {1: bid},
			f3: {1: bid + 7}, // a stray slot naming a backend the map does not hold
		},
		Backends: map[reconciler.BackendID]model.L4Addr{bid: ba, 3 << 18: bb}, // the second named by no slot
		RevNat:   map[reconciler.ServiceID]reconciler.Frontend{sid: fa},
	})
	r := reconciler.New(f, nil)
	if err := r.Restore(); err != nil {
		t.Fatal(err)
	}
	st := state(svc(a, "a", be(1, 1, model.TCP)), svc(b, "b", be(2, 1, model.TCP)))
	mustApply(t, r, st)
	want := `services:
  10.96.0.1:80/TCP [0] id=524288 count=1 flags=0x0
  10.96.0.1:80/TCP [1] backend=1048576 10.1.1.1:8080/TCP
  10.96.0.2:80/TCP [0] id=524289 count=1 flags=0x0
  10.96.0.2:80/TCP [1] backend=786432 10.1.2.1:8080/TCP
backends:
  786432 10.1.2.1:8080/TCP
  1048576 10.1.1.1:8080/TCP
rev_nat:
  524288 10.96.0.1:80/TCP
  524289 10.96.0.2:80/TCP
service_ips:
  10.96.0.1
  10.96.0.2
`
	if got := f.String(); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	if s := r.Stats(); s.Backends != 2 || s.RevNat != 2 || s.Services != 2 {
		t.Errorf("stats %+v: want 2 backends, 2 rev_nat entries, 2 services", s)
	}
}

func TestCapacity(t *testing.T) {
	f := fakedp.New(3, 4, 8)
	r := reconciler.New(f, nil)
	a, b, c := vip(1), vip(2), vip(3)
	st := state(svc(a, "a", be(1, 1, model.TCP), be(1, 2, model.TCP)), svc(b, "b", be(2, 1, model.TCP)))
	mustApply(t, r, st)
	before := f.String()

	// c needs 3 backends; only 1 is free.
	st2 := state(st.Services.Get(a), st.Services.Get(b), svc(c, "c", be(3, 1, model.TCP), be(3, 2, model.TCP), be(3, 3, model.TCP)))
	err := r.Apply(st2)
	if !errors.Is(err, reconciler.ErrCapacity) || !strings.Contains(err.Error(), "default/c") {
		t.Fatalf("err = %v, want a capacity error naming default/c", err)
	}
	if r.InSync() {
		t.Error("InSync after a failed Apply")
	}
	if got := f.String(); got != before {
		t.Errorf("a service that did not fit disturbed the others:\n%s", got)
	}

	// Growing b past the backends capacity keeps b's old programming.
	st3 := state(st.Services.Get(a), svc(b, "b", be(2, 1, model.TCP), be(1, 1, model.TCP), be(1, 2, model.TCP), be(2, 2, model.TCP), be(2, 3, model.TCP)))
	err = r.Apply(st3)
	if !errors.Is(err, reconciler.ErrCapacity) || !strings.Contains(err.Error(), "default/b") {
		t.Fatalf("err = %v, want a capacity error naming default/b", err)
	}
	if got := f.String(); got != before {
		t.Errorf("b's programming changed:\n%s", got)
	}

	// Removing a frees room for c.
	st4 := state(st.Services.Get(b), svc(c, "c", be(3, 1, model.TCP), be(3, 2, model.TCP), be(3, 3, model.TCP)))
	mustApply(t, r, st4)
	checkProgrammed(t, f, st4)
	if v := f.Violations(); len(v) > 0 {
		t.Fatal(v)
	}
	stats := r.Stats()
	if stats.Services != 2 || stats.Backends != 4 || stats.ServiceEntries != 6 || stats.MaxBackends != 4 {
		t.Errorf("stats = %+v", stats)
	}
}

func TestWriteFailureAndRecovery(t *testing.T) {
	for _, kind := range []fakedp.OpKind{fakedp.OpUpsertBackend, fakedp.OpUpsertRevNat, fakedp.OpUpsertSlot, fakedp.OpUpsertMaster, fakedp.OpDeleteSlot, fakedp.OpDeleteBackend, fakedp.OpDeleteRevNat} {
		for nth := 1; nth <= 3; nth++ {
			t.Run(fmt.Sprintf("%s#%d", kind, nth), func(t *testing.T) {
				f := newFake(t)
				r := reconciler.New(f, nil)
				st1 := bigState(4, 3)
				mustApply(t, r, st1)
				// Target: service 1 changes, service 2 goes, service 9 comes.
				st2 := bigState(4, 3)
				st2.Services.Get(vip(1)).Backends = []model.Backend{be(1, 7, model.TCP), be(1, 8, model.TCP)}
				st2.Services.Delete(vip(2))
				st2.Services.Set(vip(9), svc(vip(9), "svc-9", be(9, 1, model.TCP), be(1, 8, model.TCP)))

				seen := 0
				f.Fail = func(op fakedp.Op) error {
					if op.Kind == kind {
						if seen++; seen == nth {
							return errors.New("injected")
						}
					}
					return nil
				}
				err := r.Apply(st2)
				if seen < nth {
					if err != nil {
						t.Fatalf("no failure injected, yet: %v", err)
					}
					return
				}
				if err == nil || !strings.Contains(err.Error(), "injected") {
					t.Fatalf("err = %v", err)
				}
				if kind != fakedp.OpDeleteBackend && kind != fakedp.OpDeleteRevNat && !strings.Contains(err.Error(), "service default/svc-") {
					t.Errorf("error names no service: %v", err)
				}
				recoversAfterFailure(t, f, r, st2)
			})
		}
	}
}

func TestUDPFlush(t *testing.T) {
	f := newFake(t)
	r := reconciler.New(f, nil)
	u := model.L4Addr{Addr: netip.MustParseAddr("10.96.0.10"), Port: 53, Proto: model.UDP}
	b1, b2, b3 := be(5, 1, model.UDP), be(5, 2, model.UDP), be(5, 3, model.UDP)
	mustApply(t, r, state(svc(u, "dns", b1, b2, b3)))
	if fl := f.Flushed(); len(fl) != 0 {
		t.Fatalf("flushed %v on add", fl)
	}
	mustApply(t, r, state(svc(u, "dns", b1, b3)))
	if fl := f.Flushed(); !slices.Equal(fl, []model.L4Addr{b2.L4Addr}) {
		t.Fatalf("flushed %v, want %v", fl, b2.L4Addr)
	}
	// A failed flush is retried by the next Apply.
	f.ResetCounts()
	f.Fail = func(op fakedp.Op) error {
		if op.Kind == fakedp.OpFlushConntrack {
			return errors.New("injected")
		}
		return nil
	}
	if err := r.Apply(state()); err == nil {
		t.Fatal("flush error not reported")
	}
	f.Fail = nil
	mustApply(t, r, state())
	fl := f.Flushed()
	slices.SortFunc(fl, func(a, b model.L4Addr) int { return a.Addr.Compare(b.Addr) })
	if !slices.Equal(fl, []model.L4Addr{b1.L4Addr, b3.L4Addr}) {
		t.Fatalf("flushed %v after removal", fl)
	}
	// TCP backends are never flushed.
	f.ResetCounts()
	mustApply(t, r, state(svc(vip(1), "t", be(1, 1, model.TCP))))
	mustApply(t, r, state())
	if fl := f.Flushed(); len(fl) != 0 {
		t.Fatalf("flushed TCP %v", fl)
	}
}

func TestRefreshRepairsTampering(t *testing.T) {
	f := newFake(t)
	r := reconciler.New(f, nil)
	st := bigState(3, 2)
	mustApply(t, r, st)
	want := f.String()

	// Someone deletes a master and a backend's slots behind our back.
	ks, _ := f.Dump()
	delete(ks.Masters, reconciler.DefaultScope(vip(1)))
	delete(ks.Slots, reconciler.DefaultScope(vip(1)))
	ks.Backends[77] = be(9, 9, model.UDP).L4Addr
	f.Seed(ks)

	mustApply(t, r, st) // within the refresh interval: the view is trusted
	if f.String() == want {
		t.Fatal("tampering repaired without a refresh?")
	}
	r.SetRefreshInterval(time.Nanosecond)
	time.Sleep(time.Millisecond)
	mustApply(t, r, st)
	if got := f.String(); got != want {
		t.Fatalf("not repaired:\n%s\nwant\n%s", got, want)
	}
}

// dumpCounter counts the reads of the maps.
type dumpCounter struct {
	reconciler.Datapath
	dumps int
}

func (d *dumpCounter) Dump() (*reconciler.KernelState, error) {
	d.dumps++
	return d.Datapath.Dump()
}

// walkFails is a datapath whose Walk fails once fail is set.
type walkFails struct {
	reconciler.Datapath
	fail bool
}

func (w *walkFails) Walk(v reconciler.KernelVisitor) error {
	if w.fail {
		return errors.New("walk failed")
	}
	return w.Datapath.Walk(v)
}

// TestRefreshHookAroundRead: the hook runs right before an Apply rebuilds
// its view from a dump of the maps (they drifted, and the walk that
// would repair them entry by entry failed) and once more at that Apply's
// end, and in no other Apply: not in one whose re-read found no drift,
// nor in one whose re-read repaired it entry by entry.
func TestRefreshHookAroundRead(t *testing.T) {
	f := newFake(t)
	w := &walkFails{Datapath: f}
	d := &dumpCounter{Datapath: w}
	r := reconciler.New(d, nil)
	var calls []int // the dumps each call saw
	r.SetRefreshHook(func() { calls = append(calls, d.dumps) })
	st := bigState(3, 2)
	mustApply(t, r, st)
	mustApply(t, r, st)
	if len(calls) != 0 || d.dumps != 0 {
		t.Fatalf("within the refresh interval: hook calls %v, dumps %d, want none", calls, d.dumps)
	}
	r.SetRefreshInterval(time.Nanosecond)
	time.Sleep(time.Millisecond)
	mustApply(t, r, st)
	if len(calls) != 0 || d.dumps != 0 {
		t.Fatalf("a re-read without drift: hook calls %v, dumps %d, want none", calls, d.dumps)
	}
	ks, _ := f.Dump()
	delete(ks.Masters, reconciler.DefaultScope(vip(1)))
	delete(ks.Slots, reconciler.DefaultScope(vip(1)))
	f.Seed(ks)
	time.Sleep(time.Millisecond)
	mustApply(t, r, st)
	if len(calls) != 0 || d.dumps != 0 {
		t.Fatalf("a re-read that repaired drift entry by entry: hook calls %v, dumps %d, want none", calls, d.dumps)
	}
	// A walk that fails: the view is rebuilt from a dump.
	f.Seed(ks)
	w.fail = true
	time.Sleep(time.Millisecond)
	mustApply(t, r, st)
	if !slices.Equal(calls, []int{0, 1}) {
		t.Fatalf("hook calls saw %v dumps, want [0 1] (before the read and after it)", calls)
	}
	r.SetRefreshInterval(time.Hour)
	mustApply(t, r, st)
	if len(calls) != 2 {
		t.Fatalf("an Apply without a read called the hook: %v", calls)
	}
}

// TestViewKeepsNoOlderService: the view names the Service each frontend
// was programmed for by pointing at the desired state's; once a newer
// state's Service for the frontend is applied (programmed the same, so
// only looked at), the older one is garbage, whether the newer state says
// what changed (BaseGen) or not.
func TestViewKeepsNoOlderService(t *testing.T) {
	for _, hint := range []bool{true, false} {
		f := newFake(t)
		r := reconciler.New(f, nil)
		older := svc(vip(1), "a", be(1, 1, model.TCP), be(1, 2, model.TCP))
		st := state(older, svc(vip(2), "b", be(2, 1, model.TCP)))
		st.Gen = model.NewGeneration()
		mustApply(t, r, st)
		newer := *older
		newer.Backends = slices.Clone(older.Backends)
		next := &model.State{Services: st.Services, Gen: model.NewGeneration()}
		next.Services.Set(vip(1), &newer)
		if hint {
			next.BaseGen, next.Changed = st.Gen, []model.L4Addr{vip(1)}
		}
		gone := weak.Make(older)
		older, st = nil, nil
		f.ResetCounts()
		mustApply(t, r, next)
		if f.Writes() != 0 {
			t.Fatalf("hint %v: %d writes for a state programmed the same", hint, f.Writes())
		}
		runtime.GC()
		if gone.Value() != nil {
			t.Errorf("hint %v: the view keeps the older state's Service alive", hint)
		}
		runtime.KeepAlive(r)
		runtime.KeepAlive(next)
	}
}
