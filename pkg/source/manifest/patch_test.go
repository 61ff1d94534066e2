package manifest

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// loaders returns a loader that patches and one that always parses, the
// reference the patching one is compared with.
func loaders() (l, parse *loader) {
	l, parse = newLoader(translate.Options{}), newLoader(translate.Options{})
	parse.noPatch = true
	return l, parse
}

// loadBoth loads path with both loaders and checks that the patching
// one's result is the parsed one.
func loadBoth(t *testing.T, what string, l, parse *loader, path string) {
	t.Helper()
	got, err := l.load(path)
	if err != nil {
		t.Fatal(err)
	}
	want, err := parse.load(path)
	if err != nil {
		t.Fatal(err)
	}
	sameResult(t, what, got, want)
}

// sameResult fails the test if got differs from want in anything a caller
// sees.
func sameResult(t *testing.T, what string, got, want *Result) {
	t.Helper()
	if g, w := render(got.State), render(want.State); g != w {
		t.Errorf("%s: state\n%s\nwant (a fresh load)\n%s", what, g, w)
	}
	if g, w := errorStrings(got.Errors), errorStrings(want.Errors); !slices.Equal(g, w) {
		t.Errorf("%s: errors %q, want %q", what, g, w)
	}
	for _, c := range []struct {
		name      string
		got, want []string
	}{{"warnings", got.Warnings, want.Warnings}, {"skipped", got.Skipped, want.Skipped}, {"unknown", got.Unknown, want.Unknown}} {
		if !slices.Equal(c.got, c.want) {
			t.Errorf("%s: %s %q, want %q", what, c.name, c.got, c.want)
		}
	}
	if got.Services != want.Services || got.Slices != want.Slices {
		t.Errorf("%s: %d Services and %d slices, want %d and %d", what, got.Services, got.Slices, want.Services, want.Slices)
	}
}

// TestPatchMatchesParse edits one big file (a JSON List, a YAML stream)
// in the ways an edit can go, and checks after each that a loader that
// patches (patch.go) gives what a loader that parses every changed file
// gives after the same edits (history matters: last good versions, first
// come keeps a frontend), and that the edits that only change objects in
// place took the patch, decoding only what changed.
func TestPatchMatchesParse(t *testing.T) {
	const n = 300
	for _, format := range []string{"json", "yaml"} {
		t.Run(format, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, "services."+format)
			orig, _ := scaleFile(t, format, n, 0)
			ip := func(i, j int) string { return scaleAddr(i, j) }
			type edit struct {
				name  string
				from  string // replaced once (with to) in the current content
				to    string
				patch bool // the load takes the patch
			}
			q := `"`
			// vips is the clusterIP and clusterIPs of svc-7 when set to
			// those of Service i.
			vips := func(i int) string {
				return `"name":"svc-7","namespace":"bench"},"spec":{"type":"ClusterIP","clusterIP":"` + scaleVIP(i) + `","clusterIPs":["` + scaleVIP(i) + `"]`
			}
			if format == "yaml" {
				q = ""
				vips = func(i int) string {
					return "name: svc-7\n  namespace: bench\nspec:\n  type: ClusterIP\n  clusterIP: " + scaleVIP(i) + "\n  clusterIPs:\n  - " + scaleVIP(i) + "\n"
				}
			}
			edits := []edit{
				{"one endpoint", q + ip(150, 0) + q, q + "10.250.0.1" + q, true},
				{"back", q + "10.250.0.1" + q, q + ip(150, 0) + q, true},
				{"the first object", q + scaleVIP(0) + q, q + "10.97.255.1" + q, true},
				{"the last endpoint", q + ip(n-1, scaleEndpoints(n-1)-1) + q, q + "10.250.0.2" + q, true},
				{"a Service's ClusterIP onto another's", vips(7), vips(8), true},
				{"back", vips(8), vips(7), true},
				{"a slice to another Service", "kubernetes.io/service-name" + q + ":" + q + "svc-20" + q, "kubernetes.io/service-name" + q + ":" + q + "svc-21" + q, format == "json"},
				{"a renamed Service", "svc-33" + q + ",", "svc-33x" + q + ",", false},
				{"patched after the rename", q + ip(200, 1) + q, q + "10.250.0.3" + q, true},
				{"a bad object", q + ip(100, 1) + q, q + "10.250.0.300" + q, false},
				{"a bad object fixed", q + "10.250.0.300" + q, q + ip(100, 1) + q, false},
				{"patched after the fix", q + ip(101, 1) + q, q + "10.250.0.4" + q, true},
			}
			if format == "yaml" {
				edits[6] = edit{"a slice to another Service", "kubernetes.io/service-name: svc-20\n", "kubernetes.io/service-name: svc-21\n", true}
				edits[7] = edit{"a renamed Service", "name: svc-33\n", "name: svc-33x\n", false}
				edits = append(edits,
					edit{"a document split in two", "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: svc-40\n", "---\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: svc-40\n", false},
					edit{"an empty document removed", "---\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: svc-40\n", "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: svc-40\n", false},
					edit{"patched after the split", ip(102, 1) + "\n", "10.250.0.5\n", true},
					edit{"a comment in a document", "name: svc-41\n  namespace: bench\nspec:", "name: svc-41 # here\n  namespace: bench\nspec:", true},
					edit{"an unknown kind", "kind: Service\nmetadata:\n  name: svc-42\n", "kind: ConfigMap\nmetadata:\n  name: svc-42\n", false},
				)
			} else {
				edits = append(edits,
					edit{"the List's header", `{"apiVersion":"v1","kind":"List"`, `{"apiVersion":"v1", "kind":"List"`, false},
					edit{"patched after the header", q + ip(103, 1) + q, q + "10.250.0.6" + q, true},
					edit{"an item removed", `,{"apiVersion":"v1","kind":"Service","metadata":{"name":"svc-44"`, `,{"apiVersion":"v1","kind":"Service","metadata":{"name":"svc-44x"`, false},
					edit{"white space between items", `]},{"apiVersion":"v1","kind":"Service","metadata":{"name":"svc-45"`, `]}, {"apiVersion":"v1","kind":"Service","metadata":{"name":"svc-45"`, true},
					edit{"a syntax error", `{"name":"svc-46"`, `{"name":"svc-46",`, false},
				)
			}
			cur := orig
			if err := os.WriteFile(p, cur, 0o644); err != nil {
				t.Fatal(err)
			}
			l, parse := loaders()
			loadBoth(t, "the first load", l, parse, p)
			for _, e := range edits {
				next := bytes.ReplaceAll(cur, []byte(e.from), []byte(e.to))
				if bytes.Equal(next, cur) {
					t.Fatalf("%s: %q not found", e.name, e.from)
				}
				cur = next
				if err := os.WriteFile(p, cur, 0o644); err != nil {
					t.Fatal(err)
				}
				patches, decoded := l.patches, l.decoded.Load()
				loadBoth(t, e.name, l, parse, p)
				if took := l.patches > patches; took != e.patch {
					t.Errorf("%s: patched %v, want %v", e.name, took, e.patch)
				}
				if e.patch && l.decoded.Load()-decoded > 1 {
					t.Errorf("%s: decoded %d objects, want at most 1", e.name, l.decoded.Load()-decoded)
				}
			}
		})
	}
}

// TestPatchNotAcrossFiles: in a directory, an object that another file
// defines first is not in effect: editing it must not patch it in.
func TestPatchNotAcrossFiles(t *testing.T) {
	dir := t.TempDir()
	orig, _ := scaleFile(t, "yaml", 20, 0)
	writeFile(t, dir, "a.yaml", svcA)
	dup := strings.Replace(string(orig), "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: svc-5\n  namespace: bench\n",
		"---\napiVersion: v1\nkind: Service\nmetadata:\n  name: a\n  namespace: ns\n", 1)
	p := writeFile(t, dir, "b.yaml", dup)
	l, parse := loaders()
	loadBoth(t, "the first load", l, parse, dir)
	for i, to := range []string{"10.97.0.5", "10.97.0.6"} {
		from := scaleVIP(5)
		if i > 0 {
			from = "10.97.0.5"
		}
		dup = strings.ReplaceAll(dup, " "+from+"\n", " "+to+"\n")
		writeFile(t, dir, "b.yaml", dup)
		loadBoth(t, fmt.Sprintf("edit %d", i), l, parse, dir)
		if l.patches != 0 {
			t.Errorf("edit %d of %s patched a shadowed object", i, p)
		}
	}
}

// FuzzPatch loads two contents of one file in turn, with a loader that
// patches and one that parses: they must agree.
func FuzzPatch(f *testing.F) {
	small, _ := scaleFile(f, "yaml", 3, 0)
	list, _ := scaleFile(f, "json", 3, 0)
	f.Add(small, bytes.Replace(small, []byte(scaleAddr(1, 0)), []byte("10.9.9.9"), 1), false)
	f.Add(list, bytes.Replace(list, []byte(scaleAddr(1, 0)), []byte("10.9.9.9"), 1), true)
	f.Add(list, bytes.Replace(list, []byte(`},{`), []byte(`} , {`), 1), true)
	f.Add([]byte(svcA+"---\n"+sliceA), []byte(svcA+"---\n"+strings.Replace(sliceA, "10.0.0.1", "10.0.0.2", 1)), false)
	// Many blocks, two edits far apart: both must be found (blocks.go).
	big, _ := scaleFile(f, "yaml", 60, 0)
	twice := bytes.Replace(bytes.Replace(big, []byte(" "+scaleAddr(2, 0)+"\n"), []byte(" 10.9.9.9\n"), 1), []byte(" "+scaleAddr(57, 1)+"\n"), []byte(" 10.8.8.8\n"), 1)
	f.Add(big, twice, false)
	f.Fuzz(func(t *testing.T, first, second []byte, json bool) {
		name := "f.yaml"
		if json {
			name = "f.json"
		}
		p := filepath.Join(t.TempDir(), name)
		l, parse := loaders()
		for i, data := range [][]byte{first, second} {
			if err := os.WriteFile(p, data, 0o644); err != nil {
				t.Fatal(err)
			}
			loadBoth(t, fmt.Sprintf("load %d", i+1), l, parse, p)
		}
	})
}
