package main

import (
	"log/slog"
	"time"

	"github.com/sluice-lb/sluice/internal/namesfile"
	"github.com/sluice-lb/sluice/pkg/model"
)

// namesWriter is an agent Observer that writes the names file sluicectl
// shows beside the addresses (internal/namesfile).
type namesWriter struct {
	path  string
	bpffs string // where the maps it names are pinned
	log   *slog.Logger
	// written is what the file holds: the frontends of the state last
	// written, or found to hold the names written (ok: one was). It is
	// compared with each programmed state, so that the file is encoded
	// and written only when a name changes, not at every apply
	// (endpoints change far more often than names; at 30,000 frontends
	// the comparison costs lookups, the encoding megabytes). A Services
	// is a persistent map whose nodes never change: it shares them with
	// the states made since, and costs no copy of 30,000 names (a map of
	// them was 6 MB of the agent's heap at 30,000).
	written model.Services
	ok      bool
	// gen is the Gen of the last state found to hold the names written
	// (0: none): a state made from it (model.State.BaseGen) is compared
	// by its Changed frontends only, not all 30,000.
	gen uint64
}

func (w *namesWriter) ObserveSync(time.Duration, error) {}

// SetProgrammed writes the names of the programmed state s, if they
// changed. A failed write is logged: sluicectl then shows the older names
// or none, and the next apply tries again.
func (w *namesWriter) SetProgrammed(s *model.State) {
	if !w.unchanged(s) {
		if err := namesfile.WriteState(w.path, w.bpffs, s); err != nil {
			w.log.Warn("write the names file sluicectl reads", "path", w.path, "err", err)
			return
		}
	}
	w.written, w.ok, w.gen = s.Services, true, s.Gen
}

// unchanged says whether the file names the frontends of s as s does.
func (w *namesWriter) unchanged(s *model.State) bool {
	if !w.ok || w.written.Len() != s.Services.Len() {
		return false
	}
	if s.BaseGen != 0 && s.BaseGen == w.gen {
		for _, fe := range s.Changed {
			if !sameName(w.written.Get(fe), s.Services.Get(fe)) {
				return false
			}
		}
		return true
	}
	for fe, svc := range s.Services.All() {
		if !sameName(w.written.Get(fe), svc) {
			return false
		}
	}
	return true
}

// sameName says whether the names file names a frontend of Service a as
// one of b (nil: no such frontend).
func sameName(a, b *model.Service) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Name == b.Name && a.Kind == b.Kind
}
