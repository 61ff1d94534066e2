package testutil

import (
	"runtime/metrics"
	"time"
)

// HeapPeak samples the heap every millisecond until the function it
// returns is called, which returns the most seen of the heap's objects
// (live, and garbage not yet collected: what the process's RSS follows)
// and of what a collection found live (which the collector lets the heap
// grow to twice of at GOGC=100). A benchmark reports them less the heap
// allocated before, as the peak of the work it measures.
func HeapPeak() func() (objects, live uint64) {
	done := make(chan struct{})
	top := make(chan [2]uint64)
	go func() {
		s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/gc/heap/live:bytes"}}
		var most [2]uint64
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			metrics.Read(s)
			most[0], most[1] = max(most[0], s[0].Value.Uint64()), max(most[1], s[1].Value.Uint64())
			select {
			case <-t.C:
			case <-done:
				top <- most
				return
			}
		}
	}()
	return func() (uint64, uint64) {
		close(done)
		most := <-top
		return most[0], most[1]
	}
}
