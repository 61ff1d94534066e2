package kube

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"
)

// sliceClientDecoder returns the decoder the slices' REST client takes for
// a media type, as client-go's negotiator makes it of the serializer.
func sliceClientDecoder(t *testing.T, n sliceNegotiator, mediaType string) runtime.Decoder {
	t.Helper()
	info, ok := runtime.SerializerInfoForMediaType(n.SupportedMediaTypes(), mediaType)
	if !ok {
		t.Fatalf("no serializer for %s", mediaType)
	}
	return n.DecoderToVersion(info.Serializer, discoveryv1.SchemeGroupVersion)
}

// TestSliceClientDecodes: the slices' REST client decodes a watch event's
// slice, protobuf or JSON, into what slimSlice makes of the standard
// decoder's object: straight from its protobuf when the fast decoder
// takes it, through the standard decoder when it declines it (or the
// answer is JSON); and the rest (a list, a Status) as before.
func TestSliceClientDecodes(t *testing.T) {
	r := rand.New(rand.NewPCG(14, 63))
	pbInfo, _ := runtime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), runtime.ContentTypeProtobuf)
	jsInfo, _ := runtime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), runtime.ContentTypeJSON)
	pb := scheme.Codecs.EncoderForVersion(pbInfo.Serializer, discoveryv1.SchemeGroupVersion)
	js := scheme.Codecs.EncoderForVersion(jsInfo.Serializer, discoveryv1.SchemeGroupVersion)
	encode := func(enc runtime.Encoder, obj runtime.Object) []byte {
		var buf bytes.Buffer
		if err := enc.Encode(obj, &buf); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	const n = 2000
	var counts sliceDecodes
	sl := newSlimmer()
	neg := newSliceNegotiator(sl, &counts)
	pbDec, jsDec := sliceClientDecoder(t, neg, runtime.ContentTypeProtobuf), sliceClientDecoder(t, neg, runtime.ContentTypeJSON)
	var fast, declined int64
	for i := range n {
		es, raw, want, wantTrigger := randomStandard(t, r, i)
		if _, ok := newSliceDecoder(newSlimmer()).decode(raw); ok {
			fast++
		} else {
			declined++
		}
		for _, c := range []struct {
			what string
			dec  runtime.Decoder
			data []byte
		}{{"protobuf", pbDec, encode(pb, es)}, {"JSON", jsDec, encode(js, es)}} {
			obj, err := runtime.Decode(c.dec, c.data)
			if err != nil {
				t.Fatalf("slice %d in %s: %v", i, c.what, err)
			}
			got, ok := obj.(*cachedSlice)
			if !ok {
				t.Fatalf("slice %d in %s: decoded a %T", i, c.what, obj)
			}
			sameCached(t, fmt.Sprintf("slice %d in %s (%+v)", i, c.what, es), got, sl.takeTrigger(got), want, wantTrigger)
		}
	}
	if fast == 0 || declined == 0 {
		t.Fatalf("the fast decoder took %d slices, declined %d: want some of each", fast, declined)
	}
	if f, s := counts.fast.Load(), counts.standard.Load(); f != fast || s != declined+n {
		t.Fatalf("decoded %d fast, %d standard; want %d, %d (the declined and the JSON ones)", f, s, fast, declined+n)
	}
	if len(sl.triggers) != 0 {
		t.Fatalf("triggers left: %d", len(sl.triggers))
	}

	// A bookmark: a slice of only a resourceVersion and the annotation
	// the reflector reads at the end of a streamed list.
	bookmark := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "42",
		Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}}
	obj, err := runtime.Decode(pbDec, encode(pb, bookmark))
	if err != nil {
		t.Fatal(err)
	}
	if c, ok := obj.(*cachedSlice); !ok || c.GetResourceVersion() != "42" || c.GetAnnotations()[metav1.InitialEventsAnnotationKey] != "true" {
		t.Fatalf("bookmark decoded as %#v", obj)
	}

	// A Status (a watch's error event) and a list stay what they are.
	status := &metav1.Status{Status: metav1.StatusFailure, Message: "gone", Reason: metav1.StatusReasonExpired, Code: 410}
	for _, c := range []struct {
		dec runtime.Decoder
		enc runtime.Encoder
	}{{pbDec, pb}, {jsDec, js}} {
		obj, err := runtime.Decode(c.dec, encode(c.enc, status))
		if err != nil {
			t.Fatal(err)
		}
		if s, ok := obj.(*metav1.Status); !ok || s.Message != "gone" {
			t.Fatalf("status decoded as %#v", obj)
		}
	}
	list := &discoveryv1.EndpointSliceList{Items: []discoveryv1.EndpointSlice{*randomSlice(r)}}
	list.Items[0].AddressType = discoveryv1.AddressTypeIPv4
	var into discoveryv1.EndpointSliceList
	if err := runtime.DecodeInto(pbDec, encode(pb, list), &into); err != nil {
		t.Fatal(err)
	}
	if len(into.Items) != 1 || into.Items[0].Name != list.Items[0].Name {
		t.Fatalf("list decoded as %+v", into)
	}
}
