package manifest

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
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

// The spans of a long List's items grow by doubling (appendSpan): at
// 60,000 items append's growth by a quarter left 5.2 MB of arrays behind
// for 0.9 MB of spans. Split, a List of 60,000 items makes 13 arrays
// (16 spans to 65,536), where append's growth made 26.
func TestSplitListSpansDouble(t *testing.T) {
	const n = 60000
	var b bytes.Buffer
	b.WriteString(`{"kind":"List","items":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{}`)
	}
	b.WriteString(`]}`)
	doc := b.Bytes()
	var items []span
	allocs := testing.AllocsPerRun(3, func() {
		var ok bool
		if _, items, ok = splitJSONListSpans(doc); !ok {
			t.Fatal("not split")
		}
	})
	if len(items) != n {
		t.Fatalf("%d items, want %d", len(items), n)
	}
	if allocs > 16 {
		t.Errorf("splitting %d items: %.0f allocations, want at most 16", n, allocs)
	}
}

// skipValue and skipString, eight bytes at a time, end where a byte at a
// time does (refSkipValue, their first form), on any bytes.
func TestSkipValueMatchesByteScan(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	// With backslashes and without (whose blocks of 64 bytes skipValue
	// reads as bit masks), short and long, the brackets and quotes rarer
	// or not; from each byte of the short ones, from some of the long.
	alphabets := [][]byte{
		[]byte("{}[]\"\\ a,:\x00\x7f\xff\xdb\xdd\x7b"),
		[]byte("{}[]\" a,:\x00\x7f\xff\xdb\xdd\x7b\xfb\x5b"),
		[]byte("{}[]\"aaaaaaaaaaaaaaaaaaaaaaa\\"),
		[]byte("{}[]\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa:,"),
	}
	doc := make([]byte, 0, 400)
	for n := range 300000 {
		alphabet := alphabets[n%len(alphabets)]
		doc = doc[:0]
		long := n%3 == 0
		size := r.IntN(64)
		if long {
			size = r.IntN(400)
		}
		for range size {
			doc = append(doc, alphabet[r.IntN(len(alphabet))])
		}
		for i := range doc {
			if long && doc[i] != '{' && doc[i] != '[' && r.IntN(8) != 0 {
				continue
			}
			end, ok := skipValue(doc, i)
			wantEnd, wantOK := refSkipValue(doc, i)
			if end != wantEnd || ok != wantOK {
				t.Fatalf("skipValue(%q, %d) = %d, %v; want %d, %v", doc, i, end, ok, wantEnd, wantOK)
			}
		}
	}
}

func refSkipString(doc []byte, i int) (int, bool) {
	i++
	for {
		j := bytes.IndexByte(doc[i:], '"')
		if j < 0 {
			return 0, false
		}
		i += j
		n := 0
		for k := i - 1; k >= 0 && doc[k] == '\\'; k-- {
			n++
		}
		i++
		if n%2 == 0 {
			return i, true
		}
	}
}

func refSkipValue(doc []byte, i int) (int, bool) {
	if i < len(doc) && doc[i] == '"' {
		return refSkipString(doc, i)
	}
	if i >= len(doc) || doc[i] != '{' && doc[i] != '[' {
		return skipValue(doc, i) // a literal, or nothing: not what the test is about
	}
	depth := 0
	for i < len(doc) {
		switch doc[i] {
		case '"':
			end, ok := refSkipString(doc, i)
			if !ok {
				return 0, false
			}
			i = end
			continue
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				return i + 1, true
			}
		}
		i++
	}
	return 0, false
}
