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

// FuzzConfigMapVolume writes two contents into a ConfigMap volume the way
// the kubelet does (kubeletWrite) and loads it after each: the loader
// must never fail or panic, and after the swap it must read the new
// content exactly as a plain file holding it reads, unless that content
// has errors (a bad object keeps its last good version, an empty or
// unparsable file what it had: the states then differ on purpose).
func FuzzConfigMapVolume(f *testing.F) {
	f.Add([]byte(svcA+"---\n"+sliceA), []byte(svcA))
	f.Add([]byte(svcA), []byte(""))
	f.Add([]byte(svcA), []byte("# none\n"))
	f.Add([]byte("kind: [unclosed"), []byte(svcA+"---\n"+sliceA))
	f.Fuzz(func(t *testing.T, first, second []byte) {
		dir := t.TempDir()
		vol := filepath.Join(dir, "volume")
		if err := os.Mkdir(vol, 0o755); err != nil {
			t.Fatal(err)
		}
		l := newLoader(translate.Options{})
		kubeletWrite(t, vol, 1, map[string]string{"services.yaml": string(first)})
		if _, err := l.load(vol); err != nil {
			t.Fatalf("load after the first write: %v", err)
		}
		kubeletWrite(t, vol, 2, map[string]string{"services.yaml": string(second)})
		res, err := l.load(vol)
		if err != nil {
			t.Fatalf("load after the swap: %v", err)
		}
		plain := filepath.Join(dir, "plain")
		if err := os.Mkdir(plain, 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, plain, "services.yaml", string(second))
		want, err := newLoader(translate.Options{}).load(plain)
		if err != nil {
			t.Fatal(err)
		}
		if len(want.Errors) == 0 && len(want.Unknown) == 0 && render(res.State) != render(want.State) {
			t.Fatalf("after the swap the volume reads\n%s\nwhere its content reads\n%s", render(res.State), render(want.State))
		}
	})
}
