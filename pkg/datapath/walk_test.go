package datapath

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// walkLines is a KernelVisitor that writes down every entry it is given,
// one line each, and stops after stopAfter of them (0: never).
type walkLines struct {
	lines     []string
	stopAfter int
}

func (w *walkLines) add(format string, a ...any) bool {
	w.lines = append(w.lines, fmt.Sprintf(format, a...))
	return w.stopAfter == 0 || len(w.lines) < w.stopAfter
}

func (w *walkLines) Master(fe reconciler.Frontend, m reconciler.Master) bool {
	return w.add("master %s %+v", fe, m)
}

func (w *walkLines) Slot(fe reconciler.Frontend, s uint32, id reconciler.BackendID) bool {
	return w.add("slot %s %d %d", fe, s, id)
}

func (w *walkLines) Backend(id reconciler.BackendID, a model.L4Addr) bool {
	return w.add("backend %d %s", id, a)
}

func (w *walkLines) RevNat(id reconciler.ServiceID, fe reconciler.Frontend) bool {
	return w.add("rev_nat %d %s", id, fe)
}

func (w *walkLines) SourceRange(fe model.L4Addr, p netip.Prefix) bool {
	return w.add("range %s %s", fe, p)
}

func (w *walkLines) ServiceIP(a netip.Addr) bool { return w.add("ip %s", a) }

// dumpLines are the lines walkLines writes for the entries of ks.
func dumpLines(ks *reconciler.KernelState) []string {
	var w walkLines
	for fe, m := range ks.Masters {
		w.Master(fe, m)
	}
	for fe, slots := range ks.Slots {
		for s, id := range slots {
			w.Slot(fe, s, id)
		}
	}
	for id, a := range ks.Backends {
		w.Backend(id, a)
	}
	for id, fe := range ks.RevNat {
		w.RevNat(id, fe)
	}
	for fe, ps := range ks.SourceRanges {
		for _, p := range ps {
			w.SourceRange(fe, p)
		}
	}
	for _, a := range ks.ServiceIPs {
		w.ServiceIP(a)
	}
	slices.Sort(w.lines)
	return w.lines
}

// TestWalkSeesWhatDumpSees: Walk gives every entry Dump reads, of both
// families' maps (masters, slots, backends, rev_nat, source ranges,
// service IPs), and stops when told; a reconciler's periodic re-read of
// maps it programmed finds no drift there (no dump), and one of an entry
// deleted behind its back repairs it without a dump (TestRepairOnRealMaps
// has every kind of drift).
func TestWalkSeesWhatDumpSees(t *testing.T) {
	d, _ := newTestDatapathAt(t)
	m := d.Maps()
	r := reconciler.New(m, nil)
	dumps := 0 // the hook runs around a rebuild of the view from a dump
	r.SetRefreshHook(func() { dumps++ })
	st := dualStackState()
	if err := r.Apply(st); err != nil {
		t.Fatal(err)
	}
	ks := mustDump(t, m)
	want := dumpLines(ks)
	var w walkLines
	if err := m.Walk(&w); err != nil {
		t.Fatal(err)
	}
	slices.Sort(w.lines)
	if !slices.Equal(w.lines, want) {
		t.Errorf("Walk gave\n%v\nDump read\n%v", w.lines, want)
	}
	kinds := map[string]bool{}
	for _, l := range want {
		kinds[l[:2]] = true
	}
	if len(kinds) != 6 || len(ks.Masters) < 5 || len(ks.SourceRanges) != 2 || len(ks.ServiceIPs) != 3 {
		t.Fatalf("the maps hold too little to compare (%d kinds of entry): %s", len(kinds), ks)
	}
	for _, n := range []int{1, 5, len(want) - 1} {
		stop := walkLines{stopAfter: n}
		if err := m.Walk(&stop); err != nil || len(stop.lines) != n {
			t.Errorf("a walk told to stop after %d entries gave %d (err %v)", n, len(stop.lines), err)
		}
	}

	r.SetRefreshInterval(time.Nanosecond)
	time.Sleep(time.Millisecond)
	if err := r.Apply(st); err != nil {
		t.Fatal(err)
	}
	if dumps != 0 {
		t.Errorf("a re-read of maps that did not drift dumped them (hook called %d times)", dumps)
	}
	six := reconciler.DefaultScope(l4("2001:db8:96::10", 80, model.TCP))
	if err := m.DeleteSlot(six, 2); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Millisecond)
	if err := r.Apply(st); err != nil {
		t.Fatal(err)
	}
	if dumps != 0 {
		t.Errorf("a re-read of maps missing a slot called the hook %d times, want none (repaired entry by entry, no dump)", dumps)
	}
	if got, _ := m.Dump(); got.String() != ks.String() {
		t.Errorf("not repaired:\n%s\nwant\n%s", got, ks)
	}
}
