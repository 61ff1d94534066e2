//go:build amd64 || arm64

package reconciler

// prefetch asks the CPU to bring the cache line at addr in, without
// waiting for it (a prefetch instruction: it neither faults nor holds up
// what follows, where a load's result, even unused, must come in before
// the instructions after it retire).
//
//go:noescape
func prefetch(addr uintptr)
