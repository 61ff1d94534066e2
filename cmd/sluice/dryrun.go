package main

import (
	"log/slog"
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
