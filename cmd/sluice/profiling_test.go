package main

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/sluice-lb/sluice/pkg/health"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// TestProfilingOnTheMetricsServer: with --profiling the metrics server
// serves net/http/pprof's handlers (a heap profile is gzipped protobuf);
// without it they are 404, and the health server never has them.
func TestProfilingOnTheMetricsServer(t *testing.T) {
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("sluice_up 1\n")) })
	get := func(h http.Handler, method, path string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
		return rec
	}
	on := metricsHandler(metrics, nil, true)
	for _, path := range []string{"/debug/pprof/heap", "/debug/pprof/allocs", "/debug/pprof/goroutine"} {
		rec := get(on, "GET", path)
		if rec.Code != http.StatusOK || !bytes.HasPrefix(rec.Body.Bytes(), []byte{0x1f, 0x8b}) {
			t.Errorf("--profiling: GET %s: %d, %d bytes, want 200 and a gzipped profile", path, rec.Code, rec.Body.Len())
		}
	}
	for _, r := range []struct{ method, path string }{
		{"GET", "/debug/pprof/"}, {"GET", "/debug/pprof/cmdline"}, {"GET", "/debug/pprof/symbol"}, {"POST", "/debug/pprof/symbol"},
	} {
		if rec := get(on, r.method, r.path); rec.Code != http.StatusOK {
			t.Errorf("--profiling: %s %s: %d, want 200", r.method, r.path, rec.Code)
		}
	}
	off := metricsHandler(metrics, nil, false)
	healthz := health.Handler(func() error { return nil }, nil)
	for _, h := range []struct {
		name string
		h    http.Handler
	}{{"metrics without --profiling", off}, {"health", healthz}} {
		for _, path := range []string{"/debug/pprof/", "/debug/pprof/heap", "/debug/pprof/profile", "/debug/pprof/cmdline"} {
			if rec := get(h.h, "GET", path); rec.Code != http.StatusNotFound {
				t.Errorf("%s: GET %s: %d, want 404", h.name, path, rec.Code)
			}
		}
	}
	for _, h := range []http.Handler{on, off} {
		if rec := get(h, "GET", "/metrics"); rec.Code != http.StatusOK || rec.Body.String() != "sluice_up 1\n" {
			t.Errorf("GET /metrics: %d %q", rec.Code, rec.Body.String())
		}
	}
}

// The metrics server answers kube-proxy's /healthz (its apiserver healthz
// with the ping check: "ok", or the check listed with ?verbose) and
// /proxyMode (Sluice's name: no kube-proxy mode) beside /metrics.
func TestMetricsServerHealthzAndProxyMode(t *testing.T) {
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("sluice_up 1\n")) })
	h := metricsHandler(metrics, nil, false)
	for path, want := range map[string]string{
		"/healthz":         "ok",
		"/healthz/ping":    "ok",
		"/healthz?verbose": "[+]ping ok\nhealthz check passed\n",
		"/proxyMode":       "sluice",
	} {
		// Any method, as kube-proxy's mux answers (its apiserver
		// healthz has none).
		for _, method := range []string{"GET", "POST"} {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
			if rec.Code != http.StatusOK || rec.Body.String() != want || rec.Header().Get("Content-Type") != "text/plain; charset=utf-8" {
				t.Errorf("%s %s: %d %q (%s), want 200 %q, text/plain", method, path, rec.Code, rec.Body.String(), rec.Header().Get("Content-Type"), want)
			}
		}
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Errorf("POST /metrics: %d, want 200 as kube-proxy's promhttp answers", rec.Code)
	}
}

// The metrics server's /readyz?verbose lists the Services not programmed,
// which the health server's /readyz (every address by default) only
// counts; both follow the one Unprogrammed the agent tells, as runAgent
// wires them.
func TestReadyzListOnTheMetricsServer(t *testing.T) {
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("sluice_up 1\n")) })
	u := health.NewUnprogrammed()
	u.SetFailures([]*reconciler.FrontendError{{Service: model.ServicePortName{Namespace: "default", Name: "big", Port: "http"},
		Frontend: model.L4Addr{Addr: netip.MustParseAddr("10.96.0.99"), Port: 80, Proto: model.TCP}, Err: reconciler.ErrCapacity}})
	ready := func() error { return nil }
	get := func(h http.Handler, path string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		return rec.Code, rec.Body.String()
	}
	m := metricsHandler(metrics, health.VerboseReadyz(ready, u), false)
	code, body := get(m, "/readyz?verbose")
	if code != http.StatusOK || !strings.HasPrefix(body, "ok\nnot programmed:\n  capacity: service default/big:http (10.96.0.99:80/TCP): ") {
		t.Errorf("metrics server /readyz?verbose = %d %q, want 200 listing default/big:http", code, body)
	}
	const count = "ok\nnot programmed: 1 frontends of 1 Services (/readyz?verbose on the metrics address lists them)\n"
	for _, c := range []struct {
		name string
		h    http.Handler
		path string
	}{
		{"metrics server", m, "/readyz"},
		{"health server", health.CountedHandler(ready, u, nil, nil), "/readyz"},
		{"health server", health.CountedHandler(ready, u, nil, nil), "/readyz?verbose"},
	} {
		if code, body := get(c.h, c.path); code != http.StatusOK || body != count {
			t.Errorf("%s %s = %d %q, want 200 %q", c.name, c.path, code, body, count)
		}
	}
}
