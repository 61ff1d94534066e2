//go:build race

package reconciler_test

// raceEnabled: the race detector's build, in which append(s,
// make([]T, n)...) (slices.Grow) allocates its temporary too: the tests
// that count the bytes allocated skip it.
const raceEnabled = true
