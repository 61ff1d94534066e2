// Package agent is Sluice's run loop, shared by every source of desired
// state (manifest files, the Kubernetes API):
//
//	restore ids from the pinned maps -> attach the programs (cgroup for
//	socket load balancing, tc on devices) -> run the source -> apply every
//	desired state it produces
//
// Sources hand over whole desired states. The agent keeps only the newest:
// one goroutine applies states one at a time, so a burst of changes folds
// into the last of them, and a failed apply is retried with exponential
// backoff (or as soon as a newer state arrives) until it succeeds. The agent
// is ready once it has received a state and the reconciler is in sync with
// the newest one. After every apply it tells its Observers (metrics, the
// health check ports).
//
// Stopping (context cancelled, SIGTERM) removes nothing: the programs and
// maps stay pinned and keep serving traffic, and the next agent restores from
// them. Removing everything is an explicit operation (sluice cleanup).
//
// Nothing here knows Kubernetes or eBPF: those live behind Source,
// Datapath and Reconciler.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/sluice-lb/sluice/pkg/model"
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

// Datapath is what the agent needs of pkg/datapath.
type Datapath interface {
	AttachCgroup(path string) error
	AttachDevices(devs []string) error
	// Close releases the agent's handles and leaves pins and links in
	// place, so traffic keeps flowing after the agent exits.
	Close() error
}

// Reconciler is what the agent needs of pkg/reconciler.
type Reconciler interface {
	Restore() error
	Apply(*model.State) error
	InSync() bool
}

// Observer is told about every apply: pkg/metrics.Metrics records it,
// pkg/health's NodePortServer serves the health check ports of every
// state programmed.
type Observer interface {
	// ObserveSync is called after every apply, with how long it took and
	// its error.
	ObserveSync(d time.Duration, err error)
	// SetProgrammed is called with every state applied without error.
	SetProgrammed(s *model.State)
}

// Config says where the agent attaches and how it retries.
type Config struct {
	// Cgroup is the cgroup v2 directory for socket load balancing; empty
	// disables it.
	Cgroup string
	// Devices get tc programs on ingress and egress.
	Devices []string
	// RetryMin and RetryMax bound the backoff between failed applies
	// (defaults 100ms and 10s).
	RetryMin, RetryMax time.Duration
	// Resync re-applies the newest state this often, repairing maps
	// changed behind the agent's back. Zero disables it.
	Resync time.Duration
	// Observers are told about every apply, in order.
	Observers []Observer
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
	appliedN uint64       // newest generation applied without error
	inSync   bool         // reconciler.InSync after applying appliedN
	lastErr  error        // error of the last apply, if it failed
	wake     chan struct{}
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
		cfg:  cfg,
		dp:   dp,
		rec:  rec,
		log:  log,
		wake: make(chan struct{}, 1),
	}
}

// Run restores, attaches and runs src until ctx is done or src fails. It
// closes the datapath handles on return but removes nothing from the kernel.
func (a *Agent) Run(ctx context.Context, src Source) (err error) {
	defer func() {
		if cerr := a.dp.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("close datapath: %w", cerr))
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
	if len(a.cfg.Devices) > 0 {
		if err := a.dp.AttachDevices(a.cfg.Devices); err != nil {
			return fmt.Errorf("attach tc programs to %v: %w", a.cfg.Devices, err)
		}
		a.log.Info("tc programs attached", "devices", a.cfg.Devices)
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

// Ready returns nil once a desired state has been received and the datapath
// matches the newest one, else the reason it does not.
func (a *Agent) Ready() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case a.desired == nil:
		return errors.New("no desired state received yet")
	case a.appliedN != a.desiredN && a.lastErr != nil:
		return fmt.Errorf("applying desired state failed (retrying): %w", a.lastErr)
	case a.appliedN != a.desiredN:
		return errors.New("applying the newest desired state")
	case a.lastErr != nil:
		return fmt.Errorf("re-applying the desired state failed (retrying): %w", a.lastErr)
	case !a.inSync:
		return errors.New("reconciler reports the datapath out of sync")
	}
	return nil
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
	start := time.Now()
	err := a.rec.Apply(s)
	took := time.Since(start)
	// A failed apply may leave the maps half way: the reconciler says
	// whether they still match (a failed resync of the applied state
	// makes the agent not ready until a retry succeeds).
	inSync := err == nil && a.rec.InSync()
	for _, o := range a.cfg.Observers {
		o.ObserveSync(took, err)
		if err == nil {
			o.SetProgrammed(s)
		}
	}
	if err == nil && a.programmed != nil {
		a.programmed.Programmed(s)
	}

	a.mu.Lock()
	a.lastErr = err
	a.inSync = inSync
	if err == nil {
		a.appliedN = n
	}
	a.mu.Unlock()

	if err != nil {
		return err
	}
	if !inSync {
		return fmt.Errorf("generation %d applied but the reconciler reports the datapath out of sync", n)
	}
	level := slog.LevelInfo
	if n == prev {
		level = slog.LevelDebug // a resync of a state already applied
	}
	a.log.Log(context.Background(), level, "desired state applied", "generation", n,
		"services", len(s.Services), "took", took.Round(time.Microsecond))
	return nil
}
