// Package health serves the agent's liveness and readiness endpoints:
//
//	/healthz  200 while the process runs (it answers, so it lives)
//	/readyz   200 once the datapath matches the last desired state read,
//	          503 with the reason otherwise
//
// Readiness is a function so the package knows nothing of what "ready"
// means; the agent supplies it.
package health

import (
	"fmt"
	"io"
	"net/http"
)

// ReadyFunc returns nil when the agent is ready, else why it is not.
type ReadyFunc func() error

// Handler returns the mux serving /healthz and /readyz.
func Handler(ready ReadyFunc) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "not ready: %v\n", err)
			return
		}
		io.WriteString(w, "ok\n")
	})
	return mux
}
