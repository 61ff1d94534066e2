package main

// --profiling: net/http/pprof's handlers on the metrics server, as
// kube-proxy's enableProfiling serves them on its own. They expose the
// agent's internals (its command line, heap contents through symbol names,
// a CPU profile on demand), so they are off by default and never on the
// health address, which kube-proxy's default binds to every address.

import (
	"io"
	"net/http"
	"net/http/pprof"
)

// proxyMode is what /proxyMode answers on the metrics server: kube-proxy
// answers its --proxy-mode there (iptables, ipvs, nftables). Sluice is none
// of them, and a tool that reads the mode to decide what the node's rules
// look like (Kubernetes' e2e tests skip the iptables-only ones by it) must
// not take Sluice for one: it answers its own name.
const proxyMode = "sluice"

// metricsHandler is what --metrics-addr serves: /metrics; kube-proxy's
// /healthz (with /healthz/ping) and /proxyMode beside it; readyz (nil:
// none) as /readyz, whose ?verbose lists the Services not programmed,
// which the health address, on every address by default, only counts;
// and with profiling /debug/pprof/ (the index, and the named profiles
// under it: heap, allocs, goroutine, ...), cmdline, profile, symbol and
// trace.
//
// Importing net/http/pprof also registers them on http.DefaultServeMux,
// which no server of the agent serves: each is given its own mux.
func metricsHandler(metrics, readyz http.Handler, profiling bool) http.Handler {
	mux := http.NewServeMux()
	// No method on these: kube-proxy's mux answers any (its
	// k8s.io/apiserver healthz, /proxyMode, promhttp's /metrics).
	mux.Handle("/metrics", metrics)
	if readyz != nil {
		mux.Handle("GET /readyz", readyz) // as the health address' /readyz
	}
	// kube-proxy's metrics server has k8s.io/apiserver's healthz with its
	// one default check, ping: "ok" while the process answers, whatever
	// the proxy's health (that is /healthz and /livez on the health
	// address); ?verbose lists the check.
	plain := func(w http.ResponseWriter, body string) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		_, _ = io.WriteString(w, body) // the prober went away: nobody to tell
	}
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if _, verbose := r.URL.Query()["verbose"]; verbose {
			plain(w, "[+]ping ok\nhealthz check passed\n")
			return
		}
		plain(w, "ok")
	})
	mux.HandleFunc("/healthz/ping", func(w http.ResponseWriter, _ *http.Request) { plain(w, "ok") })
	mux.HandleFunc("/proxyMode", func(w http.ResponseWriter, _ *http.Request) { plain(w, proxyMode) })
	if profiling {
		// No method: go tool pprof POSTs to symbol, as kube-proxy
		// (k8s.io/apiserver's routes.Profiling) allows.
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}
