// Package sourcetest holds the Kubernetes objects and the state rendering
// the tests of the sources share: pkg/source/tracker feeds the objects to
// the tracker directly, pkg/source/kube through a fake API server, and both
// compare the states they get as text, as pkg/source/manifest does.
package sourcetest

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/sluice-lb/sluice/pkg/model"
)

// Service returns a ClusterIP Service default/name at vip with one TCP
// port "http" (targetPort "http").
func Service(name, vip string, port int32) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIP: vip, ClusterIPs: []string{vip},
			Ports: []corev1.ServicePort{{Name: "http", Port: port, Protocol: corev1.ProtocolTCP,
				TargetPort: intstr.FromString("http")}},
		},
	}
}

// Slice returns the EndpointSlice default/name of Service svc, with port
// "http" and one ready endpoint per address in ips.
func Slice(svc, name string, port int32, ips ...string) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name,
			Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: new("http"), Port: new(port), Protocol: new(corev1.ProtocolTCP)}},
	}
	for _, ip := range ips {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip},
			Conditions: discoveryv1.EndpointConditions{Ready: new(true)}})
	}
	return es
}

// Render prints a state compactly, one frontend a line, sorted:
// "frontend name -> backend...".
func Render(st *model.State) string {
	var lines []string
	for fe, s := range st.Services.All() {
		l := fmt.Sprintf("%s %s ->", fe, s.Name)
		for _, b := range s.Backends {
			l += " " + b.L4Addr.String()
		}
		lines = append(lines, l)
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}
