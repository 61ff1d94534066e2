package health

import (
	"fmt"
	"log/slog"
	"testing"

	"github.com/sluice-lb/sluice/pkg/model/modeltest"
)

// BenchmarkSyncOneChange is what following one programmed change costs
// the health check ports at N services (issue 14: per change,
// O(changed)).
func BenchmarkSyncOneChange(b *testing.B) {
	for _, n := range []int{30000, 100000} {
		b.Run(fmt.Sprintf("%dk", n/1000), func(b *testing.B) {
			st, next := modeltest.Scale(n)
			s := NewNodePortServer(nil, slog.New(slog.DiscardHandler))
			defer s.Close()
			if err := s.Sync(st); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if err := s.Sync(next()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
