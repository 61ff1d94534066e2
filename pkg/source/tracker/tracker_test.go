package tracker

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/source/internal/sourcetest"
	"github.com/sluice-lb/sluice/pkg/source/translate"
)

var (
	service = sourcetest.Service
	slice   = sourcetest.Slice
	render  = sourcetest.Render
)

func nameOf(o metav1.Object) types.NamespacedName {
	return types.NamespacedName{Namespace: o.GetNamespace(), Name: o.GetName()}
}

// take returns the pending changes by Service.
func take(tr *Tracker) (services map[types.NamespacedName]*corev1.Service, slices map[types.NamespacedName][]*discoveryv1.EndpointSlice) {
	services = map[types.NamespacedName]*corev1.Service{}
	slices = map[types.NamespacedName][]*discoveryv1.EndpointSlice{}
	for _, d := range tr.take().services {
		services[d.key] = d.svc.obj // fed by SetService
		if d.slices != nil {
			slices[d.key] = make([]*discoveryv1.EndpointSlice, len(d.slices))
			for i, es := range d.slices {
				slices[d.key][i] = es.obj // fed by SetSlice
			}
		}
	}
	return services, slices
}

func TestTrackerFoldsToNetChanges(t *testing.T) {
	tr := New(translate.Options{})
	web := types.NamespacedName{Namespace: "default", Name: "web"}
	svc := service("web", "10.96.0.10", 80)
	svc.ResourceVersion = "1"
	if !tr.SetService(web, svc) {
		t.Fatal("a new Service is not a change")
	}
	// An informer resync delivers the same object again: no change.
	if tr.SetService(web, svc.DeepCopy()) {
		t.Error("a resync (same resourceVersion) marked the Service dirty")
	}
	// A status-only update (new resourceVersion, same spec): no change.
	st := svc.DeepCopy()
	st.ResourceVersion = "2"
	st.Status.LoadBalancer.Ingress = nil
	tr.take()
	if tr.SetService(web, st) {
		t.Error("a status-only update marked the Service dirty")
	}
	if services, _ := take(tr); len(services) != 0 {
		t.Errorf("take after a no-op update = %v", services)
	}

	// Ten slice updates and a Service created and deleted in between fold
	// into one pending entry each, with the latest slice.
	flash := types.NamespacedName{Namespace: "default", Name: "flash"}
	es := slice("web", "web-1", 8080, "10.0.0.1")
	for i := range 10 {
		es = es.DeepCopy()
		es.ResourceVersion = string(rune('a' + i))
		tr.SetSlice(nameOf(es), es)
	}
	tr.SetService(flash, service("flash", "10.96.0.99", 80))
	tr.SetService(flash, nil)
	services, slices := take(tr)
	if len(services) != 2 || len(slices[web]) != 1 || slices[web][0].ResourceVersion != "j" {
		t.Fatalf("pending = %d services, slices %v; want web (latest slice) and flash", len(services), slices[web])
	}
	if services[flash] != nil {
		t.Error("the created-then-deleted Service is pending as present")
	}
	// Deleting an unknown slice or Service is no change.
	if tr.SetSlice(types.NamespacedName{Namespace: "default", Name: "nope"}, nil) || tr.SetService(types.NamespacedName{Name: "nope"}, nil) {
		t.Error("deleting unknown objects marked something dirty")
	}
}

// A compact Service (SetCompactService, the Kubernetes source's) is a
// change when anything of it but its resourceVersion is: a resync or an
// update of what no translation reads (a status condition, an annotation)
// is not; a new generation (a spec change of any part) and a new
// creationTimestamp (the conflict rule's) are, as is what a translation
// reads.
func TestTrackerCompactServiceChanges(t *testing.T) {
	tr := New(translate.Options{})
	web := types.NamespacedName{Namespace: "default", Name: "web"}
	svc := service("web", "10.96.0.10", 80)
	svc.ResourceVersion, svc.Generation = "1", 1
	if !tr.SetCompactService(web, translate.ServiceOf(svc)) {
		t.Fatal("a new Service is not a change")
	}
	tr.take()
	for _, c := range []struct {
		what   string
		change func(*corev1.Service)
		want   bool
	}{
		{"a resync", func(*corev1.Service) {}, false},
		{"a status condition", func(s *corev1.Service) {
			s.ResourceVersion = "2"
			s.Status.Conditions = []metav1.Condition{{Type: "Ready"}}
		}, false},
		{"an annotation", func(s *corev1.Service) { s.ResourceVersion, s.Annotations = "2", map[string]string{"a": "b"} }, false},
		{"a new generation", func(s *corev1.Service) { s.ResourceVersion, s.Generation = "2", 2 }, true},
		{"a new creationTimestamp", func(s *corev1.Service) { s.ResourceVersion, s.CreationTimestamp = "2", metav1.Unix(5, 0) }, true},
		{"a port", func(s *corev1.Service) { s.ResourceVersion, s.Spec.Ports[0].Port = "2", 81 }, true},
		{"another port at the same resourceVersion", func(s *corev1.Service) { s.Spec.Ports[0].Port = 81 }, false}, // the same version
	} {
		s := svc.DeepCopy()
		c.change(s)
		if got := tr.SetCompactService(web, translate.ServiceOf(s)); got != c.want {
			t.Errorf("%s: changed %v, want %v", c.what, got, c.want)
		}
		tr.SetCompactService(web, translate.ServiceOf(svc))
		tr.take()
	}
	if !tr.SetCompactService(web, nil) || tr.SetCompactService(web, nil) {
		t.Error("deleting the Service is not a change once")
	}
}

// Objects read from files carry no resourceVersion: two versions of one
// are told apart by what they hold, and the LoadBalancer status, which
// the translation reads, is a change.
func TestTrackerWithoutResourceVersions(t *testing.T) {
	tr := New(translate.Options{})
	web := types.NamespacedName{Namespace: "default", Name: "web"}
	svc := service("web", "10.96.0.10", 80)
	tr.SetService(web, svc)
	tr.Sync()
	moved := svc.DeepCopy()
	moved.Spec.Ports[0].Port = 81
	if !tr.SetService(web, moved) {
		t.Error("a new port with no resourceVersion is not a change")
	}
	lb := moved.DeepCopy()
	lb.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.51.100.1"}}
	if !tr.SetService(web, lb) {
		t.Error("a new LoadBalancer ingress IP is not a change")
	}
	es := slice("web", "web-1", 8080, "10.0.0.1")
	tr.SetSlice(nameOf(es), es)
	tr.Sync()
	es2 := slice("web", "web-1", 8080, "10.0.0.2")
	if !tr.SetSlice(nameOf(es2), es2) {
		t.Error("a new endpoint with no resourceVersion is not a change")
	}
	if got := render(tr.Sync().State); got != "10.96.0.10:81/TCP default/web:http -> 10.0.0.2:8080/TCP" {
		t.Errorf("state:\n%s", got)
	}
}

func TestTrackerTranslatesOnlyWhatChanged(t *testing.T) {
	tr := New(translate.Options{})
	for i := range 10 {
		name := fmt.Sprintf("s%d", i)
		tr.SetService(types.NamespacedName{Namespace: "default", Name: name}, service(name, fmt.Sprintf("10.96.0.%d", i+1), 80))
		es := slice(name, name+"-a", 8080, fmt.Sprintf("10.0.0.%d", i+1))
		tr.SetSlice(nameOf(es), es)
	}
	r := tr.Sync()
	if r.Translated != 10 || r.Changed != 10 || r.State.Services.Len() != 10 {
		t.Fatalf("first sync: translated %d, changed %d, %d frontends", r.Translated, r.Changed, r.State.Services.Len())
	}
	first := r.State

	// Nothing changed: nothing translated, the same state.
	if r := tr.Sync(); r.Translated != 0 || r.State != first {
		t.Errorf("idle sync translated %d, new state %v", r.Translated, r.State != first)
	}
	// A slice update that changes nothing the datapath sees (a hint)
	// translates one Service to the same result: the same state.
	es := slice("s3", "s3-a", 8080, "10.0.0.4")
	es.Endpoints[0].Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "z"}}}
	tr.SetSlice(nameOf(es), es)
	if r := tr.Sync(); r.Translated != 1 || r.Changed != 0 || r.State != first {
		t.Errorf("hint update: translated %d, changed %d, new state %v", r.Translated, r.Changed, r.State != first)
	}
	// One endpoint changes: one Service translated, a new state that
	// shares the other Services' translations.
	es = slice("s3", "s3-a", 8080, "10.0.0.99")
	tr.SetSlice(nameOf(es), es)
	r = tr.Sync()
	if r.Translated != 1 || r.Changed != 1 || r.State == first {
		t.Fatalf("endpoint change: translated %d, changed %d", r.Translated, r.Changed)
	}
	fe := model.L4Addr{Addr: netip.MustParseAddr("10.96.0.4"), Port: 80, Proto: model.TCP}
	if b := r.State.Services.Get(fe).Backends; len(b) != 1 || b[0].Addr != netip.MustParseAddr("10.0.0.99") {
		t.Errorf("backends of %s = %v", fe, b)
	}
	if len(first.Services.Get(fe).Backends) != 1 || first.Services.Get(fe).Backends[0].Addr != netip.MustParseAddr("10.0.0.4") {
		t.Error("a state handed out before was modified")
	}
	other := model.L4Addr{Addr: netip.MustParseAddr("10.96.0.1"), Port: 80, Proto: model.TCP}
	if r.State.Services.Get(other) != first.Services.Get(other) {
		t.Error("an unchanged Service was translated again")
	}
}

// A slice relabelled to another Service leaves the first one.
func TestTrackerSliceRelabelled(t *testing.T) {
	tr := New(translate.Options{})
	for _, n := range []string{"a", "b"} {
		tr.SetService(types.NamespacedName{Namespace: "default", Name: n}, service(n, map[string]string{"a": "10.96.0.1", "b": "10.96.0.2"}[n], 80))
	}
	es := slice("a", "shared", 8080, "10.0.0.1")
	tr.SetSlice(nameOf(es), es)
	tr.Sync()
	es = slice("b", "shared", 8080, "10.0.0.1")
	if !tr.SetSlice(nameOf(es), es) {
		t.Fatal("relabelling is not a change")
	}
	want := "10.96.0.1:80/TCP default/a:http ->\n10.96.0.2:80/TCP default/b:http -> 10.0.0.1:8080/TCP"
	if got := render(tr.Sync().State); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	// Several slices of one Service: all count, and deleting one leaves
	// the others.
	for _, n := range []string{"b-2", "b-0"} {
		es := slice("b", n, 8080, map[string]string{"b-2": "10.0.0.2", "b-0": "10.0.0.3"}[n])
		tr.SetSlice(nameOf(es), es)
	}
	tr.SetSlice(types.NamespacedName{Namespace: "default", Name: "b-2"}, nil)
	want = "10.96.0.1:80/TCP default/a:http ->\n10.96.0.2:80/TCP default/b:http -> 10.0.0.1:8080/TCP 10.0.0.3:8080/TCP"
	if got := render(tr.Sync().State); got != want {
		t.Errorf("several slices: got\n%s\nwant\n%s", got, want)
	}
	tr.SetSlice(types.NamespacedName{Namespace: "default", Name: "b-0"}, nil)

	// Losing its label, it belongs to no Service.
	es = es.DeepCopy()
	es.Labels = nil
	tr.SetSlice(nameOf(es), es)
	want = "10.96.0.1:80/TCP default/a:http ->\n10.96.0.2:80/TCP default/b:http ->"
	if got := render(tr.Sync().State); got != want {
		t.Errorf("unlabelled: got\n%s\nwant\n%s", got, want)
	}

	// A slice given under a key of another namespace than its own (a
	// source whose keys are not the objects'): filed under the Service
	// of its own namespace, it leaves it when deleted under that key.
	es = slice("b", "b-9", 8080, "10.0.0.9")
	key := types.NamespacedName{Namespace: "other", Name: es.Name}
	tr.SetSlice(key, es)
	want = "10.96.0.1:80/TCP default/a:http ->\n10.96.0.2:80/TCP default/b:http -> 10.0.0.9:8080/TCP"
	if got := render(tr.Sync().State); got != want {
		t.Errorf("key of another namespace: got\n%s\nwant\n%s", got, want)
	}
	tr.SetSlice(key, nil)
	want = "10.96.0.1:80/TCP default/a:http ->\n10.96.0.2:80/TCP default/b:http ->"
	if got := render(tr.Sync().State); got != want {
		t.Errorf("key of another namespace, deleted: got\n%s\nwant\n%s", got, want)
	}
}

// Two Services claiming one frontend, arriving together (as at start) and
// without creationTimestamps: the first by namespace/name wins, whatever
// the order they came in, and the loser is reported with both names. When
// the winner goes, the loser takes over.
func TestTrackerConflictFirstByNameWins(t *testing.T) {
	for _, order := range [][]string{{"a", "b"}, {"b", "a"}} {
		tr := New(translate.Options{})
		for _, n := range order {
			tr.SetService(types.NamespacedName{Namespace: "default", Name: n}, service(n, "10.96.0.1", 80))
			es := slice(n, n+"-1", 8080, map[string]string{"a": "10.0.0.1", "b": "10.0.0.2"}[n])
			tr.SetSlice(nameOf(es), es)
		}
		r := tr.Sync()
		if got := render(r.State); got != "10.96.0.1:80/TCP default/a:http -> 10.0.0.1:8080/TCP" {
			t.Errorf("order %v: got %s", order, got)
		}
		if len(r.Conflicts) != 1 || r.Conflicts[0].String() != "default/b:http lost 10.96.0.1:80/TCP to default/a:http" {
			t.Errorf("order %v: conflicts %v", order, r.Conflicts)
		}
		if _, _, c := tr.Issues(); len(c) != 1 {
			t.Errorf("Issues: conflicts %v", c)
		}
		tr.SetService(types.NamespacedName{Namespace: "default", Name: "a"}, nil)
		r = tr.Sync()
		if got := render(r.State); got != "10.96.0.1:80/TCP default/b:http -> 10.0.0.2:8080/TCP" || len(r.Conflicts) != 0 {
			t.Errorf("winner deleted: got %s, conflicts %v", got, r.Conflicts)
		}
	}
}

// A Service that fails to translate keeps its last good translation, and
// is reported until it is fixed or deleted; skipped Services likewise.
func TestTrackerErrorsAndSkipped(t *testing.T) {
	tr := New(translate.Options{})
	web := types.NamespacedName{Namespace: "default", Name: "web"}
	tr.SetService(web, service("web", "10.96.0.10", 80))
	tr.Sync()
	bad := service("web", "10.96.0.10", 80)
	bad.Spec.Ports[0].Protocol = "ICMP"
	tr.SetService(web, bad)
	r := tr.Sync()
	if len(r.Errors) != 1 || r.Errors[0].Service != web || !strings.Contains(r.Errors[0].Err.Error(), "ICMP") {
		t.Fatalf("errors %v", r.Errors)
	}
	if got := render(r.State); got != "10.96.0.10:80/TCP default/web:http ->" {
		t.Errorf("the last good translation is gone: %s", got)
	}
	ext := types.NamespacedName{Namespace: "default", Name: "ext"}
	es := service("ext", "", 0)
	es.Spec = corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "example.com"}
	tr.SetService(ext, es)
	r = tr.Sync()
	if len(r.Errors) != 0 || len(r.Skipped) != 1 || r.Skipped[0].Reason != translate.SkipExternalName {
		t.Errorf("errors %v (the bad Service was not changed), skipped %v", r.Errors, r.Skipped)
	}
	errs, skipped, _ := tr.Issues()
	if len(errs) != 1 || errs[0].Service != web || len(skipped) != 1 || skipped[0].Service != ext {
		t.Errorf("Issues = %v, %v", errs, skipped)
	}
	tr.SetService(web, nil)
	tr.SetService(ext, nil)
	r = tr.Sync()
	if errs, skipped, _ := tr.Issues(); len(errs) != 0 || len(skipped) != 0 || r.State.Services.Len() != 0 {
		t.Errorf("after deletion: Issues = %v, %v; %d frontends", errs, skipped, r.State.Services.Len())
	}
}

// What a translation leaves out (an SCTP port) is reported by the Sync
// that translated it and by Warnings while it lasts.
func TestTrackerWarnings(t *testing.T) {
	tr := New(translate.Options{})
	web := types.NamespacedName{Namespace: "default", Name: "web"}
	svc := service("web", "10.96.0.10", 80)
	svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: "sig", Port: 3868, Protocol: corev1.ProtocolSCTP})
	tr.SetService(web, svc)
	r := tr.Sync()
	if len(r.Warnings) != 1 || r.Warnings[0].Service != web || !strings.Contains(r.Warnings[0].Message, `port "sig"`) {
		t.Fatalf("warnings %v", r.Warnings)
	}
	if got := render(r.State); got != "10.96.0.10:80/TCP default/web:http ->" {
		t.Errorf("the TCP port is not served: %s", got)
	}
	if w := tr.Warnings(); len(w) != 1 || w[0] != r.Warnings[0] {
		t.Errorf("Warnings() = %v", w)
	}
	tr.SetService(web, service("web", "10.96.0.10", 80))
	if r = tr.Sync(); len(r.Warnings) != 0 || len(tr.Warnings()) != 0 {
		t.Errorf("fixed: warnings %v, %v", r.Warnings, tr.Warnings())
	}
	tr.SetService(web, svc)
	tr.Sync()
	tr.SetService(web, nil)
	tr.Sync()
	if len(tr.Warnings()) != 0 {
		t.Errorf("deleted: warnings %v", tr.Warnings())
	}
}

// A Node change re-translates only the Services whose translation read
// the part of the node that changed.
func TestTrackerNodeChange(t *testing.T) {
	node := translate.Node{Name: "node-a", Addresses: []netip.Addr{netip.MustParseAddr("192.168.1.1")},
		Labels: map[string]string{corev1.LabelTopologyZone: "zone-a"}}
	tr := New(translate.Options{Node: node})
	np := service("np", "10.96.0.2", 80)
	np.Spec.Type = corev1.ServiceTypeNodePort
	np.Spec.Ports[0].NodePort = 30080
	local := np.DeepCopy()
	local.Name, local.Spec.ClusterIPs, local.Spec.ClusterIP, local.Spec.Ports[0].NodePort = "local", []string{"10.96.0.3"}, "10.96.0.3", 30081
	local.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	for _, s := range []*corev1.Service{service("cip", "10.96.0.1", 80), np, local} {
		tr.SetService(nameOf(s), s)
		es := slice(s.Name, s.Name+"-1", 8080, "10.0.0.1")
		es.Endpoints[0].NodeName = new("node-a")
		tr.SetSlice(nameOf(es), es)
	}
	first := tr.Sync().State

	// The zone label: no translation reads it.
	node.Labels = map[string]string{corev1.LabelTopologyZone: "zone-b"}
	if !tr.SetNode(node) {
		t.Fatal("a new label is not a change")
	}
	if r := tr.Sync(); r.Translated != 0 || r.State != first {
		t.Errorf("label change: translated %d Services", r.Translated)
	}
	if tr.SetNode(node) {
		t.Error("the same node again is a change")
	}

	// An address: the two NodePort Services.
	node.Addresses = append(node.Addresses, netip.MustParseAddr("192.168.2.1"))
	tr.SetNode(node)
	r := tr.Sync()
	if r.Translated != 2 || r.Changed != 2 {
		t.Errorf("address change: translated %d, changed %d; want the 2 NodePort Services", r.Translated, r.Changed)
	}
	fe := model.L4Addr{Addr: netip.MustParseAddr("192.168.2.1"), Port: 30080, Proto: model.TCP}
	if _, ok := r.State.Services.Lookup(fe); !ok {
		t.Errorf("no NodePort on the new address:\n%s", render(r.State))
	}

	// The name: the externalTrafficPolicy Local Service only (its
	// endpoint is on node-a, so it loses it).
	node.Name = "node-b"
	tr.SetNode(node)
	r = tr.Sync()
	if r.Translated != 1 || r.Changed != 1 {
		t.Errorf("name change: translated %d, changed %d; want the Local Service", r.Translated, r.Changed)
	}
	lfe := model.L4Addr{Addr: netip.MustParseAddr("192.168.1.1"), Port: 30081, Proto: model.TCP}
	if s := r.State.Services.Get(lfe); s == nil || len(s.Backends) != 0 {
		t.Errorf("Local NodePort on node-b: %v", s)
	}
}

// Whatever the sequence of changes, the state Sync returns (built afresh
// or patched from the last one) and the conflicts it reports are those of
// a new tracker fed the same objects at once and told which Service held
// each frontend before (as a restarted agent is told by the maps): first
// come keeps it, however the state is made.
func TestTrackerIncrementalMatchesFresh(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	tr := New(translate.Options{})
	svcs := map[types.NamespacedName]*corev1.Service{}
	eps := map[types.NamespacedName]*discoveryv1.EndpointSlice{}
	prev := model.NewState()
	for step := range 2000 {
		// Few names and few VIPs, so that Services often claim the same
		// frontend and slices move between Services.
		name := fmt.Sprintf("s%d", rng.IntN(8))
		switch rng.IntN(4) {
		case 0:
			k := types.NamespacedName{Namespace: "default", Name: name}
			if rng.IntN(3) == 0 {
				delete(svcs, k)
				tr.SetService(k, nil)
				break
			}
			s := service(name, fmt.Sprintf("10.96.0.%d", rng.IntN(4)+1), int32(80+rng.IntN(2)))
			if c := rng.IntN(4); c > 0 { // some without: after those with one
				s.CreationTimestamp = metav1.NewTime(time.Unix(int64(c), 0))
			}
			svcs[k] = s
			tr.SetService(k, s)
		default:
			es := slice(name, fmt.Sprintf("es%d", rng.IntN(10)), 8080, fmt.Sprintf("10.0.0.%d", rng.IntN(5)+1))
			k := nameOf(es)
			if rng.IntN(4) == 0 {
				delete(eps, k)
				tr.SetSlice(k, nil)
				break
			}
			eps[k] = es
			tr.SetSlice(k, es)
		}
		if rng.IntN(3) > 0 {
			continue
		}
		got := tr.Sync()
		fresh := New(translate.Options{})
		fresh.SetHolds(func(svc *model.Service) bool {
			p := prev.Services.Get(svc.Frontend)
			return p != nil && p.Name == svc.Name
		})
		prev = got.State
		for k, s := range svcs {
			fresh.SetService(k, s)
		}
		for k, es := range eps {
			fresh.SetSlice(k, es)
		}
		want := fresh.Sync()
		if g, w := render(got.State), render(want.State); g != w {
			t.Fatalf("step %d: state\n%s\nwant\n%s", step, g, w)
		}
		_, _, gc := tr.Issues()
		if g, w := fmt.Sprint(gc), fmt.Sprint(want.Conflicts); g != w {
			t.Fatalf("step %d: conflicts %s, want %s", step, g, w)
		}
	}
}

// claim sets Service name at 10.96.0.1:80 with one endpoint.
func claim(tr *Tracker, name, ep string, created time.Time) {
	svc := service(name, "10.96.0.1", 80)
	svc.CreationTimestamp = metav1.NewTime(created)
	tr.SetService(types.NamespacedName{Namespace: "default", Name: name}, svc)
	es := slice(name, name+"-1", 8080, ep)
	tr.SetSlice(nameOf(es), es)
}

// First come keeps it: a Service that claims a frontend another one holds
// does not take it over, whatever its name or age, and is reported; it
// gets it when the holder lets go. (The tracker used to resolve by name:
// a newcomer with a smaller name took over a frontend in use.)
func TestTrackerConflictFirstComeKeepsIt(t *testing.T) {
	for _, patch := range []bool{true, false} {
		tr := New(translate.Options{})
		other := types.NamespacedName{Namespace: "default", Name: "other"}
		claim(tr, "zz", "10.0.0.2", time.Unix(2000, 0))
		if !patch {
			// Another conflict makes Sync build the state afresh.
			tr.SetService(other, service("other", "10.96.0.9", 80))
			tr.SetService(types.NamespacedName{Namespace: "default", Name: "other2"}, service("other2", "10.96.0.9", 80))
		}
		tr.Sync()
		claim(tr, "aa", "10.0.0.1", time.Unix(1000, 0)) // smaller name, older
		r := tr.Sync()
		if got := render(r.State); !strings.Contains(got, "10.96.0.1:80/TCP default/zz:http -> 10.0.0.2:8080/TCP") {
			t.Errorf("patch %v: a newcomer took the frontend over:\n%s", patch, got)
		}
		if len(r.Conflicts) == 0 || r.Conflicts[0].String() != "default/aa:http lost 10.96.0.1:80/TCP to default/zz:http" {
			t.Errorf("patch %v: conflicts %v", patch, r.Conflicts)
		}
		// A change of the holder keeps it there; so does one of the
		// newcomer.
		claim(tr, "zz", "10.0.0.3", time.Unix(2000, 0))
		claim(tr, "aa", "10.0.0.4", time.Unix(1000, 0))
		if got := render(tr.Sync().State); !strings.Contains(got, "10.96.0.1:80/TCP default/zz:http -> 10.0.0.3:8080/TCP") {
			t.Errorf("patch %v: after changes of both:\n%s", patch, got)
		}
		tr.SetService(types.NamespacedName{Namespace: "default", Name: "zz"}, nil)
		if got := render(tr.Sync().State); !strings.Contains(got, "10.96.0.1:80/TCP default/aa:http -> 10.0.0.4:8080/TCP") {
			t.Errorf("patch %v: the holder went, the newcomer did not take over:\n%s", patch, got)
		}
	}
}

// Services that claim a free frontend together go by age
// (creationTimestamp, those without one last), then by name.
func TestTrackerConflictOldestWins(t *testing.T) {
	tr := New(translate.Options{})
	claim(tr, "aa", "10.0.0.1", time.Time{})
	claim(tr, "bb", "10.0.0.2", time.Unix(2000, 0))
	claim(tr, "cc", "10.0.0.3", time.Unix(1000, 0))
	r := tr.Sync()
	if got := render(r.State); got != "10.96.0.1:80/TCP default/cc:http -> 10.0.0.3:8080/TCP" {
		t.Errorf("got %s, want the oldest", got)
	}
	if len(r.Conflicts) != 2 {
		t.Errorf("conflicts %v, want aa and bb losing to cc", r.Conflicts)
	}
}

// The conflict rule reads a Service's creationTimestamp as of its last
// translation: a Service recreated (a new timestamp, and an annotation:
// the tracker does not translate again for the timestamp alone) whose
// translation did not change, or that no longer translates and keeps its
// last translation, is as old as its new timestamp when the holder lets
// go.
func TestTrackerConflictOldestAfterRecreate(t *testing.T) {
	for _, invalid := range []bool{false, true} {
		tr := New(translate.Options{})
		claim(tr, "aa", "10.0.0.1", time.Unix(1000, 0))
		claim(tr, "bb", "10.0.0.2", time.Unix(6000, 0))
		claim(tr, "cc", "10.0.0.3", time.Unix(5000, 0))
		if got := render(tr.Sync().State); !strings.Contains(got, "default/aa:http") {
			t.Fatalf("got %s, want aa's (the oldest)", got)
		}
		bb := service("bb", "10.96.0.1", 80)
		bb.CreationTimestamp = metav1.NewTime(time.Unix(100, 0))
		bb.Annotations = map[string]string{"example.com/recreated": "yes"}
		if invalid {
			bb.Spec.ExternalIPs = []string{"not-an-address"}
		}
		tr.SetService(types.NamespacedName{Namespace: "default", Name: "bb"}, bb)
		if r := tr.Sync(); r.Changed != 0 || len(r.Errors) != map[bool]int{false: 0, true: 1}[invalid] {
			t.Fatalf("invalid %v: recreated bb changed %d translations, errors %v", invalid, r.Changed, r.Errors)
		}
		tr.SetService(types.NamespacedName{Namespace: "default", Name: "aa"}, nil)
		if got := render(tr.Sync().State); got != "10.96.0.1:80/TCP default/bb:http -> 10.0.0.2:8080/TCP" {
			t.Errorf("invalid %v: got %s, want bb's (created at 100 now)", invalid, got)
		}
	}
}

// After a restart (a new tracker), the Service the datapath holds the
// frontend for keeps it, whatever its age or name.
func TestTrackerConflictRestartKeepsHolder(t *testing.T) {
	tr := New(translate.Options{})
	var asked []string
	tr.SetHolds(func(svc *model.Service) bool {
		asked = append(asked, svc.Name.Name)
		return svc.Name.Name == "zz" && len(svc.Backends) == 1 && svc.Backends[0].Addr.String() == "10.0.0.2"
	})
	claim(tr, "aa", "10.0.0.1", time.Unix(1000, 0))
	claim(tr, "zz", "10.0.0.2", time.Unix(2000, 0))
	if got := render(tr.Sync().State); got != "10.96.0.1:80/TCP default/zz:http -> 10.0.0.2:8080/TCP" {
		t.Errorf("got %s, want the Service the maps hold", got)
	}
	// Once it holds the frontend, the datapath is not asked again.
	asked = nil
	claim(tr, "aa", "10.0.0.5", time.Unix(1000, 0))
	tr.Sync()
	if len(asked) != 0 {
		t.Errorf("asked the datapath about %v while a holder claims the frontend", asked)
	}
}

// TestTrackerTriggersCarryFamily: a slice change's trigger time reaches
// the Sync that takes it with its slice's family (the family whose
// network programming latency it is), once; a slice without the
// annotation, with an unparsable one, or of addressType FQDN has none.
func TestTrackerTriggersCarryFamily(t *testing.T) {
	tr := New(translate.Options{})
	at := time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC)
	tr.started = at.Add(-time.Hour) // the triggers are after its start
	withTrigger := func(es *discoveryv1.EndpointSlice, v string) *discoveryv1.EndpointSlice {
		es.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: v}
		return es
	}
	v6 := withTrigger(slice("web", "web-v6", 8080, "2001:db8::1"), at.Add(time.Second).Format(time.RFC3339Nano))
	v6.AddressType = discoveryv1.AddressTypeIPv6
	fqdn := withTrigger(slice("web", "web-fqdn", 8080, "db.example"), at.Format(time.RFC3339Nano))
	fqdn.AddressType = discoveryv1.AddressTypeFQDN
	tr.SetService(types.NamespacedName{Namespace: "default", Name: "web"}, service("web", "10.96.0.10", 80))
	for _, es := range []*discoveryv1.EndpointSlice{
		withTrigger(slice("web", "web-v4", 8080, "10.0.0.1"), at.Format(time.RFC3339Nano)),
		v6,
		fqdn,
		withTrigger(slice("web", "web-bad", 8080, "10.0.0.2"), "yesterday"),
		slice("web", "web-none", 8080, "10.0.0.3"),
	} {
		tr.SetSlice(nameOf(es), es)
	}
	want := []model.Trigger{{At: at}, {At: at.Add(time.Second), IPv6: true}}
	if got := tr.Sync().Triggers; !slices.Equal(got, want) {
		t.Fatalf("triggers %v, want %v", got, want)
	}
	if got := tr.Sync().Triggers; len(got) != 0 {
		t.Errorf("triggers taken twice: %v", got)
	}
}

// A slice given as what a translation reads of it (SetCompactSlice, the
// Kubernetes source) is tracked as the object it was made from (SetSlice):
// the same states after each change, a resync (the same resourceVersion)
// marks nothing, a relabelled slice leaves its first Service, and its
// trigger time is taken with its family.
func TestTrackerCompactSlicesTrackAsObjects(t *testing.T) {
	full, compact := New(translate.Options{}), New(translate.Options{})
	at := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	full.started, compact.started = at.Add(-time.Hour), at.Add(-time.Hour) // the trigger is after their start
	trigger := at.Format(time.RFC3339Nano)
	for _, name := range []string{"a", "b"} {
		svc := service(name, map[string]string{"a": "10.96.0.1", "b": "10.96.0.2"}[name], 80)
		full.SetService(nameOf(svc), svc)
		compact.SetService(nameOf(svc), svc)
	}
	a1 := slice("a", "a-1", 8080, "10.0.0.1")
	v6 := slice("a", "a-2", 8080, "2001:db8::1")
	v6.AddressType = discoveryv1.AddressTypeIPv6
	v6.ResourceVersion = "9"
	relabelled := slice("b", "a-1", 8080, "10.0.0.3")
	relabelled.ResourceVersion = "3"
	steps := []struct {
		key    types.NamespacedName
		es     *discoveryv1.EndpointSlice // nil: deleted
		change bool
	}{
		{nameOf(a1), a1, true},
		{nameOf(v6), v6, true},
		{nameOf(v6), v6.DeepCopy(), false}, // a resync
		{nameOf(relabelled), relabelled, true},
		{nameOf(v6), nil, true},
		{nameOf(v6), nil, false},
	}
	for i, s := range steps {
		if s.es != nil && s.es.ResourceVersion == "" {
			s.es.ResourceVersion = "1"
		}
		fc := full.SetSliceTriggered(s.key, s.es, trigger)
		cc := compact.SetCompactSlice(s.key, translate.SliceOf(s.es), trigger)
		if fc != s.change || cc != s.change {
			t.Errorf("step %d: changed %v (objects), %v (compact); want %v", i, fc, cc, s.change)
		}
		fr, cr := full.Sync(), compact.Sync()
		if got, want := render(cr.State), render(fr.State); got != want {
			t.Errorf("step %d: compact slices give\n%s\nwant\n%s", i, got, want)
		}
		if !slices.Equal(cr.Triggers, fr.Triggers) {
			t.Errorf("step %d: compact triggers %v, want %v", i, cr.Triggers, fr.Triggers)
		}
	}
	if got := render(compact.Sync().State); !strings.Contains(got, "10.96.0.2:80/TCP default/b:http -> 10.0.0.3:8080/TCP") ||
		strings.Contains(got, "10.0.0.1") {
		t.Errorf("after the relabel and the deletion:\n%s", got)
	}
}

// A first state fed after Reserve grows none of the tracker's maps or
// lists: feeding n Services and their slices allocates what each one
// needs (its input, its list of slices) and nothing in proportion to
// how many came before. Without Reserve the maps of inputs and owners
// and the dirty list grow as they fill, dozens of allocations at 3,000
// and arrays left behind as large as they end.
func TestTrackerReserveGrowsNothing(t *testing.T) {
	const n = 3000
	type obj struct {
		key   types.NamespacedName
		svc   *translate.Service
		slice *translate.Slice
	}
	objs := make([]obj, n)
	for i := range objs {
		name := fmt.Sprintf("s%d", i)
		es := slice(name, name+"-a", 8080, fmt.Sprintf("10.0.%d.%d", i>>8, i&0xff))
		objs[i] = obj{types.NamespacedName{Namespace: "default", Name: name},
			translate.ServiceOf(service(name, fmt.Sprintf("10.96.%d.%d", i>>8, i&0xff), 80)), translate.SliceOf(es)}
	}
	tr := New(translate.Options{})
	tr.Reserve(n, n)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for _, o := range objs {
		tr.SetCompactService(o.key, o.svc)
		tr.SetCompactSlice(types.NamespacedName{Namespace: "default", Name: o.slice.Name}, o.slice, "")
	}
	runtime.ReadMemStats(&after)
	// An input and its list of slices each.
	if got := after.Mallocs - before.Mallocs; got > 2*n+8 {
		t.Errorf("feeding %d Services and slices after Reserve: %d allocations, want at most %d", n, got, 2*n+8)
	}
	if r := tr.Sync(); r.State.Services.Len() != n {
		t.Fatalf("%d frontends, want %d", r.State.Services.Len(), n)
	}
}

// TestTrackerLastChangeTriggerTime is kube-proxy's TestLastChangeTriggerTime
// (pkg/proxy/endpointschangetracker_test.go): the trigger times a Sync
// takes, by scenario, for a tracker started at startTime. A slice whose
// trigger is before the tracker's start (kube-proxy's "Endpoints create
// before tracker started": an agent's restart) gives none; at it, none
// either (kube-proxy's t.After(trackerStartTime)); a resync of a slice
// (its resourceVersion again) adds none; a deletion drops the Service's
// pending ones, as kube-proxy's.
func TestTrackerLastChangeTriggerTime(t *testing.T) {
	startTime := time.Date(2018, 1, 1, 0, 0, 0, 0, time.UTC)
	t_1 := startTime.Add(-time.Second)
	t0 := startTime.Add(time.Second)
	t1 := t0.Add(time.Second)
	t2 := t1.Add(time.Second)
	t3 := t2.Add(time.Second)

	rv := 0
	createEndpoints := func(name string, trigger time.Time) *discoveryv1.EndpointSlice {
		es := slice(name, name, 11, "1.1.1.1")
		rv++
		es.ResourceVersion = fmt.Sprint(rv)
		es.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: trigger.Format(time.RFC3339Nano)}
		return es
	}
	modifyEndpoints := func(es *discoveryv1.EndpointSlice, trigger time.Time) *discoveryv1.EndpointSlice {
		e := es.DeepCopy()
		*e.Ports[0].Port++
		rv++
		e.ResourceVersion = fmt.Sprint(rv)
		e.Annotations[corev1.EndpointsLastChangeTriggerTime] = trigger.Format(time.RFC3339Nano)
		return e
	}
	// inWeb is a slice of the Service web, of family at.
	inWeb := func(name string, at discoveryv1.AddressType, trigger time.Time) *discoveryv1.EndpointSlice {
		addr := map[discoveryv1.AddressType]string{discoveryv1.AddressTypeIPv4: "1.1.1.1",
			discoveryv1.AddressTypeIPv6: "fd00::1", discoveryv1.AddressTypeFQDN: "db.example"}[at]
		es := slice("web", name, 11, addr)
		es.AddressType = at
		rv++
		es.ResourceVersion = fmt.Sprint(rv)
		es.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: trigger.Format(time.RFC3339Nano)}
		return es
	}
	tests := []struct {
		name     string
		scenario func(tr *Tracker)
		want     []time.Time
	}{
		{"Single addEndpoints", func(tr *Tracker) {
			e := createEndpoints("ep1", t0)
			tr.SetSlice(nameOf(e), e)
		}, []time.Time{t0}},
		{"addEndpoints then updatedEndpoints", func(tr *Tracker) {
			e := createEndpoints("ep1", t0)
			tr.SetSlice(nameOf(e), e)
			tr.SetSlice(nameOf(e), modifyEndpoints(e, t1))
		}, []time.Time{t0, t1}},
		{"Add two endpoints then modify one", func(tr *Tracker) {
			e1 := createEndpoints("ep1", t1)
			tr.SetSlice(nameOf(e1), e1)
			e2 := createEndpoints("ep2", t2)
			tr.SetSlice(nameOf(e2), e2)
			tr.SetSlice(nameOf(e1), modifyEndpoints(e1, t3))
		}, []time.Time{t1, t3, t2}},
		{"Endpoints without annotation set", func(tr *Tracker) {
			e := createEndpoints("ep1", t1)
			delete(e.Annotations, corev1.EndpointsLastChangeTriggerTime)
			tr.SetSlice(nameOf(e), e)
		}, nil},
		{"Endpoints create before tracker started", func(tr *Tracker) {
			e := createEndpoints("ep1", t_1)
			tr.SetSlice(nameOf(e), e)
		}, nil},
		{"Endpoints changed at the tracker's start", func(tr *Tracker) {
			e := createEndpoints("ep1", startTime)
			tr.SetSlice(nameOf(e), e)
		}, nil},
		{"Endpoints created before, updated after the tracker started", func(tr *Tracker) {
			e := createEndpoints("ep1", t_1)
			tr.SetSlice(nameOf(e), e)
			tr.SetSlice(nameOf(e), modifyEndpoints(e, t1))
		}, []time.Time{t1}},
		{"resync of the same resourceVersion", func(tr *Tracker) {
			e := createEndpoints("ep1", t1)
			tr.SetSlice(nameOf(e), e)
			tr.SetSlice(nameOf(e), e.DeepCopy())
		}, []time.Time{t1}},
		{"addEndpoints then deleteEndpoints", func(tr *Tracker) {
			e := createEndpoints("ep1", t1)
			tr.SetSlice(nameOf(e), e)
			tr.SetSlice(nameOf(e), nil)
		}, nil},
		{"add then delete then add again", func(tr *Tracker) {
			e := createEndpoints("ep1", t1)
			tr.SetSlice(nameOf(e), e)
			tr.SetSlice(nameOf(e), nil)
			tr.SetSlice(nameOf(e), modifyEndpoints(e, t2))
		}, []time.Time{t2}},
		{"delete", func(tr *Tracker) {
			e := createEndpoints("ep1", t1)
			tr.SetSlice(nameOf(e), nil)
		}, nil},
		// Beyond kube-proxy's table: two slices of one Service, by
		// family (kube-proxy runs an EndpointsChangeTracker a family,
		// which ignores the other family's and FQDN slices).
		{"deleting a slice drops its Service's other slices' pending times of its family", func(tr *Tracker) {
			e1 := inWeb("web-1", discoveryv1.AddressTypeIPv4, t1)
			tr.SetSlice(nameOf(e1), e1)
			e2 := inWeb("web-2", discoveryv1.AddressTypeIPv4, t2)
			tr.SetSlice(nameOf(e2), e2)
			tr.SetSlice(nameOf(e2), nil)
		}, nil},
		{"deleting an IPv6 slice keeps the Service's IPv4 pending times", func(tr *Tracker) {
			e4 := inWeb("web-4", discoveryv1.AddressTypeIPv4, t1)
			tr.SetSlice(nameOf(e4), e4)
			e6 := inWeb("web-6", discoveryv1.AddressTypeIPv6, t2)
			tr.SetSlice(nameOf(e6), e6)
			tr.SetSlice(nameOf(e6), nil)
		}, []time.Time{t1}},
		{"deleting an FQDN slice keeps every pending time", func(tr *Tracker) {
			e4 := inWeb("web-4", discoveryv1.AddressTypeIPv4, t1)
			tr.SetSlice(nameOf(e4), e4)
			e6 := inWeb("web-6", discoveryv1.AddressTypeIPv6, t2)
			tr.SetSlice(nameOf(e6), e6)
			ef := inWeb("web-f", discoveryv1.AddressTypeFQDN, t3)
			tr.SetSlice(nameOf(ef), ef)
			tr.SetSlice(nameOf(ef), nil)
		}, []time.Time{t1, t2}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := New(translate.Options{})
			tr.started = startTime
			tc.scenario(tr)
			var got []time.Time
			for _, trig := range tr.Sync().Triggers {
				got = append(got, trig.At)
			}
			if !slices.EqualFunc(got, tc.want, time.Time.Equal) {
				t.Errorf("triggers %v, want %v", got, tc.want)
			}
		})
	}
}

// A tracker's start is when New made it: a slice whose trigger time is
// before then (last changed before the agent started) gives no trigger,
// one after it does.
func TestTrackerStartsAtNew(t *testing.T) {
	before := time.Now().Add(-time.Second)
	tr := New(translate.Options{})
	after := time.Now().Add(time.Millisecond)
	for _, s := range []struct {
		name string
		at   time.Time
	}{{"old", before}, {"new", after}} {
		es := slice(s.name, s.name, 8080, "10.0.0.1")
		es.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: s.at.Format(time.RFC3339Nano)}
		tr.SetSlice(nameOf(es), es)
	}
	if got := tr.Sync().Triggers; len(got) != 1 || !got[0].At.Equal(after.Round(0)) {
		t.Errorf("triggers %v, want the one after New alone (%v)", got, after)
	}
}
