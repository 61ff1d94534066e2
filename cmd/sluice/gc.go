package main

import (
	"log/slog"
	"runtime/debug"
)

// defaultGCPercent is the collector's target the agent sets unless GOGC
// says otherwise (--gc-percent): the heap may grow by 40% of what the
// last collection found live before the next, where Go's default lets it
// double.
//
// Why: at 30,000 Services x 10 endpoints the agent's live heap is about
// 80 MB (the informers' caches or the manifest's compact objects, the
// desired state, the reconciler's view), and nearly all of it stays from
// one change to the next; what a change makes is garbage (the watch
// event's decoding, the tracker's and the sync's scratch). At GOGC 100
// that garbage may reach the size of the whole live heap before it is
// collected: with EndpointSlices changing 20 times a second the heap
// went to about 160 MB between collections and the agent's RSS from 131
// to 151 MiB (issue 14, thirty-seventh pass). At 40 it stays within 32
// MB of the live heap, for one more mark of it (about 0.1 CPU-second at
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
	return percent
}
