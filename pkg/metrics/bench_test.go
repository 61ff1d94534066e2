package metrics

import (
	"testing"

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
