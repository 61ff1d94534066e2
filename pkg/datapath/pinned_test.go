package datapath

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/model"
)

// TestOpenPinnedAnySize: pins made with sizes other than the defaults
// (which Open with the defaults would migrate to its sizes) are read by
// OpenPinned as they are, without writing to them.
func TestOpenPinnedAnySize(t *testing.T) {
	d, bpffs := newTestDatapathAt(t)
	fe := l4("10.96.2.1", 80, model.TCP)
	b := testBackend{3, l4("10.2.1.1", 8080, model.TCP)}
	addService(t, d.Maps(), 4, fe, b)
	want := mustDump(t, d.Maps())
	d.Close()

	if n := pinnedMaxEntries(t, bpffs, mapBackends); n == DefaultMaxBackends {
		t.Fatalf("%s pinned with the default size %d; this test no longer shows anything", mapBackends, n)
	}

	p, err := OpenPinned(bpffs)
	if err != nil {
		t.Fatalf("OpenPinned: %v", err)
	}
	defer p.Close()
	got := mustDump(t, p)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Pinned.Dump\n got %+v\nwant %+v", got, want)
	}
	cs := counters(t, p)
	for _, n := range CounterNames() {
		if _, ok := cs[n]; !ok {
			t.Errorf("Counters() has no %s: %v", n, cs)
		}
	}
	if err := p.backends.Put(uint32(9), &sockLb4Backend{}); err == nil {
		t.Error("a write through Pinned succeeded; want the maps opened read-only")
	}
	if ks, _ := p.Dump(); !reflect.DeepEqual(ks, want) {
		t.Errorf("state changed under Pinned: %+v", ks)
	}
}

// TestOpenPinnedMissing: nothing pinned is os.ErrNotExist, and nothing is
// created.
func TestOpenPinnedMissing(t *testing.T) {
	testutil.Privileged(t)
	bpffs := testPinDir(t)
	if _, err := OpenPinned(bpffs); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("OpenPinned of an empty bpffs: %v, want os.ErrNotExist", err)
	}
	if _, err := os.Stat(filepath.Join(bpffs, "sluice")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("OpenPinned created %s/sluice (stat: %v)", bpffs, err)
	}
}
