package tracker

import (
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// A LoadBalancer Service whose ingress IP is also one of its externalIPs
// (translate's TestOneFrontendPerAddress): the state holds the
// LoadBalancer frontend with its loadBalancerSourceRanges, and no
// conflict is reported (before, the ExternalIP frontend, open to every
// source, won, and "default/lb:http lost 198.51.100.4:80/TCP to
// default/lb:http").
func TestTrackerLoadBalancerIPAlsoExternalIP(t *testing.T) {
	tr := New(translate.Options{})
	svc := service("lb", "10.96.0.1", 80)
	svc.Spec.Type = corev1.ServiceTypeLoadBalancer
	svc.Spec.ExternalIPs = []string{"198.51.100.4"}
	svc.Spec.LoadBalancerSourceRanges = []string{"203.0.113.0/24"}
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.51.100.4"}}
	tr.SetService(nameOf(svc), svc)
	es := slice("lb", "lb-1", 8080, "10.0.0.1")
	tr.SetSlice(nameOf(es), es)
	r := tr.Sync()
	if len(r.Conflicts) != 0 {
		t.Errorf("conflicts %v", r.Conflicts)
	}
	if _, _, c := tr.Issues(); len(c) != 0 {
		t.Errorf("Issues: conflicts %v", c)
	}
	want := "10.96.0.1:80/TCP default/lb:http -> 10.0.0.1:8080/TCP\n198.51.100.4:80/TCP default/lb:http -> 10.0.0.1:8080/TCP"
	if got := render(r.State); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	fe := r.State.Services.Get(model.L4Addr{Addr: netip.MustParseAddr("198.51.100.4"), Port: 80, Proto: model.TCP})
	if fe == nil || fe.Kind != model.LoadBalancer || len(fe.SourceRanges) != 1 || fe.SourceRanges[0].String() != "203.0.113.0/24" {
		t.Errorf("198.51.100.4:80/TCP is %+v, want the LoadBalancer frontend with ranges [203.0.113.0/24]", fe)
	}
}
