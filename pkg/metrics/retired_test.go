package metrics

import (
	"testing"
	"time"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
	"github.com/sluice-lb/sluice/pkg/reconciler/fakedp"
)

// TestRetiredCounted: with the agent's reconciler retiring removed TCP
// frontends, an IPv4 and an IPv6 frontend removed are counted by
// sluice_retired_frontends, and each still takes a service id (rev_nat)
// and one service entry of its family in the fill ratios, though the
// programmed state (sluice_services) no longer counts them; past the
// retirement timeout the next Apply deletes them and both drop.
func TestRetiredCounted(t *testing.T) {
	keep, gone, gone6 := l4("10.96.0.1", 80), l4("10.96.0.2", 80), l4("2001:db8:96::2", 80)
	full := model.NewState()
	full.Services.Set(keep, &model.Service{Frontend: keep, Backends: []model.Backend{{L4Addr: l4("10.0.0.1", 8080)}}})
	full.Services.Set(gone, &model.Service{Frontend: gone, Backends: []model.Backend{{L4Addr: l4("10.0.0.2", 8080)}, {L4Addr: l4("10.0.0.3", 8080)}}})
	full.Services.Set(gone6, &model.Service{Frontend: gone6, Backends: []model.Backend{{L4Addr: l4("2001:db8::2", 8080)}}})
	kept := model.NewState()
	kept.Services.Set(keep, full.Services.Get(keep))

	f := fakedp.New(100, 100, 100)
	rec := reconciler.New(f, nil)
	rec.SetRetireTimeout(time.Hour)
	m := New()
	m.SetCapacity(f.Capacity)
	m.SetBackendCounter(rec.BackendCounts)
	if _, ok := scrape(t, m)["sluice_retired_frontends"]; ok {
		t.Error("sluice_retired_frontends exported before SetRetiredCounter")
	}
	m.SetRetiredCounter(rec.RetiredCounts)
	apply := func(s *model.State) {
		t.Helper()
		if err := rec.Apply(s); err != nil {
			t.Fatal(err)
		}
		m.SetProgrammed(s)
	}

	apply(full)
	checkSamples(t, "all programmed", scrape(t, m), map[string]float64{
		"sluice_services":                        3,
		"sluice_retired_frontends":               0,
		`sluice_map_fill_ratio{map="rev_nat"}`:   0.03,
		`sluice_map_fill_ratio{map="services"}`:  0.05, // two masters, three slots
		`sluice_map_fill_ratio{map="services6"}`: 0.02,
	})

	apply(kept)
	if n := len(rec.Retired()); n != 2 {
		t.Fatalf("retired %v, want %s and %s", rec.Retired(), gone, gone6)
	}
	checkSamples(t, "two removed, retired", scrape(t, m), map[string]float64{
		"sluice_services":                        1,
		"sluice_retired_frontends":               2,
		`sluice_map_fill_ratio{map="rev_nat"}`:   0.03, // one Service's id, two retired masters'
		`sluice_map_fill_ratio{map="services"}`:  0.03, // its master and slot, a retired master
		`sluice_map_fill_ratio{map="services6"}`: 0.01, // a retired master
	})

	// Past the timeout (a nanosecond after the retirement), the next
	// Apply deletes them.
	rec.SetRetireTimeout(time.Nanosecond)
	apply(kept)
	if n := len(rec.Retired()); n != 0 {
		t.Fatalf("past the timeout: retired %v", rec.Retired())
	}
	checkSamples(t, "past the timeout", scrape(t, m), map[string]float64{
		"sluice_services":                        1,
		"sluice_retired_frontends":               0,
		`sluice_map_fill_ratio{map="rev_nat"}`:   0.01,
		`sluice_map_fill_ratio{map="services"}`:  0.02,
		`sluice_map_fill_ratio{map="services6"}`: 0,
	})
}
