package metrics

import (
	"fmt"
	"testing"

	"github.com/sluice-lb/sluice/pkg/model/modeltest"
)

// BenchmarkSetProgrammedOneChange is what recording one programmed change
// costs at N services (issue 14: per change, O(changed)).
func BenchmarkSetProgrammedOneChange(b *testing.B) {
	for _, n := range []int{30000, 100000} {
		b.Run(fmt.Sprintf("%dk", n/1000), func(b *testing.B) {
			st, next := modeltest.Scale(n)
			m := New()
			m.SetProgrammed(st)
			b.ReportAllocs()
			for b.Loop() {
				m.SetProgrammed(next())
			}
		})
	}
}
