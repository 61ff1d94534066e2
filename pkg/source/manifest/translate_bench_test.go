package manifest

import (
	"path/filepath"
	"testing"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// BenchmarkFirstTranslate is the part of BenchmarkLoadList/30k/initial
// that is not the file's: the objects of the 30,000 x 10 List, decoded
// once, fed to a new tracker, translated and built into a first state,
// as a first load does after its parse (loader.translate). cpu-ms/op is
// the CPU time of the process, the collector's included.
func BenchmarkFirstTranslate(b *testing.B) {
	const n = 30000
	p := filepath.Join(b.TempDir(), "services.json")
	writeList(b, p, n, 10, n/2)
	l := newLoader(translate.Options{})
	if _, err := l.load(p); err != nil {
		b.Fatal(err)
	}
	objs := l.lastGood
	b.ReportAllocs()
	t0, runs := testutil.CPUTime(b), 0
	for b.Loop() {
		runs++
		fresh := newLoader(translate.Options{})
		fresh.byFile = l.byFile // as the load leaves it before translate
		res := &Result{}
		st := fresh.translate(objs, res)
		if len(res.Errors) > 0 || st.Services.Len() != n {
			b.Fatalf("%v, %d frontends", res.Errors, st.Services.Len())
		}
	}
	b.ReportMetric(float64((testutil.CPUTime(b)-t0).Microseconds())/1000/float64(runs), "cpu-ms/op")
}

// BenchmarkFirstParse is the other part of BenchmarkLoadList/30k/initial:
// the 30,000 x 10 List read and decoded by a new loader (readFile: its
// items decoded in place, compacted, validated, put in a map by key),
// nothing fed to a tracker. cpu-ms/op is the CPU time of the process,
// the collector's included.
func BenchmarkFirstParse(b *testing.B) {
	const n = 30000
	p := filepath.Join(b.TempDir(), "services.json")
	writeList(b, p, n, 10, n/2)
	b.ReportAllocs()
	t0, runs := testutil.CPUTime(b), 0
	for b.Loop() {
		runs++
		fr := newLoader(translate.Options{}).readFile(p)
		if len(fr.errs) > 0 || len(fr.objs) != 2*n {
			b.Fatalf("%v, %d objects", fr.errs, len(fr.objs))
		}
	}
	b.ReportMetric(float64((testutil.CPUTime(b)-t0).Microseconds())/1000/float64(runs), "cpu-ms/op")
}
