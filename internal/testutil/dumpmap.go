package testutil

import (
	"encoding/hex"
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
