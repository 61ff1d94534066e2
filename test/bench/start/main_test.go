package main

import (
	"reflect"
	"testing"
)

// TestParseModes: BENCH_START_MODES splits into modes at ';', each
// name=binary then its environment (NAME=value) and flags (-...); a word
// that is neither, or a mode without its binary, is refused.
func TestParseModes(t *testing.T) {
	got, err := parseModes("main=/tmp/a GODEBUG=gctrace=1; cand=/tmp/b --start-gc-percent=100 GOGC=50 ;")
	if err != nil {
		t.Fatal(err)
	}
	want := []mode{
		{Name: "main", Bin: "/tmp/a", Env: []string{"GODEBUG=gctrace=1"}},
		{Name: "cand", Bin: "/tmp/b", Env: []string{"GOGC=50"}, Args: []string{"--start-gc-percent=100"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
	for _, bad := range []string{"", "main", "main=", "=/tmp/a", "main=/tmp/a stray"} {
		if m, err := parseModes(bad); err == nil {
			t.Errorf("%q: %+v, want an error", bad, m)
		}
	}
}

// TestGCTrace: the collections before the first sync's line are counted,
// the forced ones too, their CPU summed (the five "ms cpu" figures) and
// the bytes they found live added up.
func TestGCTrace(t *testing.T) {
	log := "gc 1 @0.011s 3%: 0.46+1.8+0.007 ms clock, 0.93+0.19/0.51/0.69+0.014 ms cpu, 3->4->2 MB, 4 MB goal, 0 MB stacks, 0 MB globals, 2 P\n" +
		"time=x level=INFO msg=\"Loaded manifests\"\n" +
		"gc 15 @1.353s 4%: 0.15+46+0.006 ms clock, 0.31+0/26/65+0.013 ms cpu, 80->80->73 MB, 160 MB goal, 0 MB stacks, 0 MB globals, 2 P (forced)\n"
	var st start
	gcTrace(log, &st)
	if st.GCs != 2 || st.GCForced != 1 || st.MarkedMB != 75 || st.HeapMB != 83 || st.LiveMB != 73 {
		t.Errorf("got %+v", st)
	}
	if want := (0.93 + 0.19 + 0.51 + 0.69 + 0.014 + 0.31 + 0 + 26 + 65 + 0.013) / 1000; st.GCCPUS < want-1e-9 || st.GCCPUS > want+1e-9 {
		t.Errorf("GC CPU %v s, want %v", st.GCCPUS, want)
	}
}
