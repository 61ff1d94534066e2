// Package agent is Sluice's run loop, shared by every source of desired
// state (manifest files, the Kubernetes API):
//
//	restore ids from the pinned maps -> attach the programs (cgroup for
//	socket load balancing, tc on devices) -> run the source -> apply every
//	desired state it produces
//
// Sources hand over whole desired states. The agent keeps only the newest:
// one goroutine applies states one at a time, so a burst of changes folds
// into the last of them. After every apply it tells its Observers (metrics,
// the health check ports).
//
// One bad Service never holds up the others. The reconciler programs every
// frontend it can and names each one it could not (reconciler.FrontendError),
// and the agent sorts those into two kinds:
//
//   - permanent: the frontend does not fit in the maps or cannot be
//     represented (a Service with more endpoints than there is room for).
//     Trying the same state again cannot help, so the agent does not: it
//     reports the frontend (one log line when the failure appears or
//     changes its reason, past 32 at once one line counting the rest; a
//     metric labelled with the Service; the readiness body) and tries
//     again when a new desired state arrives (the Service changed, or
//     another one did and may have freed room) or at the next resync;
//   - transient: a map write failed, or something that concerns no one
//     frontend did (reading the maps back). That state is retried with
//     exponential backoff (or as soon as a newer state arrives) until it
//     succeeds.
//
// The agent is ready once it has received a state and everything of the
// newest one that can be programmed is: no transient failure is left, and
// the reconciler is in sync apart from the frontends reported permanently
// failed.
//
// Stopping (context cancelled, SIGTERM) removes nothing: the programs and
// maps stay pinned and keep serving traffic, and the next agent restores from
// them. Removing everything is an explicit operation (sluice cleanup).
//
// Nothing here knows Kubernetes or eBPF: those live behind Source,
// Datapath and Reconciler.
package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// Source produces desired states. Run calls apply with the full desired
// state at start and after every change, and returns when ctx is done (nil)
// or on a fatal error. apply does not block.
type Source interface {
	Run(ctx context.Context, apply func(*model.State)) error
}

// ProgrammedSource is a Source that is told when a state it handed over is
// programmed: after every successful apply, with that state. The Kubernetes
// source takes the network programming latency then.
type ProgrammedSource interface {
	Source
	Programmed(*model.State)
}

// HoldsSource is a Source whose change tracker settles a frontend claimed
// by several Services, none of which holds it yet, in favour of the one
// the datapath holds it for (pkg/source/tracker). The agent hands it the
// reconciler's Holds after Restore and before Run, so that after a restart
// a contested frontend stays with the Service it was programmed for.
type HoldsSource interface {
	Source
	SetHolds(holds func(*model.Service) bool)
}

// Holder is a Reconciler that can tell whether the maps hold a frontend
// exactly as a Service asks (reconciler.Reconciler.Holds).
type Holder interface {
	Holds(*model.Service) bool
}

// Datapath is what the agent needs of pkg/datapath.
type Datapath interface {
	AttachCgroup(path string) error
	AttachDevices(devs []string) error
	// Commit says the start is complete: what opening the datapath
	// changed in its pins (maps converted or resized) stays from then
	// on, even if the agent is killed.
	Commit() error
	// Close releases the agent's handles and leaves pins and links in
	// place, so traffic keeps flowing after the agent exits.
	Close() error
	// Abort is Close for a start that failed before Commit: the previous
	// agent's programs are put back on the hooks the start updated, and
	// the pins as they were before the datapath was opened, for those
	// programs and the next start.
	Abort() error
}

// Reconciler is what the agent needs of pkg/reconciler. Apply's error
// holds a *reconciler.FrontendError per frontend it could not program
// (joined with errors.Join, with any error that concerns no one frontend).
type Reconciler interface {
	Restore() error
	Apply(*model.State) error
	InSync() bool
}

// Observer is told about every apply: pkg/metrics.Metrics records it,
// pkg/health's NodePortServer serves the health check ports of every
// state programmed. SetFailures and SetProgrammed come before ObserveSync,
// so that whoever reads an observer sees a sync end with its state.
type Observer interface {
	// ObserveSync is called after every apply, with how long it took and
	// the error that makes the agent retry it: nil when the apply
	// programmed everything it could, permanent failures aside (those go
	// to a FailureObserver).
	ObserveSync(d time.Duration, err error)
	// SetProgrammed is called with every state applied as far as it can
	// be: without the frontends that permanently failed, if any.
	SetProgrammed(s *model.State)
}

// FailureObserver is an Observer that is also told, after every apply,
// which frontends could not be programmed (none: empty), sorted by
// Service and frontend. pkg/metrics exports them.
type FailureObserver interface {
	Observer
	SetFailures(failures []*reconciler.FrontendError)
}

// Config says where the agent attaches and how it retries.
type Config struct {
	// Cgroup is the cgroup v2 directory for socket load balancing; empty
	// disables it.
	Cgroup string
	// Devices get tc programs on ingress and egress.
	Devices []string
	// DevicesNow, if set, says which devices those are at the moment
	// they are attached, in place of Devices (cmd/sluice: the exact
	// --devices and the links their patterns match then: a pod's veth
	// gone since Devices was listed is not an error).
	DevicesNow func() ([]string, error)
	// FollowDevices, if set, runs in a goroutine of its own from the
	// start's Commit until Run returns, before the datapath is closed
	// (cmd/sluice: the links the --devices patterns match, followed as
	// they come and go; without --devices, the overlay tunnels that
	// appear or get their routes after the start).
	FollowDevices func(ctx context.Context, dp Datapath)
	// RetryMin and RetryMax bound the backoff between failed applies
	// (defaults 100ms and 10s).
	RetryMin, RetryMax time.Duration
	// Resync re-applies the newest state this often, repairing maps
	// changed behind the agent's back. Zero disables it.
	Resync time.Duration
	// Observers are told about every apply, in order.
	Observers []Observer
	// BeforeFirstApply, if set, is called once, right before the first
	// Apply (cmd/sluice: a collection; see there).
	BeforeFirstApply func()
}

// Agent drives one datapath from one source.
type Agent struct {
	cfg Config
	dp  Datapath
	rec Reconciler
	log *slog.Logger
	// programmed is the source run, if it is a ProgrammedSource; set
	// before the apply goroutine starts.
	programmed ProgrammedSource

	mu       sync.Mutex
	desired  *model.State // newest state received, nil before the first
	desiredN uint64       // generation of desired
	appliedN uint64       // newest generation applied as far as it can be
	inSync   bool         // the datapath matched appliedN after its apply
	lastErr  error        // transient error of the last apply, if any
	wake     chan struct{}
	// applying says an Apply was started (BeforeFirstApply called);
	// the apply goroutine's.
	applying bool

	// reported are the permanent failures logged, by frontend (the
	// apply goroutine's): logged again only when the Service or the
	// reason changes.
	reported map[model.L4Addr]*reconciler.FrontendError
}

// New returns an agent over dp and rec.
func New(cfg Config, dp Datapath, rec Reconciler, log *slog.Logger) *Agent {
	if cfg.RetryMin <= 0 {
		cfg.RetryMin = 100 * time.Millisecond
	}
	if cfg.RetryMax < cfg.RetryMin {
		cfg.RetryMax = max(10*time.Second, cfg.RetryMin)
	}
	return &Agent{
		cfg:      cfg,
		dp:       dp,
		rec:      rec,
		log:      log,
		wake:     make(chan struct{}, 1),
		reported: map[model.L4Addr]*reconciler.FrontendError{},
	}
}

// Run restores, attaches and runs src until ctx is done or src fails. It
// closes the datapath handles on return but removes nothing from the
// kernel; a start that fails before everything is attached puts the pins
// back as they were (Datapath.Abort).
func (a *Agent) Run(ctx context.Context, src Source) (err error) {
	started := false
	defer func() {
		closeDP, what := a.dp.Close, "close datapath"
		if err != nil && !started {
			closeDP, what = a.dp.Abort, "put the datapath's pins back"
		}
		if cerr := closeDP(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("%s: %w", what, cerr))
		}
	}()
	if err := a.rec.Restore(); err != nil {
		return fmt.Errorf("restore state from pinned maps: %w", err)
	}
	if a.cfg.Cgroup != "" {
		if err := a.dp.AttachCgroup(a.cfg.Cgroup); err != nil {
			return fmt.Errorf("attach socket load balancing to cgroup %s: %w", a.cfg.Cgroup, err)
		}
		a.log.Info("socket load balancing attached", "cgroup", a.cfg.Cgroup)
	}
	devs := a.cfg.Devices
	if a.cfg.DevicesNow != nil {
		if devs, err = a.cfg.DevicesNow(); err != nil {
			return err
		}
	}
	if len(devs) > 0 {
		if err := a.dp.AttachDevices(devs); err != nil {
			return fmt.Errorf("attach tc programs to %v: %w", devs, err)
		}
		a.log.Info("tc programs attached", "devices", devs)
	}
	// Before the first apply writes the maps.
	if err := a.dp.Commit(); err != nil {
		return fmt.Errorf("complete the datapath's start: %w", err)
	}
	started = true
	if a.cfg.FollowDevices != nil {
		fctx, stopFollowing := context.WithCancel(ctx)
		followed := make(chan struct{})
		go func() {
			defer close(followed)
			a.cfg.FollowDevices(fctx, a.dp)
		}()
		// Before the datapath closes (the defer above runs after).
		defer func() { stopFollowing(); <-followed }()
	}

	if hs, ok := src.(HoldsSource); ok {
		if h, ok := a.rec.(Holder); ok {
			hs.SetHolds(h.Holds)
		}
	}
	a.programmed, _ = src.(ProgrammedSource)
	wctx, stopWorker := context.WithCancel(ctx)
	workerDone := make(chan struct{})
	go func() {
		defer close(workerDone)
		a.applyLoop(wctx)
	}()
	srcErr := src.Run(ctx, a.Submit)
	stopWorker()
	<-workerDone
	if srcErr != nil && ctx.Err() == nil {
		return fmt.Errorf("source: %w", srcErr)
	}
	a.log.Info("stopping; datapath left in place")
	return nil
}

// Submit hands the agent a new desired state. It never blocks; the state
// replaces any not yet applied. Sources call it through Run's apply.
func (a *Agent) Submit(s *model.State) {
	a.mu.Lock()
	a.desired = s
	a.desiredN++
	a.mu.Unlock()
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// Ready returns nil once a desired state has been received and everything
// of the newest one that can be programmed is (the FailureObservers are
// told what cannot: /readyz lists it, pkg/health's Unprogrammed), else
// the reason it is not.
func (a *Agent) Ready() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case a.desired == nil:
		return errors.New("no desired state received yet")
	case a.appliedN != a.desiredN && a.lastErr != nil:
		return &notReady{why: "applying desired state failed (retrying)", err: a.lastErr}
	case a.appliedN != a.desiredN:
		return errors.New("applying the newest desired state")
	case a.lastErr != nil:
		return &notReady{why: "re-applying the desired state failed (retrying)", err: a.lastErr}
	case !a.inSync:
		return errors.New("reconciler reports the datapath out of sync")
	}
	return nil
}

// notReady is Ready's reason when an apply failed: why, then the error,
// which may name Services and their addresses (a failed write's) and be
// long (every write that failed). Short gives why alone without
// formatting err: what the health address, which any pod may ask, says
// (pkg/health).
type notReady struct {
	why string
	err error
}

func (e *notReady) Error() string { return e.why + ": " + e.err.Error() }
func (e *notReady) Unwrap() error { return e.err }
func (e *notReady) Short() string { return e.why }

// sortedFailures returns the failures by Service (as spelled), then
// frontend.
func sortedFailures(m map[model.L4Addr]*reconciler.FrontendError) []*reconciler.FrontendError {
	out := slices.AppendSeq(make([]*reconciler.FrontendError, 0, len(m)), maps.Values(m))
	slices.SortFunc(out, func(x, y *reconciler.FrontendError) int {
		return cmp.Or(x.Service.Compare(y.Service), x.Frontend.Compare(y.Frontend))
	})
	return out
}

// applyLoop applies the newest desired state whenever one arrives, retries
// failures with backoff, and re-applies every cfg.Resync.
func (a *Agent) applyLoop(ctx context.Context) {
	backoff := a.cfg.RetryMin
	var retry <-chan time.Time
	var resync <-chan time.Time
	if a.cfg.Resync > 0 {
		t := time.NewTicker(a.cfg.Resync)
		defer t.Stop()
		resync = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.wake:
			backoff = a.cfg.RetryMin // a new state deserves a fresh try
		case <-retry:
		case <-resync:
		}
		retry = nil
		if err := a.applyNewest(); err != nil {
			a.log.Error("apply desired state failed", "err", err, "retry_in", backoff)
			retry = time.After(backoff)
			backoff = min(2*backoff, a.cfg.RetryMax)
		} else {
			backoff = a.cfg.RetryMin
		}
	}
}

func (a *Agent) applyNewest() error {
	a.mu.Lock()
	s, n, prev := a.desired, a.desiredN, a.appliedN
	a.mu.Unlock()
	if s == nil {
		return nil
	}
	if !a.applying {
		a.applying = true
		if a.cfg.BeforeFirstApply != nil {
			a.cfg.BeforeFirstApply()
		}
	}
	start := time.Now()
	err := a.rec.Apply(s)
	took := time.Since(start)
	failures, transient := splitApplyError(err)
	// A failed apply may leave the maps half way: the reconciler says
	// whether they still match (a failed resync of the applied state
	// makes the agent not ready until a retry succeeds). Permanent
	// failures make it report them out of sync, and leave nothing half
	// way: they are found before any write.
	applied := transient == nil
	inSync := applied && (err != nil || a.rec.InSync())
	programmed := s
	if applied && len(failures) > 0 {
		programmed = without(s, failures)
	}
	// The state first, then the sync: a metrics scrape between the two
	// must not see a sync finished (its timestamp set) beside the
	// counts of the state before it.
	for _, o := range a.cfg.Observers {
		if fo, ok := o.(FailureObserver); ok {
			fo.SetFailures(sortedFailures(failures))
		}
		if applied {
			o.SetProgrammed(programmed)
		}
		o.ObserveSync(took, transient)
	}
	if applied && a.programmed != nil {
		a.programmed.Programmed(s)
	}

	a.mu.Lock()
	a.lastErr = transient
	a.inSync = inSync
	if applied {
		a.appliedN = n
	}
	a.mu.Unlock()
	a.reportFailures(failures)

	if transient != nil {
		return transient
	}
	if !inSync {
		return fmt.Errorf("generation %d applied but the reconciler reports the datapath out of sync", n)
	}
	level := slog.LevelInfo
	if n == prev {
		level = slog.LevelDebug // a resync of a state already applied
	}
	a.log.Log(context.Background(), level, "desired state applied", "generation", n,
		"services", s.Services.Len(), "unprogrammed", len(failures), "took", took.Round(time.Microsecond))
	return nil
}

// splitApplyError sorts the error of an Apply: the frontends that failed,
// by frontend, and the error that calls for a retry (nil if none does):
// the transient frontend failures and whatever concerns no one frontend.
func splitApplyError(err error) (map[model.L4Addr]*reconciler.FrontendError, error) {
	failures := map[model.L4Addr]*reconciler.FrontendError{}
	var transient []error
	var walk func(error)
	walk = func(err error) {
		if joined, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range joined.Unwrap() {
				walk(e)
			}
			return
		}
		var fe *reconciler.FrontendError
		if !errors.As(err, &fe) {
			transient = append(transient, err)
			return
		}
		failures[fe.Frontend] = fe
		if !fe.Permanent() {
			transient = append(transient, err)
		}
	}
	if err != nil {
		walk(err)
	}
	return failures, errors.Join(transient...)
}

// without returns s without the failed frontends (a copy; s is shared).
func without(s *model.State, failures map[model.L4Addr]*reconciler.FrontendError) *model.State {
	b := s.Services.Edit()
	for fe := range failures {
		b.Delete(fe)
	}
	return &model.State{Services: b.Services()}
}

// maxLogged is how many frontends reportFailures logs one by one after an
// apply, as failing and as no longer failing each; the rest get one line
// per reason. Maps that are full leave out every Service after them, all
// at once: thousands of lines would bury the log and say nothing the
// metric (sluice_service_unprogrammed_frontends) and sluicectl status do
// not.
const maxLogged = 32

// reportFailures logs each permanent failure once, when it appears or its
// Service or reason changes, and each that went away; past maxLogged of
// either, it counts them in one line. (Transient failures are logged with
// every failed apply, whose retries back off.)
func (a *Agent) reportFailures(failures map[model.L4Addr]*reconciler.FrontendError) {
	logged, more := 0, map[string]int{}
	for _, f := range sortedFailures(failures) {
		if !f.Permanent() {
			continue
		}
		if old := a.reported[f.Frontend]; old != nil && old.Service == f.Service && old.Reason() == f.Reason() {
			continue
		}
		a.reported[f.Frontend] = f
		if logged == maxLogged {
			more[f.Reason()]++
			continue
		}
		logged++
		a.log.Warn("service not programmed; the others are", "service", f.Service.String(),
			"frontend", f.Frontend.String(), "reason", f.Reason(), "err", f.Err)
	}
	for _, reason := range slices.Sorted(maps.Keys(more)) {
		a.log.Warn("more services not programmed, not logged one by one; sluicectl status lists them", "reason", reason,
			"frontends", more[reason], "logged", logged)
	}
	gone, notLogged := 0, 0
	for _, fe := range slices.SortedFunc(maps.Keys(a.reported), model.L4Addr.Compare) {
		if f := failures[fe]; f != nil && f.Permanent() {
			continue
		}
		old := a.reported[fe]
		delete(a.reported, fe)
		if failures[fe] != nil {
			continue
		}
		if gone == maxLogged {
			notLogged++
			continue
		}
		gone++
		a.log.Info("service no longer failing", "service", old.Service.String(), "frontend", fe.String())
	}
	if notLogged > 0 {
		a.log.Info("more services no longer failing, not logged one by one", "frontends", notLogged, "logged", gone)
	}
}
