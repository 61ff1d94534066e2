package manifest

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"testing"

	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// memoryEdits returns the file content after edit k (1-based) of a run of
// edits of orig, a JSON List from scaleFile with n Services, made in
// place in cur: endpoint 1 of one of three Services moves to a new
// address each time (a patch), and edits 5, 15, 25, ... add or remove a
// Service (a full parse).
func memoryEdit(t testing.TB, cur []byte, n, k int) []byte {
	t.Helper()
	if k%10 == 5 {
		extra := []byte(`,{"apiVersion":"v1","kind":"Service","metadata":{"name":"extra","namespace":"bench"},"spec":{"clusterIP":"10.95.0.1","ports":[{"port":80}]}}]}`)
		if k%20 == 5 {
			return append(cur[:len(cur)-2], extra...)
		}
		return append(cur[:len(cur)-len(extra)], "]}"...)
	}
	i := (k % 3) * n / 3
	at := bytes.Index(cur, []byte(`"svc-`+strconv.Itoa(i)+`-abcde"`))
	start := at + bytes.Index(cur[at:], []byte(`"nodeName":"node-0"},{"addresses":["`)) + len(`"nodeName":"node-0"},{"addresses":["`)
	end := start + bytes.IndexByte(cur[start:], '"')
	if at < 0 || start < at || end < start {
		t.Fatalf("edit %d: no endpoint 1 of Service %d", k, i)
	}
	addr := "10.251." + strconv.Itoa(k>>8) + "." + strconv.Itoa(k&0xff)
	return append(cur[:start], append([]byte(addr), cur[end:]...)...)
}

// liveHeap is the heap in use after a collection.
func liveHeap() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestLiveHeapBoundedOverEdits: what the loader holds between loads does
// not grow with the number of edits. The agent's RSS grows after its
// first load (issue 14: 861 to 1105 MiB at 100,000 Services over 5
// edits); if the loader kept something per edit (old results, read
// buffers, layouts, the tracker's states), the live heap would grow by
// at least that much per edit (here about 0.3 MiB of slices per kept
// result, 3.4 MiB per kept buffer). Edits 20 and 40 leave the same shape
// (each edited object replaced more than once, the extra Service absent).
func TestLiveHeapBoundedOverEdits(t *testing.T) {
	const n = 3000
	p := filepath.Join(t.TempDir(), "services.json")
	orig, _ := scaleFile(t, "json", n, 0)
	cur := make([]byte, len(orig), len(orig)+4096) // edited in place: the test allocates nothing per edit
	copy(cur, orig)
	if err := os.WriteFile(p, cur, 0o644); err != nil {
		t.Fatal(err)
	}
	l := newLoader(translate.Options{})
	if _, err := l.load(p); err != nil {
		t.Fatal(err)
	}
	var at20, at40 uint64
	var res *Result
	for k := 1; k <= 40; k++ {
		cur = memoryEdit(t, cur, n, k)
		if err := os.WriteFile(p, cur, 0o644); err != nil {
			t.Fatal(err)
		}
		var err error
		if res, err = l.load(p); err != nil || len(res.Errors) > 0 {
			t.Fatalf("edit %d: %v %v", k, err, res.Errors)
		}
		res = nil // as the agent, which hands it on
		switch k {
		case 20:
			at20 = liveHeap()
		case 40:
			at40 = liveHeap()
		}
	}
	t.Logf("live heap after edit 20: %.2f MiB, after edit 40: %+.1f KiB; %d of 40 edits patched", float64(at20)/(1<<20), (float64(at40)-float64(at20))/1024, l.patches)
	if l.patches < 30 {
		t.Errorf("%d of 40 edits patched, want the 36 that are patchable", l.patches)
	}
	if at40 > at20+256<<10 {
		t.Errorf("live heap grew by %.1f KiB over edits 21-40, want < 256 KiB", (float64(at40)-float64(at20))/1024)
	}
	// And what it holds is right: the state of a fresh load.
	got, err := l.load(p)
	if err != nil {
		t.Fatal(err)
	}
	want, err := Load(p, translate.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sameResult(t, "after 40 edits", got, want)
}

// TestEditAfterFullParseAllocatesLittle: the first edit after a full
// parse (the first load, a Service added or removed), patched, does not
// allocate the file's size (113 MiB at 100,000 Services): the loader
// keeps no copy of the file (it keeps hashes of its blocks, blocks.go),
// and reads only the changed region into a new buffer.
func TestEditAfterFullParseAllocatesLittle(t *testing.T) {
	const n = 300
	p := filepath.Join(t.TempDir(), "services.json")
	orig, _ := scaleFile(t, "json", n, 0)
	cur := bytes.Clone(orig)
	if err := os.WriteFile(p, cur, 0o644); err != nil {
		t.Fatal(err)
	}
	l := newLoader(translate.Options{})
	var ms runtime.MemStats
	for k := 1; k <= 6; k++ {
		if _, err := l.load(p); err != nil {
			t.Fatal(err)
		}
		cur = memoryEdit(t, cur, n, k)
		if err := os.WriteFile(p, cur, 0o644); err != nil {
			t.Fatal(err)
		}
		runtime.ReadMemStats(&ms)
		before, patches := ms.TotalAlloc, l.patches
		got, err := l.load(p)
		if err != nil {
			t.Fatal(err)
		}
		runtime.ReadMemStats(&ms)
		if l.patches == patches+1 && ms.TotalAlloc-before > uint64(len(cur))/2 {
			t.Errorf("edit %d: allocated %d bytes, the file is %d", k, ms.TotalAlloc-before, len(cur))
		}
		want, err := Load(p, translate.Options{})
		if err != nil {
			t.Fatal(err)
		}
		sameResult(t, "edit "+strconv.Itoa(k), got, want)
	}
}

// BenchmarkEditsMemory is TestLiveHeapBoundedOverEdits at 30,000 and
// 100,000 Services (issue 14): 20 edits (memoryEdit) of a JSON List after
// a load. live-MiB and end-live-MiB are the loader's live heap after the
// load and after the 20 edits; MiB/patch and MiB/parse what an edit that
// patched, or was parsed in full (2 of 20), allocated (medians; and the
// most a patched edit allocated). Run with -benchtime 1x: each run is 20
// edits.
func BenchmarkEditsMemory(b *testing.B) {
	for _, n := range scaleSizes() {
		b.Run(strconv.Itoa(n/1000)+"k", func(b *testing.B) {
			p := filepath.Join(b.TempDir(), "services.json")
			orig, _ := scaleFile(b, "json", n, 0)
			cur := make([]byte, len(orig), len(orig)+4096)
			copy(cur, orig)
			var ms runtime.MemStats
			allocated := func() uint64 { runtime.GC(); runtime.ReadMemStats(&ms); return ms.TotalAlloc }
			for b.Loop() {
				if err := os.WriteFile(p, cur, 0o644); err != nil {
					b.Fatal(err)
				}
				base := liveHeap()
				l := newLoader(translate.Options{})
				if _, err := l.load(p); err != nil {
					b.Fatal(err)
				}
				first := liveHeap()
				var patch, parse []float64
				for k := 1; k <= 20; k++ {
					cur = memoryEdit(b, cur, n, k)
					if err := os.WriteFile(p, cur, 0o644); err != nil {
						b.Fatal(err)
					}
					t0, patches := allocated(), l.patches
					res, err := l.load(p)
					if err != nil || len(res.Errors) > 0 {
						b.Fatalf("edit %d: %v %v", k, err, res.Errors)
					}
					mib := float64(allocated()-t0) / (1 << 20)
					if l.patches > patches {
						patch = append(patch, mib)
					} else {
						parse = append(parse, mib)
					}
				}
				end := liveHeap()
				runtime.KeepAlive(l)
				b.ReportMetric(float64(first-base)/(1<<20), "live-MiB")
				b.ReportMetric(float64(end-base)/(1<<20), "end-live-MiB")
				b.ReportMetric(median(patch), "MiB/patch")
				b.ReportMetric(slices.Max(patch), "max-MiB/patch")
				b.ReportMetric(median(parse), "MiB/parse")
			}
		})
	}
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	return v[len(v)/2]
}

// TestFirstLoadCopiesNoContent: a file parsed in full is read from a
// mapping of it, not copied into the heap (readFile): the agent's first
// load of a 44 MiB List held the copy live through the whole parse, and
// the collector's goal (twice the live heap) with it. The List here is
// two Services 8 MiB of white space apart, which the parse skips: the
// load allocates far less than the file holds, where a copy alone would
// be the file's size.
func TestFirstLoadCopiesNoContent(t *testing.T) {
	const gap = 8 << 20
	svc := func(i int) string {
		return `{"apiVersion":"v1","kind":"Service","metadata":{"name":"svc-` + strconv.Itoa(i) + `","namespace":"bench"},"spec":{"clusterIP":"10.96.0.` + strconv.Itoa(i) + `","ports":[{"port":80}]}}`
	}
	content := `{"apiVersion":"v1","kind":"List","items":[` + svc(1) + `,` + string(bytes.Repeat([]byte(" "), gap)) + svc(2) + `]}`
	p := filepath.Join(t.TempDir(), "services.json")
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	l := newLoader(translate.Options{})
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	res, err := l.load(p)
	runtime.ReadMemStats(&after)
	if err != nil || len(res.Errors) > 0 || res.Services != 2 {
		t.Fatalf("load: %v %v, %d Services", err, res.Errors, res.Services)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > gap/8 {
		t.Errorf("a load of a %d-byte file allocated %d bytes: want < %d (no copy of the content)", gap, alloc, gap/8)
	}
	// The file parsed from the mapping is the one hashed: an edit of it
	// is found (and patched) as after a load of a copy.
	if err := os.WriteFile(p, []byte(`{"apiVersion":"v1","kind":"List","items":[`+svc(1)+`]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if res, err = l.load(p); err != nil || len(res.Errors) > 0 || res.Services != 1 {
		t.Fatalf("load after the edit: %v %v, %d Services", err, res.Errors, res.Services)
	}
}
