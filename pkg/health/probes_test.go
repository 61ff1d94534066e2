package health

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
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

// Maps that are full leave out thousands of Services: /readyz lists the
// first maxNotes and counts the rest.
func TestReadyzBoundsNotes(t *testing.T) {
	const n = maxNotes + 50
	h := Handler(func() error { return nil }, func() []string {
		lines := make([]string, n)
		for i := range lines {
			lines[i] = fmt.Sprintf("capacity: service default/svc-%d:http: no room", i)
		}
		return lines
	})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	body := rec.Body.String()
	if got := strings.Count(body, "capacity: "); rec.Code != http.StatusOK || got != maxNotes ||
		!strings.HasSuffix(body, "\n  and 50 more (sluicectl status lists them all)\n") {
		t.Errorf("/readyz with %d notes = %d, %d of them listed, body ends %q; want 200, %d listed and the 50 more counted",
			n, rec.Code, got, body[max(0, len(body)-80):], maxNotes)
	}
}

// /livez follows staleness only; /healthz also follows the Node, as
// kube-proxy's do (KEP-3836).
func TestHealthzAndLivez(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	var pending time.Time
	p := NewProxier(time.Minute, func() time.Time { return pending })
	p.now = func() time.Time { return now }
	h := HandlerWith(func() error { return nil }, nil, p)
	get := func(path string) (int, map[string]any, http.Header) {
		t.Helper()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		var body map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatalf("%s: body %q is not kube-proxy's JSON: %v", path, rec.Body.String(), err)
		}
		return rec.Code, body, rec.Header()
	}
	want := func(what string, healthz, livez int, eligible bool) {
		t.Helper()
		code, body, hdr := get("/healthz")
		if code != healthz || body["nodeEligible"] != eligible {
			t.Errorf("%s: /healthz = %d %v (%q), want %d nodeEligible %v", what, code, body, hdr.Get("X-Sluice-Unhealthy"), healthz, eligible)
		}
		if code == http.StatusOK && body["lastUpdated"] != body["currentTime"] {
			t.Errorf("%s: healthy /healthz reports lastUpdated %v, want currentTime %v (kube-proxy's compatibility)", what, body["lastUpdated"], body["currentTime"])
		}
		code, body, _ = get("/livez")
		if _, ok := body["nodeEligible"]; code != livez || ok {
			t.Errorf("%s: /livez = %d %v, want %d without nodeEligible", what, code, body, livez)
		}
	}

	want("starting", 200, 200, true)
	pending = now.Add(-59 * time.Second)
	want("change pending, not late", 200, 200, true)
	p.Updated()
	updated := now
	now = now.Add(time.Second)
	want("change pending a minute", 503, 503, true)
	if _, body, hdr := get("/livez"); body["lastUpdated"] != updated.String() || !strings.Contains(hdr.Get("X-Sluice-Unhealthy"), "stale") {
		t.Errorf("stale /livez body %v header %q: want lastUpdated %v and the reason", body, hdr.Get("X-Sluice-Unhealthy"), updated)
	}
	pending = time.Time{}
	want("programmed", 200, 200, true)
	p.SetNode(false, "node is being deleted")
	want("node deleted", 503, 200, false)
	if _, _, hdr := get("/healthz"); hdr.Get("X-Sluice-Unhealthy") != "node is being deleted" {
		t.Errorf("/healthz reason %q, want the node's", hdr.Get("X-Sluice-Unhealthy"))
	}
	pending = now.Add(-time.Hour)
	want("node deleted and stale", 503, 503, false)
	pending = time.Time{}
	p.SetNode(true, "")
	want("node eligible again", 200, 200, true)

	if code, _ := getPlain(Handler(func() error { return nil }, nil), "/livez"); code != http.StatusOK {
		t.Errorf("/livez without a Proxier = %d, want 200", code)
	}
}

func getPlain(h http.Handler, path string) (int, string) {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code, rec.Body.String()
}
