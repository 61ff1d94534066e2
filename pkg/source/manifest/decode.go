package manifest

// A faster decoder of the two kinds the manifest source serves.
//
// Decoding JSON into the Kubernetes types with encoding/json dominated a
// load from empty (4.9 M allocations and about half the CPU at 30,000
// Services: reflection per field, and every pointer, string and slice
// allocated on its own). fastDecoder reads a Service or an EndpointSlice
// in one pass over the bytes, filling the fields by hand, and allocates
// strings, pointers and short slices from chunks shared by many objects.
//
// It is an optimization, never a second dialect: for any input it either
// declines (returns false), and the caller decodes the bytes with
// encoding/json exactly as before, errors and all, or it returns what
// encoding/json would have (TestFastDecodeMatchesEncodingJSON). So it
// declines whatever it is not sure to read the same way: any syntax or
// type error (encoding/json's message is the one reported), a key that
// matches a field only case-insensitively or appears twice, a key with
// escapes or non-ASCII bytes, a number that is not a plain int32, null
// inside an array or a map. A field it does not decode by hand (an
// object's uid, a Service's status conditions, an endpoint's targetRef,
// ...) is decoded by encoding/json into that field alone; an unknown key
// is checked for syntax and skipped, as encoding/json skips it.

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math/bits"
	"net/netip"
	"reflect"
	"strings"
	"sync"
	"unicode/utf8"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// noBit is the bit of a key object does not mark (1<<64 is 0).
const noBit = 64

// errDecline unwinds the decoder when it declines an input.
var errDecline = errors.New("declined")

// fastDecoder decodes objects one after another; the objects share its
// chunks (of string bytes, of pointed-to values), which hold nothing
// else, so a decoder's objects live and die together. Not safe for
// concurrent use.
type fastDecoder struct {
	b []byte // the object's bytes
	i int    // the read position in b

	text  chunk[byte]   // the bytes of decoded strings
	strs  chunk[string] // []string backing arrays and *string targets
	bools chunk[bool]
	i32s  chunk[int32]
	// Reused while an array is read, then copied to its exact size
	// (unless reuse).
	eps        []discoveryv1.Endpoint
	strScratch []string
	sports     []corev1.ServicePort
	eports     []discoveryv1.EndpointPort

	// reuse says each object decoded is dead before the next one is
	// decoded (the loader's: it keeps what compact.go copies out of
	// it, never the object). The decoder then decodes every object
	// into the same Service or EndpointSlice, the same maps and arrays
	// (the scratch ones above, not copied) and the same chunks, from
	// their start, instead of allocating them again: at 30,000
	// Services, 74 of the 176 MB a first load allocated were the
	// decoded objects, garbage as soon as compacted (issue 14).
	reuse bool
	// pack says an EndpointSlice's endpoints are read as a translation
	// reads them (packEndpoints), when they can be, not as API objects:
	// the loader's, which keeps nothing else of them. didPack says the
	// last object decoded was read so, its endpoints in packed.
	pack, didPack bool
	packed        []translate.SliceEndpoint
	packScratch   discoveryv1.Endpoint // the endpoint being packed, but its addresses
	packEp        packing              // its addresses
	svc           corev1.Service
	slice         discoveryv1.EndpointSlice
	labels        map[string]string
	annotations   map[string]string
	selector      map[string]string
}

// recycle makes the chunks' room, and the reused object's, free for the
// next object (reuse).
func (d *fastDecoder) recycle() {
	d.text.buf = d.text.buf[:0]
	clear(d.strs.buf) // pointers into text chunks past
	d.strs.buf = d.strs.buf[:0]
	d.bools.buf = d.bools.buf[:0]
	d.i32s.buf = d.i32s.buf[:0]
}

// chunk hands out values and runs of values from shared arrays.
type chunk[T any] struct{ buf []T }

// take returns n consecutive zero values, capped so that appending to
// them cannot reach the next.
func (c *chunk[T]) take(n int) []T {
	if len(c.buf)+n > cap(c.buf) {
		c.buf = make([]T, 0, max(n, min(2*cap(c.buf), 4096), 16))
	}
	c.buf = c.buf[:len(c.buf)+n]
	return c.buf[len(c.buf)-n : len(c.buf) : len(c.buf)]
}

func (c *chunk[T]) ptr(v T) *T {
	p := &c.take(1)[0]
	*p = v
	return p
}

// decodeTyped decodes js, a Service or an EndpointSlice, as
// decodeDocument and decodeObject would with encoding/json: the type
// meta it reads first, and the object. ok is false if the decoder
// declines (see above): the caller then decodes js as before.
//
// Which of the two js is only steers the decoding: what is returned is
// checked against the apiVersion and kind decoded. So the kind is
// guessed first (kindHint), without a pass over the values that come
// before it (an EndpointSlice that encoding/json wrote has its endpoints
// before its kind: they were skipped once to find it, then decoded); if
// that guess is wrong or missing, the top-level keys say (topKindOf).
func (d *fastDecoder) decodeTyped(js []byte) (tm typeMeta, svc *corev1.Service, slice *discoveryv1.EndpointSlice, ok bool) {
	guess := kindHint(js)
	if guess != 0 {
		if tm, svc, slice, ok = d.decodeKind(js, guess); ok {
			return tm, svc, slice, true
		}
	}
	var kind objKind
	switch av, k := topKindOf(js); {
	case string(k) == "Service" && string(av) == "v1":
		kind = kindService
	case string(k) == "EndpointSlice" && string(av) == "discovery.k8s.io/v1":
		kind = kindSlice
	}
	if kind == 0 || kind == guess {
		return typeMeta{}, nil, nil, false
	}
	return d.decodeKind(js, kind)
}

// kindHint guesses whether js, a JSON object, is a Service or an
// EndpointSlice (0: neither, or it cannot tell): by its top-level keys
// while their values are not objects or arrays, then by the first "kind"
// member anywhere after that whose value is one of the two. A List
// ("items") is neither.
func kindHint(js []byte) objKind {
	kind, i := kindHintTop(js)
	if i < 0 {
		return kind
	}
	for rest := js[i:]; ; {
		j := bytes.Index(rest, []byte(`"kind"`))
		if j < 0 {
			return 0
		}
		rest = rest[j+len(`"kind"`):]
		k := skipSpace(rest, 0)
		if k < len(rest) && rest[k] == ':' {
			if kind := kindValue(rest[skipSpace(rest, k+1):]); kind != 0 {
				return kind
			}
		}
	}
}

// kindHintTop is kindHint by the top-level keys only: the kind they say
// (0: neither), or, if they do not say, where kindHint looks further (i;
// -1 if it does not). It reads nothing of js after the object at its
// start.
func kindHintTop(js []byte) (kind objKind, i int) {
	i = skipSpace(js, 0)
	if i >= len(js) || js[i] != '{' {
		return 0, -1
	}
	i++
	for {
		i = skipSpace(js, i)
		if i >= len(js) || js[i] != '"' {
			return 0, -1
		}
		end, ok := skipString(js, i)
		if !ok {
			return 0, -1
		}
		key := js[i+1 : end-1]
		if string(key) == "items" {
			return 0, -1
		}
		i = skipSpace(js, end)
		if i >= len(js) || js[i] != ':' {
			return 0, -1
		}
		i = skipSpace(js, i+1)
		switch string(key) {
		case "kind":
			return kindValue(js[i:]), -1
		case "addressType":
			// An EndpointSlice's, which encoding/json writes first
			// (its keys sorted), its kind after its endpoints.
			return kindSlice, -1
		}
		if i >= len(js) || js[i] == '{' || js[i] == '[' {
			return 0, i
		}
		if i, ok = skipValue(js, i); !ok {
			return 0, -1
		}
		if i, _, ok = skipSeparator(js, i, '}'); !ok {
			return 0, -1
		}
	}
}

// kindValue says which of the two kinds v starts with, as a JSON string.
func kindValue(v []byte) objKind {
	switch {
	case bytes.HasPrefix(v, []byte(`"Service"`)):
		return kindService
	case bytes.HasPrefix(v, []byte(`"EndpointSlice"`)):
		return kindSlice
	}
	return 0
}

// decodeKind is decodeTyped of js as kind.
func (d *fastDecoder) decodeKind(js []byte, kind objKind) (tm typeMeta, svc *corev1.Service, slice *discoveryv1.EndpointSlice, ok bool) {
	tm, svc, slice, _, ok = d.decodeKindAt(js, kind, false)
	return tm, svc, slice, ok
}

// decodeLeading decodes the object at the start of js, a Service or an
// EndpointSlice, if its top-level keys say which before any object or
// array (kindHintTop: as encoding/json writes either), and returns where
// it ends in js, without reading anything after it: an item of a List,
// decoded where it is in the List (decodeListInPlace). ok is false if
// not, or if the decoder declines: then decodeItem of the item's bytes
// decodes it (and is never given what this decodes: the object and its
// end are decodeItem's of js[:end]).
func (d *fastDecoder) decodeLeading(js []byte) (tm typeMeta, pre fastObject, end int, ok bool) {
	guess, _ := kindHintTop(js)
	if guess == 0 {
		return typeMeta{}, fastObject{}, 0, false
	}
	tm, svc, slice, end, ok := d.decodeKindAt(js, guess, true)
	if !ok {
		return typeMeta{}, fastObject{}, 0, false
	}
	return tm, d.decoded(svc, slice), end, true
}

// decodeKindAt is decodeKind, of the object at the start of js if
// leading (anything may follow it; end is where it ends), else of js, all
// of it.
func (d *fastDecoder) decodeKindAt(js []byte, kind objKind, leading bool) (tm typeMeta, svc *corev1.Service, slice *discoveryv1.EndpointSlice, end int, ok bool) {
	apiVersion, kindName := "v1", "Service"
	if kind == kindSlice {
		apiVersion, kindName = "discovery.k8s.io/v1", "EndpointSlice"
	}
	d.b, d.i, d.didPack = js, 0, false
	if d.reuse {
		d.recycle()
	}
	defer func() {
		d.b = nil
		if r := recover(); r != nil {
			if r != errDecline { //nolint:errorlint // our own sentinel, never wrapped
				panic(r)
			}
			tm, svc, slice, end, ok = typeMeta{}, nil, nil, 0, false
		}
	}()
	var meta *metav1.ObjectMeta
	if kind == kindService {
		svc = d.service()
		tm.APIVersion, tm.Kind, meta = svc.APIVersion, svc.Kind, &svc.ObjectMeta
	} else {
		slice = d.endpointSlice()
		tm.APIVersion, tm.Kind, meta = slice.APIVersion, slice.Kind, &slice.ObjectMeta
	}
	end = d.i
	if !leading {
		d.ws()
		if d.i != len(d.b) {
			d.decline()
		}
	}
	if tm.APIVersion != apiVersion || tm.Kind != kindName {
		d.decline() // not the kind it was decoded as
	}
	tm.Metadata.Name, tm.Metadata.Namespace = meta.Name, meta.Namespace
	return tm, svc, slice, end, true
}

// topKindOf returns the apiVersion and kind members of js, a JSON object,
// looking only at its top-level keys (plain ones: anything else, and the
// decoder declines later).
func topKindOf(js []byte) (apiVersion, kind []byte) {
	i := skipSpace(js, 0)
	if i >= len(js) || js[i] != '{' {
		return nil, nil
	}
	i++
	for n := 0; n < 2; {
		i = skipSpace(js, i)
		if i >= len(js) || js[i] != '"' {
			return nil, nil
		}
		end, ok := skipString(js, i)
		if !ok {
			return nil, nil
		}
		key := js[i+1 : end-1]
		if string(key) == "items" {
			// A List's, most likely, which the fast decoder declines
			// anyway (other): not worth a pass over its items (all of
			// a List of 30,000 Services that encoding/json wrote, its
			// keys sorted) to find its kind.
			return nil, nil
		}
		i = skipSpace(js, end)
		if i >= len(js) || js[i] != ':' {
			return nil, nil
		}
		i = skipSpace(js, i+1)
		vend, ok := skipValue(js, i)
		if !ok {
			return nil, nil
		}
		if string(key) == "apiVersion" || string(key) == "kind" {
			v := js[i:vend]
			if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
				return nil, nil
			}
			if string(key) == "kind" {
				kind = v[1 : len(v)-1]
			} else {
				apiVersion = v[1 : len(v)-1]
			}
			n++
		}
		if i, _, ok = skipSeparator(js, vend, '}'); !ok {
			return nil, nil
		}
	}
	return apiVersion, kind
}

func (d *fastDecoder) decline() { panic(errDecline) }

func (d *fastDecoder) ws() {
	if d.i < len(d.b) && d.b[d.i] > ' ' {
		return // compact JSON's case
	}
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

// peek returns the next byte that is not white space.
func (d *fastDecoder) peek() byte {
	d.ws()
	if d.i >= len(d.b) {
		d.decline()
	}
	return d.b[d.i]
}

func (d *fastDecoder) expect(c byte) {
	if d.peek() != c {
		d.decline()
	}
	d.i++
}

// literal consumes lit, which must end where a value may end.
func (d *fastDecoder) literal(lit string) bool {
	if string(d.b[d.i:min(d.i+len(lit), len(d.b))]) != lit {
		return false
	}
	d.i += len(lit)
	d.endOfValue()
	return true
}

// endOfValue declines unless the value just read ends here.
func (d *fastDecoder) endOfValue() {
	if d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r', ',', '}', ']':
		default:
			d.decline()
		}
	}
}

// null consumes a null, if that is the next value.
func (d *fastDecoder) null() bool { return d.peek() == 'n' && d.literal("null") }

// rawString reads a string and returns its bytes between the quotes, and
// whether they need decoding (escapes, bytes that are not valid UTF-8).
func (d *fastDecoder) rawString() (raw []byte, decode bool) {
	raw, decode, _ = d.rawStringASCII()
	return raw, decode
}

// rawStringASCII is rawString, also saying whether the bytes are all
// ASCII.
//
// Most strings of a manifest are plain (printable ASCII, no escape):
// they are scanned eight bytes at a time to the first byte that is not
// plain (stringStops), the closing quote if they are; anything else goes
// on byte by byte, as before.
func (d *fastDecoder) rawStringASCII() (raw []byte, decode, ascii bool) {
	d.expect('"')
	start := d.i
	b := d.b
	i := plainRun(b, start)
	if i < len(b) && b[i] == '"' {
		d.i = i + 1
		return b[start:i], false, true
	}
	d.i = i
	ascii = true
	for d.i < len(d.b) {
		c := d.b[d.i]
		switch {
		case c == '"':
			raw = d.b[start:d.i]
			d.i++
			return raw, decode || !ascii && !utf8.Valid(raw), ascii
		case c < 0x20:
			d.decline()
		case c == '\\':
			decode = true
			d.i++
			if d.i >= len(d.b) {
				d.decline()
			}
			switch d.b[d.i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if d.i+4 >= len(d.b) {
					d.decline()
				}
				for _, h := range d.b[d.i+1 : d.i+5] {
					if !isHex(h) {
						d.decline()
					}
				}
				d.i += 4
			default:
				d.decline()
			}
		case c >= 0x80:
			ascii = false
		}
		d.i++
	}
	d.decline()
	return nil, false, false
}

// plainByte says a byte can be in a string as it is, and is ASCII: not a
// quote, a backslash, a control character or a byte of 0x80 and over.
var plainByte = func() (t [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// plainRun returns the index of the first byte of b from i on that is not
// plainByte (len(b) if none), eight bytes at a time (stringStops).
func plainRun(b []byte, i int) int {
	for i+8 <= len(b) {
		if m := stringStops(binary.LittleEndian.Uint64(b[i:])); m != 0 {
			return i + bits.TrailingZeros64(m)>>3
		}
		i += 8
	}
	for i < len(b) && plainByte[b[i]] {
		i++
	}
	return i
}

// stringStops flags (the high bit of its byte) the first byte of w that
// is not plainByte, and maybe bytes after it, never one before it: the
// classic tests for a zero byte and for a byte under n flag the lowest
// such byte rightly, and may flag others above it only. 0: all eight are
// plain.
func stringStops(w uint64) uint64 {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	q, bs := w^('"'*ones), w^('\\'*ones)
	return (w | (q-ones)&^q | (bs-ones)&^bs | (w-0x20*ones)&^w) & highs
}

func isHex(c byte) bool { return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' }

// str reads a string (null: ""), as encoding/json decodes it.
func (d *fastDecoder) str() string {
	if d.null() {
		return ""
	}
	return d.strValue()
}

func (d *fastDecoder) strValue() string {
	s := d.strToken()
	d.endOfValue()
	return s
}

// strToken reads a string, as strValue but for where it ends (a key's
// is followed by a colon).
func (d *fastDecoder) strToken() string {
	start := d.i
	raw, decode := d.rawString()
	if decode {
		var s string
		if json.Unmarshal(d.b[start:d.i], &s) != nil {
			d.decline()
		}
		return s
	}
	if len(raw) == 0 {
		return ""
	}
	t := d.text.take(len(raw))
	copy(t, raw)
	// Without reuse, the chunk's bytes are written once, here, and never
	// again. With reuse (the loader's), recycle hands the same bytes to
	// the next object, which overwrites them: the string is valid only
	// until then. What outlives the object (compact.go's forms) holds
	// copies (strings.Clone, or the compacter's shared copies), never
	// these strings.
	return unsafe.String(&t[0], len(t))
}

// strPtr reads a string into a new pointer (null: nil).
func (d *fastDecoder) strPtr() *string {
	if d.null() {
		return nil
	}
	return d.strs.ptr(d.strValue())
}

// key reads an object's key: plain ASCII without escapes, else declined
// (encoding/json matches keys case-insensitively, by Unicode folding).
func (d *fastDecoder) key() []byte {
	k, decode, ascii := d.rawStringASCII()
	if decode || !ascii {
		d.decline()
	}
	d.expect(':')
	return k
}

// int32v reads a plain integer that fits an int32 (null: 0).
func (d *fastDecoder) int32v() int32 {
	if d.null() {
		return 0
	}
	return d.int32Value()
}

func (d *fastDecoder) int32Value() int32 {
	d.peek()
	neg := d.b[d.i] == '-'
	if neg {
		d.i++
	}
	start := d.i
	var v int64
	for d.i < len(d.b) && '0' <= d.b[d.i] && d.b[d.i] <= '9' && d.i-start < 11 {
		v = 10*v + int64(d.b[d.i]-'0')
		d.i++
	}
	n := d.i - start
	if n == 0 || n > 10 || n > 1 && d.b[start] == '0' {
		d.decline()
	}
	d.endOfValue() // a fraction or an exponent, for one, is declined
	if neg {
		v = -v
	}
	if v != int64(int32(v)) {
		d.decline()
	}
	return int32(v)
}

func (d *fastDecoder) int32Ptr() *int32 {
	if d.null() {
		return nil
	}
	return d.i32s.ptr(d.int32Value())
}

func (d *fastDecoder) boolv() bool {
	switch {
	case d.null():
		return false
	case d.literal("true"):
		return true
	case d.literal("false"):
		return false
	}
	d.decline()
	return false
}

func (d *fastDecoder) boolPtr() *bool {
	if d.null() {
		return nil
	}
	return d.bools.ptr(d.boolv())
}

// object reads an object, calling member for each key with the value
// next to read; member declines or reads it. seen marks the keys read,
// by the bit member gives them (once): a key twice is declined.
func (d *fastDecoder) object(member func(key []byte) (bit uint)) {
	d.expect('{')
	if d.peek() == '}' {
		d.i++
		return
	}
	d.members(0, member)
}

// members reads an object's members from its next key to its end, as
// object does; seen holds the bits of the members read before.
func (d *fastDecoder) members(seen uint64, member func(key []byte) (bit uint)) {
	for {
		bit := member(d.key())
		if seen&(1<<bit) != 0 {
			d.decline()
		}
		seen |= 1 << bit
		switch d.peek() {
		case ',':
			d.i++
		case '}':
			d.i++
			return
		default:
			d.decline()
		}
	}
}

// array reads an array, calling elem for each element (never null).
func (d *fastDecoder) array(elem func()) {
	d.expect('[')
	if d.peek() == ']' {
		d.i++
		return
	}
	for {
		if d.null() {
			d.decline() // the element's zero value: not worth the care
		}
		elem()
		switch d.peek() {
		case ',':
			d.i++
		case ']':
			d.i++
			return
		default:
			d.decline()
		}
	}
}

// strings reads a []string (null: nil; []: empty, not nil).
func (d *fastDecoder) strings() []string {
	if d.null() {
		return nil
	}
	// Read into scratch (one pass), then copied to a run of its size.
	scratch := d.strScratch[:0]
	d.array(func() { scratch = append(scratch, d.strValue()) })
	d.strScratch = scratch
	if len(scratch) == 0 {
		return []string{}
	}
	out := d.strs.take(len(scratch))
	copy(out, scratch)
	clear(scratch) // (pointers into text chunks)
	return out
}

func (d *fastDecoder) skipString() {
	d.rawString()
	d.endOfValue()
}

// typedStrings reads a slice of a string type.
func typedStrings[T ~string](d *fastDecoder) []T {
	ss := d.strings()
	if ss == nil {
		return nil
	}
	// The same memory, as []T: T's underlying type is string.
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(ss))), len(ss))
}

// stringMap reads a map[string]string (null: nil).
// With reuse, *keep is the map decoded into (cleared; made if nil).
func (d *fastDecoder) stringMap(keep *map[string]string) map[string]string {
	if d.null() {
		return nil
	}
	var m map[string]string
	if d.reuse {
		if *keep == nil {
			*keep = map[string]string{}
		}
		m = *keep
		clear(m)
	} else {
		m = map[string]string{}
	}
	d.expect('{')
	if d.peek() == '}' {
		d.i++
		return m
	}
	for {
		// A key is decoded as a string is; a key twice: the last wins,
		// as encoding/json has it.
		if d.peek() != '"' {
			d.decline()
		}
		k := d.strToken()
		d.expect(':')
		if d.null() {
			d.decline()
		}
		m[k] = d.strValue()
		switch d.peek() {
		case ',':
			d.i++
		case '}':
			d.i++
			return m
		default:
			d.decline()
		}
	}
}

// exact copies what was read into a slice of its exact size, non-nil as
// encoding/json makes an empty array.
func exact[T any](s []T) []T {
	if len(s) == 0 {
		return []T{}
	}
	return append([]T(nil), s...)
}

// objects reads an array of objects into a []T (null: nil), member
// reading each member of each (as object's member, given the element).
// scratch, if not nil, is reused from one array to the next.
func objects[T any](d *fastDecoder, scratch *[]T, member func(e *T, key []byte) uint) []T {
	if d.null() {
		return nil
	}
	var s []T
	if scratch != nil {
		s = (*scratch)[:0]
	}
	d.array(func() {
		var zero T
		s = append(s, zero)
		e := &s[len(s)-1]
		d.object(func(key []byte) uint { return member(e, key) })
	})
	if scratch != nil {
		*scratch = s
		if d.reuse && len(s) > 0 {
			return s[:len(s):len(s)]
		}
	}
	return exact(s)
}

// other reads the value of key, a member of the struct *v that the
// decoder does not read by hand: a field's value is decoded into that
// field by encoding/json; a key that matches a field only by case, or
// that the type-meta decoding reads (items), is declined; an unknown
// key's value is checked and skipped. It returns key's bit for object.
func (d *fastDecoder) other(v any, key []byte) uint {
	rv := reflect.ValueOf(v).Elem()
	fs := fieldsOf(rv.Type())
	d.ws()
	start := d.i
	end, ok := skipValue(d.b, start)
	if !ok {
		d.decline()
	}
	d.i = end
	d.endOfValue()
	val := d.b[start:end]
	if f, ok := fs.byName[string(key)]; ok {
		if json.Unmarshal(val, rv.FieldByIndex(f.index).Addr().Interface()) != nil {
			d.decline()
		}
		return 32 + f.bit
	}
	for _, name := range fs.names {
		if asciiEqualFold(key, name) {
			d.decline()
		}
	}
	if !json.Valid(val) {
		d.decline()
	}
	return noBit // unknown keys may repeat
}

func asciiEqualFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range b {
		x, y := b[i], s[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// structFields are a struct's JSON members, as encoding/json finds them
// (embedded structs without a name promote theirs).
type structFields struct {
	byName map[string]field
	names  []string // and "items", which typeMeta reads beside them
}

type field struct {
	index []int
	bit   uint // the key's bit for object (below 31)
}

var fieldCache sync.Map // reflect.Type -> *structFields

func fieldsOf(t reflect.Type) *structFields {
	if fs, ok := fieldCache.Load(t); ok {
		return fs.(*structFields)
	}
	fs := &structFields{byName: map[string]field{}, names: []string{"items"}}
	var walk func(t reflect.Type, index []int)
	walk = func(t reflect.Type, index []int) {
		for i := range t.NumField() {
			sf := t.Field(i)
			idx := append(append([]int(nil), index...), i)
			name, _, _ := strings.Cut(sf.Tag.Get("json"), ",")
			if name == "-" {
				continue
			}
			if sf.Anonymous && name == "" && sf.Type.Kind() == reflect.Struct {
				walk(sf.Type, idx)
				continue
			}
			if !sf.IsExported() {
				continue
			}
			if name == "" {
				name = sf.Name
			}
			fs.byName[name] = field{idx, uint(len(fs.names)) % 31}
			fs.names = append(fs.names, name)
		}
	}
	walk(t, nil)
	got, _ := fieldCache.LoadOrStore(t, fs)
	return got.(*structFields)
}

// into returns what to decode an object into: own, zeroed, if the
// decoder reuses its objects (reuse), else a new one.
func into[T any](reuse bool, own *T) *T {
	if !reuse {
		return new(T)
	}
	var zero T
	*own = zero
	return own
}

// The bits of the members read by hand, per struct (0-31; other uses 32-63).
func (d *fastDecoder) service() *corev1.Service {
	s := into(d.reuse, &d.svc)
	d.object(func(key []byte) uint {
		switch string(key) {
		case "apiVersion":
			s.APIVersion = d.str()
		case "kind":
			s.Kind = d.str()
			return 1
		case "metadata":
			d.objectMeta(&s.ObjectMeta)
			return 2
		case "spec":
			d.serviceSpec(&s.Spec)
			return 3
		case "status":
			d.serviceStatus(&s.Status)
			return 4
		case "items":
			// A List's, which other declines too, but after a
			// pass over it (kindHint may guess a List's first
			// item's kind).
			d.decline()
		default:
			return d.other(s, key)
		}
		return 0
	})
	return s
}

func (d *fastDecoder) objectMeta(m *metav1.ObjectMeta) {
	if d.null() {
		return
	}
	d.object(func(key []byte) uint {
		switch string(key) {
		case "name":
			m.Name = d.str()
		case "namespace":
			m.Namespace = d.str()
			return 1
		case "labels":
			m.Labels = d.stringMap(&d.labels)
			return 2
		case "annotations":
			m.Annotations = d.stringMap(&d.annotations)
			return 3
		case "resourceVersion":
			m.ResourceVersion = d.str()
			return 4
		case "uid":
			m.UID = types.UID(d.str())
			return 5
		case "generateName":
			m.GenerateName = d.str()
			return 6
		case "creationTimestamp":
			if !d.null() {
				start := d.i
				d.skipString()
				if m.CreationTimestamp.UnmarshalJSON(d.b[start:d.i]) != nil {
					d.decline()
				}
			}
			return 7
		default:
			return d.other(m, key)
		}
		return 0
	})
}

func (d *fastDecoder) serviceSpec(sp *corev1.ServiceSpec) {
	if d.null() {
		return
	}
	d.object(func(key []byte) uint {
		switch string(key) {
		case "ports":
			sp.Ports = d.servicePorts()
		case "selector":
			sp.Selector = d.stringMap(&d.selector)
			return 1
		case "clusterIP":
			sp.ClusterIP = d.str()
			return 2
		case "clusterIPs":
			sp.ClusterIPs = d.strings()
			return 3
		case "type":
			sp.Type = corev1.ServiceType(d.str())
			return 4
		case "externalIPs":
			sp.ExternalIPs = d.strings()
			return 5
		case "sessionAffinity":
			sp.SessionAffinity = corev1.ServiceAffinity(d.str())
			return 6
		case "loadBalancerIP":
			sp.LoadBalancerIP = d.str()
			return 7
		case "loadBalancerSourceRanges":
			sp.LoadBalancerSourceRanges = d.strings()
			return 8
		case "externalName":
			sp.ExternalName = d.str()
			return 9
		case "externalTrafficPolicy":
			sp.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicy(d.str())
			return 10
		case "healthCheckNodePort":
			sp.HealthCheckNodePort = d.int32v()
			return 11
		case "publishNotReadyAddresses":
			sp.PublishNotReadyAddresses = d.boolv()
			return 12
		case "sessionAffinityConfig":
			sp.SessionAffinityConfig = d.sessionAffinityConfig()
			return 13
		case "ipFamilies":
			sp.IPFamilies = typedStrings[corev1.IPFamily](d)
			return 14
		case "ipFamilyPolicy":
			sp.IPFamilyPolicy = (*corev1.IPFamilyPolicy)(d.strPtr())
			return 15
		case "allocateLoadBalancerNodePorts":
			sp.AllocateLoadBalancerNodePorts = d.boolPtr()
			return 16
		case "loadBalancerClass":
			sp.LoadBalancerClass = d.strPtr()
			return 17
		case "internalTrafficPolicy":
			sp.InternalTrafficPolicy = (*corev1.ServiceInternalTrafficPolicy)(d.strPtr())
			return 18
		case "trafficDistribution":
			sp.TrafficDistribution = d.strPtr()
			return 19
		default:
			return d.other(sp, key)
		}
		return 0
	})
}

func (d *fastDecoder) servicePorts() []corev1.ServicePort {
	return objects(d, &d.sports, func(p *corev1.ServicePort, key []byte) uint {
		switch string(key) {
		case "name":
			p.Name = d.str()
		case "protocol":
			p.Protocol = corev1.Protocol(d.str())
			return 1
		case "appProtocol":
			p.AppProtocol = d.strPtr()
			return 2
		case "port":
			p.Port = d.int32v()
			return 3
		case "targetPort":
			p.TargetPort = d.intOrString()
			return 4
		case "nodePort":
			p.NodePort = d.int32v()
			return 5
		default:
			return d.other(p, key)
		}
		return 0
	})
}

// intOrString reads what IntOrString.UnmarshalJSON reads.
func (d *fastDecoder) intOrString() intstr.IntOrString {
	switch {
	case d.null():
		return intstr.IntOrString{}
	case d.b[d.i] == '"':
		return intstr.IntOrString{Type: intstr.String, StrVal: d.strValue()}
	}
	return intstr.IntOrString{Type: intstr.Int, IntVal: d.int32Value()}
}

func (d *fastDecoder) sessionAffinityConfig() *corev1.SessionAffinityConfig {
	if d.null() {
		return nil
	}
	c := &corev1.SessionAffinityConfig{}
	d.object(func(key []byte) uint {
		if string(key) != "clientIP" {
			return d.other(c, key)
		}
		if !d.null() {
			c.ClientIP = &corev1.ClientIPConfig{}
			d.object(func(key []byte) uint {
				if string(key) != "timeoutSeconds" {
					return d.other(c.ClientIP, key)
				}
				c.ClientIP.TimeoutSeconds = d.int32Ptr()
				return 0
			})
		}
		return 0
	})
	return c
}

func (d *fastDecoder) serviceStatus(st *corev1.ServiceStatus) {
	if d.null() {
		return
	}
	d.object(func(key []byte) uint {
		if string(key) != "loadBalancer" {
			return d.other(st, key)
		}
		if d.null() {
			return 0
		}
		lb := &st.LoadBalancer
		d.object(func(key []byte) uint {
			if string(key) != "ingress" {
				return d.other(lb, key)
			}
			lb.Ingress = objects(d, nil, func(ing *corev1.LoadBalancerIngress, key []byte) uint {
				switch string(key) {
				case "ip":
					ing.IP = d.str()
				case "hostname":
					ing.Hostname = d.str()
					return 1
				case "ipMode":
					ing.IPMode = (*corev1.LoadBalancerIPMode)(d.strPtr())
					return 2
				default:
					return d.other(ing, key)
				}
				return 0
			})
			return 0
		})
		return 0
	})
}

func (d *fastDecoder) endpointSlice() *discoveryv1.EndpointSlice {
	es := into(d.reuse, &d.slice)
	d.object(func(key []byte) uint {
		switch string(key) {
		case "apiVersion":
			es.APIVersion = d.str()
		case "kind":
			es.Kind = d.str()
			return 1
		case "metadata":
			d.objectMeta(&es.ObjectMeta)
			return 2
		case "addressType":
			es.AddressType = discoveryv1.AddressType(d.str())
			return 3
		case "endpoints":
			if d.pack && (es.AddressType == discoveryv1.AddressTypeIPv4 || es.AddressType == discoveryv1.AddressTypeIPv6) && d.packEndpoints(es.AddressType) {
				es.Endpoints, d.didPack = nil, true
			} else {
				es.Endpoints = d.endpoints()
			}
			return 4
		case "ports":
			es.Ports = d.endpointPorts()
			return 5
		case "items":
			// A List's, which other declines too, but after a
			// pass over it (kindHint may guess a List's first
			// item's kind).
			d.decline()
		default:
			return d.other(es, key)
		}
		return 0
	})
	return es
}

func (d *fastDecoder) endpoints() []discoveryv1.Endpoint {
	return objects(d, &d.eps, func(e *discoveryv1.Endpoint, key []byte) uint {
		return d.endpointMember(e, key, "", nil)
	})
}

// endpointMember reads the member key of an endpoint into e; its
// addresses too if pack is "", else, for packEndpoints, as
// endpointAddresses reads them for address type pack (their first into
// p.addr, e.Addresses left alone).
func (d *fastDecoder) endpointMember(e *discoveryv1.Endpoint, key []byte, pack discoveryv1.AddressType, p *packing) uint {
	switch string(key) {
	case "addresses":
		if pack == "" {
			e.Addresses = d.strings()
		} else {
			p.addr, p.addrs = d.endpointAddresses(pack), true
		}
	case "conditions":
		d.conditions(&e.Conditions)
		return 1
	case "hostname":
		e.Hostname = d.strPtr()
		return 2
	case "nodeName":
		e.NodeName = d.strPtr()
		return 3
	case "zone":
		e.Zone = d.strPtr()
		return 4
	case "hints":
		e.Hints = d.hints()
		return 5
	case "targetRef":
		e.TargetRef = d.objectReference()
		return 6
	default:
		return d.other(e, key)
	}
	return 0
}

// packing is what packEndpoints has read of an endpoint's addresses.
type packing struct {
	addr  netip.Addr // the first
	addrs bool       // it has addresses
	// compact says compactEndpoint read the endpoint: its conditions
	// are conds (ready, serving, terminating), not e.Conditions.
	compact bool
	conds   [3]bool
}

// errNoPack unwinds packEndpoints when the endpoints are not as it packs
// them.
var errNoPack = errors.New("not packed")

// packEndpoints reads the endpoints of a slice of address type t (IPv4 or
// IPv6, read before them: encoding/json writes addressType first) into
// d.packed, as a translation reads them (translate.ReadPackedSlice), if
// every endpoint has addresses and each is valid for t; if not, it reads
// nothing and returns false, and endpoints reads them as before (and
// validation reports what is wrong with them). An endpoint is read by the
// same calls as endpoints makes (endpointMember), so that what one
// declines the other does, but its addresses: parsed in place, never
// copied. At 30,000 Services x 10 endpoints, the API's endpoints were
// 300,000 arrays of one string, copied, read again by validation and
// again to be packed.
func (d *fastDecoder) packEndpoints(t discoveryv1.AddressType) (ok bool) {
	start := d.i
	defer func() {
		if r := recover(); r != nil {
			if r != errNoPack && r != errDecline { //nolint:errorlint // our own sentinels, never wrapped
				panic(r)
			}
			// As before: endpoints reads them (and declines what
			// made this decline).
			d.i, ok = start, false
		}
	}()
	d.packed = d.packed[:0]
	if d.null() {
		panic(errNoPack)
	}
	// The decoder's, not variables: the closures below would make them
	// escape, an allocation for each slice.
	e, p := &d.packScratch, &d.packEp
	d.array(func() {
		*e, *p = discoveryv1.Endpoint{}, packing{}
		member := func(key []byte) uint { return d.endpointMember(e, key, t, p) }
		if !d.compactEndpoint(t, p, member) {
			d.object(member)
		}
		if !p.addrs {
			panic(errNoPack) // no addresses: validation says so
		}
		ready, serving, terminating := p.conds[0], p.conds[1], p.conds[2]
		if !p.compact {
			ready, serving, terminating = translate.EndpointConditions(&e.Conditions)
		}
		d.packed = append(d.packed, translate.SliceEndpoint{Addr: p.addr, NodeName: e.NodeName, Hints: e.Hints,
			Ready: ready, Serving: serving, Terminating: terminating})
	})
	return true
}

// compactEndpoint reads the start of an endpoint of an IPv4 slice if it
// is written as encoding/json writes it (test/bench's files, and
// generators'): one address in dotted-quad form, then the conditions as
// compactConditions reads them, without white space; the members after
// them (nodeName, ...) are read by member, as object would. It reports
// whether it read the endpoint; if not, it has read nothing and object
// reads it. What it reads is what object and endpointMember read of the
// same bytes, without a call per member and with the address parsed in
// place (dottedQuad): the endpoints were the largest part of a List's
// decoding at 30,000 Services x 10 endpoints.
func (d *fastDecoder) compactEndpoint(t discoveryv1.AddressType, p *packing, member func(key []byte) uint) bool {
	const addrs, conds = `{"addresses":["`, `"],"conditions":`
	if t != discoveryv1.AddressTypeIPv4 {
		return false
	}
	b := d.b[d.i:]
	if !hasPrefix(b, addrs) {
		return false
	}
	a, j, ok := dottedQuad(b, len(addrs))
	// An address the API server refuses (127.0.0.1, 169.254.169.254)
	// is left to object, whose endpointAddresses declines it, and so to
	// the slice's validation, which says why (compacter.slice).
	if !ok || !hasPrefix(b[j:], conds) || translate.EndpointIPRefusal(netip.AddrFrom4(a), unsafe.String(&b[len(addrs)], j-len(addrs))) != "" {
		return false
	}
	j += len(conds)
	v, n := conditionsAt(b[j:])
	if n == 0 {
		return false
	}
	j += n
	if j >= len(b) || b[j] != ',' && b[j] != '}' {
		return false
	}
	p.addr, p.addrs = netip.AddrFrom4(a), true
	p.compact, p.conds = true, v
	d.i += j + 1
	if b[j] == ',' {
		d.members(1<<0|1<<1, member) // addresses' bit and conditions' (endpointMember's)
	}
	return true
}

// dottedQuad parses b from i as an IPv4 address in the form
// netip.ParseAddr takes (four decimal fields of one to three digits,
// none with a leading zero, each at most 255) up to a quote, and returns
// it and the quote's index; ok is false for anything else, which
// netip.ParseAddr may still take (a different address) or not.
func dottedQuad(b []byte, i int) (a [4]byte, end int, ok bool) {
	for f := range 4 {
		if f > 0 {
			if i >= len(b) || b[i] != '.' {
				return a, 0, false
			}
			i++
		}
		v, n := 0, 0
		for ; n < 3 && i+n < len(b) && '0' <= b[i+n] && b[i+n] <= '9'; n++ {
			v = v*10 + int(b[i+n]-'0')
		}
		if n == 0 || n > 1 && b[i] == '0' || v > 255 {
			return a, 0, false
		}
		a[f] = byte(v)
		i += n
	}
	if i >= len(b) || b[i] != '"' {
		return a, 0, false
	}
	return a, i, true
}

// endpointAddresses reads an endpoint's addresses, which strings would
// read, and returns the first: each plain (no escape, ASCII) and valid
// for t, at least one, else errNoPack.
func (d *fastDecoder) endpointAddresses(t discoveryv1.AddressType) netip.Addr {
	if d.null() {
		panic(errNoPack)
	}
	var first netip.Addr
	n := 0
	d.array(func() {
		raw, decode, ascii := d.rawStringASCII()
		if decode || !ascii {
			panic(errNoPack)
		}
		d.endOfValue()
		a := unsafe.String(unsafe.SliceData(raw), len(raw))
		ip, ok := translate.EndpointAddress(t, a)
		// An address the API server refuses for an endpoint is left to
		// the slice's validation, which refuses it (compacter.slice).
		if !ok || translate.EndpointIPRefusal(ip, a) != "" {
			panic(errNoPack)
		}
		if n == 0 {
			first = ip
		}
		n++
	})
	if n == 0 {
		panic(errNoPack)
	}
	return first
}

// objectReference reads an endpoint's targetRef, which kubectl prints for
// every endpoint of a Pod.
func (d *fastDecoder) objectReference() *corev1.ObjectReference {
	if d.null() {
		return nil
	}
	r := &corev1.ObjectReference{}
	d.object(func(key []byte) uint {
		switch string(key) {
		case "kind":
			r.Kind = d.str()
		case "namespace":
			r.Namespace = d.str()
			return 1
		case "name":
			r.Name = d.str()
			return 2
		case "uid":
			r.UID = types.UID(d.str())
			return 3
		case "apiVersion":
			r.APIVersion = d.str()
			return 4
		case "resourceVersion":
			r.ResourceVersion = d.str()
			return 5
		case "fieldPath":
			r.FieldPath = d.str()
			return 6
		default:
			return d.other(r, key)
		}
		return 0
	})
	return r
}

func (d *fastDecoder) conditions(c *discoveryv1.EndpointConditions) {
	if d.null() || d.compactConditions(c) {
		return
	}
	d.object(func(key []byte) uint {
		switch string(key) {
		case "ready":
			c.Ready = d.boolPtr()
		case "serving":
			c.Serving = d.boolPtr()
			return 1
		case "terminating":
			c.Terminating = d.boolPtr()
			return 2
		default:
			return d.other(c, key)
		}
		return 0
	})
}

// compactConditions reads an endpoint's conditions if they are written as
// encoding/json writes them (test/bench's files, and generators'):
// without white space, in the API's order (ready, serving, terminating),
// each true or false; it reports whether they were, and if not, it has
// read nothing. It reads what object and boolPtr would read of the same
// bytes, without a call per member: a tenth of a List's decoding at
// 30,000 Services x 10 endpoints went to the conditions.
func (d *fastDecoder) compactConditions(c *discoveryv1.EndpointConditions) bool {
	v, n := conditionsAt(d.b[d.i:])
	if n == 0 {
		return false
	}
	d.i += n
	c.Ready, c.Serving, c.Terminating = d.bools.ptr(v[0]), d.bools.ptr(v[1]), d.bools.ptr(v[2])
	return true
}

// conditionsAt reads the compact conditions at the start of b (see
// compactConditions): their values, and the count of bytes they take (0:
// b does not start with them). Every key is a constant, compared as
// words.
func conditionsAt(b []byte) (v [3]bool, n int) {
	if !hasPrefix(b, `{"ready":`) {
		return v, 0
	}
	p := len(`{"ready":`)
	var ok bool
	if v[0], p, ok = boolAt(b, p); !ok || !hasPrefix(b[p:], `,"serving":`) {
		return v, 0
	}
	p += len(`,"serving":`)
	if v[1], p, ok = boolAt(b, p); !ok || !hasPrefix(b[p:], `,"terminating":`) {
		return v, 0
	}
	p += len(`,"terminating":`)
	if v[2], p, ok = boolAt(b, p); !ok || p >= len(b) || b[p] != '}' {
		return v, 0
	}
	return v, p + 1
}

// boolAt reads true or false at b[p:] and returns it and the index after
// it.
func boolAt(b []byte, p int) (v bool, next int, ok bool) {
	switch rest := b[p:]; {
	case hasPrefix(rest, "true"):
		return true, p + len("true"), true
	case hasPrefix(rest, "false"):
		return false, p + len("false"), true
	}
	return false, p, false
}

// hasPrefix is bytes.HasPrefix(b, []byte(s)) without copying either
// (string(b) converted for a call copies b: the rest of the item, for
// each member of each endpoint, 1.2 GB a load at 30,000 Services).
func hasPrefix(b []byte, s string) bool {
	return len(b) >= len(s) && string(b[:len(s)]) == s
}

func (d *fastDecoder) hints() *discoveryv1.EndpointHints {
	if d.null() {
		return nil
	}
	h := &discoveryv1.EndpointHints{}
	d.object(func(key []byte) uint {
		switch string(key) {
		case "forZones":
			h.ForZones = objects(d, nil, func(z *discoveryv1.ForZone, key []byte) uint {
				if string(key) != "name" {
					return d.other(z, key)
				}
				z.Name = d.str()
				return 0
			})
		case "forNodes":
			h.ForNodes = objects(d, nil, func(n *discoveryv1.ForNode, key []byte) uint {
				if string(key) != "name" {
					return d.other(n, key)
				}
				n.Name = d.str()
				return 0
			})
			return 1
		default:
			return d.other(h, key)
		}
		return 0
	})
	return h
}

func (d *fastDecoder) endpointPorts() []discoveryv1.EndpointPort {
	return objects(d, &d.eports, func(p *discoveryv1.EndpointPort, key []byte) uint {
		switch string(key) {
		case "name":
			p.Name = d.strPtr()
		case "protocol":
			p.Protocol = (*corev1.Protocol)(d.strPtr())
			return 1
		case "port":
			p.Port = d.int32Ptr()
			return 2
		case "appProtocol":
			p.AppProtocol = d.strPtr()
			return 3
		default:
			return d.other(p, key)
		}
		return 0
	})
}
