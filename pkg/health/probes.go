// Package health serves what asks whether this node's proxy is healthy:
//
//   - the agent's liveness and readiness probes (probes.go), for the
//     kubelet: /healthz and /readyz on --health-addr;
//   - the healthCheckNodePorts of LoadBalancer Services with
//     externalTrafficPolicy Local (nodeport.go), for external load
//     balancers: does this node have local endpoints for the Service?
//
// It knows nothing of what "ready" means or where desired states come
// from: the agent supplies readiness as a function, and the node port
// server follows the states the agent programs (it is an agent Observer).
package health

// The probes:
//
//	/healthz  200 while the process runs (it answers, so it lives)
//	/readyz   200 once the datapath holds everything of the last desired
//	          state read that it can hold, 503 with the reason otherwise;
//	          either way followed by the Services that could not be
//	          programmed, if any

import (
	"fmt"
	"io"
	"net/http"
	"strings"
)

// ReadyFunc returns nil when the agent is ready, else why it is not.
type ReadyFunc func() error

// NotesFunc returns what /readyz reports besides readiness, one line each:
// the Services the agent could not program. A ready agent may have some (a
// Service that does not fit is reported, not waited for).
type NotesFunc func() []string

// Handler returns the mux serving /healthz and /readyz. notes may be nil.
func Handler(ready ReadyFunc, notes NotesFunc) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		reply(w, http.StatusOK, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		code, body := http.StatusOK, "ok\n"
		if err := ready(); err != nil {
			code, body = http.StatusServiceUnavailable, fmt.Sprintf("not ready: %v\n", err)
		}
		if notes != nil {
			if lines := notes(); len(lines) > 0 {
				body += "not programmed:\n  " + strings.Join(lines, "\n  ") + "\n"
			}
		}
		reply(w, code, body)
	})
	return mux
}

// reply answers a probe. The status code is the answer; a body that cannot
// be written means the prober went away, and there is nobody left to tell.
func reply(w http.ResponseWriter, code int, body string) {
	w.WriteHeader(code)
	_, _ = io.WriteString(w, body)
}
