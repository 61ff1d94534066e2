package manifest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// A List decoded where it is, on a first load.
//
// A load finds a JSON List's items without decoding them
// (splitJSONListSpans), so that an edit decodes only the items whose
// bytes changed; on a first load, every item is then decoded, a second
// pass over the same bytes (33 ms of a load of 30,000 Services x 10
// endpoints, issue 14). decodeListInPlace makes the two passes one when
// there is nothing decoded before: each item is decoded where it is in
// the List (decodeLeading), which finds its end as it decodes it; an item
// it does not decode so is passed as the split passes it (skipValue) and
// decoded as before, from its bytes. What it makes of the List is what
// splitting it, then decoding its items (decodeDocument), makes: the same
// items, in the same order, decoded the same way, with the same sums,
// outcomes, spans and messages (TestListInPlaceMatchesSplit). If the List
// turns out not to be one that splits (its kind, after its items as
// encoding/json writes it, is not a List's; a key out of place), what it
// decoded is undone and decodeDocument goes on as before.

// decodeListInPlace decodes doc, a JSON document of file (document idx),
// if it is a List that splitJSONListSpans splits and every item whose
// bytes it has not seen before is to be decoded (a first load: l.units
// empty), and returns what decodeDocument returns of it. ok is false if
// it did not: nothing of fr or l has changed then (but the pages dropped,
// and strings shared by the compacter).
func (l *loader) decodeListInPlace(fr *fileResult, file string, idx int, doc []byte) (objs []*object, warns []string, errs []error, broken, ok bool) {
	i := skipSpace(doc, 0)
	if i >= len(doc) || doc[i] != '{' {
		return nil, nil, nil, false, false
	}
	i++
	mark := len(fr.units)
	var res inPlace
	undo := func() (objs []*object, warns []string, errs []error, broken, ok bool) {
		clear(fr.units[mark:]) // (what they point to is garbage)
		fr.units = fr.units[:mark]
		l.decoded.Add(int64(-res.decoded))
		return nil, nil, nil, false, false
	}
	arr, arrEnd := -1, 0
	for {
		i = skipSpace(doc, i)
		if i >= len(doc) || doc[i] != '"' {
			return undo()
		}
		end, ok := skipString(doc, i)
		if !ok {
			return undo()
		}
		key := doc[i+1 : end-1]
		if bytes.IndexByte(key, '\\') >= 0 {
			return undo()
		}
		i = skipSpace(doc, end)
		if i >= len(doc) || doc[i] != ':' {
			return undo()
		}
		i = skipSpace(doc, i+1)
		switch {
		case bytes.EqualFold(key, []byte("items")):
			if arr >= 0 || string(key) != "items" || i >= len(doc) || doc[i] != '[' {
				return undo()
			}
			arr = i
			// The passes before (isBlank's, over all of doc) left
			// their pages mapped: the items' pass drops them behind
			// it (pages.passed).
			fr.pages.dropAll()
			if i, ok = l.decodeItemsInPlace(fr, file, idx, doc, i, &res); !ok {
				return undo()
			}
			arrEnd = i
		case arr < 0 && i < len(doc) && (doc[i] == '{' || doc[i] == '['):
			// Not a List as kubectl and encoding/json write one
			// (apiVersion, items, kind, metadata): left to the split,
			// before anything is decoded.
			return undo()
		default:
			if i, ok = skipValue(doc, i); !ok {
				return undo()
			}
		}
		var more bool
		if i, more, ok = skipSeparator(doc, i, '}'); !ok {
			return undo()
		}
		if !more {
			break
		}
	}
	if arr < 0 {
		return undo()
	}
	// The List but its items, which readJSON decodes for its type meta.
	rest := make([]byte, 0, len(doc)-(arrEnd-arr)+2)
	rest = append(rest, doc[:arr]...)
	rest = append(rest, "[]"...)
	rest = append(rest, doc[arrEnd:]...)
	var tm typeMeta
	if json.Unmarshal(rest, &tm) != nil || !(tm.Kind == "List" || strings.HasSuffix(tm.Kind, "List") && tm.Items != nil) {
		return undo()
	}
	// As decodeDocument's List.
	l.inPlace.Add(1)
	fr.pages.dropAll()
	fr.lists++
	fr.listSpans = res.spans
	return res.objs, res.warns, res.errs, res.broken, true
}

// decodeItemsInPlace decodes the items of the array at doc[i] ('['), as
// decodeDocument and decodeItems do once it is split (skipItems), and
// returns where the array ends, where its items are, what they make (as
// decodeDocument collects the items' outcomes, in their order) and how
// many it decoded. ok is false where skipItems fails.
//
// How many items there are is not known until the end: the arrays it
// makes double as they fill (append grows a long one by a quarter, which
// made 20 MB of garbage a load at 30,000 Services).
func (l *loader) decodeItemsInPlace(fr *fileResult, file string, idx int, doc []byte, i int, res *inPlace) (end int, ok bool) {
	i++
	if j := skipSpace(doc, i); j < len(doc) && doc[j] == ']' {
		return j + 1, true
	}
	// Each object is dead once decodeObject has its compact form.
	d := fastDecoder{reuse: true, pack: true}
	for j, more := 0, true; more; j++ {
		start := skipSpace(doc, i)
		itm, pre, n, decodedHere := d.decodeLeading(doc[start:])
		var err error
		if decodedHere {
			i = start + n
		} else {
			if i, ok = skipValue(doc, start); !ok {
				return 0, false
			}
			itm, pre, err = d.decodeItem(doc[start:i:i])
		}
		item := doc[start:i:i]
		res.spans = appendSpan(res.spans, span{start, i})
		sum := l.sum(item)
		sum.item = true
		if err != nil {
			res.errs = append(res.errs, fmt.Errorf("%s: document %d: items[%d]: not an object: %w", file, idx, j, err))
			res.broken = true
		} else {
			res.decoded++
			if len(fr.units) == cap(fr.units) {
				fr.units = slices.Grow(fr.units, max(len(fr.units), 16))
			}
			o, w, err := l.decodeObject(fr, sum, file, idx, j, itm, item, pre)
			if l.afterItem != nil {
				l.afterItem()
			}
			if w != "" {
				res.warns = append(res.warns, w)
			}
			if err != nil {
				res.errs = append(res.errs, err)
			}
			if o != nil {
				if len(res.objs) == cap(res.objs) {
					res.objs = slices.Grow(res.objs, max(len(res.objs), 16))
				}
				res.objs = append(res.objs, o)
			}
		}
		fr.pages.passed(item)
		if i, more, ok = skipSeparator(doc, i, ']'); !ok {
			return 0, false
		}
	}
	return i, true
}

// inPlace is what decodeItemsInPlace makes of a List's items.
type inPlace struct {
	spans  []span
	objs   []*object
	warns  []string
	errs   []error
	broken bool
	// decoded counts the objects decodeObject decoded (and counted in
	// loader.decoded).
	decoded int
}
