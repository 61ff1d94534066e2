package datapath

// The backends and reverse-NAT arrays' fill from the counts their tables
// keep (bemem.go, beTable.presentCount) instead of a walk of every entry
// on each scrape (issue 14, sixty-sixth pass): the tests hold the counts
// to the walk's over what the agent does to the arrays; the benchmark is
// a scrape's fill at 30,000 Services x 10.

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// idArraysOf are the backends and reverse-NAT arrays of d, by pin name.
func idArraysOf(d *Datapath) map[string]*ebpf.Map {
	return map[string]*ebpf.Map{mapBackends: d.maps.backends, mapBackends6: d.maps.backends6,
		mapRevNat: d.maps.revNat, mapRevNat6: d.maps.revNat6}
}

// checkIDCounts fails t unless, for each backends and reverse-NAT array
// of d, the count its table knows (wantKnown: whether it should know
// one) and MapFill's entries equal its present entries walked; it
// returns the walked counts.
func checkIDCounts(t *testing.T, step string, d *Datapath, wantKnown map[string]bool) map[string]int {
	t.Helper()
	known := d.knownEntries()
	fill, err := d.MapFill()
	if err != nil {
		t.Fatalf("%s: MapFill: %v", step, err)
	}
	filled := map[string]int{}
	for _, f := range fill {
		filled[f.Pin] = f.Entries
	}
	walked := map[string]int{}
	for pin, m := range idArraysOf(d) {
		n, err := countPresent(m)
		if err != nil {
			t.Fatalf("%s: walk %s: %v", step, pin, err)
		}
		walked[pin] = n
		want := wantKnown == nil || wantKnown[pin]
		if k, ok := known[pin]; ok != want {
			t.Errorf("%s: %s: a count known %v, want %v", step, pin, ok, want)
		} else if ok && k != n {
			t.Errorf("%s: %s: the table counts %d entries, the walk %d", step, pin, k, n)
		}
		if f, ok := filled[pin]; !ok || f != n {
			t.Errorf("%s: %s: MapFill says %d entries (%v), the walk %d", step, pin, f, ok, n)
		}
	}
	return walked
}

// idCountServices are n ClusterIP services of each family from the
// from'th, each of k backends (of its family).
func idCountServices(from, n, k int) []*model.Service {
	var svcs []*model.Service
	for i := from; i < from+n; i++ {
		fe4 := model.L4Addr{Addr: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Port: 80, Proto: model.TCP}
		fe6 := model.L4Addr{Addr: netip.AddrFrom16([16]byte{0: 0xfd, 1: 0x96, 14: byte(i >> 8), 15: byte(i)}), Port: 80, Proto: model.TCP}
		var be4, be6 []model.L4Addr
		for j := range k {
			be4 = append(be4, model.L4Addr{Addr: netip.AddrFrom4([4]byte{11, byte(j), byte(i >> 8), byte(i)}), Port: 8080, Proto: model.TCP})
			be6 = append(be6, model.L4Addr{Addr: netip.AddrFrom16([16]byte{0: 0xfd, 1: 0x11, 13: byte(j), 14: byte(i >> 8), 15: byte(i)}), Port: 8080, Proto: model.TCP})
		}
		svcs = append(svcs, clusterIP(fe4, be4...), clusterIP(fe6, be6...))
	}
	return svcs
}

// stateOf is the State of svcs.
func stateOf(svcs []*model.Service) *model.State {
	st := model.NewState()
	for _, s := range svcs {
		s.Backends = model.SortBackends(s.Backends)
		st.Services.Set(s.Frontend, s)
	}
	return st
}

// TestMapFillIDCountsMatchWalk: the backends and reverse-NAT arrays'
// entries a scrape reports, from the counts their tables keep, are the
// present entries a walk finds, through applies that add, change and
// delete services of both families (deleted ids go to the reconciler's
// quarantine), a batch whose write fails half-way, a write that goes
// around the tables (unknown, so walked, until the reconciler's re-read
// counts anew) and a restart on the same pins (counted when opened). Fails
// with the count kept wrong (a clear not counted: the table's count
// stays above the walk's after the deletes), or not counted at open.
func TestMapFillIDCountsMatchWalk(t *testing.T) {
	d, dir := newTestDatapathAt(t)
	if !d.maps.beMapped() || !d.maps.rnMapped() {
		t.Skip("the arrays are not mapped here")
	}
	r := reconciler.New(d.Maps(), nil)
	apply := func(step string, r *reconciler.Reconciler, svcs []*model.Service) {
		t.Helper()
		if err := r.Apply(stateOf(svcs)); err != nil {
			t.Fatalf("%s: Apply: %v", step, err)
		}
	}
	checkIDCounts(t, "empty", d, nil)

	apply("first", r, idCountServices(0, 20, 3))
	w := checkIDCounts(t, "first", d, nil)
	if w[mapBackends] != 60 || w[mapBackends6] != 60 || w[mapRevNat] != 20 || w[mapRevNat6] != 20 {
		t.Fatalf("first: walked %v, want 60 backends and 20 services a family", w)
	}

	// Services 0-9 go, 10-19 get a fourth backend and lose their
	// first, 20-24 come.
	next := idCountServices(10, 15, 4)
	for _, s := range next[:20] {
		s.Backends = s.Backends[1:]
	}
	apply("second", r, next)
	w = checkIDCounts(t, "second", d, nil)
	if w[mapBackends] != 50 || w[mapRevNat] != 15 {
		t.Fatalf("second: walked %v, want 50 backends and 15 services of IPv4", w)
	}

	// A batch whose second entry's id is beyond the array: the first
	// is written, the second fails and writes nothing.
	top := reconciler.BackendID(d.maps.backends.MaxEntries() - 1)
	es := []reconciler.BackendEntry{
		{ID: top, Addr: l4("12.0.0.1", 80, model.TCP)},
		{ID: top + 1, Addr: l4("12.0.0.2", 80, model.TCP)},
	}
	if n, err := d.maps.UpsertBackends(es); err == nil || n != 1 {
		t.Fatalf("UpsertBackends beyond the array: %d, %v; want 1 and an error", n, err)
	}
	checkIDCounts(t, "failed write", d, nil)
	if _, err := d.maps.DeleteBackends([]reconciler.BackendID{top}); err != nil {
		t.Fatal(err)
	}
	checkIDCounts(t, "failed write deleted", d, nil)

	// A write around the table (the system call the agent falls back
	// to where a window cannot be mapped): the IPv4 backends' count is
	// unknown, the scrape walks; the reconciler's re-read counts anew.
	if _, err := putSyscall(d.maps.beArrays(), uint32(top), sockLb4Backend{Addr: 1, Port: 80, Flags: bePresent},
		netip.MustParseAddr("12.0.0.1"), lb6Backend); err != nil {
		t.Fatal(err)
	}
	checkIDCounts(t, "around the table", d, map[string]bool{mapBackends6: true, mapRevNat: true, mapRevNat6: true})
	if err := d.maps.Walk(&entriesOf{}); err != nil {
		t.Fatal(err)
	}
	w = checkIDCounts(t, "re-read", d, nil)
	if w[mapBackends] != 51 {
		t.Fatalf("re-read: walked %v, want 51 IPv4 backends", w)
	}

	// The agent restarts on the same pins: the tables count what they
	// find, and a new reconciler, its view restored from them (Restore,
	// as the agent does), applies another state, deleting the strays.
	d.Close()
	d2 := openTest(t, smallConfig(dir))
	if w := checkIDCounts(t, "restart", d2, nil); w[mapBackends] != 51 || w[mapRevNat6] != 15 {
		t.Fatalf("restart: walked %v, want 51 IPv4 backends and 15 IPv6 services", w)
	}
	r2 := reconciler.New(d2.Maps(), nil)
	if err := r2.Restore(); err != nil {
		t.Fatal(err)
	}
	apply("after restart", r2, idCountServices(12, 5, 2))
	if w := checkIDCounts(t, "after restart", d2, nil); w[mapBackends] != 10 || w[mapRevNat6] != 5 {
		t.Fatalf("after restart: walked %v, want 10 IPv4 backends and 5 IPv6 services", w)
	}
	apply("after restart, second", r2, idCountServices(40, 3, 1))
	checkIDCounts(t, "after restart, second", d2, nil)
}

// BenchmarkMapFill30k is a scrape's fill of every map (MapFill, what
// sluice_bpf_map_entries and sluice_map_fill_ratio read) at 30,000
// ClusterIP Services x 10 endpoints programmed through the reconciler,
// the maps sized as the kube bench's agent (--max-backends 393216, the
// rest the defaults): counted is the agent's way, walked the same with
// the tables' counts not used (the walk of every array before the
// sixty-sixth pass), parts each map's count alone. cpu-ns/op is the
// process's CPU time, what a loaded machine does not inflate.
func BenchmarkMapFill30k(b *testing.B) {
	testutil.Privileged(b)
	cfg := Config{BPFFS: testPinDir(b), MaxBackends: 393216}
	d := openTest(b, cfg)
	var sb model.ServicesBuilder
	for _, s := range benchServices(30000) {
		sb.Set(s.Frontend, s)
	}
	if err := reconciler.New(d.Maps(), nil).Apply(&model.State{Services: sb.Services()}); err != nil {
		b.Fatal(err)
	}
	maps := objectsOf[*ebpf.Map](&d.sock, &d.tc, &d.xdp, &d.gc)
	counts := func(b *testing.B) map[ebpf.MapID]int {
		if d.counter == nil {
			return nil
		}
		c, err := d.counter.counts()
		if err != nil {
			b.Fatal(err)
		}
		return c
	}
	cpuPerOp := func(b *testing.B, f func()) {
		cpu0 := testutil.CPUTime(b)
		for b.Loop() {
			f()
		}
		b.ReportMetric(float64((testutil.CPUTime(b)-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
	}
	for _, known := range []bool{true, false} {
		b.Run(map[bool]string{true: "counted", false: "walked"}[known], func(b *testing.B) {
			cpuPerOp(b, func() {
				k := d.knownEntries()
				if !known {
					k = map[string]int{mapSlots: k[mapSlots], mapSlots6: k[mapSlots6]}
				}
				fill, err := mapFill(maps, counts(b), k)
				if err != nil {
					b.Fatal(err)
				}
				for _, f := range fill {
					if f.Pin == mapBackends && f.Entries != 300000 {
						b.Fatalf("%s: %d entries, want 300000", f.Pin, f.Entries)
					}
				}
			})
		})
	}
	// parts: each map's count alone (the backends and reverse-NAT
	// arrays walked), the kernel's counts read once before; and that
	// read (kernel_count), which every scrape makes once.
	b.Run("parts", func(b *testing.B) {
		c := counts(b)
		if d.counter != nil {
			b.Run("kernel_count", func(b *testing.B) { cpuPerOp(b, func() { counts(b) }) })
		}
		for _, pin := range sortedKeys(maps) {
			ids := pin == mapBackends || pin == mapBackends6 || pin == mapRevNat || pin == mapRevNat6
			if !countable(maps[pin].Type()) && !ids && pin != mapSlots && pin != mapSlots6 {
				continue
			}
			one, k := map[string]*ebpf.Map{pin: maps[pin]}, d.knownEntries()
			if ids {
				delete(k, pin)
			}
			b.Run(pin, func(b *testing.B) {
				cpuPerOp(b, func() {
					if _, err := mapFill(one, c, k); err != nil {
						b.Fatal(fmt.Errorf("%s: %w", pin, err))
					}
				})
			})
		}
	})
}
