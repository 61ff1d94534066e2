package kube

import (
	"crypto/sha256"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/source/internal/sourcetest"
	"github.com/sluice-lb/sluice/pkg/source/tracker"
	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// The change tracker fed what the informers' transform caches (each
// Service and slice in its compact form) ends every sync as the tracker
// fed the whole objects does: the same desired state, the same Services
// failing with the same errors naming the object, the same skipped, the
// same warnings, and the same conflicts with the same owners. The
// Services are drawn at random (randomObjects) and several claim the
// same frontends, with odd and invalid ones among them (oddService);
// over a few rounds of changes some are updated, re-sent unchanged (a
// resync), updated in their status or metadata only, deleted, or deleted
// and created again later.
//
// Both trackers make what a translation reads of a Service with
// translate.ServiceOf, so the results are also held against main's before
// the compact Service existed: testdata/compact-random.golden has the
// SHA-256 of each case's syncs (states, every field of every frontend;
// issues; warnings) as that
// translated them from the objects. Run with -update to rewrite it once a
// change of the translation is meant.
func TestCompactTracksTheSameRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(14, 4))
	node := translate.Node{Name: "node-a", Labels: map[string]string{corev1.LabelTopologyZone: "zone-a"},
		IPs:       []netip.Addr{netip.MustParseAddr("203.0.113.9"), netip.MustParseAddr("2001:db8::9")},
		Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1")}}
	rv := 0
	var seen struct{ frontends, errs, skipped, conflicts int }
	var sums []string // of each case's transcript
	for c := range 150 {
		var transcript strings.Builder
		whole, compact := tracker.New(translate.Options{Node: node}), tracker.New(translate.Options{Node: node})
		sl := newSlimmer()
		type current struct {
			svc *corev1.Service
			eps []*discoveryv1.EndpointSlice
		}
		live := map[string]current{}
		set := func(name string, svc *corev1.Service, eps []*discoveryv1.EndpointSlice) {
			key := types.NamespacedName{Namespace: "default", Name: name} // an odd one's may differ
			whole.SetService(key, svc)
			if svc == nil {
				compact.SetCompactService(key, nil)
			} else {
				o, err := sl.slim(svc.DeepCopy())
				if err != nil {
					t.Fatal(err)
				}
				compact.SetCompactService(key, &o.(*cachedService).Service)
			}
			for _, es := range eps {
				skey := types.NamespacedName{Namespace: es.Namespace, Name: es.Name}
				whole.SetSlice(skey, es)
				o, err := sl.slim(es.DeepCopy())
				if err != nil {
					t.Fatal(err)
				}
				compact.SetCompactSlice(skey, &o.(*cachedSlice).Slice, sl.takeTrigger(o.(*cachedSlice)))
			}
		}
		deleteSlices := func(eps []*discoveryv1.EndpointSlice) {
			for _, es := range eps {
				key := types.NamespacedName{Namespace: es.Namespace, Name: es.Name}
				whole.SetSlice(key, nil)
				compact.SetCompactSlice(key, nil, "")
			}
		}
		draw := func(name string) current {
			svc, eps := randomObjects(r)
			rv++
			svc.Name, svc.ResourceVersion, svc.Generation = name, strconv.Itoa(rv), 1
			svc.CreationTimestamp = metav1.Unix(int64(1000*(1+r.IntN(3))), 0) // ties: by name
			oddService(r, svc)
			for _, es := range eps {
				rv++
				es.Name, es.ResourceVersion = name+"-"+es.Name, strconv.Itoa(rv)
				if es.Labels[discoveryv1.LabelServiceName] == "web" {
					es.Labels[discoveryv1.LabelServiceName] = name
				}
			}
			return current{svc, eps}
		}
		for round := range 4 {
			for i := range 6 {
				name := fmt.Sprintf("svc-%d", i)
				cur, ok := live[name]
				switch {
				case !ok && (round == 0 || r.IntN(2) == 0):
					cur = draw(name)
					live[name] = cur
					set(name, cur.svc, cur.eps)
				case !ok:
				case r.IntN(5) == 0: // deleted, with its slices
					deleteSlices(cur.eps)
					set(name, nil, nil)
					delete(live, name)
				case r.IntN(4) == 0: // a resync: the same versions again
					set(name, cur.svc, cur.eps)
				case r.IntN(3) == 0: // metadata or status only: a new version
					svc := cur.svc.DeepCopy()
					rv++
					svc.ResourceVersion = strconv.Itoa(rv)
					svc.Annotations = map[string]string{"example.com/round": strconv.Itoa(round)}
					svc.Status.Conditions = []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue}}
					cur.svc = svc
					live[name] = cur
					set(name, svc, nil)
				default: // a new spec and new slices, keeping its creation time
					created := cur.svc.CreationTimestamp
					deleteSlices(cur.eps)
					next := draw(name)
					next.svc.CreationTimestamp, next.svc.Generation = created, cur.svc.Generation+1
					live[name] = next
					set(name, next.svc, next.eps)
				}
			}
			w, g := whole.Sync(), compact.Sync()
			what := fmt.Sprintf("case %d round %d", c, round)
			if !reflect.DeepEqual(g.State.Services.Map(), w.State.Services.Map()) {
				t.Fatalf("%s: compact state\n%s\nwant\n%s", what, sourcetest.Render(g.State), sourcetest.Render(w.State))
			}
			werrs, wskipped, wconflicts := whole.Issues()
			gerrs, gskipped, gconflicts := compact.Issues()
			if fmt.Sprint(gerrs) != fmt.Sprint(werrs) || !reflect.DeepEqual(gskipped, wskipped) ||
				!reflect.DeepEqual(gconflicts, wconflicts) {
				t.Fatalf("%s: compact issues\n%v\n%v\n%v\nwant\n%v\n%v\n%v", what, gerrs, gskipped, gconflicts, werrs, wskipped, wconflicts)
			}
			if gw, ww := compact.Warnings(), whole.Warnings(); !reflect.DeepEqual(gw, ww) {
				t.Fatalf("%s: compact warnings %v, want %v", what, gw, ww)
			}
			fmt.Fprintf(&transcript, "%s%v\n%v\n%v\n%v\n", dump(w.State), werrs, wskipped, wconflicts, whole.Warnings())
			seen.frontends += w.State.Services.Len()
			seen.errs, seen.skipped, seen.conflicts = seen.errs+len(werrs), seen.skipped+len(wskipped), seen.conflicts+len(wconflicts)
		}
		sums = append(sums, fmt.Sprintf("%d %x", c, sha256.Sum256([]byte(transcript.String()))))
	}
	compareGolden(t, "testdata/compact-random.golden", strings.Join(sums, "\n")+"\n")
	// The draw covers what it must: frontends, failures, skips and conflicts.
	if seen.frontends == 0 || seen.errs == 0 || seen.skipped == 0 || seen.conflicts == 0 {
		t.Errorf("the random Services gave %+v", seen)
	}
	t.Logf("over all syncs: %+v", seen)
}

// oddService makes svc odd or invalid, one time in two, in one of the ways
// translation reads differently from the plain case: addresses written
// with leading zeros, IPv4-mapped or with a zone, clusterIPs that
// disagree, an unknown type, affinity or protocol, ports out of range or
// duplicated, an empty name, namespace or proxy-name label.
func oddService(r *rand.Rand, svc *corev1.Service) {
	sp := &svc.Spec
	switch r.IntN(56) {
	case 0:
		sp.ClusterIP, sp.ClusterIPs = "010.096.000.010", []string{"010.096.000.010"}
	case 1:
		sp.ClusterIP, sp.ClusterIPs = "10.96.0.10", []string{"10.96.0.10", "10.96.0.11"}
	case 2:
		sp.ClusterIP, sp.ClusterIPs = "not-an-ip", nil
	case 3:
		sp.ClusterIP, sp.ClusterIPs = "10.96.0.10", []string{"10.96.0.10"}
		sp.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol}
	case 4:
		sp.ClusterIP, sp.ClusterIPs = "10.96.0.11", []string{"10.96.0.10"}
	case 5:
		sp.ExternalIPs = append(sp.ExternalIPs, "fe80::1%eth0")
	case 6:
		sp.ExternalIPs = append(sp.ExternalIPs, "::ffff:198.51.100.7", "198.051.100.007")
	case 7:
		sp.Type = "Bogus"
	case 8:
		sp.SessionAffinity = "Sticky"
	case 9:
		sp.SessionAffinity = corev1.ServiceAffinityClientIP
		sp.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: new(int32(90000))}}
	case 10:
		sp.Ports = append(sp.Ports, corev1.ServicePort{Name: "zero", Port: 0})
	case 11:
		sp.Ports = append(sp.Ports, corev1.ServicePort{Name: "big", Port: 70000})
	case 12:
		sp.Ports = append(sp.Ports, sp.Ports[0])
	case 13:
		p := sp.Ports[0]
		p.Name = "again"
		sp.Ports = append(sp.Ports, p)
	case 14:
		sp.Ports[0].NodePort = -1
	case 15:
		sp.Ports[0].TargetPort = intstr.FromInt32(70000)
	case 16:
		sp.Ports[0].Protocol = "ICMP"
	case 17:
		svc.Name = ""
	case 18:
		svc.Namespace = ""
	case 19:
		svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: "198.051.100.008"},
			corev1.LoadBalancerIngress{IP: "::ffff:198.51.100.9"}, corev1.LoadBalancerIngress{IP: "bogus"}, corev1.LoadBalancerIngress{Hostname: "lb.example"})
	case 20:
		sp.HealthCheckNodePort = 70000
	case 21:
		sp.Ports = append(sp.Ports, corev1.ServicePort{Port: 9999})
	case 22:
		sp.SessionAffinity = corev1.ServiceAffinityNone
		sp.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: new(int32(0))}}
	case 23:
		sp.ClusterIPs = []string{"10.96.0.10", corev1.ClusterIPNone}
		sp.ClusterIP = sp.ClusterIPs[0]
	case 24:
		sp.ClusterIP, sp.ClusterIPs = corev1.ClusterIPNone, []string{"10.96.0.10"}
	case 25:
		sp.LoadBalancerSourceRanges = append(sp.LoadBalancerSourceRanges, "::ffff:203.0.113.0/120", "010.0.0.0/8")
	case 26:
		sp.ExternalIPs = append(sp.ExternalIPs, "")
	case 27:
		sp.Ports[0].Protocol = corev1.ProtocolSCTP
	case 28:
		sp.ClusterIP, sp.ClusterIPs = "", []string{corev1.ClusterIPNone}
	case 29:
		svc.Labels[translate.LabelServiceProxyName] = ""
	}
}

var update = flag.Bool("update", false, "rewrite the golden files")

// compareGolden checks got against the file golden, or with -update
// rewrites it.
func compareGolden(t *testing.T, golden, got string) {
	t.Helper()
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		g, w := strings.Split(got, "\n"), strings.Split(string(want), "\n")
		for i := range min(len(g), len(w)) {
			if g[i] != w[i] {
				t.Fatalf("%s: first difference at line %d: %q, want %q (run with -update if intended)", golden, i+1, g[i], w[i])
			}
		}
		t.Fatalf("%s: %d lines, want %d (run with -update if intended)", golden, len(g), len(w))
	}
}

// dump is every field of every frontend of st, a line each, sorted.
func dump(st *model.State) string {
	var b strings.Builder
	for _, fe := range slices.SortedFunc(st.Services.Keys(), model.L4Addr.Compare) {
		s := st.Services.Get(fe)
		fmt.Fprintf(&b, "%v %v %v %v drop=%v two=%v %v local=%v %v hc=%d %v %v\n", fe, s.Name, s.Kind, s.Backends, s.DropWhenEmpty,
			s.TwoScopes, s.InternalBackends, s.ExternalLocal, s.SourceRanges, s.HealthCheckNodePort, s.LocalReady, s.AffinityTimeout)
	}
	return b.String()
}
