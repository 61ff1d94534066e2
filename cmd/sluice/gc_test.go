package main

import (
	"errors"
	"log/slog"
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
