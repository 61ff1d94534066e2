package kube

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/events"

	"github.com/sluice-lb/sluice/pkg/agent"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// The agent tells the source what it could not program.
var _ agent.FailureObserver = (*Source)(nil)

// drain returns the events recorded so far, waiting settle for late ones.
func drain(rec *events.FakeRecorder, settle time.Duration) []string {
	var out []string
	deadline := time.After(settle)
	for {
		select {
		case e := <-rec.Events:
			out = append(out, e)
		case <-deadline:
			return out
		}
	}
}

// One event per Service and cause, however many syncs find it; a cause
// that goes away and comes back is reported again.
func TestEventsOncePerCause(t *testing.T) {
	sctp := service("sctp", "10.96.0.30", 80)
	sctp.Spec.Ports = append(sctp.Spec.Ports, corev1.ServicePort{Name: "assoc", Port: 9999, Protocol: corev1.ProtocolSCTP})
	client := fake.NewClientset(service("first", "10.96.0.10", 80), sctp)
	fr := events.NewFakeRecorder(100)
	rec := &recorder{}
	src := run(t, Config{Client: client, Events: fr, MinSyncPeriod: 50 * time.Millisecond, SyncPeriod: 200 * time.Millisecond}, rec)
	waitFor(t, "first sync", 5*time.Second, func() bool { return rec.count() >= 1 })

	ctx := context.Background()
	// default/second claims first's ClusterIP and port: it loses.
	if _, err := client.CoreV1().Services("default").Create(ctx, service("second", "10.96.0.10", 80), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Several syncs: periodic ones, and one for an unrelated change.
	time.Sleep(400 * time.Millisecond)
	if _, err := client.CoreV1().Services("default").Create(ctx, service("third", "10.96.0.11", 80), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	got := drain(fr, time.Second)
	want := []string{
		"Warning NotServedAsAsked Served in part by this node's proxy (Sluice): ",
		"Warning FrontendConflict Port http (10.96.0.10:80/TCP) not served by this node's proxy (Sluice): Service default/first:http asks for the same address, port and protocol and keeps it.",
	}
	if len(got) != len(want) {
		t.Fatalf("events %q, want one for each of %q", got, want)
	}
	for i, w := range want {
		if !strings.HasPrefix(got[i], w) && !strings.HasPrefix(got[1-i], w) {
			t.Errorf("no event starting %q in %q", w, got)
		}
	}
	if !strings.Contains(strings.Join(got, "\n"), "SCTP") {
		t.Errorf("the NotServedAsAsked event does not name the protocol: %q", got)
	}

	// The winner goes, the loser takes the frontend: the conflict is
	// forgotten. The winner comes back, now the loser: reported again.
	if err := client.CoreV1().Services("default").Delete(ctx, "first", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if _, err := client.CoreV1().Services("default").Create(ctx, service("first", "10.96.0.10", 80), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	got = drain(fr, time.Second)
	if len(got) != 1 || !strings.HasPrefix(got[0], "Warning FrontendConflict Port http (10.96.0.10:80/TCP) not served by this node's proxy (Sluice): Service default/second:http") {
		t.Errorf("after the winner went and came back: events %q, want one conflict on first", got)
	}

	// The agent's failures: one event per cause across applies.
	full := &reconciler.FrontendError{
		Service:  model.ServicePortName{Namespace: "default", Name: "third", Port: "http"},
		Frontend: model.L4Addr{Addr: netip.MustParseAddr("10.96.0.11"), Port: 80, Proto: model.TCP},
		Err:      fmt.Errorf("%w (services: 10 in use of 10); previous programming kept", reconciler.ErrCapacity),
	}
	for range 3 {
		src.SetFailures([]*reconciler.FrontendError{full})
	}
	got = drain(fr, 200*time.Millisecond)
	if len(got) != 1 || !strings.HasPrefix(got[0], "Warning DatapathFull Port http (10.96.0.11:80/TCP) not programmed") ||
		!strings.Contains(got[0], "--max-") {
		t.Errorf("three applies with the same failure: events %q, want one DatapathFull naming the flags", got)
	}
	src.SetFailures(nil)
	src.SetFailures([]*reconciler.FrontendError{full})
	other := *full
	other.Err = errors.Join(reconciler.ErrInvalid, errors.New("70000 backends"))
	src.SetFailures([]*reconciler.FrontendError{&other})
	got = drain(fr, 200*time.Millisecond)
	if len(got) != 2 || !strings.HasPrefix(got[0], "Warning DatapathFull") || !strings.HasPrefix(got[1], "Warning NotRepresentable") {
		t.Errorf("failure gone, back, then another cause: events %q, want DatapathFull then NotRepresentable", got)
	}
	// A Service the cache does not hold gets no event (it needs a UID).
	src.SetFailures([]*reconciler.FrontendError{{Service: model.ServicePortName{Namespace: "default", Name: "gone"}, Frontend: full.Frontend, Err: full.Err}})
	if got = drain(fr, 200*time.Millisecond); len(got) != 0 {
		t.Errorf("event on a Service not in the cache: %q", got)
	}
}

// A Service's translation causes are reported again after its spec
// changed (a new generation), not after a change of its metadata alone.
func TestEventsAgainAfterSpecChange(t *testing.T) {
	sctp := service("sctp", "10.96.0.30", 80)
	sctp.Generation = 1
	sctp.Spec.Ports = append(sctp.Spec.Ports, corev1.ServicePort{Name: "assoc", Port: 9999, Protocol: corev1.ProtocolSCTP})
	client := fake.NewClientset(sctp)
	fr := events.NewFakeRecorder(100)
	rec := &recorder{}
	run(t, Config{Client: client, Events: fr, MinSyncPeriod: 50 * time.Millisecond, SyncPeriod: time.Hour}, rec)
	waitFor(t, "first sync", 5*time.Second, func() bool { return rec.count() >= 1 })
	if got := drain(fr, time.Second); len(got) != 1 || !strings.HasPrefix(got[0], "Warning NotServedAsAsked") {
		t.Fatalf("events %q, want one NotServedAsAsked", got)
	}
	for _, c := range []struct {
		generation int64
		want       int
	}{{1, 0}, {2, 1}} {
		// An annotation changed, and at generation 2 the spec: the
		// tracker translates the Service again for the new generation
		// (a sync within MinSyncPeriod), finding the same cause.
		sctp.Annotations = map[string]string{"example.com/generation": fmt.Sprint(c.generation)}
		sctp.Generation = c.generation
		if _, err := client.CoreV1().Services("default").Update(t.Context(), sctp, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if got := drain(fr, time.Second); len(got) != c.want {
			t.Errorf("update at generation %d: events %q, want %d", c.generation, got, c.want)
		}
	}
}
