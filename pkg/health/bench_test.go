package health

import (
	"log/slog"
	"testing"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/model/modeltest"
)

// BenchmarkSyncOneChange is what following one programmed change costs
// the health check ports at N services (issue 14: per change,
// O(changed)).
func BenchmarkSyncOneChange(b *testing.B) {
	modeltest.BenchOneChange(b, func(b *testing.B, st *model.State) func(*model.State) {
		s := NewNodePortServer([]string{""}, nil, slog.New(slog.DiscardHandler))
		b.Cleanup(s.Close)
		if err := s.Sync(st); err != nil {
			b.Fatal(err)
		}
		return func(st *model.State) {
			if err := s.Sync(st); err != nil {
				b.Fatal(err)
			}
		}
	})
}
