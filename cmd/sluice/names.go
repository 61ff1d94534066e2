package main

import (
	"bytes"
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
	last  []byte // what the file holds
}

func (w *namesWriter) ObserveSync(time.Duration, error) {}

// SetProgrammed writes the names of the programmed state s, if they
// changed. A failed write is logged: sluicectl then shows the older names
// or none, and the next apply tries again.
func (w *namesWriter) SetProgrammed(s *model.State) {
	b, err := namesfile.Of(w.bpffs, s)
	if err != nil {
		w.log.Error("encode the names file", "err", err)
		return
	}
	if bytes.Equal(b, w.last) {
		return
	}
	if err := namesfile.WriteAtomic(w.path, b); err != nil {
		w.log.Warn("write the names file sluicectl reads", "path", w.path, "err", err)
		return
	}
	w.last = b
}
