package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/health"
	"github.com/sluice-lb/sluice/pkg/metrics"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// failingReconciler fails the frontends its fail function names, as
// reconciler.Reconciler does: one *FrontendError each, joined, every
// other frontend programmed.
type failingReconciler struct {
	mu      sync.Mutex                            // one Apply at a time, as the agent calls it
	fail    func(fe model.L4Addr, call int) error // nil: programmed
	applies atomic.Int64
	inSync  atomic.Bool
}

func (r *failingReconciler) Restore() error { return nil }

func (r *failingReconciler) Apply(s *model.State) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	call := int(r.applies.Add(1))
	var errs []error
	for fe, svc := range s.Services.All() {
		if err := r.fail(fe, call); err != nil {
			errs = append(errs, &reconciler.FrontendError{Service: svc.Name, Frontend: fe, Err: err})
		}
	}
	r.inSync.Store(len(errs) == 0)
	return errors.Join(errs...)
}

func (r *failingReconciler) InSync() bool { return r.inSync.Load() }

func (r *failingReconciler) calls() int { return int(r.applies.Load()) }

// failureObserver records what the agent tells a FailureObserver.
type failureObserver struct {
	mu         sync.Mutex
	syncErrs   []error
	failures   []*reconciler.FrontendError
	programmed *model.State
}

func (o *failureObserver) ObserveSync(_ time.Duration, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.syncErrs = append(o.syncErrs, err)
}

func (o *failureObserver) SetProgrammed(s *model.State) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.programmed = s
}

func (o *failureObserver) SetFailures(fs []*reconciler.FrontendError) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.failures = fs
}

// namedState is stateWith(n) with Service names svc-1..svc-n.
func namedState(n int) *model.State {
	s := stateWith(n)
	for fe, svc := range s.Services.All() {
		svc.Name = model.ServicePortName{Namespace: "default", Name: fmt.Sprintf("svc-%d", fe.Addr.As4()[3])}
	}
	return s
}

// failingAgent is an agent under test and the health.Unprogrammed
// observer that /readyz reports its failures from, as runAgent gives it.
type failingAgent struct {
	*Agent
	t            *testing.T
	unprogrammed *health.Unprogrammed
}

// notProgrammed returns the frontends /readyz?verbose on the metrics
// address lists as not programmed, one line each.
func (a *failingAgent) notProgrammed() []string {
	a.t.Helper()
	return testutil.NotProgrammed(a.t, health.VerboseReadyz(a.Ready, a.unprogrammed))
}

func startFailing(t *testing.T, cfg Config, recon *failingReconciler) (*failingAgent, chanSource, *testutil.Buffer) {
	t.Helper()
	if cfg.RetryMin == 0 {
		cfg.RetryMin, cfg.RetryMax = time.Millisecond, 4*time.Millisecond
	}
	u := health.NewUnprogrammed()
	cfg.Observers = append(slices.Clip(cfg.Observers), u)
	logs := &testutil.Buffer{}
	a := New(cfg, fakeDatapath{&recorder{}}, recon, slog.New(slog.NewTextHandler(logs, nil)))
	src := chanSource{states: make(chan *model.State)}
	testutil.RunUntilCleanup(t, "agent", func(ctx context.Context) error { return a.Run(ctx, src) })
	return &failingAgent{Agent: a, t: t, unprogrammed: u}, src, logs
}

var errCapacity = fmt.Errorf("%w (3 new service entries: 62 in use of 64); previous programming kept", reconciler.ErrCapacity)

// A Service that can never fit as asked (a permanent failure) does not
// keep the agent unready or retrying: the others are programmed, the
// agent is ready, the Service is reported (observers, /readyz, one
// log line however many resyncs), and it is tried again only when a new
// desired state arrives.
func TestPermanentFailureIsReportedNotRetried(t *testing.T) {
	bad := stateWith(2)
	var badFE model.L4Addr
	for fe := range bad.Services.All() {
		if fe.Addr.As4()[3] == 2 {
			badFE = fe
		}
	}
	recon := &failingReconciler{fail: func(fe model.L4Addr, _ int) error {
		if fe == badFE {
			return errCapacity
		}
		return nil
	}}
	obs := &failureObserver{}
	a, src, logs := startFailing(t, Config{Observers: []Observer{obs}}, recon)
	st := namedState(2)
	src.states <- st
	eventually(t, "ready with one Service failing permanently", func() bool { return a.Ready() == nil })

	calls := recon.calls()
	time.Sleep(50 * time.Millisecond) // > 10 retries at RetryMax
	if n := recon.calls(); n != calls {
		t.Errorf("Apply called %d more times with nothing changed: a permanent failure is retried", n-calls)
	}
	un := a.notProgrammed()
	if len(un) != 1 || !strings.Contains(un[0], "default/svc-2") || !strings.HasPrefix(un[0], "capacity: ") {
		t.Errorf("/readyz?verbose lists %q as not programmed, want default/svc-2 for capacity", un)
	}
	obs.mu.Lock()
	if len(obs.failures) != 1 || obs.failures[0].Frontend != badFE || obs.failures[0].Reason() != "capacity" {
		t.Errorf("observer told of failures %v, want the one capacity failure", obs.failures)
	}
	if obs.programmed == nil || obs.programmed.Services.Len() != 1 || obs.programmed.Services.Get(badFE) != nil {
		t.Errorf("observer told of a programmed state of %v, want the good frontend alone", obs.programmed)
	}
	if last := obs.syncErrs[len(obs.syncErrs)-1]; last != nil {
		t.Errorf("ObserveSync got %v: a sync that programmed all it could is no sync error", last)
	}
	if st.Services.Len() != 2 {
		t.Errorf("the source's state was modified: %d services", st.Services.Len())
	}
	obs.mu.Unlock()

	// A new desired state (the Service shrank, or another one freed
	// room) is tried, and the Service is programmed then.
	recon.mu.Lock()
	recon.fail = func(model.L4Addr, int) error { return nil }
	recon.mu.Unlock()
	src.states <- namedState(2)
	eventually(t, "the Service programmed after a change", func() bool { return len(a.notProgrammed()) == 0 && a.Ready() == nil })
	if n := strings.Count(logs.String(), "service not programmed"); n != 1 {
		t.Errorf("the permanent failure was logged %d times, want once:\n%s", n, logs)
	}
	if !strings.Contains(logs.String(), "service no longer failing") {
		t.Errorf("its recovery was not logged:\n%s", logs)
	}
}

// A permanent failure is logged once however often the state is resynced.
func TestPermanentFailureLoggedOncePerChange(t *testing.T) {
	recon := &failingReconciler{fail: func(fe model.L4Addr, _ int) error {
		if fe.Addr.As4()[3] == 1 {
			return errCapacity
		}
		return nil
	}}
	a, src, logs := startFailing(t, Config{Resync: 2 * time.Millisecond}, recon)
	src.states <- namedState(3)
	eventually(t, "ready", func() bool { return a.Ready() == nil })
	eventually(t, "10 resyncs", func() bool { return recon.calls() > 10 })
	if n := strings.Count(logs.String(), "service not programmed"); n != 1 {
		t.Errorf("logged %d times over %d applies, want once:\n%s", n, recon.calls(), logs)
	}
	// The same frontend failing for another reason is a change.
	recon.mu.Lock()
	recon.fail = func(fe model.L4Addr, _ int) error {
		if fe.Addr.As4()[3] == 1 {
			return fmt.Errorf("%w: backend fd00::1:80/TCP: not an IPv4 address", reconciler.ErrInvalid)
		}
		return nil
	}
	recon.mu.Unlock()
	eventually(t, "the new reason logged", func() bool { return strings.Count(logs.String(), "service not programmed") == 2 })
	if !strings.Contains(logs.String(), "reason=invalid") {
		t.Errorf("second log line lacks the reason:\n%s", logs)
	}
}

// Maps that are full fail every Service after them at once: the first
// maxLogged are logged one by one, the rest in one line; so is their
// recovery. Every one of them is still reported (/readyz, observers).
func TestManyPermanentFailuresLoggedInFew(t *testing.T) {
	const n = maxLogged + 40
	var full atomic.Bool
	full.Store(true)
	recon := &failingReconciler{fail: func(model.L4Addr, int) error {
		if full.Load() {
			return errCapacity
		}
		return nil
	}}
	a, src, logs := startFailing(t, Config{}, recon)
	src.states <- namedState(n)
	eventually(t, "ready with every Service failing permanently", func() bool { return a.Ready() == nil && len(a.notProgrammed()) == n })
	eventually(t, "the failures logged", func() bool { return strings.Contains(logs.String(), "more services not programmed") })
	if got := strings.Count(logs.String(), "service not programmed; the others are"); got != maxLogged {
		t.Errorf("%d failures logged one by one, want %d:\n%s", got, maxLogged, logs)
	}
	if !strings.Contains(logs.String(), "reason=capacity frontends=40 ") {
		t.Errorf("the 40 others not counted in one line:\n%s", logs)
	}
	full.Store(false)
	src.states <- namedState(n)
	eventually(t, "all programmed", func() bool { return len(a.notProgrammed()) == 0 })
	eventually(t, "the recovery logged", func() bool { return strings.Contains(logs.String(), "more services no longer failing") })
	if got := strings.Count(logs.String(), "service no longer failing"); got != maxLogged {
		t.Errorf("%d recoveries logged one by one, want %d:\n%s", got, maxLogged, logs)
	}
	if !strings.Contains(logs.String(), "frontends=40 logged=32") {
		t.Errorf("the 40 other recoveries not counted in one line:\n%s", logs)
	}
}

// A failed write (a transient failure) is retried with backoff until it
// succeeds, and the agent is not ready meanwhile, even though the other
// frontends are programmed.
func TestTransientFrontendFailureRetried(t *testing.T) {
	recon := &failingReconciler{fail: func(fe model.L4Addr, call int) error {
		if fe.Addr.As4()[3] == 1 && call <= 20 {
			return errors.New("upsert master: EIO")
		}
		return nil
	}}
	obs := &failureObserver{}
	a, src, _ := startFailing(t, Config{Observers: []Observer{obs}}, recon)
	src.states <- namedState(2)
	eventually(t, "the write failure to show in Ready", func() bool {
		err := a.Ready()
		return err != nil && strings.Contains(err.Error(), "EIO")
	})
	if un := a.notProgrammed(); len(un) != 1 || !strings.HasPrefix(un[0], "write: ") {
		t.Errorf("/readyz?verbose lists %q as not programmed while the write fails, want the frontend with reason write", un)
	}
	eventually(t, "ready after the retries", func() bool { return a.Ready() == nil })
	if n := recon.calls(); n != 21 {
		t.Errorf("Apply called %d times, want 21 (20 failures, 1 success)", n)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	failed := 0
	for _, err := range obs.syncErrs {
		if err != nil {
			failed++
		}
	}
	if failed != 20 || len(obs.failures) != 0 {
		t.Errorf("observer saw %d failed syncs and %d failures at the end, want 20 and 0", failed, len(obs.failures))
	}
}

// With a permanent and a transient failure, the agent retries (not
// ready) until the transient one is gone, and is then ready with the
// permanent one reported.
func TestPermanentAndTransientFailures(t *testing.T) {
	recon := &failingReconciler{fail: func(fe model.L4Addr, call int) error {
		switch {
		case fe.Addr.As4()[3] == 1:
			return errCapacity
		case fe.Addr.As4()[3] == 2 && call <= 20:
			return errors.New("upsert slot 1: EIO")
		}
		return nil
	}}
	a, src, _ := startFailing(t, Config{}, recon)
	src.states <- namedState(3)
	eventually(t, "not ready while a write fails", func() bool {
		err := a.Ready()
		return err != nil && strings.Contains(err.Error(), "EIO")
	})
	eventually(t, "ready once only the permanent failure is left", func() bool { return a.Ready() == nil })
	if un := a.notProgrammed(); len(un) != 1 || !strings.Contains(un[0], "default/svc-1") {
		t.Errorf("/readyz?verbose lists %q as not programmed, want default/svc-1 alone", un)
	}
	if n := recon.calls(); n != 21 {
		t.Errorf("Apply called %d times, want 21 (20 with the write failing)", n)
	}
}

// The agent's metrics are a FailureObserver: the failures reach /metrics.
var _ FailureObserver = (*metrics.Metrics)(nil)

// The reconciler can tell what the maps hold.
var _ Holder = (*reconciler.Reconciler)(nil)

// holdsSource is a chanSource that records the check it is given and
// whether it had it when Run started.
type holdsSource struct {
	chanSource
	holds       func(*model.Service) bool
	hadAtRunTop bool
}

func (s *holdsSource) SetHolds(h func(*model.Service) bool) { s.holds = h }

func (s *holdsSource) Run(ctx context.Context, apply func(*model.State)) error {
	s.hadAtRunTop = s.holds != nil
	return s.chanSource.Run(ctx, apply)
}

type holdingReconciler struct{ fakeReconciler }

func (r *holdingReconciler) Holds(svc *model.Service) bool { return svc.Name.Name == "held" }

// A HoldsSource gets the reconciler's Holds before it runs (after Restore,
// so that it reflects the pinned maps).
func TestHoldsSourceGetsReconcilerHolds(t *testing.T) {
	recon := &holdingReconciler{fakeReconciler{recorder: &recorder{}}}
	src := &holdsSource{chanSource: chanSource{states: make(chan *model.State)}}
	a := New(Config{}, fakeDatapath{recon.recorder}, recon, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := a.Run(ctx, src); err != nil {
		t.Fatal(err)
	}
	if !src.hadAtRunTop || !src.holds(&model.Service{Name: model.ServicePortName{Name: "held"}}) {
		t.Errorf("source had the reconciler's Holds at Run: %v", src.hadAtRunTop)
	}
}

// failuresOf is a failure map of n frontends, over Services whose names
// are prefixes of one another ("a" and "a-b" in namespace and name, ports
// named and not), the cases where the spelled order and a field-by-field
// order part.
func failuresOf(n int) map[model.L4Addr]*reconciler.FrontendError {
	names := []string{"a", "a-b", "a0", "ab", "b"}
	ports := []string{"", "p", "p-1", "q"}
	m := map[model.L4Addr]*reconciler.FrontendError{}
	for i := range n {
		fe := model.L4Addr{Addr: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Port: 80, Proto: model.TCP}
		svc := model.ServicePortName{
			Namespace: names[i%len(names)],
			Name:      names[(i/len(names))%len(names)] + fmt.Sprint(i%3),
			Port:      ports[(i/7)%len(ports)],
		}
		if i%11 == 0 {
			svc.Name = names[i%len(names)]
		}
		m[fe] = &reconciler.FrontendError{Service: svc, Frontend: fe}
	}
	return m
}

// sortedFailures orders by the Service as it is spelled ("ns/name:port"),
// then by frontend, as it did when it compared the spellings themselves.
func TestSortedFailuresOrder(t *testing.T) {
	m := failuresOf(500)
	m[model.L4Addr{Addr: netip.MustParseAddr("10.0.0.1"), Port: 1, Proto: model.TCP}] = &reconciler.FrontendError{
		Frontend: model.L4Addr{Addr: netip.MustParseAddr("10.0.0.1"), Port: 1, Proto: model.TCP}} // nobody's
	got := sortedFailures(m)
	if len(got) != len(m) {
		t.Fatalf("%d failures sorted of %d", len(got), len(m))
	}
	if !slices.IsSortedFunc(got, func(x, y *reconciler.FrontendError) int {
		if c := strings.Compare(x.Service.String(), y.Service.String()); c != 0 {
			return c
		}
		return x.Frontend.Compare(y.Frontend)
	}) {
		for i := 1; i < len(got); i++ {
			if x, y := got[i-1].Service.String(), got[i].Service.String(); x > y {
				t.Errorf("%q sorted before %q", x, y)
			}
		}
		t.Fatal("not in the spelled Services' order")
	}
}

// BenchmarkSortedFailures is the agent's sort of an apply's failures at
// scale: 3,000 frontends the maps left out.
func BenchmarkSortedFailures(b *testing.B) {
	m := failuresOf(3000)
	b.ReportAllocs()
	for b.Loop() {
		sortedFailures(m)
	}
}
