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
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"
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

// Serve listens on addr and serves Handler(ready) until ctx is done.
func Serve(ctx context.Context, addr string, ready ReadyFunc, log *slog.Logger) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("health listener on %s: %w", addr, err)
	}
	return ServeListener(ctx, l, ready, log)
}

// ServeListener serves Handler(ready) on l until ctx is done.
func ServeListener(ctx context.Context, l net.Listener, ready ReadyFunc, log *slog.Logger) error {
	srv := &http.Server{Handler: Handler(ready), ReadHeaderTimeout: 5 * time.Second}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	log.Info("serving health endpoints", "addr", l.Addr().String())
	err := srv.Serve(l)
	<-stopped
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("health server: %w", err)
}
