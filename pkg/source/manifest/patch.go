package manifest

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
)

// Editing one object of a big file (one endpoint of one of 30,000
// Services in one JSON List) must cost what changed, not what the file
// holds. The unit cache already spares decoding the unchanged objects,
// but splitting the file into its objects, hashing each, and rebuilding
// every per-object map still walked them all: hundreds of milliseconds at
// 30,000 Services. So a file that parsed cleanly keeps its layout: where
// each piece (a document of a YAML stream, an item of a JSON List) is.
// The next load of that file finds the region that changed, splits and
// decodes only the pieces in it, and, if they are the same objects (kind,
// namespace, name) in the same places, patches the last result instead of
// parsing the file: the outcome is exactly what parseFile would return.
// Anything else (a piece added or removed, an object renamed, an error or
// a warning, a List in a YAML stream) falls back to parsing the whole
// file.
//
// The region that changed is found by hashing the file in blocks
// (blocks.go), to block granularity, made exact next to the head and the
// tail.

// layout is where a file's pieces are, and hashes of its content.
type layout struct {
	n      int  // content length
	list   bool // the pieces are the items of one JSON List; else YAML documents
	pieces []piece
	// head and tail are the content before the first piece and after
	// the last (a List's header and closing brackets), if short: a
	// change in the first or last block is then no change of them.
	head, tail []byte
}

// maxHeadTail is the longest head or tail a layout keeps.
const maxHeadTail = 1024

// piece is a document or List item and the object it holds.
type piece struct {
	span
	obj int // index in fileResult.objs (and .units), or -1 if it holds none
}

// newLayout returns the layout of a file parseFile parsed cleanly, or nil
// if it is not shaped for patching. perDoc counts the objects of each
// document.
func newLayout(file string, data []byte, fr *fileResult, perDoc []int) *layout {
	if fr.unknown || len(fr.errs) > 0 || len(fr.warns) > 0 || len(fr.objs) != len(fr.units) {
		return nil
	}
	lo := &layout{n: len(data)}
	if strings.EqualFold(filepath.Ext(file), ".json") {
		if fr.lists != 1 || fr.listSpans == nil || len(fr.listSpans) != len(fr.objs) {
			return nil
		}
		lo.list = true
		lo.pieces = make([]piece, len(fr.listSpans))
		for j, sp := range fr.listSpans {
			lo.pieces[j] = piece{sp, j}
		}
	} else {
		if fr.lists != 0 {
			return nil
		}
		spans := documentSpans(data)
		if len(spans) != len(perDoc) {
			return nil
		}
		lo.pieces = make([]piece, len(spans))
		k := 0
		for i, sp := range spans {
			lo.pieces[i] = piece{sp, -1}
			switch perDoc[i] {
			case 0:
			case 1:
				lo.pieces[i].obj = k
				k++
			default:
				return nil
			}
		}
		if k != len(fr.objs) {
			return nil
		}
	}
	lo.setHeadTail(data)
	return lo
}

func (lo *layout) setHeadTail(data []byte) {
	lo.head, lo.tail = nil, nil
	if len(lo.pieces) == 0 {
		return
	}
	if h := data[:lo.pieces[0].start]; len(h) <= maxHeadTail {
		lo.head = slices.Clone(h)
	}
	if t := data[lo.pieces[len(lo.pieces)-1].end:]; len(t) <= maxHeadTail {
		lo.tail = slices.Clone(t)
	}
}

// replacement is an object a patch replaced: the object at index obj of
// the file's objects was old, decoded from the unit oldSum, and is now new.
type replacement struct {
	obj      int
	old, new *object
	oldSum   unitSum
}

// pieceRegion is where the pieces a..b of a layout are in a file's new
// content: from the first byte of piece a to the last of piece b.
type pieceRegion struct{ a, b, from, to int }

// region returns the pieces of the layout that cover the change of a
// content of length m that begins with its first prefix bytes and ends
// with its last suffix bytes (prefix+suffix at most the shorter length),
// with what lies between them: the bytes before piece a and after piece
// b are unchanged. ok is false if there are none (the change is in the
// head or the tail).
func (lo *layout) region(prefix, suffix, m int) (r pieceRegion, ok bool) {
	if lo == nil || len(lo.pieces) == 0 || prefix+suffix > min(m, lo.n) {
		return r, false
	}
	ps := lo.pieces
	a, _ := slices.BinarySearchFunc(ps, prefix, func(p piece, off int) int { return p.end - off })
	if a == len(ps) || ps[a].start > prefix {
		a--
	}
	tail := lo.n - suffix
	b, found := slices.BinarySearchFunc(ps, tail, func(p piece, off int) int { return p.start - off })
	if !found {
		b--
	}
	if b >= 0 && ps[b].end < tail {
		b++
	}
	if lo.list {
		// The items are split from the first byte of item a to the
		// last of item b, which must be unchanged: a change that ends
		// at an item's start or begins at its end (white space
		// inserted between items) takes in the item next to it.
		if a > 0 && ps[a].start == prefix {
			a--
		}
		if b >= 0 && b < len(ps)-1 && ps[b].end == tail {
			b++
		}
	}
	if a < 0 || b >= len(ps) || b < 0 || a > b {
		return r, false
	}
	// A List's items are split from item a's first byte on: if that is
	// the end of the prefix (a is the first item, the prefix the head),
	// splitItems finds an item there only if the change left one
	// starting there, as a parse of the List would.
	from, to := ps[a].start, ps[b].end+m-lo.n
	if from > prefix || ps[b].end < tail || to < from || to > m {
		return r, false
	}
	return pieceRegion{a, b, from, to}, true
}

// patchFile returns what parseFile would return for the file's new
// content, of length m, given its last result old and that the content
// begins with the first prefix bytes of old's content and ends with its
// last suffix bytes (prefix+suffix at most the shorter length), decoding
// only the pieces in the region between; win is the new content from
// base on, at least of that region's pieces (layout.region). ok is false
// if it cannot (see the top of this file). It reads the loader's state
// only, and changes old only when it patches: fr is then old, made the
// new result in place (the caller sets its blocks). The load replaces the
// file's last result with what it finds, patched or parsed, so nothing
// reads old as it was after that, and copying its slices (the size of the
// file's objects: 14 MiB at 100,000 Services) every edit would only make
// garbage.
func (l *loader) patchFile(file string, win []byte, base, m, prefix, suffix int, old *fileResult) (fr *fileResult, repl []replacement, ok bool) {
	lo := old.layout
	r, ok := lo.region(prefix, suffix, m)
	if !ok || r.from < base || r.to > base+len(win) {
		return nil, nil, false
	}
	delta := m - lo.n
	ps, a, b := lo.pieces, r.a, r.b
	// data is the window, indexed by offsets in the file.
	data := func(from, to int) []byte { return win[from-base : to-base : to-base] }
	var spans []span
	shift := base // of what was split, in the file
	if lo.list {
		spans, ok = splitItems(win, r.from-base, r.to-base)
	} else {
		spans, ok, shift = documentSpans(data(r.from, r.to)), true, r.from
	}
	for i := range spans {
		spans[i].start += shift
		spans[i].end += shift
	}
	if !ok || len(spans) != b-a+1 {
		return nil, nil, false
	}

	l.parsed.Add(1)
	// Decoded into a scratch result and checked first: old changes
	// only once the patch cannot fail.
	type change struct {
		obj int
		u   sumUnit
		o   *object
	}
	var changes []change
	scratch := &fileResult{}
	for i, sp := range spans {
		p := ps[a+i]
		doc := data(sp.start, sp.end)
		var objs []*object
		var warns []string
		var errs []error
		var broken bool
		scratch.units = scratch.units[:0]
		if lo.list {
			o, w, err := l.decodeItem(scratch, file, a+i, doc)
			objs, broken = []*object{o}, o == nil
			if w != "" {
				warns = []string{w}
			}
			if err != nil {
				errs = []error{err}
			}
		} else {
			if len(doc) == 0 && sp.start == m {
				doc = nil // as splitDocuments
			}
			objs, warns, errs, broken = l.decodeDocument(scratch, file, a+i+1, doc)
		}
		if broken || len(warns) > 0 || len(errs) > 0 || scratch.lists > 0 {
			return nil, nil, false
		}
		switch {
		case p.obj < 0 && len(objs) == 0:
			continue
		case p.obj < 0 || len(objs) != 1 || len(scratch.units) != 1:
			return nil, nil, false
		}
		prev, o := old.objs[p.obj], objs[0]
		if o.key != prev.key || o.slice != nil && o.hasOwner != prev.hasOwner {
			return nil, nil, false
		}
		changes = append(changes, change{p.obj, scratch.units[0], o})
	}

	fr = old
	for _, c := range changes {
		// The unit goes where the old one was, as parseFile orders them.
		if prev := fr.objs[c.obj]; c.o != prev {
			repl = append(repl, replacement{c.obj, prev, c.o, fr.units[c.obj].sum})
		}
		fr.objs[c.obj], fr.units[c.obj] = c.o, c.u
	}
	// The pieces a..b are where spans say, those after them moved by
	// delta; the head and the tail are unchanged (outside a..b).
	for i, sp := range spans {
		ps[a+i].span = sp
	}
	if delta != 0 {
		for i := b + 1; i < len(ps); i++ {
			ps[i].start += delta
			ps[i].end += delta
		}
	}
	lo.n = m
	return fr, repl, true
}

// splitItems splits data[from:to], the items of a JSON List from one
// item's start to another's end, at the commas between them.
func splitItems(data []byte, from, to int) ([]span, bool) {
	var spans []span
	i := from
	for {
		end, ok := skipValue(data, i)
		if !ok || end > to {
			return nil, false
		}
		spans = append(spans, span{i, end})
		if end == to {
			return spans, true
		}
		i = skipSpace(data, end)
		if i >= to || data[i] != ',' {
			return nil, false
		}
		i = skipSpace(data, i+1)
	}
}

// decodeItem decodes item j of the List that is document 1 of file, as
// decodeDocument does, from the unit cache if it can.
func (l *loader) decodeItem(fr *fileResult, file string, j int, item []byte) (*object, string, error) {
	isum := l.sum(item)
	isum.item = true
	if u := l.units[isum]; u != nil {
		o, w := l.fromUnit(fr, isum, u, file, 1, j)
		return o, w, nil
	}
	d := fastDecoder{pack: true}
	itm, pre, err := d.decodeItem(item)
	if err != nil {
		return nil, "", fmt.Errorf("%s: document 1: items[%d]: not an object: %w", file, j, err)
	}
	return l.decodeObject(fr, isum, file, 1, j, itm, item, pre)
}

// patchedFile is a file patchFile patched: its last result and its new
// one.
type patchedFile struct {
	file     string
	old, new *fileResult
	repl     []replacement
}

// lastLoad is what the last load reported of the files (before the
// translation) and of the objects in effect, which a load that only
// replaces objects by others of the same names does not change.
type lastLoad struct {
	warns    []string
	errs     []error
	unknown  []string
	services int
	slices   int
	orphans  []string // the warnings about EndpointSlices without a Service
}

// patchObjects replaces, in the objects in effect, those the patched
// files replaced, when that is all that changed: the other files were
// unchanged and the replaced objects were in effect (not duplicates of
// another file's). It reports false, changing nothing, if not.
func (l *loader) patchObjects(patched []patchedFile) bool {
	if l.last == nil {
		return false
	}
	for _, p := range patched {
		if len(l.byFile[p.file]) != len(p.old.objs) || l.cache[p.file] != p.old {
			return false
		}
		for _, r := range p.repl {
			if l.lastGood[r.old.key] != r.old || l.byFile[p.file][r.obj] != r.old {
				return false
			}
		}
	}
	for _, p := range patched {
		// In place, as patchFile: what the file contributes is replaced.
		objs := l.byFile[p.file]
		for _, r := range p.repl {
			objs[r.obj] = r.new
			// l.lastGood is also l.fed: the tracker gets the new object
			// below.
			l.lastGood[r.new.key] = r.new
			delete(l.units, r.oldSum)
			u := p.new.units[r.obj]
			l.units[u.sum] = u.unit
		}
		l.cache[p.file] = p.new
	}
	return true
}

// patchResult is the Result of a load that only replaced objects
// (patchObjects): what load would find, at the cost of what changed.
func (l *loader) patchResult(patched []patchedFile) *Result {
	l.patches++
	res := &Result{
		Warnings: slices.Clone(l.last.warns), Errors: slices.Clone(l.last.errs), Unknown: slices.Clone(l.last.unknown),
		Services: l.last.services, Slices: l.last.slices,
	}
	for _, p := range patched {
		for _, r := range p.repl {
			if r.new.svc != nil {
				l.tracker.SetCompactService(r.new.key.NamespacedName, r.new.svc)
			} else {
				l.tracker.SetCompactSlice(r.new.key.NamespacedName, r.new.slice, "")
			}
		}
	}
	res.Warnings = append(res.Warnings, l.last.orphans...)
	res.State = l.sync(l.lastGood, res)
	return res
}
