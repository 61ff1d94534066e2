package kube

import (
	"context"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
)

// svcPort is a ServicePort; target is a port name or number.
func svcPort(name string, port int32, target string) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Port: port, Protocol: corev1.ProtocolTCP, TargetPort: intstr.Parse(target)}
}

func createNamespace(t *testing.T, c kubernetes.Interface, name string) {
	t.Helper()
	_, err := c.CoreV1().Namespaces().Create(context.Background(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
}

func createService(t *testing.T, c kubernetes.Interface, ns, name string, mutate func(*corev1.Service), ports ...corev1.ServicePort) *corev1.Service {
	t.Helper()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, Ports: ports, Selector: map[string]string{"app": name}},
	}
	if mutate != nil {
		mutate(svc)
	}
	svc, err := c.CoreV1().Services(ns).Create(context.Background(), svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create service %s/%s: %v", ns, name, err)
	}
	return svc
}

type ep struct {
	ip                          string
	ready, serving, terminating bool
}

func ready(ip string) ep       { return ep{ip: ip, ready: true, serving: true} }
func notReady(ip string) ep    { return ep{ip: ip} }
func terminating(ip string) ep { return ep{ip: ip, serving: true, terminating: true} }

// slicePorts maps port names to container ports.
type slicePorts map[string]int32

func makeSlice(ns, svc, name string, ports slicePorts, eps ...ep) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{
			discoveryv1.LabelServiceName: svc,
			discoveryv1.LabelManagedBy:   "sluice-test",
		}, Annotations: map[string]string{
			corev1.EndpointsLastChangeTriggerTime: time.Now().UTC().Format(time.RFC3339Nano),
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	for n, p := range ports {
		es.Ports = append(es.Ports, discoveryv1.EndpointPort{Name: new(n), Port: new(p), Protocol: new(corev1.ProtocolTCP)})
	}
	for _, e := range eps {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
			Addresses: []string{e.ip},
			NodeName:  new(nodeName),
			Conditions: discoveryv1.EndpointConditions{
				Ready: new(e.ready), Serving: new(e.serving), Terminating: new(e.terminating),
			},
		})
	}
	return es
}

func createSlice(t *testing.T, c kubernetes.Interface, es *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
	t.Helper()
	es, err := c.DiscoveryV1().EndpointSlices(es.Namespace).Create(context.Background(), es, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create endpointslice %s/%s: %v", es.Namespace, es.Name, err)
	}
	return es
}

// updateSlice replaces a slice's endpoints, as the EndpointSlice controller
// would after pods change.
func updateSlice(t *testing.T, c kubernetes.Interface, ns, name string, eps ...ep) {
	t.Helper()
	ctx := context.Background()
	es, err := c.DiscoveryV1().EndpointSlices(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ports := slicePorts{}
	for _, p := range es.Ports {
		ports[*p.Name] = *p.Port
	}
	fresh := makeSlice(ns, es.Labels[discoveryv1.LabelServiceName], name, ports, eps...)
	es.Endpoints = fresh.Endpoints
	es.Annotations = fresh.Annotations
	if _, err := c.DiscoveryV1().EndpointSlices(ns).Update(ctx, es, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update endpointslice %s/%s: %v", ns, name, err)
	}
}

// feOf is the frontend ip:port/TCP, as model.L4Addr prints it (an IPv6
// address in brackets).
func feOf(ip string, port int32) string {
	return netip.AddrPortFrom(netip.MustParseAddr(ip), uint16(port)).String() + "/TCP"
}

// fe is Service svc's frontend on its (first) ClusterIP.
func fe(svc *corev1.Service, port int32) string { return feOf(svc.Spec.ClusterIP, port) }

// be is the backend ip:port/TCP, printed as a frontend is.
func be(ip string, port int32) string { return feOf(ip, port) }
