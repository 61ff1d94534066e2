package kube

import (
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/events"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// refRecorder records each event with the object it regards.
type refRecorder struct {
	mu  sync.Mutex
	evs []refEvent
}

type refEvent struct {
	kind, name, reason, note string
}

var _ events.EventRecorder = (*refRecorder)(nil)

func (r *refRecorder) Eventf(regarding, _ runtime.Object, _, reason, _, note string, args ...any) {
	ref, _ := regarding.(*corev1.ObjectReference)
	e := refEvent{reason: reason, note: fmt.Sprintf(note, args...)}
	if ref != nil {
		e.kind, e.name = ref.Kind, ref.Name
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.evs = append(r.evs, e)
}

// take returns the events recorded since the last take.
func (r *refRecorder) take() []refEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.evs
	r.evs = nil
	return out
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
	rec := &refRecorder{}
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
