package manifest

import (
	"bytes"
	"encoding/binary"
	"math/bits"
)

// splitJSONList finds, without decoding them, the elements of the "items"
// array of doc, a JSON object (a List, as kubectl get -o json prints it),
// so that only elements whose bytes changed are decoded. It returns doc
// with that array emptied (for the caller to decode the rest) and the
// elements. ok is false if doc is not shaped so, or not plainly: no
// "items" member, a key with escapes or in another case (the decoder
// matches keys case-insensitively), several "items", or anything out of
// place; the caller then decodes doc as a whole, with the decoder's error
// messages. The elements themselves are not validated here: each is
// decoded (and so validated) on its own, or was before.
func splitJSONList(doc []byte) (rest []byte, items [][]byte, ok bool) {
	rest, spans, ok := splitJSONListSpans(doc)
	if !ok {
		return nil, nil, false
	}
	items = make([][]byte, len(spans))
	for j, sp := range spans {
		items[j] = doc[sp.start:sp.end:sp.end]
	}
	return rest, items, true
}

// span is where a piece (a document, an item of a List) is in a file's
// content: content[start:end].
type span struct{ start, end int }

// splitJSONListSpans is splitJSONList giving where the items are in doc.
func splitJSONListSpans(doc []byte) (rest []byte, items []span, ok bool) {
	i := skipSpace(doc, 0)
	if i >= len(doc) || doc[i] != '{' {
		return nil, nil, false
	}
	i++
	arr := -1 // where the items array starts, once found
	var arrEnd int
	for {
		i = skipSpace(doc, i)
		if i < len(doc) && doc[i] == '}' && arr < 0 {
			return nil, nil, false // no items
		}
		if i >= len(doc) || doc[i] != '"' {
			return nil, nil, false
		}
		end, ok := skipString(doc, i)
		if !ok {
			return nil, nil, false
		}
		key := doc[i+1 : end-1]
		if bytes.IndexByte(key, '\\') >= 0 {
			return nil, nil, false
		}
		i = skipSpace(doc, end)
		if i >= len(doc) || doc[i] != ':' {
			return nil, nil, false
		}
		i = skipSpace(doc, i+1)
		if bytes.EqualFold(key, []byte("items")) {
			if arr >= 0 || string(key) != "items" || i >= len(doc) || doc[i] != '[' {
				return nil, nil, false
			}
			arr = i
			if i, items, ok = skipItems(doc, i); !ok {
				return nil, nil, false
			}
			arrEnd = i
		} else if i, ok = skipValue(doc, i); !ok {
			return nil, nil, false
		}
		var more bool
		if i, more, ok = skipSeparator(doc, i, '}'); !ok {
			return nil, nil, false
		}
		if !more {
			break
		}
	}
	if arr < 0 {
		return nil, nil, false
	}
	rest = make([]byte, 0, len(doc)-(arrEnd-arr)+2)
	rest = append(rest, doc[:arr]...)
	rest = append(rest, "[]"...)
	rest = append(rest, doc[arrEnd:]...)
	return rest, items, true
}

// skipItems returns the index after the array starting at doc[i] ('[')
// and where its elements are.
func skipItems(doc []byte, i int) (end int, items []span, ok bool) {
	i++
	if j := skipSpace(doc, i); j < len(doc) && doc[j] == ']' {
		return j + 1, nil, true
	}
	for more := true; more; {
		start := skipSpace(doc, i)
		if i, ok = skipValue(doc, start); !ok {
			return 0, nil, false
		}
		items = appendSpan(items, span{start, i})
		if i, more, ok = skipSeparator(doc, i, ']'); !ok {
			return 0, nil, false
		}
	}
	return i, items, true
}

// skipContainer returns the index after the object or array starting at
// doc[i]: a quote starts or ends a string, a backslash in a string
// escapes the byte after it, and a bracket out of strings counts.
//
// It goes 64 bytes at a time where they hold no backslash: the quotes and
// brackets of the block as bit masks (blockMasks), which bytes are in a
// string as the running parity of the quotes (prefixXor), then only the
// brackets out of strings looked at one by one: fewer branches than
// stopping at every quote and bracket, whose outcome is hard to predict
// (stopping so, eight bytes at a time to the next, was slower than a
// byte at a time: issue 14, forty-fifth pass). Elsewhere, and in a block
// with a backslash, it goes byte by byte, eight at a time to the next
// one that may matter (specials).
func skipContainer(doc []byte, i int) (int, bool) {
	depth, inString := 0, false
	for i < len(doc) {
		end := len(doc)
		if i+64 <= len(doc) {
			quote, bs, open, closing := blockMasks((*[64]byte)(doc[i : i+64]))
			if bs == 0 {
				in := prefixXor(quote) // bit k: in a string after byte k
				if inString {
					in = ^in
				}
				open, closing = open&^in, closing&^in
				for br := open | closing; br != 0; br &= br - 1 {
					k := bits.TrailingZeros64(br)
					if open>>k&1 != 0 {
						depth++
					} else if depth--; depth == 0 {
						return i + k + 1, true
					}
				}
				inString = in>>63 != 0
				i += 64
				continue
			}
			end = i + 64
		}
		for i < end {
			if i+8 <= len(doc) {
				m := specials(binary.LittleEndian.Uint64(doc[i:]))
				if m == 0 {
					i += 8
					continue
				}
				i += bits.TrailingZeros64(m) >> 3
			}
			switch c := doc[i]; {
			case inString:
				switch c {
				case '"':
					inString = false
				case '\\':
					i++ // what it escapes
				}
			case c == '"':
				inString = true
			case c == '{' || c == '[':
				depth++
			case c == '}' || c == ']':
				depth--
				if depth == 0 {
					return i + 1, true
				}
			}
			i++
		}
	}
	return 0, false
}

// blockMasks returns which bytes of b are quotes, backslashes, opening and
// closing brackets, bit k for b[k].
func blockMasks(b *[64]byte) (quote, backslash, open, closing uint64) {
	const ones = 0x0101010101010101
	for k := 0; k < 64; k += 8 {
		w := binary.LittleEndian.Uint64(b[k:])
		lower := w | 0x20*ones // '[' and ']' as '{' and '}'
		quote |= byteBits(w^('"'*ones)) << k
		backslash |= byteBits(w^('\\'*ones)) << k
		open |= byteBits(lower^('{'*ones)) << k
		closing |= byteBits(lower^('}'*ones)) << k
	}
	return quote, backslash, open, closing
}

// byteBits returns which bytes of x are zero, bit j for byte j (exactly:
// not the quicker test of stringStops, which may flag more).
func byteBits(x uint64) uint64 {
	const low7 = 0x7f7f7f7f7f7f7f7f
	y := ^((x&low7 + low7) | x | low7) // the high bit of each zero byte
	return (y >> 7) * 0x0102040810204080 >> 56
}

// prefixXor returns x with bit k the parity of bits 0 to k of x.
func prefixXor(x uint64) uint64 {
	x ^= x << 1
	x ^= x << 2
	x ^= x << 4
	x ^= x << 8
	x ^= x << 16
	x ^= x << 32
	return x
}

// skipSeparator returns the index after the ',' (more is true) or the
// closing bracket (more is false) that follows a member or an element at
// doc[i:], white space aside.
func skipSeparator(doc []byte, i int, closing byte) (next int, more, ok bool) {
	i = skipSpace(doc, i)
	switch {
	case i >= len(doc):
		return 0, false, false
	case doc[i] == ',':
		return i + 1, true, true
	case doc[i] == closing:
		return i + 1, false, true
	}
	return 0, false, false
}

// appendSpan appends sp to spans, doubling their room when full, where
// append grows a long slice by a quarter: the spans of a List's 60,000
// items (or a stream's documents), garbage once the file is parsed, took
// 5.2 MB of arrays for 0.9 MB of spans. (Not slices.Grow: built with the
// race detector, its append of a made slice allocates that slice too.)
func appendSpan(spans []span, sp span) []span {
	if len(spans) == cap(spans) {
		grown := make([]span, len(spans), max(2*len(spans), 16))
		copy(grown, spans)
		spans = grown
	}
	return append(spans, sp)
}

func skipSpace(doc []byte, i int) int {
	for i < len(doc) && (doc[i] == ' ' || doc[i] == '\t' || doc[i] == '\n' || doc[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the string starting at doc[i] ('"').
// It goes eight bytes at a time to the next byte that is not plain
// (plainRun: a manifest's strings are short, and a call of
// bytes.IndexByte for each cost more than the scan); a backslash escapes
// the byte after it, and a control byte or a byte of 0x80 and over is
// passed as any other.
func skipString(doc []byte, i int) (int, bool) {
	i++
	for {
		i = plainRun(doc, i)
		switch {
		case i >= len(doc):
			return 0, false
		case doc[i] == '"':
			return i + 1, true
		case doc[i] == '\\':
			i += 2 // the backslash and what it escapes
		default:
			i++
		}
	}
}

// specials flags (the high bit of its byte) the first byte of w that is
// a quote, a backslash or a bracket, and maybe bytes after it (never one
// before it: see stringStops); 0 if none is.
func specials(w uint64) uint64 {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	zero := func(x uint64) uint64 { return (x - ones) &^ x }
	lower := w | 0x20*ones // '[' and ']' as '{' and '}'
	return (zero(w^('"'*ones)) | zero(w^('\\'*ones)) | zero(lower^('{'*ones)) | zero(lower^('}'*ones))) & highs
}

// skipValue returns the index after the value starting at doc[i]: a
// string, an object or array (by bracket depth: skipContainer), or a
// literal.
func skipValue(doc []byte, i int) (int, bool) {
	if i >= len(doc) {
		return 0, false
	}
	switch doc[i] {
	case '"':
		return skipString(doc, i)
	case '{', '[':
		return skipContainer(doc, i)
	}
	start := i
	for i < len(doc) {
		switch doc[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i, i > start
		}
		i++
	}
	return i, i > start
}
