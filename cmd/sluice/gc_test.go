package main

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"runtime"
	"runtime/debug"
	"testing"
	"time"
)

// TestSetGCPercent: without GOGC in the environment the flag's target is
// set; with it, the runtime's (from GOGC) is left as it is.
func TestSetGCPercent(t *testing.T) {
	orig := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(orig) })
	current := func() int { p := debug.SetGCPercent(-1); debug.SetGCPercent(p); return p }
	log := slog.New(slog.DiscardHandler)

	if got := setGCPercent(defaultGCPercent, "", log); got != defaultGCPercent || current() != defaultGCPercent {
		t.Errorf("no GOGC: setGCPercent says %d, the runtime's is %d; want %d", got, current(), defaultGCPercent)
	}
	debug.SetGCPercent(150) // as GOGC=150 would have
	if got := setGCPercent(defaultGCPercent, "150", log); got != 150 || current() != 150 {
		t.Errorf("GOGC=150: setGCPercent says %d, the runtime's is %d; want 150 left", got, current())
	}
}

// TestGCTargetAfterFirstSync: the target is left alone until a sync
// succeeds, set then, and not again.
func TestGCTargetAfterFirstSync(t *testing.T) {
	orig := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(orig) })
	current := func() int { p := debug.SetGCPercent(-1); debug.SetGCPercent(p); return p }
	g := &gcTarget{percent: defaultGCPercent, log: slog.New(slog.DiscardHandler)}

	g.ObserveSync(time.Second, errors.New("map full"))
	if got := current(); got != 100 {
		t.Fatalf("after a failed sync: %d, want 100 (left alone)", got)
	}
	g.ObserveSync(time.Second, nil)
	if got := current(); got != defaultGCPercent {
		t.Fatalf("after the first sync: %d, want %d", got, defaultGCPercent)
	}
	debug.SetGCPercent(100)
	g.ObserveSync(time.Second, nil)
	if got := current(); got != 100 {
		t.Errorf("after a second sync: %d, want 100 (set once)", got)
	}
}

// TestStartGCPercent: --start-gc-percent is the collector's target from
// the start, left by a failed sync, replaced by --gc-percent at the first
// good one; GOGC from the environment wins over it.
func TestStartGCPercent(t *testing.T) {
	orig := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(orig) })
	current := func() int { p := debug.SetGCPercent(-1); debug.SetGCPercent(p); return p }
	log := slog.New(slog.DiscardHandler)

	startGCPercent(defaultStartGCPercent, "", log)
	if got := current(); got != defaultStartGCPercent {
		t.Fatalf("at the start: target %d, want %d", got, defaultStartGCPercent)
	}
	g := &gcTarget{percent: defaultGCPercent, log: log}
	g.ObserveSync(time.Second, errors.New("map full"))
	if got := current(); got != defaultStartGCPercent {
		t.Fatalf("after a failed sync: target %d, want the start's %d left", got, defaultStartGCPercent)
	}
	g.ObserveSync(time.Second, nil)
	if got := current(); got != defaultGCPercent {
		t.Fatalf("after the first sync: target %d, want --gc-percent's %d", got, defaultGCPercent)
	}

	debug.SetGCPercent(150) // as GOGC=150 would have
	startGCPercent(defaultStartGCPercent, "150", log)
	if got := current(); got != 150 {
		t.Errorf("GOGC=150: target %d at the start, want the environment's 150 left", got)
	}
}

// memoryLimit reads the runtime's soft memory limit (a negative input
// only reads it).
func memoryLimit() int64 { return debug.SetMemoryLimit(-1) }

// TestStartMemoryLimit: --start-memory-limit is set at the start, left by
// a failed sync and lifted by the first good one; 0 sets none; GOMEMLIMIT
// from the environment wins and stays after the first sync.
func TestStartMemoryLimit(t *testing.T) {
	origPct := debug.SetGCPercent(100)
	orig := debug.SetMemoryLimit(math.MaxInt64)
	t.Cleanup(func() { debug.SetGCPercent(origPct); debug.SetMemoryLimit(orig) })
	log := slog.New(slog.DiscardHandler)

	t.Run("flag", func(t *testing.T) {
		debug.SetMemoryLimit(math.MaxInt64)
		s := startMemoryLimit(defaultStartMemoryLimitMiB, "", log)
		if s == nil || memoryLimit() != defaultStartMemoryLimitMiB<<20 {
			t.Fatalf("at the start: %v, limit %d; want %d", s, memoryLimit(), int64(defaultStartMemoryLimitMiB)<<20)
		}
		g := &gcTarget{percent: defaultGCPercent, start: s, log: log}
		g.ObserveSync(time.Second, errors.New("map full"))
		if memoryLimit() != defaultStartMemoryLimitMiB<<20 {
			t.Fatalf("after a failed sync: limit %d, want the start's left", memoryLimit())
		}
		g.ObserveSync(time.Second, nil)
		if memoryLimit() != math.MaxInt64 {
			t.Errorf("after the first sync: limit %d, want none (MaxInt64)", memoryLimit())
		}
	})
	t.Run("none", func(t *testing.T) {
		debug.SetMemoryLimit(math.MaxInt64)
		if s := startMemoryLimit(0, "", log); s != nil || memoryLimit() != math.MaxInt64 {
			t.Errorf("--start-memory-limit 0: %v, limit %d; want none", s, memoryLimit())
		}
	})
	t.Run("environment", func(t *testing.T) {
		debug.SetMemoryLimit(200 << 20) // as GOMEMLIMIT=200MiB would have
		s := startMemoryLimit(defaultStartMemoryLimitMiB, "200MiB", log)
		if s != nil || memoryLimit() != 200<<20 {
			t.Fatalf("GOMEMLIMIT=200MiB: %v, limit %d; want the environment's left", s, memoryLimit())
		}
		g := &gcTarget{percent: defaultGCPercent, start: s, log: log}
		g.ObserveSync(time.Second, nil)
		if memoryLimit() != 200<<20 {
			t.Errorf("after the first sync: limit %d, want the environment's %d left", memoryLimit(), 200<<20)
		}
	})
}

// TestStartMemoryLimitLiftedByLiveHeap: a live heap past liftAt of the
// start's limit lifts it before the first sync (a cluster whose state does
// not fit starts at Go's target, not with the collector running without
// pause); under it, the limit stays.
func TestStartMemoryLimitLiftedByLiveHeap(t *testing.T) {
	orig := debug.SetMemoryLimit(math.MaxInt64)
	t.Cleanup(func() { debug.SetMemoryLimit(orig) })
	log := slog.New(slog.DiscardHandler)

	// Under: a limit far above this test's live heap stays while watched,
	// for as many of the watch's reads as roundsCtx lets it make.
	s := startMemoryLimit(4096, "", log)
	s.watch(&roundsCtx{Context: context.Background(), rounds: 3}, time.Millisecond)
	if memoryLimit() != 4096<<20 {
		t.Fatalf("live heap %d B under a 4096 MiB limit: limit %d, want it left", liveHeap(), memoryLimit())
	}
	s.lift("test")

	// Over: 64 MiB kept live against a 32 MiB limit.
	keep := make([]byte, 64<<20)
	runtime.GC()
	s = startMemoryLimit(32, "", log)
	ctx, cancel := context.WithTimeout(context.Background(), hangBound) // the bound of a hang: a pass returns at the first tick
	defer cancel()
	s.watch(ctx, time.Millisecond)
	if memoryLimit() != math.MaxInt64 {
		t.Errorf("live heap %d B over 80%% of a 32 MiB limit: limit %d, want it lifted", liveHeap(), memoryLimit())
	}
	runtime.KeepAlive(keep)
}

// roundsCtx ends when its Done has been asked for more than rounds times:
// watch asks once a round, before it waits for the next tick, so a watch
// given it returns (unless it lifted the limit) only after it has read the
// live heap rounds times. Counting its rounds, not the time, keeps a test
// of what it leaves alone from passing because no tick came.
type roundsCtx struct {
	context.Context
	rounds int
	asked  int
	done   chan struct{}
}

func (c *roundsCtx) Done() <-chan struct{} {
	if c.done == nil {
		c.done = make(chan struct{})
	}
	c.asked++
	if c.asked == c.rounds+1 {
		close(c.done)
	}
	return c.done
}

func (c *roundsCtx) Err() error {
	if c.asked > c.rounds {
		return context.Canceled
	}
	return nil
}
