package metrics

import (
	"testing"
	"time"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
	"github.com/sluice-lb/sluice/pkg/reconciler/fakedp"
)

// TestDriftCounted: with the agent's reconciler counting its re-reads of
// the maps, a re-read of untouched maps counts one no_drift and no entry;
// after a slot is deleted and a backend's address overwritten behind its
// back, the next re-read counts one repaired, one slots entry and one
// backends entry, and nothing for the other maps.
func TestDriftCounted(t *testing.T) {
	fe := l4("10.96.0.1", 80)
	st := model.NewState()
	st.Services.Set(fe, &model.Service{Frontend: fe, Backends: []model.Backend{
		{L4Addr: l4("10.0.0.1", 8080)}, {L4Addr: l4("10.0.0.2", 8080)}, {L4Addr: l4("10.0.0.3", 8080)},
	}})
	f := fakedp.New(64, 64, 256)
	rec := reconciler.New(f, nil)
	m := New()
	if _, ok := scrape(t, m)[`sluice_map_rereads_total{result="no_drift"}`]; ok {
		t.Error("drift counters exported before SetDriftCounter")
	}
	m.SetDriftCounter(rec.Drift)
	apply := func() {
		t.Helper()
		rec.SetRefreshInterval(time.Nanosecond) // the next Apply re-reads the maps
		time.Sleep(time.Millisecond)
		if err := rec.Apply(st); err != nil {
			t.Fatal(err)
		}
	}
	if err := rec.Apply(st); err != nil {
		t.Fatal(err)
	}
	apply()
	want := map[string]float64{
		`sluice_map_rereads_total{result="no_drift"}`: 1,
		`sluice_map_rereads_total{result="repaired"}`: 0,
		`sluice_map_rereads_total{result="rebuilt"}`:  0,
	}
	for _, name := range reconciler.DriftMaps {
		want[`sluice_map_drift_entries_total{map="`+name+`"}`] = 0
	}
	checkSamples(t, "untouched maps", scrape(t, m), want)

	ks, err := f.Dump()
	if err != nil {
		t.Fatal(err)
	}
	dfe := reconciler.DefaultScope(fe)
	slots := ks.Slots[dfe]
	if len(slots) != 3 {
		t.Fatalf("%v has slots %v, want 3", fe, slots)
	}
	ks.Backends[slots[1]] = l4("192.0.2.99", 8080)
	delete(slots, 3)
	f.Seed(ks)
	apply()
	want[`sluice_map_rereads_total{result="repaired"}`] = 1
	want[`sluice_map_drift_entries_total{map="slots"}`] = 1
	want[`sluice_map_drift_entries_total{map="backends"}`] = 1
	checkSamples(t, "a slot deleted and a backend overwritten", scrape(t, m), want)
	got, err := f.Dump()
	if err != nil {
		t.Fatal(err)
	}
	wanted := map[model.L4Addr]bool{}
	for _, b := range st.Services.Get(fe).Backends {
		wanted[b.L4Addr] = true
	}
	for slot, id := range got.Slots[dfe] {
		if !wanted[got.Backends[id]] {
			t.Errorf("after the repair slot %d names backend %v", slot, got.Backends[id])
		}
	}
	if len(got.Slots[dfe]) != 3 {
		t.Errorf("after the repair %v has slots %v, want 3", fe, got.Slots[dfe])
	}
}

// checkSamples reports every series of want whose sample in got differs.
func checkSamples(t *testing.T, what string, got, want map[string]float64) {
	t.Helper()
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s: %s = %v (exported: %v), want %v", what, k, g, ok, v)
		}
	}
}
