package main

import (
	"log/slog"
	"runtime"
	"runtime/debug"
	"sync"
	"time"

	"github.com/sluice-lb/sluice/pkg/datapath"
	"github.com/sluice-lb/sluice/pkg/model"
)

// dryRunLoader is an agent Observer that loads the datapath's dry-run
// programs (sluicectl explain) once, in the background, after the first
// sync that succeeded: the agent opens the datapath without them
// (datapath.Config.DeferDryRun), so that Services are programmed before
// the verifier spends as long again on programs no packet meets.
//
// That load ends the agent's start, its peak of memory: the first lists
// of every Service and EndpointSlice decoded, the whole state translated
// and programmed at once, the objects loaded. The heap that held them is
// then mostly free, but the Go runtime keeps it (it returns memory only
// above the next GC's goal, twice the live heap by default), so it gives
// it back to the kernel then: the agent's RSS after start is what it
// holds, not what starting took.
type dryRunLoader struct {
	dp   *datapath.Datapath
	log  *slog.Logger
	once sync.Once
}

func (l *dryRunLoader) ObserveSync(_ time.Duration, err error) {
	if err != nil {
		return
	}
	l.once.Do(func() {
		go func() {
			defer debug.FreeOSMemory()
			took, err := l.dp.LoadDryRun()
			if err != nil {
				// The datapath serves traffic without them; only
				// sluicectl explain is missing.
				l.log.Warn("dry-run programs not loaded: sluicectl explain will say the program has no dry-run mode", "err", err)
				return
			}
			l.log.Info("dry-run programs loaded (sluicectl explain)", "took", took.Round(time.Millisecond))
		}()
	})
}

func (l *dryRunLoader) SetProgrammed(*model.State) {}

// collectBeforeFirstApply is the agent's BeforeFirstApply: a collection
// between the source's first state and the reconciler's first program,
// the two halves of the start's peak. The source's first load (or its
// informers' lists) ends with the garbage it made since the collector
// last ran still on the heap (at 30,000 Services x 10 through the
// manifest source, up to about 8 MB over 86 live); the first Apply then
// builds the reconciler's view of the maps (19 MB, kept) on top. The
// heap's goal, twice what the load's last collection found live, is
// sometimes reached during the apply, sometimes not: the agent's VmHWM
// was 146 or 152-154 MiB by that chance (issue 14, thirty-second pass).
// Collected first, the apply reuses the load's garbage and the peak is
// the lower one, or under it, every time. It costs a mark of the live
// heap (about 170 ms of CPU at 86 MB), which the collection during the
// apply costs as much when it happens. (Only when the heap grew since
// the load's last collection was tried: one start of six skipped it,
// its VmHWM 150 MiB.)
func collectBeforeFirstApply() { runtime.GC() }

// collectAroundRefresh is the reconciler's refresh hook: a collection
// before and after an Apply that rebuilds its view from a dump of the maps
// (a re-read, every 5 minutes, whose walk failed or found more than 4,096
// entries drifted; one that finds no drift compares them as it walks them,
// and one that finds a few brings those into the view, and neither calls
// the hook: issue 14, thirty-sixth and forty-first passes). The rebuild holds a dump of every map and
// a new view (at 30,000 Services x 10, 42 MiB of dump, 80 MiB of heap
// made); a collection that falls in it took 107-127 MB for live where
// 77-80 is, and the heap grew to twice that before the next, the agent's
// RSS to 225-244 MiB (thirty-third pass). Collected before, the rebuild
// starts on the live heap alone; after, its garbage sets no goal.
func collectAroundRefresh() { runtime.GC() }
