package testutil

import (
	"sync"
	"sync/atomic"
)

// Traffic runs a request over and over in the background, counting what
// succeeds and what fails: the load a test keeps up across an agent's
// stop and restart, to prove that no request failed meanwhile.
type Traffic struct {
	ok, failed atomic.Int64
	first      atomic.Pointer[error]
	stop       chan struct{}
	stopOnce   sync.Once
	wg         sync.WaitGroup
}

// StartTraffic runs request in workers goroutines, each one request after
// the other, until Stop.
func StartTraffic(workers int, request func() error) *Traffic {
	tr := &Traffic{stop: make(chan struct{})}
	for range workers {
		tr.wg.Go(func() {
			for {
				select {
				case <-tr.stop:
					return
				default:
				}
				if err := request(); err != nil {
					tr.failed.Add(1)
					tr.first.CompareAndSwap(nil, &err)
				} else {
					tr.ok.Add(1)
				}
			}
		})
	}
	return tr
}

// Stop stops the requests and waits for those under way. Calling it again
// does nothing.
func (tr *Traffic) Stop() {
	tr.stopOnce.Do(func() {
		close(tr.stop)
		tr.wg.Wait()
	})
}

// OK is how many requests have succeeded so far.
func (tr *Traffic) OK() int64 { return tr.ok.Load() }

// Failed is how many requests have failed so far.
func (tr *Traffic) Failed() int64 { return tr.failed.Load() }

// FirstErr is the error of the first request that failed, or nil.
func (tr *Traffic) FirstErr() error {
	if p := tr.first.Load(); p != nil {
		return *p
	}
	return nil
}
