package manifest

import (
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/source/translate"
)

const goodA = "10.96.0.1:80/TCP ns/a:http -> 10.0.0.1:8080/TCP"

// An empty file (zero bytes or white space: a file being written) or one
// that cannot be parsed keeps what it last contributed, and says so; a
// file that says it has no objects removes it.
func TestLoadEmptyOrUnparsableKeepsLastGood(t *testing.T) {
	for _, c := range []struct {
		name, content string
		keep          bool
		errContains   string // "" means no error
	}{
		{"zero bytes", "", true, "empty file: keeping the 2 objects"},
		{"white space", "\n  \n\t\n", true, "empty file: keeping the 2 objects"},
		{"truncated YAML", "apiVersion: v1\nkind: Service\nmetadata: {name: a, namesp", true, "malformed YAML"},
		{"binary", "\x00\x01\x02\xff\xfe garbage: [", true, "malformed YAML"},
		{"a scalar", "hello\n", true, "not an object"},
		{"only a comment", "# no Services here\n", false, ""},
		{"only separators", "---\n---\n", false, ""},
		{"null document", "null\n", false, ""},
		{"empty List", "apiVersion: v1\nkind: List\nitems: []\n", false, ""},
		{"empty JSON List", `{"apiVersion": "v1", "kind": "List", "items": []}`, false, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			name := "services.yaml"
			if strings.HasPrefix(c.content, "{") {
				name = "services.json"
				writeFile(t, dir, name, `{"apiVersion": "v1", "kind": "List", "items": [`+
					yamlToJSON(t, svcA)+", "+yamlToJSON(t, sliceA)+"]}")
			} else {
				writeFile(t, dir, name, svcA+"---\n"+sliceA)
			}
			l := newLoader(translate.Options{})
			res, err := l.load(dir)
			if err != nil || render(res.State) != goodA {
				t.Fatalf("first load: %v, %s", err, render(res.State))
			}
			writeFile(t, dir, name, c.content)
			for range 2 { // the second load finds the file in the cache
				res, err = l.load(dir)
				if err != nil {
					t.Fatal(err)
				}
				got := render(res.State)
				if c.keep && got != goodA {
					t.Errorf("state %q, want the last good one kept", got)
				}
				if !c.keep && got != "" {
					t.Errorf("state %q, want everything removed", got)
				}
				errs := errorStrings(res.Errors)
				switch {
				case c.errContains == "" && len(errs) != 0:
					t.Errorf("errors %q, want none", errs)
				case c.errContains != "" && (len(errs) != 1 || !strings.Contains(errs[0], c.errContains)):
					t.Errorf("errors %q, want one saying %q", errs, c.errContains)
				}
				if unknown := len(res.Unknown) > 0; unknown != c.keep {
					t.Errorf("Unknown = %q", res.Unknown)
				}
			}
		})
	}
}

func yamlToJSON(t *testing.T, y string) string {
	t.Helper()
	js, err := yaml.YAMLToJSON([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return string(js)
}

// An empty file is no state, however long it stays empty: the Source
// hands over the first state only once every file can be parsed, so that a
// restart reading a file half written does not remove what the maps hold
// for it. Later, an empty file keeps what it held.
func TestSourceWaitsForUnknownFilesAtStart(t *testing.T) {
	dir := t.TempDir()
	p := writeFile(t, dir, "services.yaml", "")
	writeFile(t, dir, "other.yaml", strings.NewReplacer("name: a,", "name: b,", "10.96.0.1", "10.96.0.2").Replace(svcA))
	st := newStates()
	runSource(t, dir, st)
	time.Sleep(300 * time.Millisecond)
	st.mu.Lock()
	n := len(st.got)
	st.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d states handed over while services.yaml is empty", n)
	}
	writeFile(t, dir, "services.yaml", svcA+"---\n"+sliceA)
	both := goodA + "\n10.96.0.2:80/TCP ns/b:http ->"
	st.waitFor(t, both)
	// Truncated (as `>` does before writing): the objects stay.
	if err := os.Truncate(p, 0); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	st.waitFor(t, both)
}

// kubeletWrite does what the kubelet's atomic writer does to a ConfigMap
// volume: the files go into a new timestamped directory, a ..data_tmp
// symlink to it is renamed over ..data, the old directory is removed, and
// each file is (once) a symlink to ..data/<name>.
func kubeletWrite(t testing.TB, dir string, gen int, files map[string]string) {
	t.Helper()
	ts := fmt.Sprintf("..2026_11_23_10_%02d_00.%09d", gen, 123456789+gen)
	if err := os.Mkdir(filepath.Join(dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		writeFile(t, filepath.Join(dir, ts), name, content)
	}
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	if err := os.Symlink(ts, filepath.Join(dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		link := filepath.Join(dir, name)
		if _, err := os.Lstat(link); os.IsNotExist(err) {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
				t.Fatal(err)
			}
		}
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(dir, old)); err != nil {
			t.Fatal(err)
		}
	}
}

// A ConfigMap volume is followed through its ..data swaps, given as the
// directory or as one of its files. (The watch used to ignore every name
// but the manifests', and the swap touches none of them: the new content
// was never seen.)
func TestSourceFollowsConfigMapVolume(t *testing.T) {
	for _, asFile := range []bool{false, true} {
		t.Run(fmt.Sprintf("file=%v", asFile), func(t *testing.T) {
			dir := t.TempDir()
			kubeletWrite(t, dir, 1, map[string]string{"services.yaml": svcA + "---\n" + sliceA})
			path := dir
			if asFile {
				path = filepath.Join(dir, "services.yaml")
			}
			st := newStates()
			runSource(t, path, st)
			st.waitFor(t, goodA)

			kubeletWrite(t, dir, 2, map[string]string{"services.yaml": svcA + "---\n" + strings.Replace(sliceA, "10.0.0.1", "10.0.0.2", 1)})
			st.waitFor(t, "10.96.0.1:80/TCP ns/a:http -> 10.0.0.2:8080/TCP")
			kubeletWrite(t, dir, 3, map[string]string{"services.yaml": svcA})
			st.waitFor(t, "10.96.0.1:80/TCP ns/a:http ->")
		})
	}
}

// The kubelet's private names are never read as manifests.
func TestConfigMapPrivateNamesIgnored(t *testing.T) {
	dir := t.TempDir()
	kubeletWrite(t, dir, 1, map[string]string{"services.yaml": svcA})
	got, err := files(dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{filepath.Join(dir, "services.yaml")}; !slices.Equal(got, want) {
		t.Errorf("files = %q, want %q", got, want)
	}
	src := NewSource(dir, translate.Options{}, slog.New(slog.DiscardHandler))
	var n int
	if err := src.reload(func(s *model.State) { n = s.Services.Len() }, nil); err != nil || n != 1 {
		t.Errorf("reload: %v, %d frontends", err, n)
	}
}
