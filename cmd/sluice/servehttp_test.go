package main

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestServeHTTPWaitsForHandlers: serveHTTP returns only once its handlers
// have, even those that outlive the shutdown's deadline (a /metrics
// scrape reading the maps, which runAgent closes once serveHTTP returned).
func TestServeHTTPWaitsForHandlers(t *testing.T) {
	was := httpShutdownWait
	httpShutdownWait = 10 * time.Millisecond
	t.Cleanup(func() { httpShutdownWait = was })
	entered, release := make(chan struct{}), make(chan struct{})
	var finished atomic.Bool
	h := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		close(entered)
		<-release // ignoring its context, as a map read does
		finished.Store(true)
	})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	returned := make(chan error, 1)
	go func() { returned <- serveHTTP(ctx, l, h, slog.New(slog.DiscardHandler)) }()
	go func() {
		// Its error is the connection the shutdown closed.
		if resp, err := http.Get("http://" + l.Addr().String()); err == nil {
			_ = resp.Body.Close()
		}
	}()
	<-entered
	cancel()
	// The handler is released only once serveHTTP waits for it (its
	// goroutine is in inflight.wait, past the shutdown's deadline and
	// the close): a serveHTTP that does not wait returns before that,
	// whatever the timing. The poll's period decides no outcome.
	for !inflightWaiting() {
		select {
		case err := <-returned:
			t.Fatalf("serveHTTP returned (%v) while a handler still ran", err)
		case <-time.After(time.Millisecond):
		}
	}
	close(release)
	if err := <-returned; err != nil {
		t.Fatalf("serveHTTP: %v", err)
	}
	if !finished.Load() {
		t.Fatal("serveHTTP returned while a handler still ran")
	}
}

// inflightWaiting says whether a goroutine is in (*inflight).wait.
func inflightWaiting() bool {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Contains(string(buf[:n]), ".(*inflight).wait(")
		}
		buf = make([]byte, 2*len(buf))
	}
}
