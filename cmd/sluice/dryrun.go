package main

import (
	"log/slog"
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
