package manifest

import (
	"bytes"
	"cmp"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// TestReusedDecoderKeepsEachObject: the loader's fast decoder decodes
// every object into the same object, maps, arrays and chunks (reuse), so
// what the loader keeps of an object must hold nothing of them: else the
// objects decoded after it overwrite it. Thousands of random objects,
// as the items of a List and as the documents of a stream, each kept
// object's compact form compared, once all are decoded, with what a
// translation reads of its bytes as encoding/json decodes them.
func TestReusedDecoderKeepsEachObject(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	const n = 3000
	byKey := map[objKey][]byte{}
	var items [][]byte
	for i := range n {
		js := randObjectJSON(r, i)
		var tm typeMeta
		mustUnmarshal(t, string(js), &tm)
		kind := kindService
		if tm.Kind == "EndpointSlice" {
			kind = kindSlice
		}
		byKey[objKey{Kind: kind, NamespacedName: types.NamespacedName{
			Namespace: cmp.Or(tm.Metadata.Namespace, "default"), Name: tm.Metadata.Name}}] = js
		items = append(items, js)
	}
	list := append(append([]byte(`{"apiVersion":"v1","kind":"List","items":[`), bytes.Join(items, []byte(","))...), "]}"...)
	stream := bytes.Join(items, []byte("\n---\n"))
	for _, f := range []struct {
		name string
		data []byte
	}{{"f.json", list}, {"f.yaml", stream}} {
		l := newLoader(translate.Options{})
		fr := l.parseFile(f.name, f.data)
		svcs, slices := 0, 0
		for _, o := range fr.objs {
			js := byKey[o.key]
			if js == nil {
				t.Fatalf("%s: kept %s, not an object of the file", f.name, o.key)
			}
			var got, want any
			switch o.key.Kind {
			case kindService:
				var svc corev1.Service
				mustUnmarshal(t, string(js), &svc)
				svc.Namespace, svc.ResourceVersion = o.key.Namespace, ""
				got, want = o.svc, translate.ServiceOf(&svc)
				svcs++
			default:
				var es discoveryv1.EndpointSlice
				mustUnmarshal(t, string(js), &es)
				es.Namespace, es.ResourceVersion = o.key.Namespace, ""
				got, want = o.slice, translate.SliceOf(&es)
				slices++
			}
			if !reflect.DeepEqual(got, want) {
				g, _ := json.Marshal(got)
				w, _ := json.Marshal(want)
				t.Fatalf("%s: %s kept as\n%s\nwant\n%s", f.name, o.key, g, w)
			}
		}
		t.Logf("%s: %d Services and %d slices kept of %d objects", f.name, svcs, slices, n)
		if svcs < 100 || slices < 100 {
			t.Fatalf("%s: %d Services and %d slices kept: want more of each", f.name, svcs, slices)
		}
	}
}
