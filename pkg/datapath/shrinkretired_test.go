package datapath

import (
	"fmt"
	"maps"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// TestShrinkLeavesRetiredMastersOut: a removed TCP frontend's retired
// master (reconciler/retired.go) is not a Service the operator keeps, so
// a shrinking start does not count it (shrink.go): three ClusterIPs
// programmed through a reconciler, one removed (retired, an established
// flow still translated), then, on the same pins:
//
//   - --max-services=1, too small for the two live ones: refused naming
//     2, every pin and entry as it was;
//   - --max-service-entries=4, the live masters and slots only: accepted,
//     the retired master kept (no slots of its own, and the services maps
//     keep their size), its flow still translated;
//   - the same sizes again, and --max-services=4, which holds it: kept;
//   - --max-services=2, which holds the live ones only: accepted, the
//     retired master and its rev_nat entry left out of the copies, the
//     live ones as they were, served, and a reconciler's Restore reads no
//     retired master; the flow's data then passes untranslated, as at a
//     deletion.
//
// The two accepted shrinks were refused before (--max-service-entries=5
// and --max-services=3 asked for). Both families.
func TestShrinkLeavesRetiredMastersOut(t *testing.T) {
	forFamilies(t, testShrinkLeavesRetiredMastersOut)
}

func testShrinkLeavesRetiredMastersOut(t *testing.T, v6 bool) {
	a := twinOf(v6)
	d, bpffs := newTestDatapathAt(t)
	r := reconciler.New(d.Maps(), nil)
	r.SetRetireTimeout(time.Hour)
	be := testBackend{addr: l4(a("10.1.7.1"), 8080, model.TCP)}
	fes := []model.L4Addr{l4(a("10.96.7.1"), 80, model.TCP), l4(a("10.96.7.2"), 80, model.TCP), l4(a("10.96.7.3"), 80, model.TCP)}
	live, removed := fes[:2], fes[2]
	apply := func(r *reconciler.Reconciler, fes []model.L4Addr) {
		t.Helper()
		st := model.NewState()
		for _, fe := range fes {
			st.Services.Set(fe, clusterIP(fe, be.addr))
		}
		if err := r.Apply(st); err != nil {
			t.Fatalf("Apply: %v", err)
		}
	}
	apply(r, fes)
	f := flow{a("10.0.7.9"), 45200, removed}
	establish(t, d, f, be)
	apply(r, live)
	if _, ok := r.Retired()[reconciler.DefaultScope(removed)]; !ok {
		t.Fatalf("%s not retired: %v", removed, r.Retired())
	}
	before := mustDump(t, d.Maps())
	retiredID := before.Masters[reconciler.DefaultScope(removed)].ID
	if _, ok := before.RevNat[retiredID]; !ok {
		t.Fatalf("the retired master's service id %d has no rev_nat entry: %+v", retiredID, before.RevNat)
	}
	d.Close()

	cfg := smallConfig(bpffs)
	// openKeeps opens the pins with c, checks that the retired master is
	// kept there, still translating its flow, and closes them again.
	openKeeps := func(c Config) {
		t.Helper()
		d := openTest(t, c)
		defer d.Close()
		name := fmt.Sprintf("--max-services=%d --max-service-entries=%d", c.MaxServices, c.MaxServiceEntries)
		if n := d.RetiredLeftOut(); n != 0 {
			t.Errorf("%s: RetiredLeftOut %d, want 0 (the retired master kept)", name, n)
		}
		ks := mustDump(t, d.Maps())
		if m, ok := ks.Masters[reconciler.DefaultScope(removed)]; !ok || m.Flags&reconciler.FlagRetired == 0 {
			t.Errorf("%s: the retired master of %s is %+v, %v; want it kept", name, removed, m, ok)
		}
		if v, dst := sendTo(t, d.TCIngress(), f.pkt(tcpACK)); v != tcActOK || dst != be.addr.Addr.String() {
			t.Errorf("%s: the retired frontend's established flow: verdict %d to %s, want %d to the backend %s", name, v, dst, tcActOK, be.addr.Addr)
		}
	}

	pinned := pinnedSizes(t, bpffs, cfg)
	c := cfg
	c.MaxServices = 1
	want := "--max-services=1 is too small for the 2 services of both families"
	if d, err := Open(c); err == nil {
		d.Close()
		t.Errorf("Open with --max-services=1, below the 2 live Services, succeeded")
	} else if !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "start the agent with --max-services=2 or more") {
		t.Errorf("Open's error\n%v\ndoes not say %q and --max-services=2", err, want)
	}
	if got := pinnedSizes(t, bpffs, cfg); !maps.Equal(got, pinned) {
		t.Errorf("a refused Open changed the pins' sizes: %v, were %v", got, pinned)
	}
	d2 := openTest(t, cfg)
	if got := mustDump(t, d2.Maps()); !reflect.DeepEqual(got, before) {
		t.Errorf("state after the refusal: %+v; want %+v", got, before)
	}
	d2.Close()

	cfg.MaxServiceEntries = 4 // 2 live masters and their 2 slots
	openKeeps(cfg)
	openKeeps(cfg) // the same sizes
	cfg.MaxServices = 4
	openKeeps(cfg)
	if got := pinnedMaxEntries(t, bpffs, mapServices6); got != 4 {
		t.Fatalf("%s has %d entries with --max-services=4", mapServices6, got)
	}

	cfg.MaxServices = 2
	d3 := openTest(t, cfg)
	if n := d3.RetiredLeftOut(); n != 1 {
		t.Errorf("--max-services=2: RetiredLeftOut %d, want 1 (the agent logs it)", n)
	}
	if got := pinnedMaxEntries(t, bpffs, mapServices6); got != 2 {
		t.Errorf("%s has %d entries with --max-services=2", mapServices6, got)
	}
	ks := mustDump(t, d3.Maps())
	wantState := *before
	wantState.Masters = maps.Clone(before.Masters)
	delete(wantState.Masters, reconciler.DefaultScope(removed))
	wantState.RevNat = maps.Clone(before.RevNat)
	delete(wantState.RevNat, retiredID)
	if !reflect.DeepEqual(ks, &wantState) {
		t.Errorf("state with --max-services=2:\n%+v\nwant the retired master and its rev_nat entry gone:\n%+v", ks, &wantState)
	}
	r3 := reconciler.New(d3.Maps(), nil)
	r3.SetRetireTimeout(time.Hour)
	if err := r3.Restore(); err != nil {
		t.Fatal(err)
	}
	if got := r3.Retired(); len(got) != 0 {
		t.Errorf("Restore read retired masters: %v", got)
	}
	apply(r3, live)
	if got := mustDump(t, d3.Maps()); !reflect.DeepEqual(got, &wantState) {
		t.Errorf("the live Services applied again changed the maps:\n%+v\nwant\n%+v", got, &wantState)
	}
	for i, fe := range live {
		g := flow{a("10.0.7.9"), uint16(45300 + i), fe}
		if v, dst := sendTo(t, d3.TCIngress(), g.pkt(tcpSYN_)); v != tcActOK || dst != be.addr.Addr.String() {
			t.Errorf("new connection to %s: verdict %d to %s, want %d to the backend %s", fe, v, dst, tcActOK, be.addr.Addr)
		}
	}
	if v, dst := sendTo(t, d3.TCIngress(), f.pkt(tcpACK)); v != tcActOK || dst != removed.Addr.String() {
		t.Errorf("the dropped retired frontend's flow: verdict %d to %s, want %d untranslated (to %s)", v, dst, tcActOK, removed.Addr)
	}
}
