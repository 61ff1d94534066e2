package datapath

import "testing"

// TestHalfOpenDriftDecision: the resync's decision alone (no BPF). A
// difference must last two collections the same way, beyond the band, to
// be corrected, by the smaller of the two; the churn of a pass (within
// the band, either way or the same way every time, as a flood refilling
// behind the cursor makes it) is never corrected; the first collection
// after a correction or after churn starts afresh.
func TestHalfOpenDriftDecision(t *testing.T) {
	const band = 1024 // halfOpenBand of the default share
	if got := halfOpenBand(65536); got != band {
		t.Fatalf("halfOpenBand(65536) = %d, want %d", got, band)
	}
	if got := halfOpenBand(5); got != 0 {
		t.Fatalf("halfOpenBand(5) = %d, want 0 (a test's share)", got)
	}
	for _, c := range []struct {
		name  string
		diffs []int64
		fixes []int64
	}{
		{"a flood's churn, the same way every pass", []int64{500, 700, 300, 900, 1024}, []int64{0, 0, 0, 0, 0}},
		{"a busy node's churn, both ways", []int64{-3, 5, -1024, 1000}, []int64{0, 0, 0, 0}},
		{"a leak", []int64{5000, 4800, 0}, []int64{0, -4800, 0}},
		{"a leak, the smaller first", []int64{2000, 3000}, []int64{0, -2000}},
		{"an undercount", []int64{-3000, -2500}, []int64{0, 2500}},
		{"a leak once, then churn", []int64{5000, 10, 5000}, []int64{0, 0, 0}},
		{"opposite ways", []int64{5000, -5000, 5000}, []int64{0, 0, 0}},
		{"after a correction, afresh", []int64{5000, 5000, 5000, 5000}, []int64{0, -5000, 0, -5000}},
	} {
		var h halfOpenDrift
		for i, d := range c.diffs {
			if got := h.next(1, d, band); got != c.fixes[i] {
				t.Errorf("%s: collection %d (difference %d): correction %d, want %d", c.name, i+1, d, got, c.fixes[i])
			}
		}
		if h.last[0] != 0 {
			t.Errorf("%s: the other family's memory changed: %d", c.name, h.last[0])
		}
	}
}
