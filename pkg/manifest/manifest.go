// Package manifest is Sluice's standalone source: it reads Service and
// EndpointSlice objects from YAML or JSON files (as kubectl writes and
// prints them) and turns them into the desired state through pkg/k8s, the
// same translation the Kubernetes source uses.
//
// Bad input never loses what is programmed. An object that fails to decode
// or validate keeps its last good version (by kind, namespace and name), or
// is left out if it never had one; a document that cannot be parsed at all
// keeps the objects its file last contributed. Everything else in the file
// is still applied. Every error names the file, the document (1-based) and,
// where known, the object.
package manifest

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/sluice-lb/sluice/pkg/k8s"
	"github.com/sluice-lb/sluice/pkg/model"
)

// Result is the outcome of loading manifests.
type Result struct {
	State *model.State
	// Errors has one entry per bad document or object (or per Service that
	// could not be translated), each naming the file and document.
	Errors []error
	// Warnings are objects ignored: unknown kinds, EndpointSlices that
	// name no Service.
	Warnings []string
	// Skipped are Services deliberately not served (headless,
	// ExternalName, another proxy's, IPv6 only), with the reason.
	Skipped []string
	// Services and Slices count the objects in effect (including last-good
	// versions kept in place of bad ones).
	Services, Slices int
}

// Load reads path, a file or a directory (its *.yaml, *.yml and *.json
// files, not recursively, in name order), and returns the desired state.
// The error is non-nil only when path itself cannot be read; bad content is
// reported in Result.Errors.
func Load(path string, opts k8s.Options) (*Result, error) {
	return newLoader(opts).load(path)
}

// objKey identifies an object across loads.
type objKey struct {
	Kind string // "Service" or "EndpointSlice"
	types.NamespacedName
}

func (k objKey) String() string { return k.Kind + " " + k.NamespacedName.String() }

// object is one decoded, validated object and where it came from.
type object struct {
	key   objKey
	svc   *corev1.Service
	slice *discoveryv1.EndpointSlice
	file  string
	doc   int // 1-based document index in file
}

func (o *object) where() string { return fmt.Sprintf("%s: document %d", o.file, o.doc) }

// loader remembers the last good objects across loads, for retention.
type loader struct {
	opts     k8s.Options
	lastGood map[objKey]*object
	byFile   map[string][]*object // what each file contributed last time
	cache    map[string]*fileResult
	parsed   atomic.Int64 // files parsed (not served from cache), for tests
}

func newLoader(opts k8s.Options) *loader {
	return &loader{opts: opts, lastGood: map[objKey]*object{}, byFile: map[string][]*object{}}
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

func (l *loader) load(path string) (*Result, error) {
	paths, err := files(path)
	if err != nil {
		return nil, fmt.Errorf("read manifests: %w", err)
	}

	// Parse the files whose content changed since the last load (all of
	// them the first time), in parallel; reuse the outcome of the others.
	results := make([]*fileResult, len(paths))
	var todo []int
	datas := make([][]byte, len(paths))
	for i, file := range paths {
		data, err := os.ReadFile(file)
		if err != nil {
			// Unreadable (e.g. removed between listing and reading):
			// keep what it contributed last time.
			results[i] = &fileResult{objs: l.byFile[file], errs: []error{fmt.Errorf("%s: %w", file, err)}}
			continue
		}
		sum := sha256.Sum256(data)
		if c, ok := l.cache[file]; ok && c.sum == sum {
			results[i] = c
			continue
		}
		datas[i] = data
		todo = append(todo, i)
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	for _, i := range todo {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			results[i] = l.parseFile(paths[i], datas[i])
			results[i].sum = sha256.Sum256(datas[i])
		}()
	}
	wg.Wait()

	res := &Result{}
	effective := map[objKey]*object{}
	newByFile := map[string][]*object{}
	newCache := map[string]*fileResult{}
	for i, file := range paths {
		fr := results[i]
		if fr.sum != ([32]byte{}) {
			newCache[file] = fr
		}
		res.Warnings = append(res.Warnings, fr.warns...)
		res.Errors = append(res.Errors, fr.errs...)
		for _, o := range fr.objs {
			if prev, dup := effective[o.key]; dup {
				res.Errors = append(res.Errors, fmt.Errorf("%s: %s: already defined in %s; ignored", o.where(), o.key, prev.where()))
				continue
			}
			effective[o.key] = o
			newByFile[file] = append(newByFile[file], o)
		}
	}
	l.byFile = newByFile
	l.cache = newCache
	for k, o := range effective {
		l.lastGood[k] = o
	}
	for k := range l.lastGood {
		if _, ok := effective[k]; !ok {
			delete(l.lastGood, k) // deleted on purpose: forget it
		}
	}

	res.State = l.translate(effective, res)
	return res, nil
}

// fileResult is the outcome of parsing one file, cached by content.
type fileResult struct {
	sum   [32]byte // sha256 of the content; zero if the file could not be read
	objs  []*object
	warns []string
	errs  []error
}

// parseFile returns the objects a file contributes: the good ones it holds
// now, last-good versions of bad ones, and, if a document could not be
// parsed, what the file contributed last time that is not redefined. It
// only reads the loader's state, so files can be parsed in parallel.
func (l *loader) parseFile(file string, data []byte) *fileResult {
	l.parsed.Add(1)
	fr := &fileResult{}
	seen := map[objKey]*object{}
	lost := false
	for i, doc := range splitDocuments(file, data) {
		idx := i + 1
		objs, warns, errs, broken := l.decodeDocument(file, idx, doc)
		for _, w := range warns {
			fr.warns = append(fr.warns, fmt.Sprintf("%s: document %d: %s", file, idx, w))
		}
		fr.errs = append(fr.errs, errs...)
		lost = lost || broken
		for _, o := range objs {
			if prev, dup := seen[o.key]; dup {
				fr.errs = append(fr.errs, fmt.Errorf("%s: document %d: %s: already defined in %s; ignored", file, idx, o.key, prev.where()))
				continue
			}
			seen[o.key] = o
			fr.objs = append(fr.objs, o)
		}
	}
	if lost {
		for _, o := range l.byFile[file] {
			if _, ok := seen[o.key]; !ok {
				seen[o.key] = o
				fr.objs = append(fr.objs, o)
			}
		}
	}
	return fr
}

// splitDocuments splits a YAML stream at "---" lines. A JSON file is one
// document.
func splitDocuments(file string, data []byte) [][]byte {
	if strings.EqualFold(filepath.Ext(file), ".json") {
		return [][]byte{data}
	}
	var docs [][]byte
	var cur []byte
	for line := range bytes.Lines(data) {
		t := bytes.TrimRight(line, " \t\r\n")
		if bytes.Equal(t, []byte("---")) || bytes.HasPrefix(t, []byte("--- ")) {
			docs = append(docs, cur)
			cur = nil
			continue
		}
		cur = append(cur, line...)
	}
	return append(docs, cur)
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
func (l *loader) decodeDocument(file string, idx int, doc []byte) (objs []*object, warns []string, errs []error, broken bool) {
	if isBlank(doc) {
		return nil, nil, nil, false
	}
	js, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return nil, nil, []error{fmt.Errorf("%s: document %d: malformed YAML: %w", file, idx, err)}, true
	}
	if bytes.Equal(bytes.TrimSpace(js), []byte("null")) {
		return nil, nil, nil, false
	}
	var tm typeMeta
	if err := json.Unmarshal(js, &tm); err != nil {
		return nil, nil, []error{fmt.Errorf("%s: document %d: not an object: %w", file, idx, err)}, true
	}
	if tm.Kind == "List" || strings.HasSuffix(tm.Kind, "List") && tm.Items != nil {
		for j, item := range tm.Items {
			var itm typeMeta
			if err := json.Unmarshal(item, &itm); err != nil {
				errs = append(errs, fmt.Errorf("%s: document %d: items[%d]: not an object: %w", file, idx, j, err))
				broken = true
				continue
			}
			o, w, err := l.decodeObject(file, idx, fmt.Sprintf("items[%d]: ", j), itm, item)
			if w != "" {
				warns = append(warns, w)
			}
			if err != nil {
				errs = append(errs, err)
			}
			if o != nil {
				objs = append(objs, o)
			}
		}
		return objs, warns, errs, broken
	}
	o, w, err := l.decodeObject(file, idx, "", tm, js)
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

// decodeObject decodes and validates one object. On error it returns the
// object's last good version, if any, with the error.
func (l *loader) decodeObject(file string, idx int, prefix string, tm typeMeta, js []byte) (*object, string, error) {
	var kind string
	switch {
	case tm.Kind == "Service" && tm.APIVersion == "v1":
		kind = "Service"
	case tm.Kind == "EndpointSlice" && tm.APIVersion == "discovery.k8s.io/v1":
		kind = "EndpointSlice"
	default:
		what := tm.Kind
		if what == "" {
			what = "(no kind)"
		}
		return nil, fmt.Sprintf("%signoring %s %s", prefix, tm.APIVersion, what), nil
	}
	key := objKey{Kind: kind, NamespacedName: types.NamespacedName{
		Namespace: cmp.Or(tm.Metadata.Namespace, "default"), Name: tm.Metadata.Name,
	}}
	o := &object{key: key, file: file, doc: idx}
	var err error
	switch kind {
	case "Service":
		o.svc = &corev1.Service{}
		if err = json.Unmarshal(js, o.svc); err == nil {
			o.svc.Namespace = key.Namespace
			err = k8s.ValidateService(o.svc)
		}
	case "EndpointSlice":
		o.slice = &discoveryv1.EndpointSlice{}
		if err = json.Unmarshal(js, o.slice); err == nil {
			o.slice.Namespace = key.Namespace
			err = k8s.ValidateEndpointSlice(o.slice)
		}
	}
	if err == nil {
		return o, "", nil
	}
	err = fmt.Errorf("%s: document %d: %s%s: %w", file, idx, prefix, key, err)
	if prev, ok := l.lastGood[key]; ok && key.Name != "" {
		return prev, "", fmt.Errorf("%w (keeping the last good version)", err)
	}
	return nil, "", err
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

// translate builds the desired state from the objects in effect.
func (l *loader) translate(objs map[objKey]*object, res *Result) *model.State {
	st := model.NewState()
	slicesOf := map[types.NamespacedName][]*discoveryv1.EndpointSlice{}
	var svcs []*object
	all := make([]*object, 0, len(objs))
	for _, o := range objs {
		all = append(all, o)
	}
	// Sorted, so that results (which endpoint's nodeName wins among
	// duplicates, the order of warnings) do not depend on map order.
	slices.SortFunc(all, func(a, b *object) int {
		return cmp.Or(cmp.Compare(a.key.Kind, b.key.Kind), cmp.Compare(a.key.Namespace, b.key.Namespace), cmp.Compare(a.key.Name, b.key.Name))
	})
	for _, o := range all {
		switch {
		case o.svc != nil:
			svcs = append(svcs, o)
			res.Services++
		case o.slice != nil:
			res.Slices++
			if nn, ok := k8s.ServiceNameOfSlice(o.slice); ok {
				slicesOf[nn] = append(slicesOf[nn], o.slice)
			} else {
				res.Warnings = append(res.Warnings, fmt.Sprintf("%s: %s has no %s label; ignored", o.where(), o.key, discoveryv1.LabelServiceName))
			}
		}
	}
	owner := map[model.L4Addr]*object{}
	for _, o := range svcs {
		nn := o.key.NamespacedName
		ms, skipped, err := k8s.ServiceToModel(o.svc, slicesOf[nn], l.opts)
		if err != nil {
			res.Errors = append(res.Errors, fmt.Errorf("%s: %w", o.where(), err))
			continue
		}
		if skipped != "" {
			res.Skipped = append(res.Skipped, fmt.Sprintf("%s: %s skipped: %s", o.where(), o.key, skipped))
			continue
		}
		for _, m := range ms {
			if prev, taken := owner[m.Frontend]; taken {
				res.Errors = append(res.Errors, fmt.Errorf("%s: %s: frontend %s already belongs to %s (%s); ignored",
					o.where(), o.key, m.Frontend, prev.key, prev.where()))
				continue
			}
			owner[m.Frontend] = o
			st.Services[m.Frontend] = m
		}
	}
	return st
}

// errorStrings renders errors for comparison and logging.
func errorStrings(errs []error) []string {
	out := make([]string, len(errs))
	for i, e := range errs {
		out[i] = e.Error()
	}
	return out
}
