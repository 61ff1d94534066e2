package main

// --profiling: net/http/pprof's handlers on the metrics server, as
// kube-proxy's enableProfiling serves them on its own. They expose the
// agent's internals (its command line, heap contents through symbol names,
// a CPU profile on demand), so they are off by default and never on the
// health address, which kube-proxy's default binds to every address.

import (
	"net/http"
	"net/http/pprof"
)

// metricsHandler is what --metrics-addr serves: /metrics, and with
// profiling /debug/pprof/ (the index, and the named profiles under it:
// heap, allocs, goroutine, ...), cmdline, profile, symbol and trace.
//
// Importing net/http/pprof also registers them on http.DefaultServeMux,
// which no server of the agent serves: each is given its own mux.
func metricsHandler(metrics http.Handler, profiling bool) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", metrics)
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
