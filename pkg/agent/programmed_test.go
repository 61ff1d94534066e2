package agent

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/pkg/model"
)

// programmedSource is a chanSource that records what the agent reports
// programmed.
type programmedSource struct {
	chanSource
	mu         sync.Mutex
	programmed []*model.State
}

func (s *programmedSource) Programmed(st *model.State) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.programmed = append(s.programmed, st)
}

func (s *programmedSource) reported() []*model.State {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*model.State(nil), s.programmed...)
}

// A source that implements ProgrammedSource is told of every successful
// apply, with the state applied, and of no failed one.
func TestProgrammedSourceToldAfterSuccessfulApply(t *testing.T) {
	recon := &fakeReconciler{recorder: &recorder{}, failures: 2}
	src := &programmedSource{chanSource: chanSource{states: make(chan *model.State)}}
	a := New(Config{RetryMin: time.Millisecond, RetryMax: 4 * time.Millisecond}, fakeDatapath{recon.recorder}, recon, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, src) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run after cancel = %v, want nil", err)
		}
	}()

	st := stateWith(3)
	src.states <- st
	eventually(t, "ready", func() bool { return a.Ready() == nil })
	if got := src.reported(); len(got) != 1 || got[0] != st {
		t.Fatalf("Programmed called with %d states after 2 failed applies and 1 good one, want the state once", len(got))
	}
	if n := len(recon.appliedStates()); n != 1 {
		t.Fatalf("applied %d states", n)
	}
}
