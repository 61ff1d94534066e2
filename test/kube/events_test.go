package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/agent"
	"github.com/sluice-lb/sluice/pkg/health"
	"github.com/sluice-lb/sluice/pkg/reconciler"
	"github.com/sluice-lb/sluice/pkg/reconciler/fakedp"
	"github.com/sluice-lb/sluice/pkg/source/kube"
	"github.com/sluice-lb/sluice/pkg/source/translate"
	"github.com/sluice-lb/sluice/test/kube/kubeenv"
)

// eventsOn lists the events.k8s.io/v1 Events the agent reported
// (reportingController sluice) regarding Service ns/name. The apiserver's
// own controllers report on Services too (ClusterIPNotAllocated, from the
// IP allocator's repair loop).
func eventsOn(c kubernetes.Interface, ns, name string) ([]eventsv1.Event, error) {
	l, err := c.EventsV1().Events(ns).List(context.Background(), metav1.ListOptions{
		FieldSelector: "regarding.kind=Service,regarding.name=" + name + ",reportingController=sluice"})
	if err != nil {
		return nil, err
	}
	return l.Items, nil
}

// eventsAgent is the agent startEventsAgent runs, with the
// health.Unprogrammed observer /readyz reports its failures from, as
// runAgent gives it.
type eventsAgent struct {
	*agent.Agent
	unprogrammed *health.Unprogrammed
}

// notProgrammed returns the frontends /readyz?verbose on the metrics
// address lists as not programmed, one line each.
func (a *eventsAgent) notProgrammed(t *testing.T) []string {
	t.Helper()
	return testutil.NotProgrammed(t, health.VerboseReadyz(a.Ready, a.unprogrammed))
}

// startEventsAgent runs, until the test ends, the Kubernetes source (its
// real event broadcaster, with the agent's identity) and an agent over dp,
// with many syncs and resyncs, each finding the causes to report again.
func startEventsAgent(t *testing.T, env *kubeenv.Env, dp reconciler.Datapath) (*kube.Source, *eventsAgent) {
	t.Helper()
	client, err := kubernetes.NewForConfig(env.AgentConfig)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	src, err := kube.New(kube.Config{
		Client:        client,
		Options:       translate.Options{Node: translate.Node{Name: nodeName}},
		MinSyncPeriod: 100 * time.Millisecond,
		SyncPeriod:    500 * time.Millisecond,
		Logger:        log,
	})
	if err != nil {
		t.Fatal(err)
	}
	rec := reconciler.New(dp, log.With("component", "reconciler"))
	u := health.NewUnprogrammed()
	a := agent.New(agent.Config{Observers: []agent.Observer{src, u}, Resync: 300 * time.Millisecond}, testutil.NoPrograms{}, rec, log.With("component", "agent"))
	testutil.RunUntilCleanup(t, "agent", func(ctx context.Context) error { return a.Run(ctx, src) })
	return src, &eventsAgent{Agent: a, unprogrammed: u}
}

// waitEvent waits for exactly one event with reason on Service ns/name and
// returns it.
func waitEvent(t *testing.T, c kubernetes.Interface, ns, name, reason string) eventsv1.Event {
	t.Helper()
	var got eventsv1.Event
	eventually(t, reason+" event on "+ns+"/"+name, 30*time.Second, func() error {
		evs, err := eventsOn(c, ns, name)
		if err != nil {
			return err
		}
		var match []eventsv1.Event
		for _, e := range evs {
			if e.Reason == reason {
				match = append(match, e)
			}
		}
		if len(match) != 1 {
			return fmt.Errorf("%d %s events of %d: %v", len(match), reason, len(evs), evs)
		}
		got = match[0]
		return nil
	})
	return got
}

// Services that cannot be programmed get one Warning event each, through
// the agent's own identity (deploy/'s ClusterRole): a frontend claimed
// twice (the loser), and a Service the maps have no room for. Syncs that
// find the same cause again add none. Per family, over one agent: each
// family's Services are deleted before the next family's come, so each
// finds the maps as empty.
func TestEventsOnUnprogrammableServices(t *testing.T) {
	env := startEnv(t)
	c := env.Client
	// Room for four frontends: default/kubernetes's, and three.
	dp := fakedp.New(4, 100, 100)
	src, _ := startEventsAgent(t, env, dp)
	waitSynced(t, src)

	forFamilies(t, func(t *testing.T, f family) {
		ns := f.namespace(t, c, "events")
		names := []string{"winner", "loser", "overflow"}
		t.Cleanup(func() {
			for _, name := range names {
				err := c.CoreV1().Services(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
				if err != nil && !apierrors.IsNotFound(err) { // not created: the subtest failed before
					t.Errorf("delete service %s/%s: %v", ns, name, err)
				}
			}
			eventually(t, "the maps to hold default/kubernetes's frontend alone", 30*time.Second, func() error {
				if n, _, _ := dp.Sizes(); n != 1 {
					return fmt.Errorf("%d frontends:\n%s", n, dp.String())
				}
				return nil
			})
		})
		extIP := f.externalIP(50)
		withIP := func(s *corev1.Service) { s.Spec.ExternalIPs = []string{extIP} }
		f.service(t, c, ns, "winner", withIP, svcPort("http", 80, "http"))
		// The winner is programmed first, and keeps it. Waited for, not
		// slept on: had a sync not taken the winner in yet when the loser
		// came (300 ms were slept here), both would be newcomers, and
		// within one second of creationTimestamp the first by name wins:
		// "loser".
		eventually(t, "the winner's two frontends programmed", 30*time.Second, func() error {
			if n, _, _ := dp.Sizes(); n != 3 {
				return fmt.Errorf("%d frontends:\n%s", n, dp.String())
			}
			return nil
		})
		// loser asks for winner's external IP and port: of its two
		// frontends (ClusterIP and external IP) it loses the latter. The
		// maps are then full (kubernetes's, winner's two, loser's
		// ClusterIP): overflow's ClusterIP finds no room.
		f.service(t, c, ns, "loser", withIP, svcPort("http", 80, "http"))
		conflict := waitEvent(t, c, ns, "loser", kube.ReasonFrontendConflict)
		f.service(t, c, ns, "overflow", nil, svcPort("http", 80, "http"))
		full := waitEvent(t, c, ns, "overflow", kube.ReasonDatapathFull)
		for _, e := range []eventsv1.Event{conflict, full} {
			if e.Type != corev1.EventTypeWarning || e.Action != "Program" || e.ReportingController != "sluice" ||
				e.Regarding.UID == "" || !strings.Contains(e.Note, "Sluice") {
				t.Errorf("event %s: type %q action %q controller %q regarding %v note %q", e.Reason, e.Type, e.Action,
					e.ReportingController, e.Regarding, e.Note)
			}
		}
		if !strings.Contains(conflict.Note, feOf(extIP, 80)) || !strings.Contains(conflict.Note, ns+"/winner:http") {
			t.Errorf("conflict note %q: want the frontend (%s) and the Service that keeps it", conflict.Note, feOf(extIP, 80))
		}
		if !strings.Contains(full.Note, "--max-") {
			t.Errorf("capacity note %q: want what to raise", full.Note)
		}
		// Several syncs and resyncs later: still one event per cause, no
		// series, none on the winner.
		time.Sleep(3 * time.Second)
		var evs []eventsv1.Event
		for _, name := range []string{"loser", "overflow"} {
			got, err := eventsOn(c, ns, name)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 {
				t.Errorf("after many syncs %d events on %s, want 1: %v", len(got), name, got)
			}
			evs = append(evs, got...)
		}
		for _, e := range evs {
			if e.Series != nil {
				t.Errorf("event %s became a series: the agent reported the same cause again", e.Reason)
			}
		}
		if evs, err := eventsOn(c, ns, "winner"); err != nil || len(evs) != 0 {
			t.Errorf("events on the winner: %v (%v)", evs, err)
		}
	})
}

// growingEndpoints is a Service's endpoints, n of them, at 10.9.0.1 and on.
func growingEndpoints(n int) []ep {
	eps := make([]ep, n)
	for i := range eps {
		eps[i] = ready(fmt.Sprintf("10.9.0.%d", i+1))
	}
	return eps
}

// causeComesBack makes the DatapathFull cause of Service ns/name (whose
// slice is name+"-a") come, go and come back within client-go's
// event-series window (6 minutes): its endpoints grow to grow, past the
// room in the node's backends map, shrink to fit (fits says when the agent
// programmed them all), and grow again. The Service itself does not
// change, so the return is the same Event to the broadcaster (regarding,
// reason): it patches the first into a series of 2.
// (Later returns the broadcaster counts in its cache, and writes when the
// series ends, 6 minutes quiet, or every 30 minutes: not waited for here.)
func causeComesBack(t *testing.T, c kubernetes.Interface, ns, name string, fit, grow int, fits func() error) {
	t.Helper()
	updateSlice(t, c, ns, name+"-a", growingEndpoints(grow)...)
	first := waitEvent(t, c, ns, name, kube.ReasonDatapathFull)
	if first.Series != nil {
		t.Errorf("first %s event already a series: %v", first.Reason, first.Series)
	}
	updateSlice(t, c, ns, name+"-a", growingEndpoints(fit)...)
	eventually(t, "the endpoints to fit again", 30*time.Second, fits)
	updateSlice(t, c, ns, name+"-a", growingEndpoints(grow)...)
	var got eventsv1.Event
	eventually(t, "the event patched into a series", 30*time.Second, func() error {
		evs, err := eventsOn(c, ns, name)
		if err != nil {
			return err
		}
		if len(evs) != 1 {
			return fmt.Errorf("%d events: %v", len(evs), evs)
		}
		got = evs[0]
		if got.Name != first.Name || got.Reason != kube.ReasonDatapathFull {
			return fmt.Errorf("event %s %s, want %s (the first) patched into a series", got.Name, got.Reason, first.Name)
		}
		if got.Series == nil || got.Series.Count != 2 {
			return fmt.Errorf("series %v, want count 2", got.Series)
		}
		return nil
	})
	if !got.Series.LastObservedTime.After(first.EventTime.Time) {
		t.Errorf("series last observed %v, not after the first event's time %v", got.Series.LastObservedTime, first.EventTime)
	}
	if got.Note != first.Note {
		t.Errorf("series note %q, was %q", got.Note, first.Note)
	}
}

// A cause that goes away and comes back within client-go's event-series
// window: the broadcaster patches the Service's Event into a series (its
// count and last observed time move) rather than creating another, with
// the agent's own identity, which deploy/'s ClusterRole lets patch (the
// audit log shows the patches and no request refused).
func TestEventSeriesWhenCauseComesBack(t *testing.T) {
	env := startEnv(t)
	c := env.Client
	const ns, name = "comeback", "grow"
	createNamespace(t, c, ns)
	createService(t, c, ns, name, nil, svcPort("http", 80, "http"))
	createSlice(t, c, makeSlice(ns, name, name+"-a", slicePorts{"http": 8080}, growingEndpoints(4)...))
	// Room for 8 backends: default/kubernetes's one, grow's 4 and not 10.
	dp := fakedp.New(100, 8, 1000)
	src, a := startEventsAgent(t, env, dp)
	fits := func() error {
		if !src.Synced() {
			return errors.New("not synced")
		}
		if u := a.notProgrammed(t); len(u) > 0 {
			return fmt.Errorf("not programmed: %v", u)
		}
		return nil
	}
	eventually(t, "the Service programmed", 30*time.Second, fits)
	causeComesBack(t, c, ns, name, 4, 10, fits)
	patches := 0
	for _, ev := range env.AgentRequests() {
		if ev.ResponseStatus != nil && ev.ResponseStatus.Code == 403 {
			t.Errorf("the apiserver refused the agent %s %s", ev.Verb, ev.RequestURI)
		}
		if ev.Verb == "patch" && ev.ObjectRef != nil && ev.ObjectRef.Resource == "events" {
			patches++
		}
	}
	if patches != 1 {
		t.Errorf("%d patches of events by the agent, want the series' one", patches)
	}
}
