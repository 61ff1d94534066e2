package testutil

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// NotProgrammed serves one GET /readyz?verbose from h (pkg/health's
// VerboseReadyz over the agent's Ready and its health.Unprogrammed, as
// the metrics address serves it) and returns the frontends it lists as
// not programmed, one line each ("capacity: service
// default/svc:http (10.96.0.1:80/TCP): ..."), none when it lists none:
// what the agent reports, read where production reads it. A list cut
// short ("and N more", beyond what /readyz lists) fails tb.
func NotProgrammed(tb testing.TB, h http.Handler) []string {
	tb.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/readyz?verbose", nil))
	_, list, _ := strings.Cut(rec.Body.String(), "\nnot programmed:\n")
	var out []string
	for line := range strings.Lines(list) {
		if strings.HasPrefix(line, "  and ") {
			tb.Fatalf("/readyz?verbose lists some of the frontends not programmed only:\n%s", rec.Body.String())
		}
		out = append(out, strings.TrimSpace(line))
	}
	return out
}
