package e2e

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/internal/testutil"
)

// repairLog is what the reconciler logs when a re-read of the maps finds
// entries that drifted and brings them into its view (pkg/reconciler's
// recheck.go), for the next apply to rewrite.
const repairLog = "Datapath maps drifted from the reconciler's view, repairing the entries that differ"

// The raw layouts of bpf/lib/structs.h, as bpftool sees them: struct
// lb4_key (12 bytes: vip and port in network order, proto, scope, slot
// in host order, padding), struct lb4_service (20 bytes: count in host
// order at 4, slots_base at 16) and struct lb4_backend (8 bytes: addr,
// port, proto, flags); a slot of sluice_slots_v1 is a __u32 backend id.
type (
	lb4Key     [12]byte
	lb4Service [20]byte
	lb4Backend [8]byte
)

func (k lb4Key) vip() netip.Addr { return netip.AddrFrom4([4]byte(k[0:4])) }
func (k lb4Key) port() uint16    { return binary.BigEndian.Uint16(k[4:6]) }
func (v lb4Service) count() uint32 {
	return binary.NativeEndian.Uint32(v[4:8])
}
func (v lb4Service) slotsBase() uint32 {
	return binary.NativeEndian.Uint32(v[16:20])
}

// TestAgentRepairsMapsChangedBehindItsBack: the running agent, re-reading
// its maps every --map-refresh-interval, puts back what was changed in
// them from outside (as with bpftool): a slot of the web Service emptied
// in sluice_slots_v1, and the address of another slot's backend
// overwritten in sluice_backends_v2. The slot comes back byte for byte;
// the backend's address comes back as its entry was, byte for byte, named
// by the same slot, under a new id (the repair takes the overwritten id
// for the wrong address's, as a rebuild of the view from a dump would,
// and releases it). The agent logs the repair, and every connection to
// the VIP works again.
func TestAgentRepairsMapsChangedBehindItsBack(t *testing.T) {
	e := setup(t, "--map-refresh-interval", "2s", "--resync-interval", "1s")
	e.waitServices(t, webVIP, func(l string) bool { return strings.Count(l, ":8080") == 3 })
	if counts := e.spreadOverAll(t, webVIP, 30); len(counts) != 3 {
		t.Fatalf("before the drift, %s answered from %v, want 3 backends", webVIP, counts)
	}

	pins := filepath.Join(e.agent.BPFFS, "sluice")
	services := openPinned(t, filepath.Join(pins, "sluice_services_v2"))
	slotsArr := openPinned(t, filepath.Join(pins, "sluice_slots_v1"))
	backends := openPinned(t, filepath.Join(pins, "sluice_backends_v2"))
	before := webSlots(t, services, slotsArr, backends)
	if len(before) != 3 {
		t.Fatalf("%s has slots %v, want 3", webVIP, before)
	}
	// Slot 2 is deleted; slot 1's backend, another one, gets a wrong
	// address.
	deleted, changed := before[1], before[0]
	if changed.id == deleted.id {
		t.Fatalf("slots 1 and 2 name the same backend %d", changed.id)
	}
	wrong := changed.backend
	copy(wrong[0:4], netip.MustParseAddr("192.0.2.99").AsSlice())
	if err := slotsArr.Put(deleted.key, uint32(0)); err != nil {
		t.Fatalf("empty slot 2 of %s: %v", webVIP, err)
	}
	if err := backends.Put(changed.id, wrong); err != nil {
		t.Fatalf("overwrite backend %d: %v", changed.id, err)
	}

	testutil.Eventually(t, "the agent to put back the slot and the backend", 60*time.Second, func() error {
		now, err := webSlotsErr(services, slotsArr, backends)
		if err != nil {
			return err
		}
		if len(now) < 2 || now[1].id != deleted.id {
			return fmt.Errorf("slots of %s are %v; slot 2 was backend %d", webVIP, now, deleted.id)
		}
		if now[0].backend != changed.backend {
			return fmt.Errorf("slot 1 of %s names backend %d, % x; it was % x", webVIP, now[0].id, now[0].backend, changed.backend)
		}
		return nil
	})
	if now, err := webSlotsErr(services, slotsArr, backends); err == nil && len(now) > 0 {
		t.Logf("slot 1's backend, overwritten under id %d, is back under id %d", changed.id, now[0].id)
	}
	if !strings.Contains(e.agent.Log.String(), repairLog) {
		t.Errorf("the agent's log has no %q", repairLog)
	}
	// The repair is counted where an operator can alert on it: the
	// re-read that repaired, the slot deleted and the backend
	// overwritten.
	m, err := e.agent.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	samples, err := testutil.Samples(strings.NewReader(m), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, series := range []string{
		`sluice_map_rereads_total{result="repaired"}`,
		`sluice_map_drift_entries_total{map="slots"}`,
		`sluice_map_drift_entries_total{map="backends"}`,
	} {
		if samples[series] < 1 {
			t.Errorf("/metrics has %s %v after the repair, want at least 1", series, samples[series])
		}
	}
	after := webSlots(t, services, slotsArr, backends)
	if len(after) != len(before) {
		t.Errorf("after the repair %s has slots %v, want %v", webVIP, after, before)
	}
	for i := range min(len(after), len(before)) {
		if after[i].slot != before[i].slot || after[i].backend != before[i].backend {
			t.Errorf("after the repair, slot %d of %s is %v, was %v", i+1, webVIP, after[i], before[i])
		}
	}
	if counts := e.spread(t, webVIP, 60); len(counts) != 3 {
		t.Errorf("after the repair, %s answered from %v, want 3 backends", webVIP, counts)
	}
}

// spreadOverAll is spread (n requests to vip), then n more at a time
// until every backend answered, 3n in all: a fair pick over three
// backends leaves one unanswered in 30 requests once in 64,000 runs
// (3 * (2/3)^30), in 90 once in 2e15; a passing run makes n.
func (e *env) spreadOverAll(t *testing.T, vip string, n int) map[string]int {
	t.Helper()
	counts := e.spread(t, vip, n)
	for range 2 {
		if len(counts) >= len(e.backends) {
			break
		}
		for who, k := range e.spread(t, vip, n) {
			counts[who] += k
		}
	}
	return counts
}

func openPinned(t *testing.T, path string) *ebpf.Map {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(path, nil)
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	t.Cleanup(func() { _ = m.Close() }) // a descriptor; the pin stays the agent's
	return m
}

type slotEntry struct {
	key     uint32     // its index in sluice_slots_v1
	slot    uint32     // its number, 1..count
	id      uint32     // the backend it names
	backend lb4Backend // the entry of the backend it names
}

// webSlots returns the backend slots (1..count) of webVIP's default-scope
// frontend, in slot order, with the backend entries they name: its
// master's range of the slots array.
func webSlots(t *testing.T, services, slots, backends *ebpf.Map) []slotEntry {
	t.Helper()
	out, err := webSlotsErr(services, slots, backends)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func webSlotsErr(services, slots, backends *ebpf.Map) ([]slotEntry, error) {
	vip := netip.MustParseAddrPort(webVIP)
	var master lb4Service
	found := false
	var k lb4Key
	var v lb4Service
	it := services.Iterate()
	for it.Next(&k, &v) {
		if k.vip() == vip.Addr() && k.port() == vip.Port() && k[6] == 6 && k[7] == 0 {
			master, found = v, true
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("walk sluice_services_v2: %w", err)
	}
	if !found {
		return nil, fmt.Errorf("no master of %s", webVIP)
	}
	var out []slotEntry
	for i := range master.count() {
		e := slotEntry{key: master.slotsBase() + i, slot: i + 1}
		if err := slots.Lookup(e.key, &e.id); err != nil {
			return nil, fmt.Errorf("slot %d of %s: %w", i+1, webVIP, err)
		}
		if e.id == 0 {
			continue
		}
		if err := backends.Lookup(e.id, &e.backend); err != nil {
			return nil, fmt.Errorf("look up backend %d: %w", e.id, err)
		}
		out = append(out, e)
	}
	return out, nil
}
