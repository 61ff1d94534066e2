package kube

import (
	"net/http/httptest"
	"strings"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/metrics"
)

// eventually is testutil.Eventually, under the short name every test of
// this package uses.
var eventually = testutil.Eventually

func scrape(m *metrics.Metrics) string {
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	return rec.Body.String()
}

func hasPrefixLine(body, prefix string) bool {
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, prefix) {
			return true
		}
	}
	return false
}
