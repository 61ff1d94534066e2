package testutil

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
)

// Scrape serves one GET /metrics from h (a metrics handler) and returns
// the exposition, failing tb unless h answered 200.
func Scrape(tb testing.TB, h http.Handler) string {
	tb.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != http.StatusOK {
		tb.Fatalf("scrape: %d\n%s", rec.Code, rec.Body.String())
	}
	return rec.Body.String()
}

// Samples parses a Prometheus text exposition (what /metrics serves) into
// its samples, by series as the format spells it (name{labels}), keeping
// those whose line keep accepts (all when keep is nil).
func Samples(r io.Reader, keep func(line string) bool) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") || (keep != nil && !keep(line)) {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if i < 0 || err != nil {
			return nil, fmt.Errorf("sample %q: not <series> <value>", line)
		}
		out[line[:i]] = v
	}
	return out, sc.Err()
}
