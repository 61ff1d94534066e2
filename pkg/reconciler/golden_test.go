package reconciler_test

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-lb/sluice/pkg/reconciler"
	"github.com/sluice-lb/sluice/pkg/source/manifest"
	"github.com/sluice-lb/sluice/pkg/source/translate"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// TestGolden feeds real Service and EndpointSlice YAML through
// manifest.Load and the reconciler into the fake maps, and compares a text
// dump of the maps with testdata/golden/<case>.golden. A case is a
// directory of manifests, or a directory of numbered steps applied in
// order (the dump after each step, with the conntrack flushes it caused).
// Run with -update to rewrite the golden files after an intended change.
func TestGolden(t *testing.T) {
	cases, err := filepath.Glob("testdata/golden/*")
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range cases {
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			continue
		}
		t.Run(filepath.Base(dir), func(t *testing.T) {
			steps := []string{dir}
			if subs, _ := filepath.Glob(filepath.Join(dir, "[0-9]*")); len(subs) > 0 {
				slices.Sort(subs)
				steps = subs
			}
			f := newFake(t)
			r := reconciler.New(f, nil)
			var out strings.Builder
			for _, step := range steps {
				res, err := manifest.Load(step, translate.Options{Node: translate.Node{Name: "node-a"}})
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range res.Errors {
					t.Errorf("%s", e)
				}
				f.ResetCounts()
				mustApply(t, r, res.State)
				if len(steps) > 1 {
					fmt.Fprintf(&out, "### after %s (%d map writes)\n", filepath.Base(step), f.Writes())
				}
				out.WriteString(f.String())
				for _, b := range f.Flushed() {
					fmt.Fprintf(&out, "conntrack flushed: %s\n", b)
				}
				// Restart: restoring and re-applying writes nothing.
				f.ResetCounts()
				r2 := reconciler.New(f, nil)
				if err := r2.Restore(); err != nil {
					t.Fatal(err)
				}
				mustApply(t, r2, res.State)
				if n := f.Writes(); n != 0 {
					t.Errorf("%s: re-apply after restore wrote %d entries", step, n)
				}
			}
			golden := dir + ".golden"
			if *update {
				if err := os.WriteFile(golden, []byte(out.String()), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if got := out.String(); got != string(want) {
				t.Errorf("maps differ from %s (run with -update if intended)\ngot:\n%s\nwant:\n%s", golden, got, want)
			}
		})
	}
}
