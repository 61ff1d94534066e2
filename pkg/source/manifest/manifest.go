// Package manifest is Sluice's standalone source: it reads Service and
// EndpointSlice objects from YAML or JSON files (as kubectl writes and
// prints them), finds which objects changed since the last load, and feeds
// those to pkg/source/tracker, the change tracker the Kubernetes source
// feeds from its informers (as kpng's file2store feeds the store kube2store
// feeds). The tracker translates only the Services that changed and
// resolves frontends claimed twice, by the same rules for both sources.
//
// Bad input never loses what is programmed. An object that fails to decode
// or validate keeps its last good version (by kind, namespace and name), or
// is left out if it never had one; a document that cannot be parsed at all
// keeps the objects its file last contributed. Everything else in the file
// is still applied. Every error names the file, the document (1-based) and,
// where known, the object.
//
// An empty file (zero bytes, or only white space) is a file being written
// (a shell's `>` truncates before it writes), not a file without objects:
// it keeps the objects it last contributed, with an error saying so. A
// file with no objects says so: it holds only comments, `---` separators
// or `null` documents, or an empty List; it removes what it contributed.
// Source does not hand over a first state while a file's content is
// unknown (empty, unreadable, or with a document that cannot be parsed):
// after a restart that state would remove what the maps hold for it.
package manifest

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"hash/maphash"
	"io/fs"
	"iter"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/source/tracker"
	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// Result is the outcome of loading manifests.
type Result struct {
	State *model.State
	// Errors has one entry per bad document or object (or per Service that
	// could not be translated, or frontend it lost to another Service),
	// each naming the file and document.
	Errors []error
	// Warnings are objects ignored (unknown kinds, EndpointSlices that
	// name no Service) and parts of Services not served as written (an
	// SCTP port, source ranges that do not parse).
	Warnings []string
	// Skipped are Services deliberately not served (headless,
	// ExternalName, another proxy's), with the reason.
	Skipped []string
	// Services and Slices count the objects in effect (including last-good
	// versions kept in place of bad ones).
	Services, Slices int
	// Unknown are the files whose content is not known: empty (being
	// written), unreadable, or with a document that cannot be parsed.
	// Each keeps the objects it last contributed, if any.
	Unknown []string
}

// Load reads path, a file or a directory (its *.yaml, *.yml and *.json
// files, not recursively, in name order), and returns the desired state.
// The error is non-nil only when path itself cannot be read; bad content is
// reported in Result.Errors.
func Load(path string, opts translate.Options) (*Result, error) {
	return newLoader(opts).load(path)
}

// objKey identifies an object across loads.
type objKey struct {
	Kind objKind
	types.NamespacedName
}

func (k objKey) String() string { return k.Kind.String() + " " + k.NamespacedName.String() }

// objKind is what kind of object a key names: a byte, not the kind's
// name, in the 60,000 keys of 30,000 Services (the loader's map of
// objects in effect, and each object's key: 2 MiB less, issue 14).
type objKind uint8

const (
	kindService objKind = iota + 1
	kindSlice
)

func (k objKind) String() string {
	switch k {
	case kindService:
		return "Service"
	case kindSlice:
		return "EndpointSlice"
	}
	return "(no kind)"
}

// object is one decoded, validated object, as the loader keeps it (what
// a translation reads of it: compact.go), and where it came from.
type object struct {
	key   objKey
	svc   *translate.Service
	slice *translate.Slice
	file  string
	doc   int32 // 1-based document index in file (80 bytes an object, not 96)
	// hasOwner says an EndpointSlice names a Service (its
	// kubernetes.io/service-name label), found once when it is decoded.
	hasOwner bool
}

func (o *object) where() string { return fmt.Sprintf("%s: document %d", o.file, o.doc) }

// loader remembers the last good objects across loads, for retention.
//
// It also caches what it decoded, so that a change costs what changed: a
// file whose content is unchanged is not parsed again, and in a file that
// changed, an object (a document, or an item of a List) whose bytes are
// unchanged is not decoded again (units, by content hash). Decoding
// dominates: a one-endpoint edit of a single file holding 30,000 Services
// decodes one EndpointSlice instead of 60,000 objects. Decoded objects are
// shared between loads and never modified, so an object whose pointer did
// not change did not change, and only the others are fed to the tracker,
// which then translates one Service.
type loader struct {
	lastGood map[objKey]*object
	byFile   map[string][]*object // what each file contributed last time
	cache    map[string]*fileResult
	units    map[unitSum]*unit // what the last load decoded, by content
	tracker  *tracker.Tracker
	compact  compacter          // what is kept of each object decoded (compact.go)
	fed      map[objKey]*object // the objects the tracker holds
	seed     maphash.Seed
	// spareBlocks is the block list of a file's content before its last
	// patch, which nothing reads any more: the next scan fills it
	// (takeSpareBlocks) instead of allocating one. nil if none.
	spareBlocks *blockHashes
	// last is what the last load found outside the objects, for a load
	// that only patches objects (patch.go); nil when it cannot.
	last       *lastLoad
	parsed     atomic.Int64 // files parsed (not served from cache), for tests
	reads      atomic.Int64 // files read, for tests
	loads      atomic.Int64 // loads, for tests
	decoded    atomic.Int64 // objects decoded (not served from units), for tests
	inPlace    atomic.Int64 // Lists decoded in place (listinplace.go), for tests
	translated int          // Services translated, for tests
	patches    int          // loads that only patched objects, for tests
	noPatch    bool         // never patch (patch.go), for tests
	noInPlace  bool         // never decode a List in place (listinplace.go), for tests
	mapOrder   bool         // feed a first load in map order (not inFileOrder), for tests
	afterItem  func()       // called after each item of a List is decoded, for tests
}

func newLoader(opts translate.Options) *loader {
	return &loader{lastGood: map[objKey]*object{}, byFile: map[string][]*object{},
		units: map[unitSum]*unit{}, tracker: tracker.New(opts), seed: maphash.MakeSeed()}
}

// unitSum identifies content: a 64-bit keyed hash and the length. The
// cache lives in memory only and the seed is random per process, so a
// collision (2^-64) cannot be provoked by crafted input.
type unitSum struct {
	hash uint64
	// n is the length, the low 32 bits of it (16 bytes a sum, not 24,
	// in the map of 60,000 units at 30,000 Services: a unit 4 GiB longer
	// than another goes by its hash alone).
	n uint32
	// item says the bytes are an item of a JSON List, which only JSON
	// decodes: the same bytes as a whole document may be YAML.
	item bool
}

func rawItems(items []json.RawMessage) [][]byte {
	out := make([][]byte, len(items))
	for i, it := range items {
		out[i] = it
	}
	return out
}

func (l *loader) sum(data []byte) unitSum {
	return unitSum{hash: maphash.Bytes(l.seed, data), n: uint32(len(data))}
}

// unit is the outcome of decoding one object's bytes, when it is not an
// error: the same bytes always decode to it. The decoded objects are
// shared between loads and never modified: the same bytes elsewhere (in
// another file or document) are last's key and compact form with
// another place.
type unit struct {
	ignore string  // not served: "apiVersion Kind", reported as a warning
	last   *object // the object it was decoded as (nil if ignored)
}

// files lists the manifest files of path.
func files(path string) ([]string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return []string{path}, nil
	}
	ents, err := os.ReadDir(path)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() || strings.HasPrefix(e.Name(), ".") || !isManifest(e.Name()) {
			continue
		}
		if e.Type()&fs.ModeSymlink == 0 && !e.Type().IsRegular() {
			continue
		}
		out = append(out, filepath.Join(path, e.Name()))
	}
	slices.Sort(out)
	return out, nil
}

func isManifest(name string) bool {
	switch strings.ToLower(filepath.Ext(name)) {
	case ".yaml", ".yml", ".json":
		return true
	}
	return false
}

func (l *loader) load(path string) (*Result, error) { return l.loadChanged(path, nil) }

// loadChanged is load when only the files named in changed (base names)
// can have changed since the last load: the others, if that load read
// them, are taken from it unread. The watch names the files an event is
// about (Source.Run), so an edit of one file of a directory of many costs
// that file. nil: every file may have changed.
func (l *loader) loadChanged(path string, changed map[string]bool) (*Result, error) {
	l.loads.Add(1)
	paths, err := files(path)
	if err != nil {
		return nil, fmt.Errorf("read manifests: %w", err)
	}

	// Parse the files whose content changed since the last load (all of
	// them the first time), in parallel; reuse the outcome of the others.
	results := make([]*fileResult, len(paths))
	var todo []int // the files to read in full and parse
	var patched []patchedFile
	cached := 0 // files read whose last result is cached
	for i, file := range paths {
		c, ok := l.cache[file]
		if ok && changed != nil && !changed[filepath.Base(file)] {
			results[i] = c
			cached++
			continue
		}
		l.reads.Add(1)
		if ok {
			// Hashed in blocks against what it was (blocks.go); read
			// in full if that fails, or the patch does.
			ch, err := l.scanFile(file, c.blocks, c.layout)
			if err == nil && ch.same {
				results[i] = c
				cached++
				continue
			}
			if err == nil && !l.noPatch && ch.win != nil {
				if fr, repl, ok := l.patchFile(file, ch.win, ch.base, ch.size, ch.prefix, ch.suffix, c); ok {
					// c's blocks were of the old content: the
					// next scan may reuse them.
					l.spareBlocks, fr.blocks = c.blocks, ch.blocks
					results[i] = fr
					cached++
					patched = append(patched, patchedFile{file, c, fr, repl})
					continue
				}
			}
		}
		if ok {
			cached++
		}
		todo = append(todo, i)
	}
	if len(todo) == 0 && cached == len(paths) && cached == len(l.cache) && l.patchObjects(patched) {
		return l.patchResult(patched), nil
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	for _, i := range todo {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			results[i] = l.readFile(paths[i])
		}()
	}
	wg.Wait()

	res := &Result{}
	nobjs, nunits := 0, 0
	for _, fr := range results {
		nobjs += len(fr.objs)
		nunits += len(fr.units)
	}
	var effective map[objKey]*object
	own := len(paths) == 1 && results[0].seen != nil
	if own {
		// One file, parsed: the objects in effect are its objects,
		// which its parse put in a map by key (8 MiB at 30,000
		// Services, not made twice).
		effective = results[0].seen
	} else {
		effective = make(map[objKey]*object, nobjs)
	}
	newByFile := map[string][]*object{}
	newCache := map[string]*fileResult{}
	units := make(map[unitSum]*unit, nunits)
	for i, file := range paths {
		fr := results[i]
		fr.seen = nil // the map is effective, or garbage
		if fr.blocks != nil {
			newCache[file] = fr
			for _, u := range fr.units {
				units[u.sum] = u.unit
			}
		}
		res.Warnings = append(res.Warnings, fr.warns...)
		res.Errors = append(res.Errors, fr.errs...)
		if fr.unknown {
			res.Unknown = append(res.Unknown, file)
		}
		if len(fr.objs) > 0 {
			newByFile[file] = make([]*object, 0, len(fr.objs))
		}
		if own {
			// effective is this file's map: its parse put every one
			// of its objects there under its key, and only those (a
			// key twice was reported then). 60,000 lookups and
			// stores at 30,000 Services (12 ms of a first load)
			// would find each where it is.
			newByFile[file] = append(newByFile[file], fr.objs...)
			continue
		}
		for _, o := range fr.objs {
			// (o itself is there if effective is the file's map.)
			if prev, dup := effective[o.key]; dup && prev != o {
				res.Errors = append(res.Errors, fmt.Errorf("%s: %s: already defined in %s; ignored", o.where(), o.key, prev.where()))
				continue
			}
			effective[o.key] = o
			newByFile[file] = append(newByFile[file], o)
		}
	}
	l.byFile = newByFile
	l.cache = newCache
	l.units = units
	// What is in effect is the last good version of each object; objects
	// no longer defined are forgotten (deleted on purpose).
	l.lastGood = effective
	l.last = &lastLoad{
		warns: slices.Clone(res.Warnings), errs: slices.Clone(res.Errors), unknown: slices.Clone(res.Unknown),
	}

	res.State = l.translate(effective, res)
	return res, nil
}

// fileResult is the outcome of parsing one file, cached by content.
type fileResult struct {
	// blocks are the hashes of the content's blocks (blocks.go); nil if
	// the file could not be read.
	blocks *blockHashes
	objs   []*object
	warns  []string
	errs   []error
	units  []sumUnit // what it decoded, or found decoded, by content
	// unknown says the content is not known: empty, unreadable, or with a
	// document that could not be parsed (Result.Unknown).
	unknown bool
	// lists counts the documents that are Lists; listSpans are the items
	// of the last, if it was split without decoding it (splitJSONList),
	// while the file is parsed (newLayout takes them).
	lists     int
	listSpans []span
	// layout says where the objects are in the content, so that the next
	// load can decode only the part that changed (patch.go); nil if the
	// file is not shaped for that.
	layout *layout
	// dec decodes the documents while the file is parsed; nil after.
	dec *docDecoder
	// pages drops the pages of the file's mapping that the parse has
	// read, while it is parsed (nil: not mapped, or after).
	pages *mappedPages
	// seen holds objs by key, from the parse until loadChanged takes it
	// (as the map of objects in effect, if the file is the only one).
	seen map[objKey]*object
}

// docDecoder is what decodeDocument reuses from one document to the next.
type docDecoder struct {
	fast fastDecoder
	yaml yamlConv
}

// newDocDecoder returns a docDecoder whose fast decoder reuses its room
// (decodeObject keeps nothing of a decoded object: compact.go).
func newDocDecoder() *docDecoder { return &docDecoder{fast: fastDecoder{reuse: true, pack: true}} }

// readJSON reads js, a JSON object: its type meta, and the object if the
// fast decoder can (pre), or the items of a List (and where they are in
// js, if it split them without decoding them). err is encoding/json's if
// the type meta does not decode.
func (d *fastDecoder) readJSON(js []byte) (tm typeMeta, pre fastObject, items [][]byte, spans []span, err error) {
	if ftm, svc, slice, ok := d.decodeTyped(js); ok {
		return ftm, d.decoded(svc, slice), nil, nil, nil
	}
	if rest, sps, ok := splitJSONListSpans(js); ok && json.Unmarshal(rest, &tm) == nil {
		items = make([][]byte, len(sps))
		for j, sp := range sps {
			items[j] = js[sp.start:sp.end:sp.end]
		}
		return tm, fastObject{}, items, sps, nil
	}
	tm = typeMeta{}
	err = json.Unmarshal(js, &tm)
	return tm, fastObject{}, rawItems(tm.Items), nil, err
}

type sumUnit struct {
	sum unitSum
	*unit
}

// parseFile returns the objects a file contributes: the good ones it holds
// now, last-good versions of bad ones, and, if a document could not be
// parsed, what the file contributed last time that is not redefined. It
// only reads the loader's state, so files can be parsed in parallel.
func (l *loader) parseFile(file string, data []byte) *fileResult {
	return l.parseFileMapped(file, data, nil)
}

// parseFileMapped is parseFile of data, a mapping whose pages its passes
// drop behind them (pages; nil: data is not mapped).
func (l *loader) parseFileMapped(file string, data []byte, pages *mappedPages) *fileResult {
	l.parsed.Add(1)
	fr := &fileResult{}
	if len(bytes.TrimSpace(data)) == 0 {
		// Being written: keep what it held. (No objects is said with a
		// comment or a ---.)
		fr.objs, fr.unknown = l.byFile[file], true
		if n := len(fr.objs); n > 0 {
			fr.errs = append(fr.errs, fmt.Errorf("%s: empty file: keeping the %d objects it last defined (a file meaning no objects holds a comment or ---)", file, n))
		}
		return fr
	}
	lost := false
	fr.dec, fr.pages = newDocDecoder(), pages
	defer func() { fr.dec, fr.pages = nil, nil }()
	docs := splitDocuments(file, data)
	pages.dropAll()                  // a stream's split read it all
	perDoc := make([]int, len(docs)) // objects per document, for the layout
	// Decoded first, so that the map of objects seen is made its size.
	type decoded struct {
		objs []*object
		errs []error
	}
	decs := make([]decoded, len(docs))
	n := 0
	for i, doc := range docs {
		idx := i + 1
		objs, warns, errs, broken := l.decodeDocument(fr, file, idx, doc)
		pages.passed(doc)
		perDoc[i], decs[i] = len(objs), decoded{objs, errs}
		n += len(objs)
		for _, w := range warns {
			fr.warns = append(fr.warns, fmt.Sprintf("%s: document %d: %s", file, idx, w))
		}
		lost = lost || broken
	}
	seen := make(map[objKey]*object, n)
	fr.objs = make([]*object, 0, n)
	for i, dec := range decs {
		idx := i + 1
		fr.errs = append(fr.errs, dec.errs...)
		for _, o := range dec.objs {
			if prev, dup := seen[o.key]; dup {
				fr.errs = append(fr.errs, fmt.Errorf("%s: document %d: %s: already defined in %s; ignored", file, idx, o.key, prev.where()))
				continue
			}
			seen[o.key] = o
			fr.objs = append(fr.objs, o)
		}
	}
	if lost {
		fr.unknown = true
		for _, o := range l.byFile[file] {
			if _, ok := seen[o.key]; !ok {
				seen[o.key] = o
				fr.objs = append(fr.objs, o)
			}
		}
	}
	fr.seen = seen
	pages.dropAll()
	fr.layout = newLayout(file, data, fr, perDoc)
	pages.dropAll()    // a stream's layout splits it again
	fr.listSpans = nil // in the layout now, if anywhere: kept for as long as the result
	return fr
}

// splitDocuments splits a YAML stream at "---" lines. A JSON file is one
// document.
func splitDocuments(file string, data []byte) [][]byte {
	if strings.EqualFold(filepath.Ext(file), ".json") {
		return [][]byte{data}
	}
	// The documents are sub-slices of data, not copies.
	spans := documentSpans(data)
	docs := make([][]byte, len(spans))
	for i, sp := range spans {
		if sp.start < len(data) {
			docs[i] = data[sp.start:sp.end:sp.end]
		}
	}
	return docs
}

// documentSpans returns where the documents of a YAML stream are: between
// "---" lines. A stream that ends with one ends with an empty document.
func documentSpans(data []byte) []span {
	var docs []span
	start, off := 0, 0
	for line := range bytes.Lines(data) {
		t := bytes.TrimRight(line, " \t\r\n")
		if bytes.Equal(t, []byte("---")) || bytes.HasPrefix(t, []byte("--- ")) {
			docs = appendSpan(docs, span{start, off})
			start = off + len(line)
		}
		off += len(line)
	}
	return append(docs, span{start, len(data)})
}

// typeMeta is what every document is first decoded as.
type typeMeta struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Items []json.RawMessage `json:"items"`
}

// decodeDocument decodes one document. broken reports a document that
// could not be parsed at all (so what it held is unknown).
//
// A document that is one object and whose bytes decoded cleanly before is
// not decoded again; nor is an item of a List. A document that is JSON
// (as kubectl -o json and most generators write) is decoded as such,
// without converting it to JSON first; anything else goes through YAML.
func (l *loader) decodeDocument(fr *fileResult, file string, idx int, doc []byte) (objs []*object, warns []string, errs []error, broken bool) {
	if isBlank(doc) {
		return nil, nil, nil, false
	}
	// The document's sum, to find it among the units decoded before
	// (none on a first load: a List's whole document, 34 MiB at 30,000
	// Services, is not hashed for nothing) and to file an object under.
	var sum unitSum
	if len(l.units) > 0 {
		sum = l.sum(doc)
		if u := l.units[sum]; u != nil {
			o, w := l.fromUnit(fr, sum, u, file, idx, -1)
			if w != "" {
				warns = append(warns, w)
			}
			if o != nil {
				objs = append(objs, o)
			}
			return objs, warns, nil, false
		}
	}
	if len(l.units) == 0 && !l.noInPlace && isJSONObject(doc) {
		// Nothing decoded before: a List's items decoded as they are
		// found (listinplace.go).
		if objs, warns, errs, broken, ok := l.decodeListInPlace(fr, file, idx, doc); ok {
			return objs, warns, errs, broken
		}
	}
	var tm typeMeta
	js := doc
	var items [][]byte // a JSON List's items, split without decoding them
	var spans []span   // where they are in doc
	jsonOK := false
	var pre fastObject // doc decoded by the fast decoder, if it did
	dd := fr.dec
	if dd == nil {
		dd = newDocDecoder()
	}
	if isJSONObject(doc) {
		var err error
		tm, pre, items, spans, err = dd.fast.readJSON(doc)
		jsonOK = err == nil
	}
	if !jsonOK {
		// The plain YAML most files hold, converted without going
		// through generic values: the same JSON as YAMLToJSON's
		// (yamljson.go), read as JSON.
		if conv, ok := dd.yaml.convert(doc); ok {
			var err error
			if tm, pre, items, _, err = dd.fast.readJSON(conv); err != nil {
				return nil, nil, []error{fmt.Errorf("%s: document %d: not an object: %w", file, idx, err)}, true
			}
			jsonOK, js = true, conv
			if items != nil {
				dd.yaml = yamlConv{} // the items are in its buffer
			}
		}
	}
	if !jsonOK {
		var err error
		if js, err = yaml.YAMLToJSON(doc); err != nil {
			return nil, nil, []error{fmt.Errorf("%s: document %d: malformed YAML: %w", file, idx, err)}, true
		}
		if bytes.Equal(bytes.TrimSpace(js), []byte("null")) {
			return nil, nil, nil, false
		}
		tm = typeMeta{}
		if err := json.Unmarshal(js, &tm); err != nil {
			return nil, nil, []error{fmt.Errorf("%s: document %d: not an object: %w", file, idx, err)}, true
		}
		items = rawItems(tm.Items)
	}
	if tm.Kind == "List" || strings.HasSuffix(tm.Kind, "List") && tm.Items != nil {
		fr.pages.dropAll() // the split read all of the List
		fr.lists++
		fr.listSpans = spans
		fr.units = slices.Grow(fr.units, len(items))
		outs := make([]itemOutcome, len(items))
		var todo []int
		if len(l.units) == 0 {
			// Nothing decoded before: every item is to decode.
			todo = make([]int, 0, len(items))
		}
		objs = make([]*object, 0, len(items))
		mark := len(fr.units)
		for j, item := range items {
			isum := l.sum(item)
			isum.item = true
			outs[j].unit = -1
			if u := l.units[isum]; u != nil {
				outs[j].unit = len(fr.units)
				outs[j].o, outs[j].w = l.fromUnit(fr, isum, u, file, idx, j)
				continue
			}
			outs[j].sum = isum
			todo = append(todo, j)
			fr.pages.passed(item)
		}
		fr.pages.dropAll()
		l.decodeItems(fr, file, idx, items, todo, outs)
		if len(todo) > 0 && len(todo) < len(items) {
			// The units in item order, as the layout (patch.go) expects.
			ordered := make([]sumUnit, 0, len(fr.units)-mark)
			for _, out := range outs {
				if out.unit >= 0 {
					ordered = append(ordered, fr.units[out.unit])
				}
			}
			copy(fr.units[mark:], ordered)
		}
		for _, out := range outs {
			if out.w != "" {
				warns = append(warns, out.w)
			}
			if out.err != nil {
				errs = append(errs, out.err)
			}
			broken = broken || out.broken
			if out.o != nil {
				objs = append(objs, out.o)
			}
		}
		return objs, warns, errs, broken
	}
	if len(l.units) == 0 {
		sum = l.sum(doc)
	}
	o, w, err := l.decodeObject(fr, sum, file, idx, -1, tm, js, pre)
	if w != "" {
		warns = append(warns, w)
	}
	if err != nil {
		errs = append(errs, err)
	}
	if o != nil {
		objs = append(objs, o)
	}
	return objs, warns, errs, false
}

// itemOutcome is what one item of a List contributes.
type itemOutcome struct {
	sum    unitSum
	unit   int // its index in fileResult.units, -1 if none
	o      *object
	w      string
	err    error
	broken bool
}

// decodeItems decodes the items todo names. (Decoding them in parallel
// gained nothing measurable on a busy 2-core machine: GC and allocation
// dominate.)
func (l *loader) decodeItems(fr *fileResult, file string, idx int, items [][]byte, todo []int, outs []itemOutcome) {
	// Each object is dead once decodeObject has its compact form.
	d := fastDecoder{reuse: true, pack: true}
	for _, j := range todo {
		out := &outs[j]
		itm, pre, err := d.decodeItem(items[j])
		if err != nil {
			out.err = fmt.Errorf("%s: document %d: items[%d]: not an object: %w", file, idx, j, err)
			out.broken = true
			continue
		}
		n := len(fr.units)
		out.o, out.w, out.err = l.decodeObject(fr, out.sum, file, idx, j, itm, items[j], pre)
		fr.pages.passed(items[j])
		if l.afterItem != nil {
			l.afterItem()
		}
		if len(fr.units) > n {
			out.unit = n
		}
	}
}

// isJSONObject reports whether doc looks like a JSON object (it may still
// be YAML's flow style, which the JSON decoder then rejects).
func isJSONObject(doc []byte) bool {
	t := bytes.TrimLeft(doc, " \t\r\n")
	return len(t) > 0 && t[0] == '{'
}

// fromUnit returns the object (or warning) of bytes decoded before.
// item is the index in a List, or -1 for a whole document.
func (l *loader) fromUnit(fr *fileResult, sum unitSum, u *unit, file string, idx, item int) (*object, string) {
	fr.units = append(fr.units, sumUnit{sum, u})
	if u.ignore != "" {
		if item >= 0 {
			return nil, fmt.Sprintf("items[%d]: ignoring %s", item, u.ignore)
		}
		return nil, "ignoring " + u.ignore
	}
	if o := u.last; o.file == file && int(o.doc) == idx {
		return o, ""
	}
	o := *u.last
	o.file, o.doc = file, int32(idx)
	return &o, ""
}

// itemPrefix is what messages about item (an index in a List, -1 for
// none) start with.
func itemPrefix(item int) string {
	if item < 0 {
		return ""
	}
	return fmt.Sprintf("items[%d]: ", item)
}

// fastObject is an object the fast decoder decoded (decode.go), or
// nothing (the zero value).
type fastObject struct {
	svc   *corev1.Service
	slice *discoveryv1.EndpointSlice
	// eps are slice's endpoints if the decoder packed them
	// (packEndpoints), slice.Endpoints then empty; valid until the
	// decoder decodes again.
	eps    []translate.SliceEndpoint
	packed bool
}

// decoded is what d decoded last, svc or slice, as a fastObject.
func (d *fastDecoder) decoded(svc *corev1.Service, slice *discoveryv1.EndpointSlice) fastObject {
	o := fastObject{svc: svc, slice: slice}
	if slice != nil && d.didPack {
		o.eps, o.packed = d.packed, true
	}
	return o
}

// decodeItem reads the type meta of item, an item of a List, and the
// object if d can (pre; zero if not). err is encoding/json's when the
// type meta does not decode.
func (d *fastDecoder) decodeItem(item []byte) (typeMeta, fastObject, error) {
	if tm, svc, slice, ok := d.decodeTyped(item); ok {
		return tm, d.decoded(svc, slice), nil
	}
	// Declared here, not as a result: Unmarshal makes it escape, and a
	// result would be allocated for every item, decoded by hand or not.
	var tm typeMeta
	err := json.Unmarshal(item, &tm)
	return tm, fastObject{}, err
}

// decodeObject decodes and validates one object (js, or what the fast
// decoder made of it: pre, if not nil). On error it returns the object's
// last good version, if any, with the error.
//
// Clean outcomes are recorded in fr.units under sum, the content's sum.
func (l *loader) decodeObject(fr *fileResult, sum unitSum, file string, idx, item int, tm typeMeta, js []byte, pre fastObject) (*object, string, error) {
	l.decoded.Add(1)
	var kind objKind
	switch {
	case tm.Kind == "Service" && tm.APIVersion == "v1":
		kind = kindService
	case tm.Kind == "EndpointSlice" && tm.APIVersion == "discovery.k8s.io/v1":
		kind = kindSlice
	default:
		what := tm.Kind
		if what == "" {
			what = "(no kind)"
		}
		ignore := tm.APIVersion + " " + what
		fr.units = append(fr.units, sumUnit{sum, &unit{ignore: ignore}})
		return nil, itemPrefix(item) + "ignoring " + ignore, nil
	}
	// The key's strings are the loader's: the fast decoder's would keep
	// its chunk of text (compact.go).
	key := objKey{Kind: kind, NamespacedName: types.NamespacedName{
		Namespace: l.compact.shareValue(cmp.Or(tm.Metadata.Namespace, "default")), Name: strings.Clone(tm.Metadata.Name),
	}}
	o := &object{key: key, file: file, doc: int32(idx)}
	var err error
	switch kind {
	case kindService:
		var svc *corev1.Service
		if svc, err = decodeAs(pre.svc, js, key.Namespace); err == nil {
			o.svc = l.compact.service(svc, key.NamespacedName)
			err = o.svc.Invalid // translate.ValidateService's, or CheckExternalIPs'
		}
	case kindSlice:
		var es *discoveryv1.EndpointSlice
		if es, err = decodeAs(pre.slice, js, key.Namespace); err == nil {
			o.slice = l.compact.slice(es, key.NamespacedName, pre)
			err = o.slice.Invalid // translate.ValidateEndpointSlice's, or CheckEndpointIPs'
		}
		if err == nil {
			_, o.hasOwner = o.slice.ServiceName()
		}
	}
	if err == nil {
		fr.units = append(fr.units, sumUnit{sum, &unit{last: o}})
		return o, "", nil
	}
	err = fmt.Errorf("%s: document %d: %s%s: %w", file, idx, itemPrefix(item), key, err)
	if prev, ok := l.lastGood[key]; ok && key.Name != "" {
		return prev, "", fmt.Errorf("%w (keeping the last good version)", err)
	}
	return nil, "", err
}

// decodeAs returns pre (what the fast decoder made), or else js decoded
// into a new object, in namespace ns. A file's objects have no versions:
// a resourceVersion (as kubectl get -o yaml writes it) kept through an
// edit must not make the tracker take the edit for a resync.
func decodeAs[T any, P interface {
	*T
	metav1.Object
}](pre P, js []byte, ns string) (P, error) {
	o := pre
	if o == nil {
		o = new(T)
		if err := json.Unmarshal(js, o); err != nil {
			return o, err
		}
	}
	o.SetNamespace(ns)
	o.SetResourceVersion("")
	return o, nil
}

func isBlank(doc []byte) bool {
	for line := range bytes.Lines(doc) {
		t := bytes.TrimSpace(line)
		if len(t) > 0 && t[0] != '#' {
			return false
		}
	}
	return true
}

// translate feeds the tracker the objects in effect that changed since the
// last load, and returns the desired state it builds.
func (l *loader) translate(objs map[objKey]*object, res *Result) *model.State {
	all := maps.Values(objs)
	if len(l.fed) == 0 {
		if !l.mapOrder {
			all = l.inFileOrder(objs)
		}
		// The first state: the tracker's maps made their size.
		svcs := 0
		for o := range all {
			if o.svc != nil {
				svcs++
			}
		}
		l.tracker.Reserve(svcs, len(objs)-svcs)
	}
	var orphans []*object
	kept := 0 // objects the tracker holds that are still in effect
	l.tracker.Batch(func(b *tracker.Batch) {
		for o := range all {
			k := o.key
			prev := l.fed[k]
			if prev != nil {
				kept++
			}
			switch {
			case o.svc != nil:
				res.Services++
				if prev == nil || prev.svc != o.svc {
					b.SetCompactService(k.NamespacedName, o.svc)
				}
			case o.slice != nil:
				res.Slices++
				if !o.hasOwner && !o.slice.Headless {
					// One labelled service.kubernetes.io/headless
					// belongs to no Service by design (as kube-proxy
					// never lists it): no warning.
					orphans = append(orphans, o)
				}
				if prev == nil || prev.slice != o.slice {
					// No trigger time: the network programming latency is
					// the Kubernetes source's (Sync's Triggers go unread).
					b.SetCompactSlice(k.NamespacedName, o.slice, "")
				}
			}
		}
		for k, prev := range l.fed {
			if kept == len(l.fed) {
				break // none was removed
			}
			if _, ok := objs[k]; ok {
				continue
			}
			if prev.svc != nil {
				b.SetCompactService(k.NamespacedName, nil)
			} else {
				b.SetCompactSlice(k.NamespacedName, nil, "")
			}
		}
	})
	l.fed = objs

	// Sorted, so that the order of warnings does not depend on map order.
	slices.SortFunc(orphans, func(a, b *object) int {
		return cmp.Or(cmp.Compare(a.key.Namespace, b.key.Namespace), cmp.Compare(a.key.Name, b.key.Name))
	})
	var orphanWarns []string
	for _, o := range orphans {
		orphanWarns = append(orphanWarns, fmt.Sprintf("%s: %s has no %s label; ignored", o.where(), o.key, discoveryv1.LabelServiceName))
	}
	if l.last != nil {
		l.last.services, l.last.slices, l.last.orphans = res.Services, res.Slices, orphanWarns
	}
	res.Warnings = append(res.Warnings, orphanWarns...)
	return l.sync(objs, res)
}

// inFileOrder returns the objects in effect, objs, as the files hold them
// (l.byFile: each file's objects in effect, in its order), the files in
// name order, if they are all there (else in map order). A first load
// feeds the tracker so: an EndpointSlice then comes next to its Service
// (where a List or a stream has it there), and the objects, decoded in
// that order, are read in the order they lie in memory, and so are the
// tracker's inputs, made in that order, when Sync translates the Services
// in the order they came. In map order every object, every input and
// what each translation reads were a cache miss: at 30,000 Services, half
// of what the feed, the translation and the first state cost (75 ms of
// CPU of 150).
func (l *loader) inFileOrder(objs map[objKey]*object) iter.Seq[*object] {
	n := 0
	for _, os := range l.byFile {
		n += len(os)
	}
	if n != len(objs) {
		return maps.Values(objs)
	}
	files := slices.Sorted(maps.Keys(l.byFile))
	return func(yield func(*object) bool) {
		for _, f := range files {
			for _, o := range l.byFile[f] {
				if !yield(o) {
					return
				}
			}
		}
	}
}

// sync syncs the tracker and returns the desired state, adding to res
// what the tracker found wrong with the Services in objs.
func (l *loader) sync(objs map[objKey]*object, res *Result) *model.State {
	r := l.tracker.Sync()
	l.translated += r.Translated
	res.Errors = append(res.Errors, l.issues(objs, res)...)
	return r.State
}

// issues reports what the tracker found wrong with the Services in objs,
// in Service order, each naming the file and document of the Service (and
// of the one it lost a frontend to). Skipped Services go to res.Skipped.
func (l *loader) issues(objs map[objKey]*object, res *Result) []error {
	svc := func(nn types.NamespacedName) (objKey, string) {
		k := objKey{Kind: kindService, NamespacedName: nn}
		if o := objs[k]; o != nil {
			return k, o.where()
		}
		return k, "(unknown)"
	}
	errs, skipped, conflicts := l.tracker.Issues()
	for _, sk := range skipped {
		k, where := svc(sk.Service)
		res.Skipped = append(res.Skipped, fmt.Sprintf("%s: %s skipped: %s", where, k, sk.Reason))
	}
	for _, w := range l.tracker.Warnings() {
		k, where := svc(w.Service)
		res.Warnings = append(res.Warnings, fmt.Sprintf("%s: %s: %s", where, k, w.Message))
	}
	type issue struct {
		svc types.NamespacedName
		err error
	}
	var out []issue
	for _, e := range errs {
		_, where := svc(e.Service)
		out = append(out, issue{e.Service, fmt.Errorf("%s: %w", where, e.Err)})
	}
	for _, c := range conflicts {
		loser := types.NamespacedName{Namespace: c.Loser.Namespace, Name: c.Loser.Name}
		k, where := svc(loser)
		wk, wwhere := svc(types.NamespacedName{Namespace: c.Winner.Namespace, Name: c.Winner.Name})
		out = append(out, issue{loser, fmt.Errorf("%s: %s: frontend %s already belongs to %s (%s); ignored",
			where, k, c.Frontend, wk, wwhere)})
	}
	// A Service's translation error comes before the frontends it lost.
	slices.SortStableFunc(out, func(a, b issue) int {
		return cmp.Or(cmp.Compare(a.svc.Namespace, b.svc.Namespace), cmp.Compare(a.svc.Name, b.svc.Name))
	})
	errList := make([]error, len(out))
	for i, is := range out {
		errList[i] = is.err
	}
	return errList
}

// errorStrings renders errors for comparison and logging.
func errorStrings(errs []error) []string {
	out := make([]string, len(errs))
	for i, e := range errs {
		out[i] = e.Error()
	}
	return out
}
