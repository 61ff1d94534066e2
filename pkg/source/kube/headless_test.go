package kube

import (
	"bytes"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/client-go/kubernetes/scheme"
)

// An EndpointSlice labelled service.kubernetes.io/headless belongs to no
// Service (translate.Slice.Headless: kube-proxy's informer never lists
// it), whichever way the informers' cache reads it: the protobuf
// decoder, which keeps only the labels a translation reads, keeps that
// one as slimSlice does of the decoded object.
func TestHeadlessSliceCached(t *testing.T) {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-1", ResourceVersion: "7",
			Labels: map[string]string{discoveryv1.LabelServiceName: "web", corev1.IsHeadlessService: "",
				discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: new("http"), Port: new(int32(8080)), Protocol: new(corev1.ProtocolTCP)}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.1"}}},
	}
	data, err := es.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	want, wantTrigger, ok := slimStandard(data)
	if !ok {
		t.Fatal("the standard decoder fails")
	}
	if !want.Headless {
		t.Fatal("slimSlice: not Headless")
	}
	var buf bytes.Buffer
	enc := scheme.Codecs.EncoderForVersion(protobuf.NewSerializer(scheme.Scheme, scheme.Scheme), discoveryv1.SchemeGroupVersion)
	if err := enc.Encode(es, &buf); err != nil {
		t.Fatal(err)
	}
	sl := newSlimmer()
	got, ok := newSliceDecoder(sl).decodeEnvelope(buf.Bytes())
	if !ok {
		t.Fatal("the fast decoder declined")
	}
	sameCached(t, "labelled headless", got, sl.takeTrigger(got), want, wantTrigger)
	if nn, ok := got.ServiceName(); ok {
		t.Errorf("the slice belongs to %v", nn)
	}
	// Without the label, it is the Service's.
	delete(es.Labels, corev1.IsHeadlessService)
	buf.Reset()
	if err := enc.Encode(es, &buf); err != nil {
		t.Fatal(err)
	}
	got, ok = newSliceDecoder(newSlimmer()).decodeEnvelope(buf.Bytes())
	if nn, owned := got.ServiceName(); !ok || !owned || nn.Name != "web" || got.Headless {
		t.Errorf("unlabelled: decoded %v, belongs to %v %v, Headless %v", ok, nn, owned, got.Headless)
	}
}
