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
// manifest source, about 8 MB over 86 live); the first Apply then
// builds the reconciler's view of the maps (19 MB, kept) and its batches
// on top, and the heap, whose goal the load's last collection set at
// twice what was live then, grows over both without collecting: the
// agent's VmHWM. Collected first, the apply reuses the load's garbage
// (issue 14, thirty-second pass: 6-7 MiB off the peak). It costs one
// mark of the live heap, once.
func collectBeforeFirstApply() { runtime.GC() }
