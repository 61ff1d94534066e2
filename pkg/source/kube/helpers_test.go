package kube

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/metrics"
)

func containsLine(body, line string) bool {
	for _, l := range strings.Split(body, "\n") {
		if l == line {
			return true
		}
	}
	return false
}

func histogramCount(t *testing.T, m *metrics.Metrics) int {
	t.Helper()
	for _, l := range strings.Split(testutil.Scrape(t, m.Handler()), "\n") {
		if v, ok := strings.CutPrefix(l, "sluice_network_programming_duration_seconds_count "); ok {
			var n int
			if _, err := fmt.Sscan(v, &n); err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	return 0
}

// scrapeSamples scrapes m into its samples, by series.
func scrapeSamples(t *testing.T, m *metrics.Metrics) map[string]float64 {
	t.Helper()
	out, err := testutil.Samples(strings.NewReader(testutil.Scrape(t, m.Handler())), nil)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
