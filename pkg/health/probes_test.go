package health

import (
	"bytes"
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

// kubeProxyHealth is kube-proxy v1.36's body of /healthz and /livez,
// copied from pkg/proxy/healthcheck/proxy_health.go (ProxyHealth and
// ProxierHealth; its map key is a v1.IPFamily, a string).
type kubeProxyHealth struct {
	LastUpdated  time.Time `json:"lastUpdated"`
	CurrentTime  time.Time `json:"currentTime"`
	NodeEligible *bool     `json:"nodeEligible,omitempty"`
	Healthy      bool      `json:"healthy"`
	Status       map[string]struct {
		LastUpdated time.Time `json:"lastUpdated"`
		Healthy     bool      `json:"healthy"`
	} `json:"status,omitempty"`
}

// /livez follows staleness only; /healthz also follows the Node, as
// kube-proxy's do (KEP-3836), and both bodies are kube-proxy's: they decode
// into its struct, nothing more in them, times in RFC 3339, no newline.
func TestHealthzAndLivez(t *testing.T) {
	start := time.Date(2026, 12, 6, 16, 8, 41, 900_000_000, time.UTC)
	now := start
	var pending time.Time
	clock := func() time.Time { return now }
	before := time.Now().Round(0)
	p := NewProxier(time.Minute, func() time.Time { return pending })
	after := time.Now().Round(0)
	// lastUpdated is the Proxier's making until the first sync, as
	// kube-proxy's SyncLoop's Updated before it: not 1970.
	if last := time.Unix(0, p.lastUpdated.Load()); last.Before(before) || last.After(after) {
		t.Errorf("lastUpdated %v after NewProxier, want its call's time (%v to %v)", last, before, after)
	}
	p.now = clock
	p.Updated() // NewProxier's, on the test's clock
	var counted []string
	h := CountedHandler(func() error { return nil }, nil, p, func(probe string, code int) {
		counted = append(counted, fmt.Sprintf("%s %d", probe, code))
	})
	get := func(path string) (int, kubeProxyHealth, http.Header) {
		t.Helper()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		var body kubeProxyHealth
		dec := json.NewDecoder(bytes.NewReader(rec.Body.Bytes()))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&body); err != nil || dec.More() || strings.HasSuffix(rec.Body.String(), "\n") {
			t.Fatalf("%s: body %q is not kube-proxy's JSON: %v", path, rec.Body.String(), err)
		}
		if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s: Content-Type %q, want application/json", path, ct)
		}
		return rec.Code, body, rec.Header()
	}
	want := func(what string, healthz, livez int, eligible bool, lastUpdated time.Time) {
		t.Helper()
		code, body, hdr := get("/healthz")
		// healthy is the proxy's, as in kube-proxy: not the Node's.
		if code != healthz || body.NodeEligible == nil || *body.NodeEligible != eligible || body.Healthy != (livez == 200) {
			t.Errorf("%s: /healthz = %d %+v (%q), want %d nodeEligible %v", what, code, body, hdr.Get("X-Sluice-Unhealthy"), healthz, eligible)
		}
		// kube-proxy's compatibility: lastUpdated is now while healthy.
		wantLast := lastUpdated
		if code == http.StatusOK {
			wantLast = now
		}
		if !body.LastUpdated.Equal(wantLast) || !body.CurrentTime.Equal(now) {
			t.Errorf("%s: /healthz lastUpdated %v currentTime %v, want %v and %v", what, body.LastUpdated, body.CurrentTime, wantLast, now)
		}
		code, body, _ = get("/livez")
		if code != livez || body.NodeEligible != nil || body.Healthy != (livez == 200) {
			t.Errorf("%s: /livez = %d %+v, want %d without nodeEligible", what, code, body, livez)
		}
		// Both families, each with the last update, as a dual-stack
		// kube-proxy's two proxiers: one Sluice sync serves both.
		for _, f := range []string{"IPv4", "IPv6"} {
			if s, ok := body.Status[f]; !ok || s.Healthy != (livez == 200) || !s.LastUpdated.Equal(lastUpdated) {
				t.Errorf("%s: /livez status %+v, want %s healthy %v last updated %v", what, body.Status, f, livez == 200, lastUpdated)
			}
		}
	}

	want("starting", 200, 200, true, start)
	pending = now.Add(-59 * time.Second)
	want("change pending, not late", 200, 200, true, start)
	now = now.Add(time.Second)
	updated := now
	p.Updated()
	now = now.Add(time.Second)
	want("change pending a minute", 503, 503, true, updated)
	if _, _, hdr := get("/livez"); !strings.Contains(hdr.Get("X-Sluice-Unhealthy"), "stale") {
		t.Errorf("stale /livez header %q: want the reason", hdr.Get("X-Sluice-Unhealthy"))
	}
	pending = time.Time{}
	want("programmed", 200, 200, true, updated)
	p.SetNode(false, "node is being deleted")
	want("node deleted", 503, 200, false, updated)
	if _, _, hdr := get("/healthz"); hdr.Get("X-Sluice-Unhealthy") != "node is being deleted" {
		t.Errorf("/healthz reason %q, want the node's", hdr.Get("X-Sluice-Unhealthy"))
	}
	pending = now.Add(-time.Hour)
	want("node deleted and stale", 503, 503, false, updated)
	pending = time.Time{}
	p.SetNode(true, "")
	want("node eligible again", 200, 200, true, updated)

	// The byte form: kube-proxy's json.Marshal of the same values.
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/livez", nil))
	wantBody := `{"lastUpdated":"2026-12-06T16:08:43.9Z","currentTime":"2026-12-06T16:08:43.9Z","healthy":true,` +
		`"status":{"IPv4":{"lastUpdated":"2026-12-06T16:08:42.9Z","healthy":true},"IPv6":{"lastUpdated":"2026-12-06T16:08:42.9Z","healthy":true}}}`
	if rec.Body.String() != wantBody {
		t.Errorf("/livez body\n%s\nwant kube-proxy's\n%s", rec.Body.String(), wantBody)
	}
	// Any method, as kube-proxy's health server (its mux has none): a
	// load balancer's probe may not GET.
	for _, path := range []string{"/healthz", "/livez"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, nil))
		if rec.Code != http.StatusOK || !strings.HasPrefix(rec.Body.String(), `{"lastUpdated":`) {
			t.Errorf("POST %s: %d %q, want 200 and the JSON body", path, rec.Code, rec.Body.String())
		}
	}
	// kube-proxy's kubeproxy_proxy_healthz_total and _livez_total count
	// every answer by code.
	codes := map[string]int{}
	for _, c := range counted {
		codes[c]++
	}
	if codes["healthz 200"] != 5 || codes["healthz 503"] != 4 || codes["livez 200"] != 7 || codes["livez 503"] != 3 {
		t.Errorf("probes counted %v", codes)
	}

	if code, _ := getPlain(Handler(func() error { return nil }, nil), "/livez"); code != http.StatusOK {
		t.Errorf("/livez without a Proxier = %d, want 200", code)
	}
}

func getPlain(h http.Handler, path string) (int, string) {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code, rec.Body.String()
}
