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
	// written is what the file holds, by frontend: compared with each
	// programmed state, so that the file is encoded and written only
	// when a name changes, not at every apply (endpoints change far
	// more often than names; at 30,000 frontends the comparison costs
	// map lookups, the encoding megabytes).
	written map[model.L4Addr]nameOf
	// gen is the Gen of the last state found to hold the names written
	// (0: none): a state made from it (model.State.BaseGen) is compared
	// by its Changed frontends only, not all 30,000.
	gen uint64
}

type nameOf struct {
	name model.ServicePortName
	kind model.FrontendKind
}

func (w *namesWriter) ObserveSync(time.Duration, error) {}

// SetProgrammed writes the names of the programmed state s, if they
// changed. A failed write is logged: sluicectl then shows the older names
// or none, and the next apply tries again.
func (w *namesWriter) SetProgrammed(s *model.State) {
	if w.unchanged(s) {
		w.gen = s.Gen
		return
	}
	b, err := namesfile.Of(w.bpffs, s)
	if err != nil {
		w.log.Error("encode the names file", "err", err)
		return
	}
	if err := namesfile.WriteAtomic(w.path, b); err != nil {
		w.log.Warn("write the names file sluicectl reads", "path", w.path, "err", err)
		return
	}
	w.written = make(map[model.L4Addr]nameOf, s.Services.Len())
	for fe, svc := range s.Services.All() {
		w.written[fe] = nameOf{svc.Name, svc.Kind}
	}
	w.gen = s.Gen
}

// unchanged says whether the file names the frontends of s as s does.
func (w *namesWriter) unchanged(s *model.State) bool {
	if w.written == nil || len(w.written) != s.Services.Len() {
		return false
	}
	if s.BaseGen != 0 && s.BaseGen == w.gen {
		for _, fe := range s.Changed {
			svc := s.Services.Get(fe)
			n, ok := w.written[fe]
			if svc == nil && ok || svc != nil && (!ok || n != (nameOf{svc.Name, svc.Kind})) {
				return false
			}
		}
		return true
	}
	for fe, svc := range s.Services.All() {
		if n, ok := w.written[fe]; !ok || n != (nameOf{svc.Name, svc.Kind}) {
			return false
		}
	}
	return true
}
