package translate

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// The service.kubernetes.io/headless label is read on EndpointSlices, not
// Services, as kube-proxy v1.36 reads it (cmd/kube-proxy/app/server.go:
// its Services informer lists those without the service-proxy-name label
// whose spec.clusterIP is not None, its EndpointSlices informer those
// without the headless label). A ClusterIP Service carrying the label is
// served; a slice carrying it belongs to no Service, even an invalid one.
func TestHeadlessLabel(t *testing.T) {
	ports := []discoveryv1.EndpointPort{eport("http", 8080, corev1.ProtocolTCP)}
	labelled := func(es *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
		es.Labels[corev1.IsHeadlessService] = ""
		return es
	}
	invalid := labelled(slice("web-bad", "web", ports, ep{addr: "not-an-ip"}))
	for _, c := range []struct {
		name   string
		svc    func(*corev1.Service)
		slices []*discoveryv1.EndpointSlice
		want   string
	}{
		{"a ClusterIP Service labelled headless is served", func(s *corev1.Service) {
			s.Labels = map[string]string{corev1.IsHeadlessService: ""}
		}, []*discoveryv1.EndpointSlice{slice("web-1", "web", ports, here)}, `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1
`},
		{"a slice labelled headless contributes no backends", func(*corev1.Service) {},
			[]*discoveryv1.EndpointSlice{slice("web-1", "web", ports, here), labelled(slice("web-2", "web", ports, there))}, `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1
`},
		{"the Service's only slice labelled headless: no endpoints, rejected", func(*corev1.Service) {},
			[]*discoveryv1.EndpointSlice{labelled(slice("web-1", "web", ports, here))}, `
ClusterIP 10.96.0.1:80/TCP ->
`},
		{"an invalid slice labelled headless fails nothing", func(*corev1.Service) {},
			[]*discoveryv1.EndpointSlice{slice("web-1", "web", ports, here), invalid}, `
ClusterIP 10.96.0.1:80/TCP -> 10.1.0.1
`},
	} {
		t.Run(c.name, func(t *testing.T) {
			svc := service("web", []string{"10.96.0.1"}, sport("http", 80, corev1.ProtocolTCP))
			c.svc(svc)
			tr, err := ServiceToModel(svc, c.slices, Options{Node: Node{Name: "node-a"}})
			if err != nil || tr.Skipped != "" {
				t.Fatalf("ServiceToModel: %v %q", err, tr.Skipped)
			}
			if g, w := renderNS(tr.Services), strings.TrimPrefix(c.want, "\n"); g != w {
				t.Fatalf("got\n%s\nwant\n%s", g, w)
			}
		})
	}

	// clusterIP None is still headless, labelled or not.
	svc := service("h", []string{"None"}, sport("", 80, ""))
	if tr, err := ServiceToModel(svc, nil, Options{}); err != nil || tr.Skipped != SkipHeadless {
		t.Errorf("clusterIP None: %v %q, want skipped %q", err, tr.Skipped, SkipHeadless)
	}

	// The slice belongs to no Service: the sources' trackers file it
	// under none, as kube-proxy's informer never lists it.
	es := labelled(slice("web-2", "web", ports, there))
	if nn, ok := ServiceNameOfSlice(es); ok {
		t.Errorf("ServiceNameOfSlice of a slice labelled headless: %v", nn)
	}
	if nn, ok := SliceOf(es).ServiceName(); ok {
		t.Errorf("Slice.ServiceName of a slice labelled headless: %v", nn)
	}
	if !SliceOf(es).Headless {
		t.Error("Slice.Headless false for a slice labelled headless")
	}
}
