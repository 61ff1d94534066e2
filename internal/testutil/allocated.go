package testutil

import "runtime"

// Allocated returns the bytes of heap fn allocates (run on this goroutine,
// with nothing else allocating meanwhile): what a test checks to pin that
// work holds no copy of something large.
func Allocated(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}
