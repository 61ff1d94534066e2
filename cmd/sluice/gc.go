package main

import (
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	"github.com/sluice-lb/sluice/pkg/model"
)

// defaultGCPercent is the collector's target the agent sets after its
// first sync unless GOGC says otherwise (--gc-percent): the heap may grow
// by 40% of what the last collection found live before the next, where
// Go's default lets it double.
//
// Why: at 30,000 Services x 10 endpoints the agent's live heap is about
// 80 MB (the informers' caches or the manifest's compact objects, the
// desired state, the reconciler's view), and nearly all of it stays from
// one change to the next; what a change makes is garbage (the watch
// event's decoding, the tracker's and the sync's scratch). At GOGC 100
// that garbage may reach the size of the live heap before it is
// collected, and the runtime keeps the pages it freed while they are
// under the heap's goal: with EndpointSlices changing 20 times a second
// the heap went to 114-119 MB between collections (the runtime's own
// every 2 minutes came first) and the agent's RSS from 131 to 155-157
// MiB (issue 14, thirty-seventh pass). At 40 the goal is about 110 MB,
// for one more mark of the live heap (about 0.1-0.2 CPU-second at
// 30,000) per 32 MB of garbage. Calico's Felix, another node agent that
// holds the cluster's state, sets the same 40 by default
// (goGCThreshold).
const defaultGCPercent = 40

// setGCPercent sets the collector's target to percent (negative: off, as
// GOGC=off) unless the environment's GOGC set it, which then wins, as
// GOMEMLIMIT is left to the environment. It returns the target in force.
func setGCPercent(percent int, gogc string, log *slog.Logger) int {
	if gogc != "" {
		p := debug.SetGCPercent(-1) // reads it: there is no getter
		debug.SetGCPercent(p)
		log.Info("GOGC from the environment; --gc-percent ignored", "GOGC", gogc, "gc_percent", p)
		return p
	}
	debug.SetGCPercent(percent)
	log.Debug("collector's target set", "gc_percent", percent)
	return percent
}

// gcTarget is an agent Observer that sets the collector's target
// (setGCPercent) after the first successful sync, not at start: until
// then the heap grows with what stays (the first lists or load, the
// first view), and a lower target would only mark it more often (at 40,
// about 3.5 times the final live heap marked in all where 100 marks
// about twice); after it, what is made is mostly garbage.
type gcTarget struct {
	percent int
	gogc    string
	log     *slog.Logger
	once    sync.Once
}

func (g *gcTarget) ObserveSync(_ time.Duration, err error) {
	if err != nil {
		return
	}
	g.once.Do(func() { setGCPercent(g.percent, g.gogc, g.log) })
}

func (g *gcTarget) SetProgrammed(*model.State) {}
