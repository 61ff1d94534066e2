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
	"testing"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/model"
)

// recorder logs the calls the agent makes, in order.
type recorder struct {
	mu    sync.Mutex
	calls []string
}

func (r *recorder) add(format string, args ...any) {
	r.mu.Lock()
	r.calls = append(r.calls, fmt.Sprintf(format, args...))
	r.mu.Unlock()
}

func (r *recorder) list() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

type fakeDatapath struct{ *recorder }

func (d fakeDatapath) AttachCgroup(p string) error     { d.add("attach-cgroup %s", p); return nil }
func (d fakeDatapath) AttachDevices(ds []string) error { d.add("attach-devices %v", ds); return nil }
func (d fakeDatapath) Commit() error                   { d.add("commit"); return nil }
func (d fakeDatapath) Close() error                    { d.add("close"); return nil }
func (d fakeDatapath) Abort() error                    { d.add("abort"); return nil }

type fakeReconciler struct {
	*recorder
	restoreErr error
	mu         sync.Mutex
	failures   int           // Apply fails this many times first
	gate       chan struct{} // if set, Apply waits on it
	applied    []*model.State
	inSync     bool
}

func (r *fakeReconciler) Restore() error { r.add("restore"); return r.restoreErr }

func (r *fakeReconciler) Apply(s *model.State) error {
	if r.gate != nil {
		<-r.gate
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.add("apply %d", s.Services.Len())
	if r.failures > 0 {
		r.failures--
		r.inSync = false
		return errors.New("map full")
	}
	r.applied = append(r.applied, s)
	r.inSync = true
	return nil
}

func (r *fakeReconciler) InSync() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.inSync
}

func (r *fakeReconciler) appliedStates() []*model.State {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.applied)
}

// chanSource hands over every state sent on its channel.
type chanSource struct {
	states chan *model.State
	err    error // returned when states is closed
}

func (s chanSource) Run(ctx context.Context, apply func(*model.State)) error {
	for ctx.Err() == nil {
		select {
		case <-ctx.Done(): // the loop ends
		case st, ok := <-s.states:
			if !ok {
				return s.err
			}
			apply(st)
		}
	}
	return nil
}

func stateWith(n int) *model.State {
	s := model.NewState()
	for i := range n {
		fe := model.L4Addr{Addr: netip.AddrFrom4([4]byte{10, 96, 0, byte(i + 1)}), Port: 80, Proto: model.TCP}
		s.Services.Set(fe, &model.Service{Frontend: fe})
	}
	return s
}

// eventually waits up to 5s, the bound of every wait in these tests.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testutil.EventuallyTrue(t, what, 5*time.Second, cond)
}

type harness struct {
	rec    *recorder
	recon  *fakeReconciler
	agent  *Agent
	src    chanSource
	cancel context.CancelFunc
	done   chan error
}

func start(t *testing.T, cfg Config, recon *fakeReconciler, srcErr error) *harness {
	t.Helper()
	h := &harness{rec: recon.recorder, recon: recon, src: chanSource{states: make(chan *model.State), err: srcErr}}
	if cfg.RetryMin == 0 {
		cfg.RetryMin, cfg.RetryMax = time.Millisecond, 4*time.Millisecond
	}
	h.agent = New(cfg, fakeDatapath{recon.recorder}, recon, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	h.done = make(chan error, 1)
	go func() { h.done <- h.agent.Run(ctx, h.src) }()
	t.Cleanup(func() {
		cancel()
		// A source that fails ends Run with its error, which that
		// test checks; otherwise a cancel ends Run cleanly.
		if err := <-h.done; err != nil && srcErr == nil {
			t.Errorf("Run after cancel = %v, want nil", err)
		}
	})
	return h
}

func (h *harness) stop(t *testing.T) error {
	t.Helper()
	h.cancel()
	select {
	case err := <-h.done:
		h.done <- err // for the cleanup
		return err
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
		return nil
	}
}

func TestRunRestoresThenAttachesThenApplies(t *testing.T) {
	recon := &fakeReconciler{recorder: &recorder{}}
	h := start(t, Config{Cgroup: "/sys/fs/cgroup/test", Devices: []string{"eth0", "eth1"}}, recon, nil)

	eventually(t, "attach", func() bool { return len(h.rec.list()) >= 3 })
	if err := h.agent.Ready(); err == nil {
		t.Fatal("ready before any desired state was received")
	}
	h.src.states <- stateWith(2)
	eventually(t, "ready", func() bool { return h.agent.Ready() == nil })

	if err := h.stop(t); err != nil {
		t.Fatalf("Run after cancel = %v, want nil", err)
	}
	want := []string{"restore", "attach-cgroup /sys/fs/cgroup/test", "attach-devices [eth0 eth1]", "commit", "apply 2", "close"}
	if got := h.rec.list(); !slices.Equal(got, want) {
		t.Errorf("calls = %q\nwant    %q", got, want)
	}
}

// TestBeforeFirstApplyOnce: the hook runs once, right before the first
// Apply, not before the retries of a failed one or before later states.
func TestBeforeFirstApplyOnce(t *testing.T) {
	recon := &fakeReconciler{recorder: &recorder{}, failures: 1}
	h := start(t, Config{BeforeFirstApply: func() { recon.add("before first apply") }}, recon, nil)
	h.src.states <- stateWith(1)
	eventually(t, "ready", func() bool { return h.agent.Ready() == nil })
	h.src.states <- stateWith(2)
	eventually(t, "second state applied", func() bool { return len(recon.appliedStates()) == 2 })
	if err := h.stop(t); err != nil {
		t.Fatalf("Run after cancel = %v, want nil", err)
	}
	want := []string{"restore", "commit", "before first apply", "apply 1", "apply 1", "apply 2", "close"}
	if got := h.rec.list(); !slices.Equal(got, want) {
		t.Errorf("calls = %q\nwant    %q", got, want)
	}
}

func TestSocketLBOffSkipsCgroup(t *testing.T) {
	recon := &fakeReconciler{recorder: &recorder{}}
	h := start(t, Config{}, recon, nil)
	h.src.states <- stateWith(1)
	eventually(t, "ready", func() bool { return h.agent.Ready() == nil })
	if err := h.stop(t); err != nil {
		t.Fatalf("Run after cancel = %v, want nil", err)
	}
	for _, c := range h.rec.list() {
		if c != "restore" && c != "commit" && c != "apply 1" && c != "close" {
			t.Errorf("unexpected call %q with no cgroup and no devices", c)
		}
	}
}

func TestFailedApplyIsRetriedUntilItSucceeds(t *testing.T) {
	// Each Apply takes a token from the gate: the first one fails, and
	// the retries wait until the check below has seen the failure in
	// Ready. (With retries 50 ms apart and no gate, the failure showed
	// for about 150 ms, which a poller that a loaded machine holds back,
	// under the race detector, could miss, and then wait out its bound.)
	gate := make(chan struct{}, 4)
	defer close(gate) // before the harness stops: a later Apply, if any, does not block its end
	recon := &fakeReconciler{recorder: &recorder{}, failures: 3, gate: gate}
	h := start(t, Config{RetryMin: time.Millisecond, RetryMax: 4 * time.Millisecond}, recon, nil)
	gate <- struct{}{}
	h.src.states <- stateWith(1)
	eventually(t, "a failed apply to show in Ready", func() bool {
		err := h.agent.Ready()
		return err != nil && strings.Contains(err.Error(), "map full")
	})
	for range 3 {
		gate <- struct{}{}
	}
	eventually(t, "ready after retries", func() bool { return h.agent.Ready() == nil })
	applies := 0
	for _, c := range h.rec.list() {
		if c == "apply 1" {
			applies++
		}
	}
	if applies != 4 {
		t.Errorf("Apply called %d times, want 4 (3 failures, 1 success)", applies)
	}
	if got := recon.appliedStates(); len(got) != 1 || got[0].Services.Len() != 1 {
		t.Errorf("applied states = %v", got)
	}
}

func TestBurstFoldsIntoNewestState(t *testing.T) {
	gate := make(chan struct{})
	recon := &fakeReconciler{recorder: &recorder{}, gate: gate}
	h := start(t, Config{}, recon, nil)

	// Submit, not the channel: a send returns once the source has the
	// state, before it hands it to the agent, so the newest might not be
	// the agent's yet when the gate opens (seen under load).
	h.agent.Submit(stateWith(1))
	// The first apply blocks on the gate; these pile up behind it.
	for n := 2; n <= 6; n++ {
		h.agent.Submit(stateWith(n))
	}
	if err := h.agent.Ready(); err == nil {
		t.Fatal("ready while an apply is still pending")
	}
	close(gate)
	eventually(t, "ready", func() bool { return h.agent.Ready() == nil })
	got := recon.appliedStates()
	if last := got[len(got)-1]; last.Services.Len() != 6 {
		t.Errorf("last applied state has %d services, want the newest (6)", last.Services.Len())
	}
	if len(got) > 3 {
		t.Errorf("%d applies for a burst of 6 states; want them folded (<= 3)", len(got))
	}
}

func TestNewerStateMakesItNotReadyUntilApplied(t *testing.T) {
	recon := &fakeReconciler{recorder: &recorder{}}
	h := start(t, Config{}, recon, nil)
	h.src.states <- stateWith(1)
	eventually(t, "ready", func() bool { return h.agent.Ready() == nil })

	recon.mu.Lock()
	recon.failures = 1000 // every later apply fails
	recon.mu.Unlock()
	h.src.states <- stateWith(2)
	eventually(t, "not ready", func() bool { return h.agent.Ready() != nil })
	// It stays not ready while the newest state cannot be applied.
	time.Sleep(20 * time.Millisecond)
	if h.agent.Ready() == nil {
		t.Fatal("ready although the newest desired state was never applied")
	}
}

// TestRestoreFailureStopsBeforeAttaching: and the start failed, so the
// datapath is aborted (its pins put back), not closed.
func TestRestoreFailureStopsBeforeAttaching(t *testing.T) {
	recon := &fakeReconciler{recorder: &recorder{}, restoreErr: errors.New("bad pin")}
	a := New(Config{Cgroup: "/cg", Devices: []string{"eth0"}}, fakeDatapath{recon.recorder}, recon, slog.New(slog.DiscardHandler))
	err := a.Run(context.Background(), chanSource{states: make(chan *model.State)})
	if err == nil || !strings.Contains(err.Error(), "bad pin") {
		t.Fatalf("Run = %v, want the restore error", err)
	}
	if got, want := recon.list(), []string{"restore", "abort"}; !slices.Equal(got, want) {
		t.Errorf("calls = %q, want %q", got, want)
	}
}

func TestSourceErrorEndsRun(t *testing.T) {
	recon := &fakeReconciler{recorder: &recorder{}}
	h := start(t, Config{}, recon, errors.New("watch failed"))
	close(h.src.states)
	select {
	case err := <-h.done:
		h.done <- err
		if err == nil || !strings.Contains(err.Error(), "watch failed") {
			t.Fatalf("Run = %v, want the source's error", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after the source failed")
	}
}

type countingObserver struct {
	mu              sync.Mutex
	syncs, failures int
	programmed      int // services in the last programmed state
	// programmedAtSync is programmed when the last successful sync was
	// observed: a scrape between the two calls must not see a finished
	// sync beside the state before it.
	programmedAtSync int
}

func (o *countingObserver) ObserveSync(_ time.Duration, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.syncs++
	if err != nil {
		o.failures++
		return
	}
	o.programmedAtSync = o.programmed
}

func (o *countingObserver) SetProgrammed(s *model.State) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.programmed = s.Services.Len()
}

// TestObserverSeesEveryApply: every observer (metrics and the health
// check ports, in the agent) is told about every apply.
func TestObserverSeesEveryApply(t *testing.T) {
	obs := []*countingObserver{{}, {}}
	recon := &fakeReconciler{recorder: &recorder{}, failures: 2}
	h := start(t, Config{Observers: []Observer{obs[0], obs[1]}}, recon, nil)
	h.src.states <- stateWith(4)
	eventually(t, "ready", func() bool { return h.agent.Ready() == nil })
	for i, obs := range obs {
		obs.mu.Lock()
		if obs.syncs != 3 || obs.failures != 2 || obs.programmed != 4 {
			t.Errorf("observer %d saw %d syncs, %d failures, %d services programmed; want 3, 2, 4",
				i, obs.syncs, obs.failures, obs.programmed)
		}
		if obs.programmedAtSync != 4 {
			t.Errorf("observer %d was told of the successful sync when %d services were programmed, want 4: "+
				"the state goes to an observer before the sync that programmed it", i, obs.programmedAtSync)
		}
		obs.mu.Unlock()
	}
}

func TestFailedResyncMakesItNotReadyUntilRepaired(t *testing.T) {
	recon := &fakeReconciler{recorder: &recorder{}}
	h := start(t, Config{Resync: 5 * time.Millisecond}, recon, nil)
	h.src.states <- stateWith(1)
	eventually(t, "ready", func() bool { return h.agent.Ready() == nil })

	recon.mu.Lock()
	recon.failures = 50 // the next resyncs fail for a while (~200ms of retries)
	recon.mu.Unlock()
	eventually(t, "not ready after a failed resync", func() bool {
		err := h.agent.Ready()
		return err != nil && strings.Contains(err.Error(), "map full")
	})
	eventually(t, "ready again once a resync succeeds", func() bool { return h.agent.Ready() == nil })
}

func TestResyncReappliesNewestState(t *testing.T) {
	recon := &fakeReconciler{recorder: &recorder{}}
	h := start(t, Config{Resync: 5 * time.Millisecond}, recon, nil)
	h.src.states <- stateWith(3)
	eventually(t, "several re-applies", func() bool { return len(recon.appliedStates()) >= 3 })
	for _, s := range recon.appliedStates() {
		if s.Services.Len() != 3 {
			t.Fatalf("resync applied a state with %d services, want 3", s.Services.Len())
		}
	}
}

// failingAttach is a fakeDatapath whose devices cannot be attached.
type failingAttach struct{ fakeDatapath }

func (d failingAttach) AttachDevices(ds []string) error {
	d.add("attach-devices %v", ds)
	return errors.New("no such device")
}

// TestAttachFailureAborts: a start that fails at attaching puts the
// datapath's pins back (Abort) instead of keeping what Open changed; one
// that attached commits them before the first apply, and closes.
func TestAttachFailureAborts(t *testing.T) {
	recon := &fakeReconciler{recorder: &recorder{}}
	a := New(Config{Cgroup: "/cg", Devices: []string{"eth9"}}, failingAttach{fakeDatapath{recon.recorder}}, recon, slog.New(slog.DiscardHandler))
	err := a.Run(context.Background(), chanSource{states: make(chan *model.State)})
	if err == nil || !strings.Contains(err.Error(), "no such device") {
		t.Fatalf("Run = %v, want the attach error", err)
	}
	want := []string{"restore", "attach-cgroup /cg", "attach-devices [eth9]", "abort"}
	if got := recon.list(); !slices.Equal(got, want) {
		t.Errorf("calls = %q, want %q", got, want)
	}
}

// TestFollowDevicesBetweenCommitAndClose: the devices are listed when they
// are attached (DevicesNow, not Devices), and FollowDevices runs from the
// start's Commit until Run returns, ending before the datapath closes.
func TestFollowDevicesBetweenCommitAndClose(t *testing.T) {
	recon := &fakeReconciler{recorder: &recorder{}}
	cfg := Config{
		Devices:    []string{"eth0", "veth1"},
		DevicesNow: func() ([]string, error) { recon.add("list devices"); return []string{"eth0", "veth2"}, nil },
		FollowDevices: func(ctx context.Context, dp Datapath) {
			if _, ok := dp.(fakeDatapath); !ok {
				recon.add("follow: not the agent's datapath")
			}
			recon.add("follow devices")
			<-ctx.Done()
			recon.add("follow devices stopped")
		},
	}
	h := start(t, cfg, recon, nil)
	h.src.states <- stateWith(1)
	eventually(t, "ready", func() bool { return h.agent.Ready() == nil })
	eventually(t, "following", func() bool { return slices.Contains(h.rec.list(), "follow devices") })
	if err := h.stop(t); err != nil {
		t.Fatalf("Run after cancel = %v, want nil", err)
	}
	got := h.rec.list()
	// The apply and the follow start run concurrently after the commit.
	got = slices.DeleteFunc(got, func(c string) bool { return c == "apply 1" })
	want := []string{"restore", "list devices", "attach-devices [eth0 veth2]", "commit", "follow devices", "follow devices stopped", "close"}
	if !slices.Equal(got, want) {
		t.Errorf("calls (apply left out) = %q\nwant    %q", got, want)
	}
}
