package kube

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/kubeclient"
)

// healthRecorder is a fake Health.
type healthRecorder struct {
	mu       sync.Mutex
	updated  int
	eligible bool
	why      string
	told     int
}

func (h *healthRecorder) Updated() { h.mu.Lock(); h.updated++; h.mu.Unlock() }

func (h *healthRecorder) SetNode(eligible bool, why string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.eligible, h.why = eligible, why
	h.told++
}

func (h *healthRecorder) node() (bool, string, int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.eligible, h.why, h.told
}

// The Node going away (kube-proxy's SyncNode: a deletionTimestamp, or the
// cluster autoscaler's taint) reaches Health; the Node coming back to
// normal too.
func TestNodeEligibility(t *testing.T) {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}
	client := fake.NewClientset(n)
	h := &healthRecorder{}
	rec := &recorder{}
	run(t, Config{Client: client, Health: h}, rec)
	waitFor(t, "the Node seen", 5*time.Second, func() bool { _, _, told := h.node(); return told > 0 })
	if ok, why, _ := h.node(); !ok {
		t.Fatalf("plain Node not eligible: %s", why)
	}
	ctx := context.Background()
	update := func(mutate func(*corev1.Node)) {
		t.Helper()
		kubeclient.UpdateNode(t, ctx, client, node, mutate)
	}
	wait := func(what string, eligible bool, why string) {
		t.Helper()
		waitFor(t, what, 5*time.Second, func() bool { ok, w, _ := h.node(); return ok == eligible && w == why })
	}
	update(func(n *corev1.Node) {
		n.Spec.Taints = []corev1.Taint{{Key: "other", Effect: corev1.TaintEffectNoSchedule}, {Key: toBeDeletedTaint, Effect: corev1.TaintEffectNoSchedule}}
	})
	wait("tainted Node ineligible", false, "node node-a is tainted ToBeDeletedByClusterAutoscaler")
	update(func(n *corev1.Node) { n.Spec.Taints = n.Spec.Taints[:1] })
	wait("untainted Node eligible", true, "")
	update(func(n *corev1.Node) { n.DeletionTimestamp = &metav1.Time{Time: time.Now()} })
	wait("Node being deleted ineligible", false, "node node-a is being deleted")
	if err := client.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	wait("deleted Node ineligible", false, "node node-a deleted")
}

// A Node that does not exist once the caches synced is not eligible, as in
// kube-proxy (its node manager's Node() is nil: NodeEligible false); it is
// once it is created.
func TestMissingNodeIneligible(t *testing.T) {
	client := fake.NewClientset()
	h := &healthRecorder{}
	rec := &recorder{}
	run(t, Config{Client: client, Health: h}, rec)
	waitFor(t, "first sync", 5*time.Second, func() bool { return rec.count() == 1 })
	if ok, why, told := h.node(); ok || why != "node node-a not found" {
		t.Fatalf("no Node: eligible %v (%q, told %d times), want not eligible, not found", ok, why, told)
	}
	if _, err := client.CoreV1().Nodes().Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the Node created eligible", 5*time.Second, func() bool { ok, _, _ := h.node(); return ok })
}

// A change is pending from when it arrives until the state carrying it is
// programmed; before the first sync nothing is (kube-proxy is healthy
// while it starts).
func TestOldestPending(t *testing.T) {
	client := fake.NewClientset()
	h := &healthRecorder{}
	rec := &recorder{}
	src := run(t, Config{Client: client, Health: h, MinSyncPeriod: 200 * time.Millisecond}, rec)
	waitFor(t, "initial sync", 5*time.Second, func() bool { return rec.count() == 1 })
	if p := src.OldestPending(); !p.IsZero() {
		t.Errorf("pending %v after the first sync with nothing changed", p)
	}
	before := time.Now()
	if _, err := client.CoreV1().Services("default").Create(context.Background(), service("web", "10.96.0.10", 80), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the Service handed over", 5*time.Second, func() bool { return rec.count() == 2 })
	// rec is Run's apply, not an agent: nothing reports the state
	// programmed, so the change stays pending.
	p := src.OldestPending()
	if p.Before(before) || time.Since(p) > 5*time.Second {
		t.Fatalf("pending since %v, want the Service's arrival (after %v)", p, before)
	}
	time.Sleep(300 * time.Millisecond)
	if again := src.OldestPending(); !again.Equal(p) {
		t.Errorf("pending moved from %v to %v without a programmed state", p, again)
	}
	src.Programmed(rec.last())
	if p := src.OldestPending(); !p.IsZero() {
		t.Errorf("pending %v after the state was programmed", p)
	}
	h.mu.Lock()
	updated := h.updated
	h.mu.Unlock()
	if updated != 1 {
		t.Errorf("Health.Updated called %d times, want 1", updated)
	}
}

// NodeCIDR mode (Config.PodCIDRs): label changes of the Node go on as
// before, and a change of its podCIDRs ends Run with an error naming the
// old and new ones, as kube-proxy's node manager exits, so that the agent
// restarts and takes them.
func TestPodCIDRsChangeEndsRun(t *testing.T) {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}, Spec: corev1.NodeSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24"}}}
	client := fake.NewClientset(n)
	h := &healthRecorder{}
	src := newSource(t, Config{Client: client, Health: h, PodCIDRs: []string{"10.244.1.0/24"}})
	rec := &recorder{}
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { done <- src.Run(ctx, rec.apply) }()
	waitFor(t, "first sync", 5*time.Second, func() bool { return rec.count() >= 1 })
	kubeclient.UpdateNode(t, ctx, client, node, func(n *corev1.Node) { n.Labels = map[string]string{"a": "b"} })
	waitFor(t, "the label change seen", 5*time.Second, func() bool { _, _, told := h.node(); return told >= 2 })
	select {
	case err := <-done:
		t.Fatalf("Run ended on a label change: %v", err)
	default:
	}

	kubeclient.UpdateNode(t, ctx, client, node, func(n *corev1.Node) {
		n.Spec.PodCIDRs = append(n.Spec.PodCIDRs, "fd00:10:244:1::/64")
	})
	select {
	case err := <-done:
		var changed *PodCIDRsChangedError
		if !errors.As(err, &changed) || !slices.Equal(changed.Old, []string{"10.244.1.0/24"}) ||
			!slices.Equal(changed.New, []string{"10.244.1.0/24", "fd00:10:244:1::/64"}) {
			t.Fatalf("Run returned %v, want the podCIDRs change from [10.244.1.0/24] to [10.244.1.0/24 fd00:10:244:1::/64]", err)
		}
		if !strings.Contains(err.Error(), "node "+node) {
			t.Errorf("error %q does not name the node", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run still running 10s after the Node's podCIDRs changed")
	}
}

// A Node created between Run's finding none in the synced cache and its
// telling Health "not found" ends eligible: onNode's verdict comes after
// (nodeMu), not before to be overwritten. The hook holds Run in that gap
// until the Node's onNode either told Health (the race lost: Run then
// overwrites it) or waits for nodeMu; either way Run then goes on.
func TestNodeCreatedWhileMarkedMissing(t *testing.T) {
	client := fake.NewClientset()
	h := &healthRecorder{}
	rec := &recorder{}
	src := newSource(t, Config{Client: client, Health: h})
	src.nodeChecked = func() {
		if _, err := client.CoreV1().Nodes().Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
			t.Error(err)
			return
		}
		for {
			if ok, _, _ := h.node(); ok || onNodeWaitsForLock() {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}
	testutil.RunUntilCleanup(t, "Run", func(ctx context.Context) error { return src.Run(ctx, rec.apply) })
	waitFor(t, "first sync", 5*time.Second, func() bool { return rec.count() == 1 })
	waitFor(t, "the Node created eligible", 5*time.Second, func() bool { ok, _, told := h.node(); return ok && told == 2 })
}

// onNodeWaitsForLock reports whether a goroutine is blocked on a mutex in
// Source.onNode, from the goroutines' stacks: the one way to see a
// goroutine wait on a lock.
func onNodeWaitsForLock() bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		header, _, _ := strings.Cut(g, "\n")
		if strings.Contains(header, "[sync.Mutex.Lock") && strings.Contains(g, "(*Source).onNode(") {
			return true
		}
	}
	return false
}
