package manifest

import (
	"encoding/json"
	"reflect"
	"runtime"
	"testing"
	"unsafe"
	"weak"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// Every string field a compact form keeps, set.
const (
	compactService = `{"apiVersion":"v1","kind":"Service","metadata":{"name":"svc-a","namespace":"ns-a","resourceVersion":"7",` +
		`"labels":{"service.kubernetes.io/service-proxy-name":"other","app":"a"},"annotations":{"note":"n"}},` +
		`"spec":{"type":"LoadBalancer","clusterIP":"10.96.0.10","clusterIPs":["10.96.0.10"],` +
		`"ports":[{"name":"http","protocol":"TCP","port":80,"targetPort":8080,"nodePort":30080},{"name":"dns","protocol":"UDP","port":53,"nodePort":30053}],` +
		`"externalIPs":["192.0.2.1"],"loadBalancerSourceRanges":["10.0.0.0/8"],"externalTrafficPolicy":"Local","healthCheckNodePort":31000,` +
		`"sessionAffinity":"ClientIP","sessionAffinityConfig":{"clientIP":{"timeoutSeconds":60}}},` +
		`"status":{"loadBalancer":{"ingress":[{"ip":"198.51.100.1"}]}}}`
	compactSlice = `{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"svc-a-x1","namespace":"ns-a","resourceVersion":"9",` +
		`"labels":{"kubernetes.io/service-name":"svc-a"},"annotations":{"endpoints.kubernetes.io/last-change-trigger-time":"2026-01-02T03:04:05Z"}},` +
		`"addressType":"IPv4","ports":[{"name":"http","protocol":"TCP","port":8080}],` +
		`"endpoints":[{"addresses":["10.0.0.1"],"conditions":{"ready":true,"serving":true,"terminating":false},"nodeName":"node-a","zone":"z1",` +
		`"hints":{"forZones":[{"name":"z1"}],"forNodes":[{"name":"node-a"}]}},` +
		`{"addresses":["10.0.0.2"],"conditions":{"ready":false},"nodeName":"node-b"}]}`
)

// TestCompactKeepsNoDecodedBytes: what the loader keeps of an object the
// fast decoder decoded (its key and compact form) holds none of the
// decoder's chunks, which are shared by every object decoded beside it: a
// string or pointer kept from them would keep them all (compact.go). And
// the compact form is what a translation reads of the object as
// encoding/json decodes it.
func TestCompactKeepsNoDecodedBytes(t *testing.T) {
	for _, js := range []string{compactService, compactSlice} {
		l := newLoader(translate.Options{})
		var fr fileResult
		o, chunks := decodeCompact(t, l, &fr, []byte(js))
		runtime.GC()
		runtime.GC()
		for name, alive := range chunks {
			if alive() {
				t.Errorf("%s: the decoder's %s chunk is kept", o.key, name)
			}
		}

		var want any
		switch {
		case o.svc != nil:
			var svc corev1.Service
			mustUnmarshal(t, js, &svc)
			svc.ResourceVersion = ""
			want = translate.ServiceOf(&svc)
			if o.svc.Invalid != nil || len(o.svc.Ports) != 2 || o.svc.External == nil || o.svc.ProxyName == nil {
				t.Fatalf("not the Service meant: %+v", o.svc)
			}
		default:
			var es discoveryv1.EndpointSlice
			mustUnmarshal(t, js, &es)
			es.ResourceVersion = ""
			want = translate.SliceOf(&es)
			if o.slice.Invalid != nil || o.slice.Endpoints.Len() != 2 || o.slice.Endpoints.At(0).Hints == nil {
				t.Fatalf("not the slice meant: %+v", o.slice)
			}
		}
		got := any(o.slice)
		if o.svc != nil {
			got = o.svc
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("kept %+v, want %+v", got, want)
		}
		runtime.KeepAlive(l)
		runtime.KeepAlive(&fr)
	}
}

// decodeCompact decodes js, one object, with the fast decoder as
// decodeItems does, into chunks of its own, and returns what the loader
// keeps of it and, by chunk, whether the chunk is still reachable. The
// decoder and the API object are gone when it returns.
func decodeCompact(t *testing.T, l *loader, fr *fileResult, js []byte) (*object, map[string]func() bool) {
	t.Helper()
	d := &fastDecoder{pack: true} // its endpoints packed, as the loader's
	// One buffer per chunk, large enough for every value of js: the
	// weak pointers below cover all.
	d.text.buf = make([]byte, 0, 4096)
	d.strs.buf = make([]string, 0, 256)
	d.bools.buf = make([]bool, 0, 256)
	d.i32s.buf = make([]int32, 0, 256)
	chunks := map[string]func() bool{
		"text":  weakAlive(unsafe.SliceData(d.text.buf)),
		"strs":  weakAlive(unsafe.SliceData(d.strs.buf)),
		"bools": weakAlive(unsafe.SliceData(d.bools.buf)),
		"i32s":  weakAlive(unsafe.SliceData(d.i32s.buf)),
	}
	tm, pre, err := d.decodeItem(js)
	if err != nil || pre.svc == nil && pre.slice == nil {
		t.Fatalf("the fast decoder declined (%v):\n%s", err, js)
	}
	if pre.slice != nil && !pre.packed {
		t.Fatalf("the fast decoder did not pack the endpoints:\n%s", js)
	}
	if cap(d.text.buf) != 4096 || cap(d.strs.buf) != 256 || len(d.text.buf) == 0 || len(d.strs.buf) == 0 {
		t.Fatalf("the decoder used other chunks than the test's")
	}
	o, w, err := l.decodeObject(fr, unitSum{}, "f.json", 1, -1, tm, js, pre)
	if o == nil || w != "" || err != nil {
		t.Fatalf("decodeObject: %v %q %v", o, w, err)
	}
	return o, chunks
}

func weakAlive[T any](p *T) func() bool {
	w := weak.Make(p)
	return func() bool { return w.Value() != nil }
}

func mustUnmarshal(t *testing.T, js string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(js), v); err != nil {
		t.Fatal(err)
	}
}
