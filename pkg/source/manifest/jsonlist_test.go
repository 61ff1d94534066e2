package manifest

import (
	"bytes"
	"encoding/json"
	"testing"
)

// checkSplit compares splitJSONList with encoding/json: when it splits a
// valid document, the items are the decoder's raw items, and the rest
// decodes to the same object without them.
func checkSplit(t *testing.T, doc []byte) (ok bool) {
	t.Helper()
	rest, items, ok := splitJSONList(doc)
	var want struct {
		Items []json.RawMessage `json:"items"`
	}
	if !ok || json.Unmarshal(doc, &want) != nil {
		return ok
	}
	if len(items) != len(want.Items) {
		t.Fatalf("%q: %d items, want %d", doc, len(items), len(want.Items))
	}
	for i := range items {
		if !bytes.Equal(items[i], want.Items[i]) {
			t.Fatalf("%q: item %d = %q, want %q", doc, i, items[i], want.Items[i])
		}
	}
	// Numbers are kept as text: a valid document may hold numbers out of
	// float64's range, which json.RawMessage accepts and float64 does not.
	var got, all map[string]any
	if err := unmarshalNumbers(rest, &got); err != nil {
		t.Fatalf("%q: rest %q: %v", doc, rest, err)
	}
	if err := unmarshalNumbers(doc, &all); err != nil {
		t.Fatalf("%q: %v", doc, err)
	}
	if all["items"] = []any{}; !jsonEqual(got, all) {
		t.Fatalf("%q: rest %q", doc, rest)
	}
	return ok
}

func unmarshalNumbers(doc []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(doc))
	d.UseNumber()
	return d.Decode(v)
}

func jsonEqual(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}

func TestSplitJSONList(t *testing.T) {
	for _, tc := range []struct {
		doc string
		ok  bool
	}{
		{`{"kind":"List","items":[{"a":1},{"b":"x\"]}"}, [1,[2]] ,"s", 3, null]}`, true},
		{` { "items" : [ ] , "kind" : "List" } `, true},
		{`{"apiVersion":"v1","kind":"List","metadata":{"items":[1]},"items":[{"k":"v\\"}]}`, true},
		{`{"kind":"Service"}`, false},
		{`{"Items":[{}]}`, false},
		{`{"it\u0065ms":[{}]}`, false},
		{`{"items":[{}],"items":[]}`, false},
		{`{"items":{}}`, false},
		{`{"items":[{}}`, false},
		{`{"items":[{} {}]}`, false},
		{`{"items":[,{}]}`, false},
		{`[{"items":[]}]`, false},
		{`{"items":["unterminated]}`, false},
	} {
		if ok := checkSplit(t, []byte(tc.doc)); ok != tc.ok {
			t.Errorf("%s: ok = %v, want %v", tc.doc, ok, tc.ok)
		}
	}
}

func FuzzSplitJSONList(f *testing.F) {
	f.Add([]byte(`{"kind":"List","items":[{"a":1},{"b":"x\"]}"}]}`))
	f.Add([]byte(`{"items":[1,"2",[3],{"4":4}],"kind":"List"}`))
	// Found by CI's fuzz run: a number float64 cannot hold, outside the
	// items, made the oracle's own decode fail.
	f.Add([]byte(`{"items":[1],"n":1e400,"kind":"List"}`))
	f.Fuzz(func(t *testing.T, doc []byte) { checkSplit(t, doc) })
}
