package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/agent"
	"github.com/sluice-lb/sluice/pkg/metrics"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
	"github.com/sluice-lb/sluice/pkg/reconciler/fakedp"
	"github.com/sluice-lb/sluice/pkg/source/kube"
	"github.com/sluice-lb/sluice/pkg/source/translate"
	"github.com/sluice-lb/sluice/test/kube/kubeenv"
)

const nodeName = "node-a"

func startEnv(t *testing.T) *kubeenv.Env {
	t.Helper()
	if os.Getenv("SLUICE_SKIP_KUBE") != "" {
		t.Skip("SLUICE_SKIP_KUBE set")
	}
	return kubeenv.Start(t)
}

// proxy is the Kubernetes source, the agent and the reconciler run
// in-process over a datapath, as cmd/sluice runs them, minus the BPF
// programs.
type proxy struct {
	t       *testing.T
	src     *kube.Source
	rec     *reconciler.Reconciler
	metrics *metrics.Metrics
	applies atomic.Int64 // the states the agent applied
	last    atomic.Pointer[model.State]
	cancel  context.CancelFunc
	done    chan error
}

type proxyOpts struct {
	minSync, sync time.Duration
}

// startProxy runs an agent over dp with a kube source against cfg until
// the test ends (or stop). The agent restores the reconciler from dp
// first.
func startProxy(t *testing.T, cfg *rest.Config, dp reconciler.Datapath, o proxyOpts) *proxy {
	t.Helper()
	if o.sync == 0 {
		o.sync = time.Minute
	}
	cfg = rest.CopyConfig(cfg)
	// Fail fast while the apiserver is down, so relists resume quickly.
	cfg.Timeout = 5 * time.Second
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	p := &proxy{t: t, metrics: metrics.New(), done: make(chan error, 1)}
	p.rec = reconciler.New(dp, log.With("component", "reconciler"))
	p.metrics.SetCapacity(dp.Capacity)
	p.src, err = kube.New(kube.Config{
		Client:            client,
		REST:              cfg, // as cmd/sluice: the slices read from their protobuf
		Options:           translate.Options{Node: translate.Node{Name: nodeName}},
		MinSyncPeriod:     o.minSync,
		SyncPeriod:        o.sync,
		ObserveProgrammed: p.metrics.ObserveProgrammed,
		Changes:           p.metrics, // as cmd/sluice
		Logger:            log,
	})
	if err != nil {
		t.Fatal(err)
	}
	a := agent.New(agent.Config{Observers: []agent.Observer{p.metrics}}, testutil.NoPrograms{}, countApplies{p.rec, &p.applies, &p.last}, log.With("component", "agent"))
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	go func() { p.done <- a.Run(ctx, p.src) }()
	t.Cleanup(p.stop)
	return p
}

// startSyncedProxy starts an apiserver and a proxy over a fake datapath
// syncing every 100ms at most, and waits for its first sync.
func startSyncedProxy(t *testing.T) (kubernetes.Interface, *fakedp.Fake, *proxy) {
	t.Helper()
	env := startEnv(t)
	dp := newFake()
	p := startProxy(t, env.AgentConfig, dp, proxyOpts{minSync: 100 * time.Millisecond})
	waitSynced(t, p.src)
	return env.Client, dp, p
}

// waitSynced waits for src's first sync.
func waitSynced(t *testing.T, src *kube.Source) {
	t.Helper()
	eventually(t, "first sync", 30*time.Second, func() error {
		if !src.Synced() {
			return errors.New("not synced")
		}
		return nil
	})
}

func (p *proxy) stop() {
	if p.cancel == nil {
		return
	}
	p.cancel()
	if err := <-p.done; err != nil {
		p.t.Errorf("agent: %v", err)
	}
	p.cancel = nil
}

// countApplies counts the states the agent applies, and keeps the last.
type countApplies struct {
	*reconciler.Reconciler
	n    *atomic.Int64
	last *atomic.Pointer[model.State]
}

func (c countApplies) Apply(st *model.State) error {
	c.n.Add(1)
	c.last.Store(st)
	return c.Reconciler.Apply(st)
}

// testWriter sends log lines to t.Log, so they show only on failure (or -v).
type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// programmed reads the datapath back: frontend -> its backends, in slot
// order, as the BPF program would walk them.
func programmed(t *testing.T, dp reconciler.Datapath) map[string][]string {
	t.Helper()
	ks, err := dp.Dump()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for fe, m := range ks.Masters {
		bs := []string{}
		for slot := uint32(1); slot <= m.Count; slot++ {
			id, ok := ks.Slots[fe][slot]
			if !ok {
				t.Fatalf("%s: slot %d of %d missing", fe, slot, m.Count)
			}
			b, ok := ks.Backends[id]
			if !ok {
				t.Fatalf("%s: slot %d names missing backend %d", fe, slot, id)
			}
			bs = append(bs, b.String())
		}
		slices.Sort(bs)
		out[fe.String()] = bs
	}
	return out
}

func dumpView(v map[string][]string) string {
	var sb strings.Builder
	for _, fe := range slices.Sorted(maps.Keys(v)) {
		fmt.Fprintf(&sb, "%s -> %v\n", fe, v[fe])
	}
	return sb.String()
}

// emitted reads the last state the agent applied, what the source made of
// the objects: frontend -> its backends, sorted, as programmed shows them.
func emitted(p *proxy) map[string][]string {
	out := map[string][]string{}
	st := p.last.Load()
	if st == nil {
		return out
	}
	for fe, s := range st.Services.All() {
		bs := []string{}
		for _, b := range s.Backends {
			bs = append(bs, b.L4Addr.String())
		}
		out[fe.String()] = bs
	}
	return out
}

// wantProgrammed waits until the datapath holds exactly want for the
// frontends named in want, and none of the frontends in gone.
func wantProgrammed(t *testing.T, dp reconciler.Datapath, want map[string][]string, gone ...string) {
	t.Helper()
	wantView(t, "datapath state", func() map[string][]string { return programmed(t, dp) }, want, gone...)
}

// wantView waits until view holds exactly want for the frontends named in
// want, and none of the frontends in gone.
func wantView(t *testing.T, what string, view func() map[string][]string, want map[string][]string, gone ...string) {
	t.Helper()
	eventually(t, what, 30*time.Second, func() error {
		got := view()
		for fe, bs := range want {
			slices.Sort(bs)
			if g, ok := got[fe]; !ok || !slices.Equal(g, bs) {
				return fmt.Errorf("%s -> %v, want %v; datapath:\n%s", fe, g, bs, dumpView(got))
			}
		}
		for _, fe := range gone {
			if _, ok := got[fe]; ok {
				return fmt.Errorf("%s still programmed; datapath:\n%s", fe, dumpView(got))
			}
		}
		return nil
	})
}

func newFake() *fakedp.Fake { return fakedp.New(1000, 1000, 10000) }

func checkFake(t *testing.T, dp *fakedp.Fake) {
	t.Helper()
	if v := dp.Violations(); len(v) > 0 {
		t.Errorf("datapath invariants violated:\n%s", strings.Join(v, "\n"))
	}
}
