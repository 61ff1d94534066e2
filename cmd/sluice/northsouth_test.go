package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/datapath"
	"github.com/sluice-lb/sluice/pkg/metrics"
)

// fakeWatch is a routing watch that ends, with err, when the test closes
// end.
type fakeWatch struct {
	end    chan struct{}
	err    error
	closed chan struct{}
}

func (w *fakeWatch) Done() <-chan struct{} { return w.end }
func (w *fakeWatch) Close() error          { close(w.closed); return w.err }

// TestFollowRouting: a routing watch that cannot start, or that ends, is
// logged and started again after the retry interval; stopping closes the
// running one.
func TestFollowRouting(t *testing.T) {
	var out testutil.Buffer
	log := slog.New(slog.NewTextHandler(&out, nil))
	watches := make(chan *fakeWatch, 4)
	starts := 0
	watch := func() (routingWatch, error) {
		starts++
		if starts == 1 {
			return nil, errors.New("no netlink")
		}
		w := &fakeWatch{end: make(chan struct{}), err: errors.New("socket gone"), closed: make(chan struct{})}
		watches <- w
		return w, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		followRouting(ctx, watch, time.Millisecond, log)
	}()
	first := <-watches // started again after the failed start
	close(first.end)   // the watch ends with an error
	second := <-watches
	cancel()
	<-done
	select {
	case <-second.closed:
	default:
		t.Error("the running watch was not closed when ctx was done")
	}
	testutil.ContainsAll(t, "log", out.String(), `err="no netlink"`, `err="socket gone"`)
}

// fakeCT stands in for the datapath's conntrack: a refusal counter the
// test raises, and a table that is as full as the test says (live
// entries, and entries counted expired ones included, which a collection
// brings down to live).
type fakeCT struct {
	mu      sync.Mutex
	refused uint64
	live    int
	entries int
	runs    int
	deleted int   // what each collection deletes
	fail    error // what each collection fails with
}

func (f *fakeCT) GCConntrack() (datapath.ConntrackStats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.runs++
	if f.fail != nil {
		return datapath.ConntrackStats{}, f.fail
	}
	f.entries = f.live
	return datapath.ConntrackStats{Deleted: f.deleted, Live: f.live, Max: 1000, Refused: f.refused}, nil
}

func (f *fakeCT) ConntrackEntries() (n, size int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.entries, 1000, nil
}

func (f *fakeCT) ConntrackRefused() (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.refused, nil
}

// runGCAnHour runs runConntrackGC on f with an interval of an hour, so
// that only pressure makes it collect, until the test ends.
func runGCAnHour(t *testing.T, f *fakeCT, log *slog.Logger) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		runConntrackGC(ctx, f, time.Hour, log)
	}()
	t.Cleanup(func() { cancel(); <-done })
}

// TestConntrackGCPressure: flows refused by a full table make the GC run
// at once (not at its hour-long interval here) and say so in the log; so
// does a table over 90% full.
func TestConntrackGCPressure(t *testing.T) {
	var out testutil.Buffer
	log := slog.New(slog.NewTextHandler(&out, nil))
	f := &fakeCT{live: 100}
	runGCAnHour(t, f, log)

	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(hangBound); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if cond() {
				return
			}
		}
		t.Fatalf("%s; log:\n%s", what, out.String())
	}
	time.Sleep(1500 * time.Millisecond)
	f.mu.Lock()
	if f.runs != 0 {
		t.Errorf("GC ran %d times with no pressure and an interval of an hour", f.runs)
	}
	f.refused, f.live = 7, 950
	f.mu.Unlock()
	waitFor("no warning about refused flows", func() bool {
		return strings.Contains(out.String(), `msg="conntrack table full: new flows refused or kept in the LRU" refused=7`)
	})
	// Over 3/4 full: every second from now on, warning while over 90%.
	waitFor("no warning about a nearly full table", func() bool {
		return strings.Contains(out.String(), `msg="conntrack table nearly full" established=950`)
	})
}

// TestConntrackGCFillingUp: a table that expired entries of short flows
// fill to 3/4 between two collections is collected at once (not at the
// hour-long interval here), before the datapath refuses a flow; the bench's
// last VIP stalled a second per worker and run on such refusals.
func TestConntrackGCFillingUp(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	f := &fakeCT{live: 100, entries: 100}
	runGCAnHour(t, f, log)

	runs := func() int {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.runs
	}
	time.Sleep(1500 * time.Millisecond)
	if n := runs(); n != 0 {
		t.Fatalf("GC ran %d times with a table 1/10 full and an interval of an hour", n)
	}
	f.mu.Lock()
	f.entries = 760 // 100 alive, 660 expired: no flow refused yet
	f.mu.Unlock()
	for deadline := time.Now().Add(hangBound); runs() == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a table 3/4 full of expired entries was not collected before it refused a flow")
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.entries != f.live || f.refused != 0 {
		t.Errorf("after the collection: %d entries (%d live), %d refused", f.entries, f.live, f.refused)
	}
}

// The agent's conntrack GC records each collection: how many it deleted,
// and the failed ones.
func TestObservedGC(t *testing.T) {
	m := metrics.New()
	f := &fakeCT{live: 10, deleted: 7}
	o := observedGC{f, m.ObserveConntrackGC, m.SetConntrackHalfOpen}
	for range 2 {
		if _, err := o.GCConntrack(); err != nil {
			t.Fatal(err)
		}
	}
	f.fail = errors.New("EPERM")
	if _, err := o.GCConntrack(); err == nil {
		t.Fatal("a failed collection was not reported")
	}
	if got := promtestutil.ToFloat64(m.ConntrackGCDeleted); got != 14 {
		t.Errorf("deleted %v, want 14", got)
	}
	if s, e := promtestutil.ToFloat64(m.ConntrackGCRuns.WithLabelValues("success")), promtestutil.ToFloat64(m.ConntrackGCRuns.WithLabelValues("error")); s != 2 || e != 1 {
		t.Errorf("runs: %v succeeded, %v failed; want 2, 1", s, e)
	}
}
