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
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/events"

	"github.com/sluice-lb/sluice/pkg/agent"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// The agent tells the source what it could not program.
var _ agent.FailureObserver = (*Source)(nil)

// drain returns the events recorded so far and within settle, but for the
// proxy's Starting event (proxyevents_test.go checks it). If fewer
// than want came by then, it waits for the rest (at most lateEvents), and
// then settle again for any beyond them. A passing run takes settle, as a
// window alone did; but a window alone failed a test whose sync a loaded
// machine (the race detector's run) held back past it, and the events
// that came a little late were not there to count.
func drain(rec *events.FakeRecorder, settle time.Duration, want int) []string {
	var out []string
	deadline := time.After(settle)
	late := false
	for {
		select {
		case e := <-rec.Events:
			if e == corev1.EventTypeNormal+" "+ReasonStarting+" " {
				continue
			}
			out = append(out, e)
			if late && len(out) >= want {
				late, deadline = false, time.After(settle)
			}
		case <-deadline:
			if late || len(out) >= want {
				return out
			}
			late, deadline = true, time.After(lateEvents)
		}
	}
}

// lateEvents bounds the wait for events a sync owes after drain's window.
const lateEvents = 10 * time.Second

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
	got := drain(fr, time.Second, 2)
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
	got = drain(fr, time.Second, 1)
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
	got = drain(fr, 200*time.Millisecond, 1)
	if len(got) != 1 || !strings.HasPrefix(got[0], "Warning DatapathFull Port http (10.96.0.11:80/TCP) not programmed") ||
		!strings.Contains(got[0], "--max-") {
		t.Errorf("three applies with the same failure: events %q, want one DatapathFull naming the flags", got)
	}
	src.SetFailures(nil)
	src.SetFailures([]*reconciler.FrontendError{full})
	other := *full
	other.Err = errors.Join(reconciler.ErrInvalid, errors.New("70000 backends"))
	src.SetFailures([]*reconciler.FrontendError{&other})
	got = drain(fr, 200*time.Millisecond, 2)
	if len(got) != 2 || !strings.HasPrefix(got[0], "Warning DatapathFull") || !strings.HasPrefix(got[1], "Warning NotRepresentable") {
		t.Errorf("failure gone, back, then another cause: events %q, want DatapathFull then NotRepresentable", got)
	}
	// A Service the cache does not hold gets no event (it needs a UID).
	src.SetFailures([]*reconciler.FrontendError{{Service: model.ServicePortName{Namespace: "default", Name: "gone"}, Frontend: full.Frontend, Err: full.Err}})
	if got = drain(fr, 200*time.Millisecond, 0); len(got) != 0 {
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
	if got := drain(fr, time.Second, 1); len(got) != 1 || !strings.HasPrefix(got[0], "Warning NotServedAsAsked") {
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
		if got := drain(fr, time.Second, c.want); len(got) != c.want {
			t.Errorf("update at generation %d: events %q, want %d", c.generation, got, c.want)
		}
	}
}

// refRecorder records each event with the object it regards (up to 1000
// not taken yet).
type refRecorder struct{ evs chan refEvent }

type refEvent struct {
	kind, name, reason, note string
}

var _ events.EventRecorder = refRecorder{}

func (r refRecorder) Eventf(regarding, _ runtime.Object, _, reason, _, note string, args ...any) {
	ref, _ := regarding.(*corev1.ObjectReference)
	e := refEvent{reason: reason, note: fmt.Sprintf(note, args...)}
	if ref != nil {
		e.kind, e.name = ref.Kind, ref.Name
	}
	r.evs <- e
}

// take returns the events recorded since the last take.
func (r refRecorder) take() []refEvent {
	var out []refEvent
	for {
		select {
		case e := <-r.evs:
			out = append(out, e)
		default:
			return out
		}
	}
}

// byKind counts events by the kind of object they regard.
func byKind(evs []refEvent) map[string]int {
	n := map[string]int{}
	for _, e := range evs {
		n[e.kind]++
	}
	return n
}

// Maps that are full leave out every Service after them: at most
// maxServiceEvents of them get an event of their own, one for all of
// their ports, and one event on the Node counts the rest and names the
// flags to raise. Applies that find the same failures (with other
// numbers in their errors) report nothing new; Services that got
// programmed make room under the bound for the ones left out.
func TestDatapathEventsBounded(t *testing.T) {
	const n = maxServiceEvents + 8
	var objs []runtime.Object
	for i := range n {
		objs = append(objs, service(fmt.Sprintf("svc-%02d", i), fmt.Sprintf("10.96.1.%d", i+1), 80))
	}
	rec := refRecorder{evs: make(chan refEvent, 1000)}
	states := &recorder{}
	src := run(t, Config{Client: fake.NewClientset(objs...), Events: rec, MinSyncPeriod: 10 * time.Millisecond}, states)
	waitFor(t, "first sync", 5*time.Second, func() bool { return states.count() >= 1 })
	rec.take()

	// Each Service fails with two ports: http and metrics.
	failures := func(from int, inUse int) []*reconciler.FrontendError {
		var out []*reconciler.FrontendError
		for i := from; i < n; i++ {
			for k, port := range []string{"http", "metrics"} {
				out = append(out, &reconciler.FrontendError{
					Service:  model.ServicePortName{Namespace: "default", Name: fmt.Sprintf("svc-%02d", i), Port: port},
					Frontend: model.L4Addr{Addr: netip.AddrFrom4([4]byte{10, 96, 1, byte(i + 1)}), Port: uint16(80 + k), Proto: model.TCP},
					Err: fmt.Errorf("%w (10 new IPv4 backends: %d in use of 1000 in sluice_backends); previous programming kept",
						reconciler.ErrCapacity, inUse),
				})
			}
		}
		return out
	}
	src.SetFailures(failures(0, 995))
	got := rec.take()
	if k := byKind(got); k["Service"] != maxServiceEvents || k["Node"] != 1 || len(got) != maxServiceEvents+1 {
		t.Fatalf("%d Services failing, 2 ports each: events by kind %v, want %d on Services and 1 on the Node", n, k, maxServiceEvents)
	}
	for _, e := range got {
		if e.reason != ReasonDatapathFull || !strings.Contains(e.note, "--max-") {
			t.Errorf("event %+v: want %s naming the flags to raise", e, ReasonDatapathFull)
		}
		switch e.kind {
		case "Service":
			if !strings.Contains(e.note, "and 1 more of its ports") {
				t.Errorf("event on %s: %q does not say another port failed too", e.name, e.note)
			}
		case "Node":
			if e.name != node || !strings.Contains(e.note, "8 Services") || !strings.Contains(e.note, "sluicectl status") {
				t.Errorf("event on the Node %s: %q, want node %s, the 8 left out, and where they are listed", e.name, e.note, node)
			}
		}
	}

	// The next apply finds them again, the maps now a little fuller.
	src.SetFailures(failures(0, 1000))
	if got := rec.take(); len(got) != 0 {
		t.Errorf("the same failures again: %d more events, want none: %+v", len(got), got[:min(3, len(got))])
	}

	// Room freed: the first 10 Services are programmed. The 8 left out
	// get their events (30 with one now); none is left out, so no new
	// event on the Node.
	src.SetFailures(failures(10, 1000))
	got = rec.take()
	if k := byKind(got); k["Service"] != 8 || len(got) != 8 {
		t.Errorf("10 Services programmed: events by kind %v, want 8 on the Services left out before", k)
	}
	for _, e := range got {
		if e.name < fmt.Sprintf("svc-%02d", maxServiceEvents) {
			t.Errorf("event on %s, which had one", e.name)
		}
	}

	// All programmed, then full again: reported again, the Node too.
	src.SetFailures(nil)
	src.SetFailures(failures(0, 1000))
	if k := byKind(rec.take()); k["Service"] != maxServiceEvents || k["Node"] != 1 {
		t.Errorf("full again: events by kind %v, want %d on Services and 1 on the Node", k, maxServiceEvents)
	}
}

// A ServiceCIDR-only change makes a new state whose conflicts are the last
// one's: they are not forgotten, so the next Service change does not send
// the same FrontendConflict again.
func TestConflictNotRepeatedAfterServiceCIDRChange(t *testing.T) {
	client := fake.NewClientset(service("first", "10.96.0.10", 80), service("second", "10.96.0.10", 80))
	fr := events.NewFakeRecorder(100)
	rec := &recorder{}
	run(t, Config{Client: client, Events: fr, MinSyncPeriod: 50 * time.Millisecond}, rec)
	if got := drain(fr, time.Second, 1); len(got) != 1 || !strings.HasPrefix(got[0], "Warning FrontendConflict") {
		t.Fatalf("events %q, want one FrontendConflict", got)
	}
	ctx := context.Background()
	if _, err := client.NetworkingV1().ServiceCIDRs().Create(ctx, serviceCIDR("extra", "10.200.0.0/16"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the ServiceCIDR's state", 5*time.Second, func() bool { return cidrsOf(rec.last()) == "[10.200.0.0/16]" })
	if _, err := client.CoreV1().Services("default").Create(ctx, service("third", "10.96.0.11", 80), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "third's state", 5*time.Second, func() bool { return rec.last().Services.Len() == 2 })
	if got := drain(fr, 500*time.Millisecond, 0); len(got) != 0 {
		t.Errorf("after a ServiceCIDR change and an unrelated Service: events %q, want none", got)
	}
}
