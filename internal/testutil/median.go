package testutil

import "slices"

// Number is what Median takes: measurements.
type Number interface {
	~int | ~int64 | ~float64
}

// Median returns the median of v (the mean of the middle two for an even
// count), or 0 for no samples. v is not modified.
func Median[T Number](v []T) T {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + m) / 2
	}
	return m
}

// Spread is a median with the range of the samples it came from: the
// benchmarks' summary of a figure measured over rounds.
type Spread struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

// SpreadOf summarises v; the zero Spread for no samples.
func SpreadOf(v []float64) Spread {
	if len(v) == 0 {
		return Spread{}
	}
	return Spread{Median: Median(v), Min: slices.Min(v), Max: slices.Max(v)}
}
