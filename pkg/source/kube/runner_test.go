package kube

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil"
)

type runLog struct {
	mu    sync.Mutex
	times []time.Time
	kinds []bool
}

func (l *runLog) add(periodic bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.times = append(l.times, time.Now())
	l.kinds = append(l.kinds, periodic)
}

func (l *runLog) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.times)
}

func startRunner(t *testing.T, r *runner) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Loop(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// waitFor is testutil.EventuallyTrue, under the name this package's tests
// use.
var waitFor = testutil.EventuallyTrue

func TestRunnerFoldsBurstWithinMinInterval(t *testing.T) {
	var log runLog
	const minInterval = 200 * time.Millisecond
	r := newRunner(func(p bool) { log.add(p) }, minInterval, time.Hour)
	startRunner(t, r)

	r.Request()
	waitFor(t, "first run", 10*time.Second, func() bool { return log.len() == 1 })
	// The burst's own length is measured rather than assumed: on a loaded
	// machine 100 one-millisecond sleeps can take longer than minInterval,
	// and then a second folded run is correct. What must hold whatever the
	// load: runs are at least minInterval apart, counted from the first
	// run (the burst starts some time after it), so requests until a time
	// w after the first run yield at most 1+w/minInterval runs after it
	// (the last one folding what came after the one before), and at
	// least one.
	for range 100 {
		r.Request()
		time.Sleep(time.Millisecond)
	}
	end := time.Now()
	waitFor(t, "a run after the burst", 10*time.Second, func() bool { return log.len() >= 2 })
	time.Sleep(3 * minInterval)
	log.mu.Lock()
	defer log.mu.Unlock()
	after := len(log.times) - 1
	window := end.Sub(log.times[0])
	if limit := 1 + int(window/minInterval); after > limit {
		t.Fatalf("100 requests until %v after the first run ran %d times after it, want at most %d", window, after, limit)
	}
	for i := 1; i < len(log.times); i++ {
		if gap := log.times[i].Sub(log.times[i-1]); gap < minInterval {
			t.Errorf("runs %d and %d are %v apart, want >= %v", i-1, i, gap, minInterval)
		}
	}
	for i, periodic := range log.kinds {
		if periodic {
			t.Errorf("requested run %d reported as periodic", i)
		}
	}
}

func TestRunnerRunsPeriodically(t *testing.T) {
	var log runLog
	r := newRunner(func(p bool) { log.add(p) }, 0, 100*time.Millisecond)
	startRunner(t, r)
	r.Request()
	waitFor(t, "three runs", 10*time.Second, func() bool { return log.len() >= 3 })
	log.mu.Lock()
	defer log.mu.Unlock()
	if log.kinds[0] || !log.kinds[1] || !log.kinds[2] {
		t.Errorf("periodic flags = %v, want [false true true ...]", log.kinds)
	}
}
