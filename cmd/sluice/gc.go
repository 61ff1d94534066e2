package main

import (
	"context"
	"log/slog"
	"math"
	"runtime/debug"
	"runtime/metrics"
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

// defaultStartGCPercent is --start-gc-percent: with the manifest source,
// the collector's target from the agent's start until its first sync
// (then --gc-percent), where Go's default is 100.
//
// Why: the first load keeps most of what it makes (the compact Services
// and slices, the desired state: at 30,000 Services x 10 endpoints 73 MB
// live when it ends, 90 once the first apply's view is built), its live
// heap doubling from step to step, and at 100 the collector marks it at
// each doubling: 15 collections to the first sync [8-18], 280 MB marked
// in all, the last two back to back at 73-79 MB (the load's last, then
// the forced one before the first apply, collectBeforeFirstApply). At 300,
// 8 collections and 170-185 MB marked; the CPU to the first sync (the
// programs' load included) 0.943 of 100's per interleaved pair over 56
// pairs and 0.905 over 18 with this flag, lower in 60 of the 74, VmHWM
// 132.3-136.5 MiB against 131.8-134.4; at 100,000 x 10, 0.876 over 8 pairs
// and VmHWM 341.2-343.2 against 340.8-342.7 (issue 14, sixty-ninth pass).
// The peak does not move because what the load allocates in all bounds
// the heap: the forced collection finds 80 MB there as at 100. Higher
// was worse: with the collector off until the first sync, paced by a
// soft limit of 120 or 130 MiB, the load's heap reached 109-120 MB before
// its one collection, VmHWM up to 154.5 MiB, and the fresh pages it
// faulted in cost what the marking saved. The Kubernetes source's lists
// make mostly garbage and its start is paced by --start-memory-limit: 300
// there marked less (359-483 MB against 479-578) but its CPU to the first
// sync, 0.969 of main's per pair [0.763-1.127], was not told from the
// noise; it starts at Go's default, as before.
const defaultStartGCPercent = 300

// startGCPercent sets the collector's target for the start (percent, >
// 0) unless the environment's GOGC set it, which then wins. gcTarget sets
// --gc-percent at the first sync.
func startGCPercent(percent int, gogc string, log *slog.Logger) {
	if gogc != "" {
		log.Info("GOGC from the environment; --start-gc-percent ignored", "GOGC", gogc)
		return
	}
	debug.SetGCPercent(percent)
	log.Debug("collector's target for the start set", "start_gc_percent", percent)
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
	// start, if not nil, is the start's memory limit, lifted here.
	start *startLimit
	log   *slog.Logger
	once  sync.Once
}

func (g *gcTarget) ObserveSync(_ time.Duration, err error) {
	if err != nil {
		return
	}
	g.once.Do(func() {
		setGCPercent(g.percent, g.gogc, g.log)
		if g.start != nil {
			g.start.lift("first sync")
		}
	})
}

func (g *gcTarget) SetProgrammed(*model.State) {}

// defaultStartMemoryLimitMiB is --start-memory-limit: with the Kubernetes
// source, a soft memory limit (debug.SetMemoryLimit, what GOMEMLIMIT sets)
// for the Go runtime from the agent's start until its first sync, then
// lifted.
//
// Why: the agent's peak of RSS is its first sync (the informers' lists,
// the translation, the first apply), at Go's default target until then:
// each collection lets the heap grow to twice what it found live, so the
// heap's largest is twice what was live at whichever collection came last
// in the lists, and where the collections fall moves it. At 30,000
// Services x 10 endpoints through a real kube-apiserver that was 77-116
// MB, and the VmHWM 132.1-152.7 MiB over 33 starts of main, above 150 in 6
// (issue 14, sixty-first pass). Under a limit the collector runs when the
// runtime's memory nears it, and the runtime returns freed pages to stay
// under it: 129.7-138.8 MiB in 15 starts, at a CPU to the first sync
// within the noise (the collections come at Go's target until the heap
// nears the limit; about 82 MiB is live at the first sync there). A lower
// target for the start alone (GOGC 50) settled the peak too (129.0-138.9
// MiB) but marked twice the bytes, about a quarter more CPU to the first
// sync.
//
// A limit under what a larger cluster keeps live would make the collector
// run without pause (the runtime caps it at half the CPU) until the first
// sync: startLimit lifts it as soon as the live heap passes liftAt of it,
// and that start goes on at Go's target, as before. The manifest source
// starts without: its first load keeps most of what it makes (73 MB live
// at 30,000 when it ends, 91 with the first apply's view), near the
// limit's 80%, and under the same limit its collections came at large
// heaps: 16 to the first sync, CPU 1.05 of no limit's per pair
// [0.91-1.24], VmHWM 135.4-136.7 MiB against 131.8-134.4 (issue 14,
// sixty-ninth pass).
const defaultStartMemoryLimitMiB = 110

// liftAt is the fraction of the start's limit at which the live heap
// (what the last collection found) lifts it: the runtime's own memory
// (spans, stacks, the collector's metadata) and the allocations between two
// collections need the rest.
const liftAt = 0.8

// startLimit is the start's soft memory limit (--start-memory-limit),
// lifted at the first sync (gcTarget) or as soon as the live heap passes
// liftAt of it (watch), whichever comes first.
type startLimit struct {
	bytes int64
	log   *slog.Logger
	once  sync.Once
	done  chan struct{}
}

// startMemoryLimit sets a soft memory limit of mib MiB until the first
// sync, unless mib is 0 or less or GOMEMLIMIT is in the environment, which
// then wins (and stays); it returns nil then.
func startMemoryLimit(mib int, gomemlimit string, log *slog.Logger) *startLimit {
	if mib <= 0 {
		return nil
	}
	if gomemlimit != "" {
		log.Info("GOMEMLIMIT from the environment; --start-memory-limit ignored", "GOMEMLIMIT", gomemlimit)
		return nil
	}
	s := &startLimit{bytes: int64(mib) << 20, log: log, done: make(chan struct{})}
	debug.SetMemoryLimit(s.bytes)
	log.Debug("start's memory limit set", "mib", mib)
	return s
}

// lift removes the limit (once).
func (s *startLimit) lift(why string) {
	s.once.Do(func() {
		debug.SetMemoryLimit(math.MaxInt64)
		close(s.done)
		s.log.Info("start's memory limit lifted", "why", why, "limit_mib", s.bytes>>20, "live_heap_mib", liveHeap()>>20)
	})
}

// watch reads the live heap every period until the limit is lifted or ctx
// ends, and lifts the limit when the live heap passes liftAt of it.
func (s *startLimit) watch(ctx context.Context, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.done:
			return
		case <-t.C:
			if float64(liveHeap()) > liftAt*float64(s.bytes) {
				s.lift("live heap near the limit")
				return
			}
		}
	}
}

// liveHeap is the heap the last collection found live, in bytes.
func liveHeap() uint64 {
	m := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(m)
	if m[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return m[0].Value.Uint64()
}
