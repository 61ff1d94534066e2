package testutil

import (
	"encoding/hex"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
)

// DumpMap renders every entry of m as hex key=value lines, sorted (per-CPU
// values comma-separated by CPU), so that two dumps are equal exactly when
// the map holds the same entries: the tests that assert a dry run
// (sluicectl explain) changed no map compare them. name is m's, for the
// failure.
func DumpMap(tb testing.TB, name string, m *ebpf.Map) string {
	tb.Helper()
	var lines []string
	var k []byte
	it := m.Iterate()
	switch m.Type() {
	case ebpf.PerCPUArray, ebpf.PerCPUHash, ebpf.LRUCPUHash:
		var v [][]byte
		for it.Next(&k, &v) {
			var b strings.Builder
			for _, c := range v {
				b.WriteString(hex.EncodeToString(c) + ",")
			}
			lines = append(lines, hex.EncodeToString(k)+"="+b.String())
		}
	default:
		var v []byte
		for it.Next(&k, &v) {
			lines = append(lines, hex.EncodeToString(k)+"="+hex.EncodeToString(v))
		}
	}
	if err := it.Err(); err != nil {
		tb.Fatalf("dump %s: %v", name, err)
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// ProgArrayIDs returns the ids of the programs in the pinned program array
// at pin, slot by slot (0: an empty slot).
func ProgArrayIDs(tb testing.TB, pin string) []ebpf.ProgramID {
	tb.Helper()
	m, err := ebpf.LoadPinnedMap(pin, nil)
	if err != nil {
		tb.Fatalf("%s: %v", pin, err)
	}
	defer m.Close()
	ids := make([]ebpf.ProgramID, m.MaxEntries())
	for i := range ids {
		var id uint32
		if err := m.Lookup(uint32(i), &id); err == nil {
			ids[i] = ebpf.ProgramID(id)
		} else if !errors.Is(err, ebpf.ErrKeyNotExist) {
			tb.Fatalf("%s slot %d: %v", pin, i, err)
		}
	}
	return ids
}
