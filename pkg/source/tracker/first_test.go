package tracker

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// randomFirstObjects feeds tr a random cluster through set (SetService
// and SetSlice, or a Batch's): Services with one to three ports, some
// NodePort with external IPs (several frontends a port), a few VIPs so
// that Services claim one frontend, some invalid or headless, some
// deleted again, slices of Services that never come, slices deleted.
func randomFirstObjects(r *rand.Rand, set func(svc bool, key types.NamespacedName, s *translate.Service, es *translate.Slice)) {
	for range 1 + r.IntN(60) {
		name := fmt.Sprintf("s%d", r.IntN(40))
		key := types.NamespacedName{Namespace: "default", Name: name}
		if r.IntN(3) == 0 {
			es := slice(name, fmt.Sprintf("%s-%d", name, r.IntN(3)), 8080, fmt.Sprintf("10.0.%d.%d", r.IntN(2), 1+r.IntN(9)),
				fmt.Sprintf("10.1.%d.%d", r.IntN(2), 1+r.IntN(9)))
			if r.IntN(3) == 0 {
				es.Labels[discoveryv1.LabelServiceName] = fmt.Sprintf("s%d", r.IntN(40)) // filed elsewhere
			}
			k := types.NamespacedName{Namespace: es.Namespace, Name: es.Name}
			if r.IntN(8) == 0 {
				set(false, k, nil, nil)
				continue
			}
			set(false, k, nil, translate.SliceOf(es))
			continue
		}
		if r.IntN(10) == 0 {
			set(true, key, nil, nil)
			continue
		}
		svc := service(name, fmt.Sprintf("10.96.0.%d", 1+r.IntN(12)), int32(80+r.IntN(2)))
		for i := range r.IntN(3) {
			svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: fmt.Sprintf("p%d", i), Port: int32(90 + i), NodePort: int32(30000 + r.IntN(4)),
				Protocol: corev1.ProtocolTCP})
		}
		switch r.IntN(8) {
		case 0:
			svc.Spec.Type = corev1.ServiceTypeNodePort
			svc.Spec.ExternalIPs = []string{fmt.Sprintf("192.0.2.%d", 1+r.IntN(3))}
		case 1:
			svc.Spec.Ports[0].Port = 0 // invalid: fails to translate
		case 2:
			svc.Spec.ClusterIP, svc.Spec.ClusterIPs = corev1.ClusterIPNone, []string{corev1.ClusterIPNone} // skipped
		}
		if c := r.IntN(3); c > 0 {
			svc.CreationTimestamp = metav1.NewTime(time.Unix(int64(c), 0))
		}
		set(true, key, translate.ServiceOf(svc), nil)
	}
}

// The first state, built from the frontends Sync's loop collects, is the
// one build makes by walking every Service's translation (as it did for
// a first state): the same frontends held by the same translations, and
// the same conflicts, over random clusters with conflicts, errors,
// skipped Services, north-south frontends and deletions before the
// first Sync.
func TestFirstStateAsBuilt(t *testing.T) {
	r := rand.New(rand.NewPCG(54, 1))
	opts := translate.Options{Node: translate.Node{Name: "n1", Addresses: []netip.Addr{netip.MustParseAddr("192.168.0.1")}}}
	var conflicted, multi int
	for n := range 2000 {
		tr := New(opts)
		randomFirstObjects(r, func(svc bool, key types.NamespacedName, s *translate.Service, es *translate.Slice) {
			if svc {
				tr.SetCompactService(key, s)
			} else {
				tr.SetCompactSlice(key, es, "")
			}
		})
		got := tr.Sync()
		tr.state = nil // build as for a first state: no holder
		tr.build()
		want := tr.state
		if got.State.Services.Len() != want.Services.Len() {
			t.Fatalf("cluster %d: %d frontends, build makes %d", n, got.State.Services.Len(), want.Services.Len())
		}
		for fe, s := range want.Services.All() {
			if g := got.State.Services.Get(fe); g != s {
				t.Fatalf("cluster %d: %s held by %v, build gives it to %v", n, fe, g, s)
			}
		}
		if !reflect.DeepEqual(got.Conflicts, tr.conflicts) {
			t.Fatalf("cluster %d: conflicts %v, build finds %v", n, got.Conflicts, tr.conflicts)
		}
		if len(got.Conflicts) > 0 {
			conflicted++
		}
		if got.State.Services.Len() > got.Translated {
			multi++
		}
	}
	if conflicted < 200 || multi < 200 {
		t.Errorf("%d clusters with conflicts, %d with several frontends a Service: the random clusters miss a case", conflicted, multi)
	}
}

// A Batch's calls do what the Tracker's do: the same Services dirty with
// the same inputs, the same state, over random sequences of Services
// and slices set and deleted, fed to one tracker call by call and to
// another through a Batch.
func TestBatchAsCalls(t *testing.T) {
	r := rand.New(rand.NewPCG(54, 2))
	for n := range 500 {
		seed := r.Uint64()
		direct, batched := New(translate.Options{}), New(translate.Options{})
		var changedDirect, changedBatched []bool
		randomFirstObjects(rand.New(rand.NewPCG(seed, 0)), func(svc bool, key types.NamespacedName, s *translate.Service, es *translate.Slice) {
			if svc {
				changedDirect = append(changedDirect, direct.SetCompactService(key, s))
			} else {
				changedDirect = append(changedDirect, direct.SetCompactSlice(key, es, "2026-12-05T03:00:00Z"))
			}
		})
		batched.Batch(func(b *Batch) {
			randomFirstObjects(rand.New(rand.NewPCG(seed, 0)), func(svc bool, key types.NamespacedName, s *translate.Service, es *translate.Slice) {
				if svc {
					changedBatched = append(changedBatched, b.SetCompactService(key, s))
				} else {
					changedBatched = append(changedBatched, b.SetCompactSlice(key, es, "2026-12-05T03:00:00Z"))
				}
			})
		})
		if !reflect.DeepEqual(changedDirect, changedBatched) {
			t.Fatalf("sequence %d: changes %v, batched %v", n, changedDirect, changedBatched)
		}
		pd, pb := direct.take(), batched.take()
		if len(pd.services) != len(pb.services) || !reflect.DeepEqual(pd.triggers, pb.triggers) {
			t.Fatalf("sequence %d: %d dirty, %d triggers; batched %d, %d", n, len(pd.services), len(pd.triggers), len(pb.services), len(pb.triggers))
		}
		// The objects of the two runs are alike, not the same: compared
		// by what they hold.
		for i := range pd.services {
			if d, b := pd.services[i], pb.services[i]; d.key != b.key || !reflect.DeepEqual(d, b) {
				t.Fatalf("sequence %d: dirty %d is %v %+v %+v, batched %v %+v %+v", n, i, d.key, d.svc, d.slices, b.key, b.svc, b.slices)
			}
		}
		if !reflect.DeepEqual(direct.ownerOf, batched.ownerOf) || !reflect.DeepEqual(direct.ownerElsewhere, batched.ownerElsewhere) {
			t.Fatalf("sequence %d: owners %v %v, batched %v %v", n, direct.ownerOf, direct.ownerElsewhere, batched.ownerOf, batched.ownerElsewhere)
		}
	}
}
