//go:build !race

package reconciler_test

const raceEnabled = false
