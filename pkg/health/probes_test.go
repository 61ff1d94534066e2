package health

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

func TestReadyzFollowsReadyFunc(t *testing.T) {
	var reason atomic.Pointer[error]
	notYet := errors.New("no desired state received yet")
	reason.Store(&notYet)
	h := Handler(func() error { return *reason.Load() }, nil)

	get := func(path string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code, rec.Body.String()
	}

	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d before ready, want 200", code)
	}
	code, body := get("/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, notYet.Error()) {
		t.Errorf("/readyz = %d %q, want 503 naming the reason", code, body)
	}
	var ok error
	reason.Store(&ok)
	if code, body := get("/readyz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/readyz = %d %q once ready, want 200 ok", code, body)
	}
	if code, _ := get("/nothing"); code != http.StatusNotFound {
		t.Errorf("/nothing = %d, want 404", code)
	}
}

// A ready agent with Services it could not program still answers 200, and
// lists them.
func TestReadyzListsNotes(t *testing.T) {
	h := Handler(func() error { return nil }, func() []string {
		return []string{"capacity: service default/big:http (10.96.0.20:80/TCP): no room"}
	})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	want := "ok\nnot programmed:\n  capacity: service default/big:http (10.96.0.20:80/TCP): no room\n"
	if rec.Code != http.StatusOK || rec.Body.String() != want {
		t.Errorf("/readyz = %d %q, want 200 %q", rec.Code, rec.Body.String(), want)
	}
}
