package metrics

import (
	"testing"
	"time"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/model/modeltest"
)

// BenchmarkSetProgrammedOneChange is what recording one programmed change
// costs at N services (issue 14: per change, O(changed)).
func BenchmarkSetProgrammedOneChange(b *testing.B) {
	modeltest.BenchOneChange(b, func(b *testing.B, st *model.State) func(*model.State) {
		m := New()
		m.SetProgrammed(st)
		return m.SetProgrammed
	})
}

// BenchmarkObserveQueued is what the Kubernetes source's stamp of a change
// costs, once per changed event after the first sync.
func BenchmarkObserveQueued(b *testing.B) {
	m := New()
	now := time.Now()
	for b.Loop() {
		m.ObserveQueued(now)
	}
}
