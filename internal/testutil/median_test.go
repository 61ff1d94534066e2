package testutil

import (
	"testing"
	"time"
)

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 2.5},
	} {
		in := append([]float64(nil), c.in...)
		if got := Median(in); got != c.want {
			t.Errorf("Median(%v) = %v, want %v", c.in, got, c.want)
		}
		for i := range in {
			if in[i] != c.in[i] {
				t.Errorf("Median(%v) reordered its argument to %v", c.in, in)
			}
		}
	}
	if got := Median([]time.Duration{30, 10, 20, 40}); got != 25 {
		t.Errorf("Median of durations = %v, want 25", got)
	}
}

// The cases of the benchmark harness's stat, which SpreadOf replaced.
func TestSpreadOf(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want Spread
	}{
		{nil, Spread{}},
		{[]float64{3}, Spread{3, 3, 3}},
		{[]float64{5, 1, 3}, Spread{3, 1, 5}},
		{[]float64{4, 1, 3, 2}, Spread{2.5, 1, 4}},
	} {
		if got := SpreadOf(c.in); got != c.want {
			t.Errorf("SpreadOf(%v) = %+v, want %+v", c.in, got, c.want)
		}
	}
}
