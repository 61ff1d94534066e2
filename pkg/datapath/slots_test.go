package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// newFlows sends n SYNs of new flows to fe through tc ingress and fails t
// unless each is translated to one of allowed (addresses).
func newFlows(t *testing.T, d *Datapath, v6 bool, fe model.L4Addr, sport *uint16, n int, allowed map[string]bool, when string) {
	t.Helper()
	for range n {
		*sport++
		in := tcpSYN(twinAddr(v6, "10.0.0.2"), *sport, fe.Addr.String(), fe.Port)
		verdict, out := runProg(t, d.TCIngress(), in.Bytes())
		if verdict != tcActOK || !allowed[outDst(out)] {
			t.Fatalf("%s: flow from port %d: verdict %d, to %s; want one of %v", when, *sport, verdict, outDst(out), allowed)
		}
	}
}

// TestSlotsMoveUnderTraffic: a frontend that grows from 1 to 40 backends
// outgrows its range four times (1, 2, 4, ... 64 entries); every new
// flow, before and after each slot is written (the master then has the
// old count, its range perhaps moved) and after each master, goes to a
// backend of the frontend. Per family.
func TestSlotsMoveUnderTraffic(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		d := newTestDatapath(t)
		m := d.Maps()
		fe := twinL4(v6, vipTCP)
		dfe := reconciler.DefaultScope(fe)
		be := func(i int) testBackend {
			return testBackend{reconciler.BackendID(100 + i), l4(twinAddr(v6, fmt.Sprintf("10.1.3.%d", i)), 8080, model.TCP)}
		}
		addService(t, m, 1, fe, be(1))
		allowed := map[string]bool{be(1).addr.Addr.String(): true}
		var sport uint16 = 20000
		newFlows(t, d, v6, fe, &sport, 8, allowed, "before")
		tbl := m.slotTableOf(dfe)
		bases := map[uint32]bool{tbl.at(dfe).r.base: true}
		// The quarantine passes between a slot and its master: the
		// range the frontend left is emptied and handed out again (to
		// frontends without masters yet, whose slots name another
		// backend).
		clock := &fakeClock{t: time.Now()}
		tbl.alloc.now = clock.now
		other := be(99)
		must(t, m.UpsertBackend(other.id, other.addr))
		for i := 2; i <= 40; i++ {
			b := be(i)
			must(t, m.UpsertBackend(b.id, b.addr))
			must(t, m.UpsertSlot(dfe, uint32(i), b.id))
			clock.t = clock.t.Add(2 * slotQuarantine)
			ofe := reconciler.DefaultScope(l4(twinAddr(v6, fmt.Sprintf("10.96.9.%d", i)), 80, model.TCP))
			for j := range uint32(i) {
				must(t, m.UpsertSlot(ofe, j+1, other.id))
			}
			// The master still says i-1 backends.
			newFlows(t, d, v6, fe, &sport, 8, allowed, fmt.Sprintf("slot %d written", i))
			must(t, m.UpsertMaster(dfe, reconciler.Master{ID: 1, Count: uint32(i)}))
			allowed[b.addr.Addr.String()] = true
			newFlows(t, d, v6, fe, &sport, 8, allowed, fmt.Sprintf("master of %d", i))
			bases[tbl.at(dfe).r.base] = true
		}
		if len(bases) < 5 {
			t.Errorf("the frontend's range moved %d times, want 5 or more: %v", len(bases)-1, bases)
		}
		ks := mustDump(t, m)
		if ms := ks.Masters[dfe]; ms.Count != 40 || len(ks.Slots[dfe]) != 40 {
			t.Fatalf("after growing: master %+v, %d slots", ms, len(ks.Slots[dfe]))
		}
		// Shrinking as the reconciler does (the master, then the slots
		// above it) keeps every flow on a backend of the frontend.
		for i := 40; i > 1; i-- {
			must(t, m.UpsertMaster(dfe, reconciler.Master{ID: 1, Count: uint32(i - 1)}))
			delete(allowed, be(i).addr.Addr.String())
			must(t, m.DeleteSlot(dfe, uint32(i)))
			newFlows(t, d, v6, fe, &sport, 4, allowed, fmt.Sprintf("shrunk to %d", i-1))
		}
	})
}

// TestSlotsSurviveRestart: an agent that starts over the pins of one
// that programmed Services finds their ids and slots as they were, in
// the same ranges, and gives a frontend that grows a range of its own:
// the others' slots stay.
func TestSlotsSurviveRestart(t *testing.T) {
	d, bpffs := newTestDatapathAt(t)
	var svcs []*model.Service
	var fes []model.L4Addr
	for i := range 24 {
		v6 := i%3 == 2
		var bes []model.L4Addr
		for j := range 1 + i%7 {
			bes = append(bes, l4(twinAddr(v6, fmt.Sprintf("10.2.%d.%d", i, j+1)), 8080, model.TCP))
		}
		fes = append(fes, l4(twinAddr(v6, fmt.Sprintf("10.96.7.%d", i+1)), 80, model.TCP))
		svcs = append(svcs, clusterIP(fes[i], bes...))
	}
	applyServices(t, d, svcs...)
	want := mustDump(t, d.Maps())
	bases := func(m *Maps) map[reconciler.Frontend]slotRange {
		out := map[reconciler.Frontend]slotRange{}
		for _, tb := range []*slotTable{m.slots4, m.slots6} {
			for fe, e := range tb.entries() {
				out[fe] = e.r
			}
		}
		return out
	}
	wantBases := bases(d.Maps())
	d.Close()

	d2 := openTest(t, smallConfig(bpffs))
	m2 := d2.Maps()
	got := mustDump(t, m2)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("after the restart\n%s\nwant\n%s", got, want)
	}
	if gb := bases(m2); !reflect.DeepEqual(gb, wantBases) {
		t.Errorf("ranges after the restart %v, want %v", gb, wantBases)
	}
	// The first frontend grows to 30 backends: a new range, not one of
	// the others'.
	fe := reconciler.DefaultScope(fes[0])
	for j := 2; j <= 30; j++ {
		id := reconciler.BackendID(2000 + j)
		must(t, m2.UpsertBackend(id, l4(fmt.Sprintf("10.3.0.%d", j), 8080, model.TCP)))
		must(t, m2.UpsertSlot(fe, uint32(j), id))
	}
	ms := want.Masters[fe]
	ms.Count = 30
	must(t, m2.UpsertMaster(fe, ms))
	after := mustDump(t, m2)
	for f, s := range want.Slots {
		if f != fe && !reflect.DeepEqual(after.Slots[f], s) {
			t.Errorf("slots of %s after another frontend grew: %v, want %v", f, after.Slots[f], s)
		}
	}
	if len(after.Slots[fe]) != 30 {
		t.Errorf("the grown frontend has %d slots, want 30", len(after.Slots[fe]))
	}
}

// pinServicesV1 replaces, in the pin directory dir of an agent of this
// build, the services maps and slots arrays by services maps of the
// previous layout (v1: masters and slots in one hash), as an agent of
// the previous release pinned them; it returns them.
func pinServicesV1(t *testing.T, dir string) (v4, v6 *ebpf.Map) {
	t.Helper()
	spec := specOf(t, loadTc)
	for _, name := range []string{mapServices, mapServices6, mapSlots, mapSlots6} {
		must(t, os.Remove(filepath.Join(dir, name)))
	}
	pin := func(name, cur string) *ebpf.Map {
		ms := spec.Maps[cur].Copy()
		ms.Name = name
		ms.MaxEntries = uint32(smallConfig("").withDefaults().MaxServiceEntries)
		ms.ValueSize = 16 // lb4ServiceV1
		m, err := ebpf.NewMapWithOptions(ms, ebpf.MapOptions{PinPath: dir})
		if err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		t.Cleanup(func() { m.Close() })
		return m
	}
	return pin("sluice_services_v1", mapServices), pin("sluice6_services_v1", mapServices6)
}

// TestOpenMigratesServicesV1: an agent started over the pins of the
// previous release, whose services maps held the slots, finds every
// master with its service id and every slot with its backend id, the
// slots in the arrays, and new flows go to the backends; a start that
// fails first puts the v1 pins back. OpenPinned reads the v1 pins.
func TestOpenMigratesServicesV1(t *testing.T) {
	testutil.Privileged(t)
	bpffs := testPinDir(t)
	dir := filepath.Join(bpffs, "sluice")
	openTest(t, smallConfig(bpffs)).Close()
	s4, s6 := pinServicesV1(t, dir)
	// The rest as the previous agent left them: its maps are this
	// build's (same names).
	old, err := OpenPinned(bpffs)
	must(t, err)
	old.Close()
	pinned := func(name string) *ebpf.Map {
		m, err := ebpf.LoadPinnedMap(filepath.Join(dir, name), nil)
		must(t, err)
		t.Cleanup(func() { m.Close() })
		return m
	}
	backends, backends6, revNat, revNat6 := pinned(mapBackends), pinned(mapBackends6), pinned(mapRevNat), pinned(mapRevNat6)
	m0 := &Maps{services: s4, services6: s6, backends: backends, backends6: backends6, revNat: revNat, revNat6: revNat6}
	type svc struct {
		v6  bool
		fe  model.L4Addr
		bes []testBackend
	}
	var svcs []svc
	for i := range 12 {
		v6 := i%2 == 1
		s := svc{v6: v6, fe: l4(twinAddr(v6, fmt.Sprintf("10.96.8.%d", i+1)), 80, model.TCP)}
		for j := range 1 + i%5 {
			s.bes = append(s.bes, testBackend{reconciler.BackendID(10*i + j + 1), l4(twinAddr(v6, fmt.Sprintf("10.4.%d.%d", i, j+1)), 8080, model.TCP)})
		}
		addService(t, m0, reconciler.ServiceID(i+1), s.fe, s.bes...)
		svcs = append(svcs, s)
	}
	want := mustDump(t, m0)
	if len(want.Masters) != 12 || len(want.Slots) != 12 {
		t.Fatalf("v1 state: %s", want)
	}
	p, err := OpenPinned(bpffs)
	must(t, err)
	if got, err := p.Dump(); err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("OpenPinned over v1 pins: %v\n%s\nwant\n%s", err, got, want)
	}
	p.Close()

	// A start that fails after the conversion puts the v1 pins back.
	override(t, &failAfterLoad, func() error { return errors.New("failed start") })
	if _, err := Open(smallConfig(bpffs)); err == nil {
		t.Fatal("Open with a failing start succeeded")
	}
	failAfterLoad = nil
	for name, there := range map[string]bool{"sluice_services_v1": true, "sluice6_services_v1": true,
		mapServices: false, mapSlots: false, mapServices6: false, mapSlots6: false} {
		if _, err := os.Stat(filepath.Join(dir, name)); (err == nil) != there {
			t.Errorf("after a failed start: pin %s: %v, want there %v", name, err, there)
		}
	}

	d := openTest(t, smallConfig(bpffs))
	for _, name := range []string{"sluice_services_v1", "sluice6_services_v1"} {
		if _, err := os.Stat(filepath.Join(dir, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("pin %s after Open: %v", name, err)
		}
	}
	got := mustDump(t, d.Maps())
	if !reflect.DeepEqual(got, want) {
		t.Errorf("after the migration\n%s\nwant\n%s", got, want)
	}
	var sport uint16 = 30000
	for _, s := range svcs {
		allowed := map[string]bool{}
		for _, b := range s.bes {
			allowed[b.addr.Addr.String()] = true
		}
		newFlows(t, d, s.v6, s.fe, &sport, 4, allowed, "after the migration "+s.fe.String())
	}
}

// BenchmarkFillSlots is BenchmarkFillServicesMap's successor: the 30,000
// frontends x 11 entries of a first program at 30,000 Services x 10,
// each frontend's 10 slots written into a fresh slots array through its
// mapping (slotTable, a range allocated per frontend), then the 30,000
// masters into a fresh sluice_services_v2 in batches of 1,024. Reported
// per entry (of the 330,000), CPU and system time: what the kernel's
// 330,000 inserts took before.
func BenchmarkFillSlots(b *testing.B) {
	testutil.Privileged(b)
	const frontends, per, batch = 30000, 10, 1024
	fes := make([]reconciler.Frontend, frontends)
	keys := make([]sockLb4Key, frontends)
	ids := make([]reconciler.BackendID, per)
	for i := range fes {
		a := netip.AddrFrom4([4]byte{10, byte(96 + i>>16), byte(i >> 8), byte(i)})
		fes[i] = reconciler.DefaultScope(model.L4Addr{Addr: a, Port: 80, Proto: model.TCP})
		keys[i] = sockLb4Key{Vip: be32(a), Port: be16(80), Proto: uint8(model.TCP)}
	}
	for j := range ids {
		ids[j] = reconciler.BackendID(j + 1)
	}
	spec := specOf(b, loadTc)
	cfg := Config{MaxServiceEntries: 12 * frontends}
	if err := configure(spec, cfg.withDefaults()); err != nil {
		b.Fatal(err)
	}
	values := make([]sockLb4Service, frontends)
	none := func(reconciler.Frontend, uint32) error { return nil }
	var cpu, sys time.Duration
	for b.Loop() {
		b.StopTimer()
		arr, err := ebpf.NewMap(unpinned(spec.Maps[mapSlots]))
		if err != nil {
			b.Fatal(err)
		}
		services, err := ebpf.NewMap(unpinned(spec.Maps[mapServices]))
		if err != nil {
			b.Fatal(err)
		}
		tb, err := openSlotTable(arr, mapSlots)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		cpu0, sys0 := testutil.CPUTime(b), sysTime(b)
		for i, fe := range fes {
			if err := tb.write(fe, 1, ids, none); err != nil {
				b.Fatal(err)
			}
			values[i] = sockLb4Service{Count: per, RevNatId: uint32(i + 1), SlotsBase: tb.at(fe).r.base}
		}
		for i := 0; i < frontends; i += batch {
			j := min(i+batch, frontends)
			if _, err := putBatch(services, keys[i:j], values[i:j]); err != nil {
				b.Fatal(err)
			}
		}
		cpu += testutil.CPUTime(b) - cpu0
		sys += sysTime(b) - sys0
		b.StopTimer()
		_ = tb.close()
		arr.Close()
		services.Close()
		b.StartTimer()
	}
	n := float64(b.N) * frontends * (per + 1)
	b.ReportMetric(float64(cpu.Nanoseconds())/n, "cpu-ns/entry")
	b.ReportMetric(float64(sys.Nanoseconds())/n, "sys-ns/entry")
}
