package kube

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/sluice-lb/sluice/pkg/reconciler/fakedp"
	"github.com/sluice-lb/sluice/pkg/source/kube"
)

// nodeEvents lists the events.k8s.io/v1 Events the agent reported on its
// Node (in namespace default, as events about cluster-scoped objects are),
// but for its Starting event (proxyevents_test.go).
func nodeEvents(c kubernetes.Interface) ([]eventsv1.Event, error) {
	l, err := c.EventsV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{
		FieldSelector: "regarding.kind=Node,regarding.name=" + nodeName + ",reportingController=sluice,reason!=" + kube.ReasonStarting})
	if err != nil {
		return nil, err
	}
	return l.Items, nil
}

// Maps that are full at scale, against a real apiserver and client-go's
// real event broadcaster: 45 Services of 10 endpoints where the backends
// map holds 50 (four or five Services, with the kubernetes Service's
// backend or not).
// The agent is ready and its first sync done with the rest left out; a
// bounded number of them get a DatapathFull event each and one event on
// the Node counts the others and names the flag; syncs that find the maps
// full again report nothing more and never update an event (no series:
// the same cause is reported once while it lasts; the audit log shows no
// request refused); what is programmed stays programmed; and deleting programmed
// Services lets others in on that change.
func TestFullMapsReportedBounded(t *testing.T) {
	env := startEnv(t)
	c := env.Client
	const ns, n = "full", 45
	createNamespace(t, c, ns)
	services := map[string]string{} // frontend -> Service name
	for i := range n {
		name := fmt.Sprintf("svc-%02d", i)
		svc := createService(t, c, ns, name, nil, svcPort("http", 80, "http"))
		var eps []ep
		for k := range 10 {
			eps = append(eps, ready(fmt.Sprintf("10.1.%d.%d", i, k+1)))
		}
		createSlice(t, c, makeSlice(ns, name, name+"-a", slicePorts{"http": 8080}, eps...))
		services[fe(svc, 80)] = name
	}

	dp := fakedp.New(1000, 50, 10000)
	src, a := startEventsAgent(t, env, dp)
	inMaps := func() []string {
		var in []string
		for f := range programmed(t, dp) {
			if name, ok := services[f]; ok {
				in = append(in, name)
			}
		}
		return in
	}
	eventually(t, "the first sync, with some Services programmed", 30*time.Second, func() error {
		if !src.Synced() {
			return errors.New("not synced")
		}
		if err := a.Ready(); err != nil {
			return err
		}
		if in := inMaps(); len(in) < 4 || len(in) > 5 {
			return fmt.Errorf("%d Services programmed: %v", len(in), in)
		}
		return nil
	})
	before := inMaps()
	slices.Sort(before)
	leftOut := n - len(before)
	if got := len(a.notProgrammed(t)); got != leftOut {
		t.Errorf("%d frontends reported not programmed, want the %d Services left out", got, leftOut)
	}

	// The events: some on Services, one on the Node counting the rest.
	onServices := func() (int, []eventsv1.Event, error) {
		l, err := c.EventsV1().Events(ns).List(context.Background(), metav1.ListOptions{FieldSelector: "reportingController=sluice"})
		if err != nil {
			return 0, nil, err
		}
		full := 0
		for _, e := range l.Items {
			if e.Reason == kube.ReasonDatapathFull && e.Regarding.Kind == "Service" {
				full++
			}
		}
		return full, l.Items, nil
	}
	countRe := regexp.MustCompile(`^(\d+) Services not programmed`)
	eventually(t, "the events on the Services and the Node", 60*time.Second, func() error {
		full, _, err := onServices()
		if err != nil {
			return err
		}
		evs, err := nodeEvents(c)
		if err != nil {
			return err
		}
		if len(evs) != 1 {
			return fmt.Errorf("%d events on the Node, %d on Services", len(evs), full)
		}
		m := countRe.FindStringSubmatch(evs[0].Note)
		if m == nil || evs[0].Reason != kube.ReasonDatapathFull || !regexp.MustCompile(`--max-`).MatchString(evs[0].Note) {
			return fmt.Errorf("event on the Node: %s %q, want %s counting the Services and naming the flags", evs[0].Reason, evs[0].Note, kube.ReasonDatapathFull)
		}
		counted, _ := strconv.Atoi(m[1])
		if full == 0 || full+counted != leftOut {
			return fmt.Errorf("%d events on Services and %d counted on the Node, want %d left out in all", full, counted, leftOut)
		}
		return nil
	})
	full, _, err := onServices()
	if err != nil {
		t.Fatal(err)
	}
	if full >= leftOut {
		t.Errorf("%d Services left out, %d DatapathFull events on them: not bounded", leftOut, full)
	}

	// Syncs and resyncs later: nothing more, no series, the same four
	// programmed.
	time.Sleep(3 * time.Second)
	full2, all, err := onServices()
	if err != nil {
		t.Fatal(err)
	}
	nevs, err := nodeEvents(c)
	if err != nil {
		t.Fatal(err)
	}
	if full2 != full || len(nevs) != 1 {
		t.Errorf("after more syncs %d events on Services (were %d), %d on the Node (was 1)", full2, full, len(nevs))
	}
	for _, e := range append(all, nevs...) {
		if e.Series != nil {
			t.Errorf("event %s on %s became a series: the agent reported the same cause again", e.Reason, e.Regarding.Name)
		}
	}
	if now := inMaps(); !slices.Equal(slices.Sorted(slices.Values(now)), before) {
		t.Errorf("programmed Services %v while full, were %v", now, before)
	}
	for _, ev := range env.AgentRequests() {
		if ev.ResponseStatus != nil && ev.ResponseStatus.Code == 403 {
			t.Errorf("the apiserver refused the agent %s %s", ev.Verb, ev.RequestURI)
		}
	}

	// Room made: the programmed Services deleted, as many others get in
	// on that change.
	for _, name := range before {
		if err := c.CoreV1().Services(ns).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "as many other Services programmed", 30*time.Second, func() error {
		in := inMaps()
		if len(in) != len(before) {
			return fmt.Errorf("%d Services programmed: %v", len(in), in)
		}
		for _, name := range in {
			if slices.Contains(before, name) {
				return fmt.Errorf("deleted Service %s still programmed", name)
			}
		}
		if got := len(a.notProgrammed(t)); got != leftOut-len(before) {
			return fmt.Errorf("%d not programmed, want %d", got, leftOut-len(before))
		}
		return nil
	})
	if v := dp.Violations(); len(v) > 0 {
		t.Errorf("datapath invariants violated: %v", v)
	}
}
