package manifest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// parsedString renders all a parse of a file made that a load reads: its
// objects (key, place, compact form), warnings, errors, units (sums, in
// order, and what each holds), Lists, spans and layout; and how many
// objects it decoded.
func parsedString(l *loader, fr *fileResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "unknown=%v lists=%d decoded=%d\n", fr.unknown, fr.lists, l.decoded.Load())
	for _, o := range fr.objs {
		fmt.Fprintf(&b, "obj %s %s %d owner=%v\n", o.key, o.file, o.doc, o.hasOwner)
		if o.svc != nil {
			js, _ := json.Marshal(o.svc)
			fmt.Fprintf(&b, "  svc %s invalid=%v\n", js, o.svc.Invalid)
		}
		if o.slice != nil {
			fmt.Fprintf(&b, "  slice %s", sliceString(o.slice))
		}
	}
	for _, w := range fr.warns {
		fmt.Fprintf(&b, "warn %s\n", w)
	}
	for _, e := range fr.errs {
		fmt.Fprintf(&b, "err %v\n", e)
	}
	for _, u := range fr.units {
		last := "-"
		if u.last != nil {
			last = u.last.key.String()
		}
		fmt.Fprintf(&b, "unit %v ignore=%q last=%s\n", u.sum, u.ignore, last)
	}
	fmt.Fprintf(&b, "layout %+v\n", fr.layout)
	return b.String()
}

// checkInPlace parses data as a JSON file with a first load's loader,
// with and without decoding a List in place: everything the parse makes
// must be the same, the objects' compact forms every field. It reports
// whether the List was decoded in place.
func checkInPlace(t *testing.T, data []byte) bool {
	t.Helper()
	var got, want string
	var inPlace bool
	seed := maphash.MakeSeed() // the same sums
	for _, off := range []bool{false, true} {
		l := newLoader(translate.Options{})
		l.noInPlace, l.seed = off, seed
		fr := l.parseFile("f.json", data)
		s := parsedString(l, fr)
		if off {
			want = s
			continue
		}
		got = s
		inPlace = l.inPlace.Load() == 1
		if fr.objs != nil {
			// The compact forms, compared as values too.
			l2 := newLoader(translate.Options{})
			l2.noInPlace = true
			fr2 := l2.parseFile("f.json", data)
			if len(fr2.objs) == len(fr.objs) {
				for i, o := range fr.objs {
					if !reflect.DeepEqual(o.svc, fr2.objs[i].svc) || !reflect.DeepEqual(o.slice, fr2.objs[i].slice) {
						t.Fatalf("%s: in place %+v, split %+v", o.key, o, fr2.objs[i])
					}
				}
			}
		}
	}
	if got != want {
		t.Fatalf("in place:\n%s\nsplit:\n%s\ninput:\n%.2000s", got, want, data)
	}
	return inPlace
}

// randList returns a List of n random objects written as encoding/json or
// kubectl write one, and at times otherwise: items rewritten in other
// ways JSON allows or with what the fast decoder declines, items that are
// not objects, keys out of place, and broken bytes.
func randList(r *rand.Rand, n int) []byte {
	items := make([][]byte, n)
	for i := range items {
		js := randObjectJSON(r, i)
		if i%2 == 1 && r.IntN(2) == 0 {
			js = randPackableSlice(r, i)
		}
		switch r.IntN(20) {
		case 0:
			js = rewrite(r, js, false)
		case 1:
			js = rewrite(r, js, true)
		case 2:
			js = []byte(pick(r, `1`, `"x"`, `null`, `[]`, `{}`, `{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"c"}}`,
				`{"metadata":{"name":"m"},"kind":"Service","apiVersion":"v1","spec":{"ports":[{"port":80}],"clusterIP":"10.96.9.9"}}`))
		case 3:
			var v any
			if json.Unmarshal(js, &v) == nil {
				js, _ = json.MarshalIndent(v, "  ", "  ")
			}
		}
		items[i] = js
	}
	sep := pick(r, ",", ", ", ",\n    ")
	head := pick(r, `{"apiVersion":"v1","items":[`, `{"apiVersion": "v1", "items": [`, `{"items":[`, `{"kind":"List","items":[`,
		`{"metadata":{},"items":[`, `{"apiVersion":"v1","Items":[`, `{"apiVersion":"v1","it\u0065ms":[`)
	tail := pick(r, `],"kind":"List","metadata":{"resourceVersion":""}}`, `],"kind":"List"}`, `], "kind": "ServiceList"}`,
		`],"kind":"Service"}`, `],"kind":"List","items":[]}`, `]}`, `],"kind":"List"}x`, `],"kind":"List"} `, `],"kind":"List","apiVersion":7}`)
	list := []byte(head + string(bytes.Join(items, []byte(sep))) + tail)
	switch r.IntN(10) {
	case 0: // cut
		list = list[:r.IntN(len(list)+1)]
	case 1: // a byte changed
		if len(list) > 0 {
			list[r.IntN(len(list))] = pick(r, byte('{'), '}', '"', ',', ']', '\\', 'x')
		}
	}
	return list
}

// A List decoded in place on a first load (decodeListInPlace) makes what
// splitting it and decoding its items makes: objects, compact forms,
// errors naming each bad item, units, spans and layout, for Lists of
// random objects written in many ways, and broken ones.
func TestListInPlaceMatchesSplit(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	inPlace, all := 0, 0
	for range 1500 {
		all++
		if checkInPlace(t, randList(r, r.IntN(12))) {
			inPlace++
		}
	}
	t.Logf("%d of %d Lists decoded in place", inPlace, all)
	if inPlace < all/6 {
		t.Errorf("%d of %d Lists decoded in place: want more", inPlace, all)
	}
	// The benchmark's List, as test/bench writes it.
	p := t.TempDir() + "/services.json"
	orig, _ := writeList(t, p, 300, 10, 7)
	if !checkInPlace(t, orig) {
		t.Error("the benchmark's List was not decoded in place")
	}
}

// FuzzListInPlace: on any bytes, a first load's parse of a JSON file
// makes the same with and without decoding a List in place.
func FuzzListInPlace(f *testing.F) {
	r := rand.New(rand.NewPCG(13, 14))
	for range 20 {
		f.Add(randList(r, r.IntN(3))) // small: the fuzzer minimizes each new input
	}
	f.Add([]byte(`{"apiVersion":"v1","items":[{"apiVersion":"v1","kind":"Service","metadata":{"name":"a"},"spec":{"clusterIP":"10.96.0.1","ports":[{"port":80}]}}],"kind":"List"}`))
	f.Fuzz(func(t *testing.T, data []byte) { checkInPlace(t, data) })
}
