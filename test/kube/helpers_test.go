package kube

import (
	"net/http/httptest"
	"strings"

	"github.com/sluice-lb/sluice/pkg/metrics"
)

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
