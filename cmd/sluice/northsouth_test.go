package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
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
	refused uint64
	live    int
	entries int
	// uncounted: a kernel without the table's count (size 0), where only
	// the refusals and the interval make the GC collect.
	uncounted bool
	runs      int
	deleted   int   // what each collection deletes
	fail      error // what each collection fails with
}

func (f *fakeCT) GCConntrack() (datapath.ConntrackStats, error) {
	f.runs++
	if f.fail != nil {
		return datapath.ConntrackStats{}, f.fail
	}
	f.entries = f.live
	return datapath.ConntrackStats{Deleted: f.deleted, Live: f.live, Max: 1000, Refused: f.refused}, nil
}

func (f *fakeCT) ConntrackEntries() (n, size int, err error) {
	if f.uncounted {
		return 0, 0, nil
	}
	return f.entries, 1000, nil
}

func (f *fakeCT) ConntrackRefused() (uint64, error) { return f.refused, nil }

// ctPolls drives the conntrack GC's polls on f as runConntrackGC's ticker
// does, one a second, by a clock the test moves on: no outcome rests on
// time passing.
type ctPolls struct {
	t   *testing.T
	f   *fakeCT
	g   *ctCollector
	now time.Time
}

func newCTPolls(t *testing.T, f *fakeCT, every time.Duration, log *slog.Logger) *ctPolls {
	p := &ctPolls{t: t, f: f, now: time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)}
	p.g = newCTCollector(f, every, func() time.Time { return p.now }, log)
	return p
}

// poll moves the clock on by a second and polls once, and fails the test
// unless that poll collected (want) or not; why says what should have
// decided it.
func (p *ctPolls) poll(want bool, why string) {
	p.t.Helper()
	p.now = p.now.Add(time.Second)
	runs := p.f.runs
	said := p.g.poll()
	if ran := p.f.runs > runs; ran != want || said != ran {
		p.t.Fatalf("%s: collected %v (poll said %v), want %v", why, ran, said, want)
	}
}

// TestConntrackGCPressure: flows refused by a full table make the GC run
// at once (not at its hour-long interval here) and say so in the log; so
// does a table over 90% full. Under pressure the interval shortens: a
// second over 3/4 full, 5 seconds over half, the hour again below.
func TestConntrackGCPressure(t *testing.T) {
	var out testutil.Buffer
	log := slog.New(slog.NewTextHandler(&out, nil))
	f := &fakeCT{live: 100}
	p := newCTPolls(t, f, time.Hour, log)

	for range 60 {
		p.poll(false, "a minute of polls with no pressure and an interval of an hour")
	}
	if f.runs != 0 {
		t.Errorf("GC ran %d times with no pressure and an interval of an hour", f.runs)
	}
	f.refused, f.live = 7, 950
	p.poll(true, "flows refused (the table's count under 3/4, the hour not passed)")
	if !strings.Contains(out.String(), `msg="conntrack table or half-open share full: new flows refused or kept in the LRU" refused=7`) {
		t.Fatalf("no warning about refused flows; log:\n%s", out.String())
	}
	// Over 3/4 full: every second from now on, warning while over 90%;
	// on a kernel without the table's count, so that only the interval
	// decides.
	f.uncounted = true
	p.poll(true, "a second after a collection that found the table over 3/4 full")
	if !strings.Contains(out.String(), `msg="conntrack table nearly full" established=950`) {
		t.Fatalf("no warning about a nearly full table; log:\n%s", out.String())
	}
	f.live = 600
	p.poll(true, "a second after a collection that found the table over 3/4 full")
	// Over half full: every 5 seconds.
	for range 4 {
		p.poll(false, "under 5 seconds after a collection that found the table over half full")
	}
	f.live = 100
	p.poll(true, "5 seconds after a collection that found the table over half full")
	for range 60 {
		p.poll(false, "a minute after a collection that found the table 1/10 full, with an interval of an hour")
	}
	if n := strings.Count(out.String(), "level=WARN"); n != 2 {
		t.Errorf("%d warnings, want 2 (refused flows, nearly full); log:\n%s", n, out.String())
	}
}

// TestConntrackGCNearlyFullWarningsLimited: a table that stays over 90%
// full is collected every second (over 3/4 full), and said so at most
// once a minute: the first collection that finds it so, then a minute
// later. Before, every collection warned.
func TestConntrackGCNearlyFullWarningsLimited(t *testing.T) {
	var out testutil.Buffer
	log := slog.New(slog.NewTextHandler(&out, nil))
	f := &fakeCT{live: 950, entries: 950}
	p := newCTPolls(t, f, time.Hour, log)
	for s := 1; s <= 90; s++ {
		p.poll(true, "a table over 3/4 full, collected every second")
	}
	if f.runs != 90 {
		t.Fatalf("%d collections in 90 seconds of a table over 3/4 full, want 90", f.runs)
	}
	if n := strings.Count(out.String(), `level=WARN msg="conntrack table nearly full" established=950`); n != 2 {
		t.Errorf("%d nearly-full warnings in 90 collections, want 2 (seconds 1 and 61); log:\n%s", n, out.String())
	}
}

// TestConntrackGCRefusalWarningsLimited: a flood that makes the datapath
// refuse flows before every poll for 90 seconds (every poll collects at
// once) logs its first refusals at once, then at most one warning a
// minute with the refusals summed since the last one: a minute into the
// flood, and the flood's last 29 seconds a minute after that, though the
// flood has ended and no poll collects then. Every refusal is in one
// warning, and the collector's counter follows the datapath's. A refusal
// after a quiet minute is logged at once again. Before, each of the 90
// collections warned.
func TestConntrackGCRefusalWarningsLimited(t *testing.T) {
	var out testutil.Buffer
	log := slog.New(slog.NewTextHandler(&out, nil))
	f := &fakeCT{live: 100}
	p := newCTPolls(t, f, time.Hour, log)
	const msg = `level=WARN msg="conntrack table or half-open share full: new flows refused or kept in the LRU" `
	warnings := func() []string {
		var ws []string
		for line := range strings.Lines(out.String()) {
			if strings.Contains(line, "level=WARN") {
				ws = append(ws, strings.TrimSpace(line[strings.Index(line, "level=WARN"):]))
			}
		}
		return ws
	}
	want := func(why string, lines ...string) {
		t.Helper()
		got, wanted := warnings(), make([]string, len(lines))
		for i, l := range lines {
			wanted[i] = msg + l
		}
		if !slices.Equal(got, wanted) {
			t.Fatalf("%s: warnings\n%s\nwant\n%s", why, strings.Join(got, "\n"), strings.Join(wanted, "\n"))
		}
	}

	// Seconds 1 to 90: 3 refused before each poll.
	for s := 1; s <= 90; s++ {
		f.refused += 3
		p.poll(true, "flows refused since the last collection")
		if s == 60 {
			want("a minute into the flood", "refused=3 established=100 max=1000 deleted=0")
		}
	}
	if p.g.refused != f.refused {
		t.Errorf("the collector's refusal counter is %d, the datapath's %d", p.g.refused, f.refused)
	}
	want("the flood's 90 collections", "refused=3 established=100 max=1000 deleted=0",
		"refused=180 over=1m0s established=100 max=1000") // seconds 2 to 61
	// Seconds 91 to 120: no refusal, no collection; 121: a minute after
	// the last warning, the flood's last refusals (seconds 62 to 90).
	for range 30 {
		p.poll(false, "no flow refused since the flood, the hour not passed")
	}
	want("30 quiet seconds after the flood", "refused=3 established=100 max=1000 deleted=0",
		"refused=180 over=1m0s established=100 max=1000")
	p.poll(false, "no flow refused since the flood, the hour not passed")
	flood := []string{"refused=3 established=100 max=1000 deleted=0",
		"refused=180 over=1m0s established=100 max=1000", "refused=87 over=1m0s established=100 max=1000"}
	want("a minute after the last warning", flood...)
	if sum := 3 + 180 + 87; uint64(sum) != f.refused {
		t.Errorf("the warnings sum %d refusals, the datapath counted %d", sum, f.refused)
	}
	// A quiet minute and more, then a refusal: logged at once.
	for range 70 {
		p.poll(false, "no flow refused, the hour not passed")
	}
	f.refused++
	p.poll(true, "a flow refused since the last collection")
	want("a refusal after a quiet minute", append(flood, "refused=1 established=100 max=1000 deleted=0")...)
}

// TestConntrackGCFillingUp: a table that expired entries of short flows
// fill to 3/4 between two collections is collected at once (not at the
// hour-long interval here), before the datapath refuses a flow; the bench's
// last VIP stalled a second per worker and run on such refusals.
func TestConntrackGCFillingUp(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	f := &fakeCT{live: 100, entries: 100}
	p := newCTPolls(t, f, time.Hour, log)

	for range 60 {
		p.poll(false, "a minute of polls with a table 1/10 full and an interval of an hour")
	}
	if f.runs != 0 {
		t.Fatalf("GC ran %d times with a table 1/10 full and an interval of an hour", f.runs)
	}
	f.entries = 749 // just under 3/4
	p.poll(false, "a table of 749 entries of 1000, no flow refused, the hour not passed")
	f.entries = 760 // 100 alive, 660 expired: no flow refused yet
	if p.poll(true, "a table 3/4 full of expired entries, before it refused a flow (no flow refused, the hour not passed)"); f.runs != 1 {
		t.Fatal("a table 3/4 full of expired entries was not collected before it refused a flow")
	}
	if f.entries != f.live || f.refused != 0 {
		t.Errorf("after the collection: %d entries (%d live), %d refused", f.entries, f.live, f.refused)
	}
	p.poll(false, "the table collected down to 1/10 full, the hour not passed")
}

// TestConntrackGCStops: the GC's loop returns once its context is done.
// (What each of its polls does is the tests above'.)
func TestConntrackGCStops(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		runConntrackGC(ctx, &fakeCT{}, time.Hour, slog.New(slog.DiscardHandler))
	}()
	select {
	case <-done:
	case <-time.After(hangBound):
		t.Fatalf("runConntrackGC still running %v after its context ended", hangBound)
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
