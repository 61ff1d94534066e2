package testutil

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
)

// PinnedMapIDs returns the maps pinned in dir (its directories aside), by
// pin name: the kernel's id of each, which says whether a pin still names
// the map it named.
func PinnedMapIDs(tb testing.TB, dir string) map[string]ebpf.MapID {
	tb.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		tb.Fatal(err)
	}
	out := map[string]ebpf.MapID{}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		m, err := ebpf.LoadPinnedMap(filepath.Join(dir, e.Name()), &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			tb.Fatalf("pin %s: %v", e.Name(), err)
		}
		info, err := m.Info()
		m.Close()
		if err != nil {
			tb.Fatalf("info of pin %s: %v", e.Name(), err)
		}
		id, ok := info.ID()
		if !ok {
			tb.Fatalf("pin %s: the kernel gives no map id", e.Name())
		}
		out[e.Name()] = id
	}
	return out
}

// SamePinnedMaps reports, after what, each pin of got (PinnedMapIDs) that
// names another map than in want, or is not in both.
func SamePinnedMaps(tb testing.TB, what string, got, want map[string]ebpf.MapID) {
	tb.Helper()
	names := map[string]bool{}
	for n := range got {
		names[n] = true
	}
	for n := range want {
		names[n] = true
	}
	for _, n := range slices.Sorted(maps.Keys(names)) {
		if got[n] != want[n] {
			tb.Errorf("%s, pin %s names map %d, was %d (0: no pin)", what, n, got[n], want[n])
		}
	}
}
