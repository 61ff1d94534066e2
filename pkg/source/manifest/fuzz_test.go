package manifest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// FuzzParseFile feeds arbitrary bytes to the parser and the translation:
// bad input must give errors, never a panic.
func FuzzParseFile(f *testing.F) {
	files, _ := filepath.Glob("testdata/cluster/*")
	for _, p := range files {
		if data, err := os.ReadFile(p); err == nil {
			f.Add(data)
		}
	}
	f.Add([]byte(svcA + "---\n" + sliceA))
	f.Add([]byte("kind: List\napiVersion: v1\nitems: [1, {kind: Service, apiVersion: v1}]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, name := range []string{"f.yaml", "f.json"} {
			l := newLoader(translate.Options{})
			fr := l.parseFile(name, data)
			objs := map[objKey]*object{}
			for _, o := range fr.objs {
				objs[o.key] = o
			}
			l.translate(objs, &Result{})
		}
	})
}
