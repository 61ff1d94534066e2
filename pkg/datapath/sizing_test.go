package datapath

import (
	"testing"

	"github.com/sluice-lb/sluice/internal/testutil"
)

func TestDynamicFlowTables(t *testing.T) {
	eb, err := FlowTableEntryBytes()
	if err != nil {
		t.Fatal(err)
	}
	for i, b := range eb.fields() {
		if *b <= 48*len(flowTableMaps[i]) {
			t.Fatalf("flow table %v: %d bytes an entry, less than the maps' element headers", flowTableMaps[i], *b)
		}
	}
	def := DefaultFlowTables.Bytes(eb)
	for _, c := range []struct {
		name     string
		mem      uint64
		ratio    float64
		want     FlowTables
		wantBust bool
	}{
		// The memory the defaults cost: the defaults.
		{name: "defaults' memory", mem: def * 400, ratio: 0.0025, want: DefaultFlowTables},
		// Half of it: half of each.
		{name: "half", mem: def * 200, ratio: 0.0025, want: FlowTables{DefaultMaxConntrack / 2, DefaultMaxConntrackNew / 2, DefaultMaxSockRev / 2, DefaultMaxAffinity / 2}},
		// A tiny node: each at the lower bound.
		{name: "tiny", mem: 1 << 20, ratio: 0.0025, want: FlowTables{minFlowTable, minFlowTable, minFlowTable, minFlowTable}},
		// A huge one: each at the upper bound.
		{name: "huge", mem: 1 << 50, ratio: 1, want: FlowTables{maxFlowTable, maxFlowTable, maxFlowTable, maxFlowTable}},
		{name: "ratio 0", mem: 1 << 30, ratio: 0, wantBust: true},
		{name: "ratio above 1", mem: 1 << 30, ratio: 1.5, wantBust: true},
	} {
		got, err := DynamicFlowTables(c.mem, c.ratio, eb)
		if c.wantBust {
			if err == nil {
				t.Errorf("%s: %+v, want an error", c.name, got)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%s: %+v, %v; want %+v", c.name, got, err, c.want)
		}
	}
}

// TestFlowTableBytesMatchTheKernel: what FlowTableEntryBytes says the flow
// tables cost is what the kernel says they hold (memlock), but for the
// buckets and free lists it leaves out: within 20%.
func TestFlowTableBytesMatchTheKernel(t *testing.T) {
	testutil.Privileged(t)
	eb, err := FlowTableEntryBytes()
	if err != nil {
		t.Fatal(err)
	}
	d := openTest(t, Config{BPFFS: testPinDir(t), DeferDryRun: true})
	pins := mapBytes(t, d, func(f MapFill) string { return f.Pin })
	for i, n := range DefaultFlowTables.fields() {
		var kernel uint64
		for _, name := range flowTableMaps[i] {
			b, ok := pins[name]
			if !ok || b == 0 {
				t.Fatalf("no memory reported for %s", name)
			}
			kernel += b
		}
		est := uint64(*n) * uint64(*eb.fields()[i])
		t.Logf("%v: estimated %d MiB, the kernel %d MiB", flowTableMaps[i], est>>20, kernel>>20)
		if est > kernel || float64(est) < 0.8*float64(kernel) {
			t.Errorf("%v: estimated %d bytes, the kernel holds %d", flowTableMaps[i], est, kernel)
		}
	}
}
