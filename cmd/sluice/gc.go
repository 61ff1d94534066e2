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
// by 25% of what the last collection found live before the next, where
// Go's default lets it double.
//
// Why: at 30,000 Services x 10 endpoints the agent's live heap is about
// 80 MB (the informers' caches or the manifest's compact objects, the
// desired state, the reconciler's view), and nearly all of it stays from
// one change to the next; what a change makes is garbage (the watch
// event's decoding, the tracker's and the sync's scratch: 0.3-0.5 MB a
// second at 20 EndpointSlice changes a second). The runtime keeps the
// pages it freed while its heap stays under the goal (and up to a tenth
// over it), so the agent's RSS follows the largest heap between two
// collections, not the live heap: at GOGC 100 that was 114-140 MB (the
// runtime's own collection every 2 minutes came before the goal) and
// VmHWM 155-178 MiB; at 40 the goal was 108-113 MB and VmHWM 150.1 MiB,
// the binary's mapped pages (about 28 MiB) on top; at 25, 97-101 MB and
// 145.6 MiB (issue 14, thirty-seventh pass). Each collection
// marks the live heap (about 0.1-0.2 CPU-second at 30,000): one every
// 20 MB of garbage, under a minute at that rate, where the runtime's
// 2-minute one came first before. Calico's Felix, another node agent
// that holds the cluster's state, runs at 40 by default and ran at 20
// before (goGCThreshold).
const defaultGCPercent = 25

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
// about twice; at 25 five times); after it, what is made is mostly
// garbage. Set as the first sync ends, the lower goal can be under the
// heap then: one collection starts at once (about a second before the
// dry-run loader's).
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
