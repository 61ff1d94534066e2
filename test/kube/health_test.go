package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/kubeclient"
	"github.com/sluice-lb/sluice/pkg/agent"
	"github.com/sluice-lb/sluice/pkg/health"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
	"github.com/sluice-lb/sluice/pkg/source/kube"
	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// failingApplies fails every apply while fail is set: a datapath that stopped
// taking writes, so changes stay pending.
type failingApplies struct {
	*reconciler.Reconciler
	fail *atomic.Bool
}

func (f failingApplies) Apply(st *model.State) error {
	if f.fail.Load() {
		return errors.New("injected: the datapath takes no writes")
	}
	return f.Reconciler.Apply(st)
}

// KEP-3836 against a real apiserver: /healthz fails while the agent's Node is
// tainted ToBeDeletedByClusterAutoscaler or being deleted, and /livez stays
// 200 then; both fail once a change waits longer than twice the sync period
// to be programmed.
func TestHealthzFollowsNodeLivezStaleness(t *testing.T) {
	env := startEnv(t)
	ctx := context.Background()
	c := env.Client
	env.CreateNode(ctx, nodeName, "192.0.2.10")

	client, err := kubernetes.NewForConfig(env.AgentConfig)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	const syncPeriod = 2 * time.Second
	var src *kube.Source
	prox := health.NewProxier(2*syncPeriod, func() time.Time { return src.OldestPending() })
	src, err = kube.New(kube.Config{
		Client:        client,
		Options:       translate.Options{Node: translate.Node{Name: nodeName}},
		MinSyncPeriod: 100 * time.Millisecond,
		SyncPeriod:    syncPeriod,
		Health:        prox,
		Logger:        log,
	})
	if err != nil {
		t.Fatal(err)
	}
	var fail atomic.Bool
	rec := reconciler.New(newFake(), log.With("component", "reconciler"))
	a := agent.New(agent.Config{RetryMax: 500 * time.Millisecond}, testutil.NoPrograms{}, failingApplies{rec, &fail}, log.With("component", "agent"))
	testutil.RunUntilCleanup(t, "agent", func(ctx context.Context) error { return a.Run(ctx, src) })
	srv := httptest.NewServer(health.HandlerWith(a.Ready, nil, prox))
	t.Cleanup(srv.Close)

	probe := func(path string) (int, map[string]any, error) {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			return 0, nil, err
		}
		defer func() { _ = resp.Body.Close() }() // read to the end below; nothing to report
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return 0, nil, err
		}
		var body map[string]any
		if err := json.Unmarshal(b, &body); err != nil {
			return 0, nil, fmt.Errorf("%s: %q: %w", path, b, err)
		}
		return resp.StatusCode, body, nil
	}
	want := func(what string, healthz, livez int) {
		t.Helper()
		eventually(t, what, 30*time.Second, func() error {
			for path, code := range map[string]int{"/healthz": healthz, "/livez": livez} {
				got, body, err := probe(path)
				if err != nil {
					return err
				}
				if got != code {
					return fmt.Errorf("%s = %d %v, want %d", path, got, body, code)
				}
			}
			return nil
		})
	}
	// Stays so: a few probes over a sync period.
	stays := func(what string, healthz, livez int) {
		t.Helper()
		for range 5 {
			want(what, healthz, livez)
			time.Sleep(syncPeriod / 4)
		}
	}
	updateNode := func(mutate func(*corev1.Node)) {
		t.Helper()
		kubeclient.UpdateNode(t, ctx, c, nodeName, mutate)
	}

	waitSynced(t, src)
	createService(t, c, "default", "web", nil, svcPort("http", 80, "http"))
	stays("healthy node, programmed", 200, 200)

	updateNode(func(n *corev1.Node) {
		n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: health.ToBeDeletedTaint, Effect: corev1.TaintEffectNoSchedule})
	})
	want("tainted ToBeDeletedByClusterAutoscaler", 503, 200)
	_, body, err := probe("/healthz")
	if err != nil || body["nodeEligible"] != false {
		t.Errorf("/healthz body %v (%v), want nodeEligible false", body, err)
	}
	updateNode(func(n *corev1.Node) { n.Spec.Taints = nil })
	want("taint removed", 200, 200)

	// A finalizer keeps the Node while it is being deleted, as a cloud
	// controller's would.
	updateNode(func(n *corev1.Node) { n.Finalizers = append(n.Finalizers, "sluice.test/hold") })
	if err := c.CoreV1().Nodes().Delete(ctx, nodeName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	want("node being deleted", 503, 200)
	t.Cleanup(func() {
		// Let the Node go, so the apiserver's shutdown is not held up.
		n, err := c.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err == nil {
			n.Finalizers = nil
			_, _ = c.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}) // best effort: the apiserver stops next
		}
	})
	stays("node being deleted, datapath fresh", 503, 200)

	// The datapath stops taking writes: the next change stays pending,
	// and after twice the sync period /livez fails too.
	fail.Store(true)
	createService(t, c, "default", "late", nil, svcPort("http", 80, "http"))
	time.Sleep(syncPeriod) // pending, not late yet
	if code, body, err := probe("/livez"); err != nil || code != 200 {
		t.Errorf("/livez = %d %v (%v) one sync period into a pending change, want 200", code, body, err)
	}
	want("datapath stale", 503, 503)
	fail.Store(false)
	want("datapath caught up (node still going)", 503, 200)
}
