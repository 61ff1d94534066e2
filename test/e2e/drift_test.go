package e2e

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
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
// in host order, padding), struct lb4_service (16 bytes, backend_id in
// host order first) and struct lb4_backend (8 bytes: addr, port, proto,
// flags).
type (
	lb4Key     [12]byte
	lb4Service [16]byte
	lb4Backend [8]byte
)

func (k lb4Key) vip() netip.Addr { return netip.AddrFrom4([4]byte(k[0:4])) }
func (k lb4Key) port() uint16    { return binary.BigEndian.Uint16(k[4:6]) }
func (k lb4Key) slot() uint16    { return binary.NativeEndian.Uint16(k[8:10]) }
func (v lb4Service) backendID() uint32 {
	return binary.NativeEndian.Uint32(v[0:4])
}

// TestAgentRepairsMapsChangedBehindItsBack: the running agent, re-reading
// its maps every --map-refresh-interval, puts back what was changed in
// them from outside (as with bpftool): a slot of the web Service deleted
// from sluice_services_v1, and the address of another slot's backend
// overwritten in sluice_backends_v2. The slot comes back byte for byte;
// the backend's address comes back as its entry was, byte for byte, named
// by the same slot, under a new id (the repair takes the overwritten id
// for the wrong address's, as a rebuild of the view from a dump would,
// and releases it). The agent logs the repair, and every connection to
// the VIP works again.
func TestAgentRepairsMapsChangedBehindItsBack(t *testing.T) {
	e := setup(t, "--map-refresh-interval", "2s", "--resync-interval", "1s")
	e.waitServices(t, webVIP, func(l string) bool { return strings.Count(l, ":8080") == 3 })
	if counts := e.spread(t, webVIP, 30); len(counts) != 3 {
		t.Fatalf("before the drift, %s answered from %v, want 3 backends", webVIP, counts)
	}

	pins := filepath.Join(e.agent.BPFFS, "sluice")
	services := openPinned(t, filepath.Join(pins, "sluice_services_v1"))
	backends := openPinned(t, filepath.Join(pins, "sluice_backends_v2"))
	before := webSlots(t, services, backends)
	if len(before) != 3 {
		t.Fatalf("%s has slots %v, want 3", webVIP, before)
	}
	// Slot 2 is deleted; slot 1's backend, another one, gets a wrong
	// address.
	deleted, changed := before[1], before[0]
	if changed.value.backendID() == deleted.value.backendID() {
		t.Fatalf("slots 1 and 2 name the same backend %d", changed.value.backendID())
	}
	wrong := changed.backend
	copy(wrong[0:4], netip.MustParseAddr("192.0.2.99").AsSlice())
	if err := services.Delete(deleted.key); err != nil {
		t.Fatalf("delete slot 2 of %s: %v", webVIP, err)
	}
	if err := backends.Put(changed.value.backendID(), wrong); err != nil {
		t.Fatalf("overwrite backend %d: %v", changed.value.backendID(), err)
	}

	testutil.Eventually(t, "the agent to put back the slot and the backend", 60*time.Second, func() error {
		var got lb4Service
		if err := services.Lookup(deleted.key, &got); err != nil {
			return fmt.Errorf("slot 2 of %s: %w", webVIP, err)
		}
		if got != deleted.value {
			return fmt.Errorf("slot 2 of %s is % x, was % x", webVIP, got, deleted.value)
		}
		if err := services.Lookup(changed.key, &got); err != nil {
			return fmt.Errorf("slot 1 of %s: %w", webVIP, err)
		}
		var b lb4Backend
		if err := backends.Lookup(got.backendID(), &b); err != nil {
			return fmt.Errorf("backend %d: %w", got.backendID(), err)
		}
		if b != changed.backend {
			return fmt.Errorf("slot 1 of %s names backend %d, % x; it was % x", webVIP, got.backendID(), b, changed.backend)
		}
		return nil
	})
	var now lb4Service
	if err := services.Lookup(changed.key, &now); err == nil {
		t.Logf("slot 1's backend, overwritten under id %d, is back under id %d", changed.value.backendID(), now.backendID())
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
	after := webSlots(t, services, backends)
	if len(after) != len(before) {
		t.Errorf("after the repair %s has slots %v, want %v", webVIP, after, before)
	}
	for i := range min(len(after), len(before)) {
		if after[i].key != before[i].key || after[i].backend != before[i].backend {
			t.Errorf("after the repair, slot %d of %s is %v, was %v", i+1, webVIP, after[i], before[i])
		}
	}
	if counts := e.spread(t, webVIP, 60); len(counts) != 3 {
		t.Errorf("after the repair, %s answered from %v, want 3 backends", webVIP, counts)
	}
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
	key     lb4Key
	value   lb4Service
	backend lb4Backend // the entry of the backend it names
}

// webSlots returns the backend slots (1..n) of webVIP's default-scope
// frontend, in slot order, with the backend entries they name.
func webSlots(t *testing.T, services, backends *ebpf.Map) []slotEntry {
	t.Helper()
	vip := netip.MustParseAddrPort(webVIP)
	var out []slotEntry
	var k lb4Key
	var v lb4Service
	it := services.Iterate()
	for it.Next(&k, &v) {
		if k.vip() == vip.Addr() && k.port() == vip.Port() && k[6] == 6 && k[7] == 0 && k.slot() > 0 {
			out = append(out, slotEntry{key: k, value: v})
		}
	}
	if err := it.Err(); err != nil {
		t.Fatalf("walk sluice_services_v1: %v", err)
	}
	slices.SortFunc(out, func(a, b slotEntry) int { return cmp.Compare(a.key.slot(), b.key.slot()) })
	for i := range out {
		if err := backends.Lookup(out[i].value.backendID(), &out[i].backend); err != nil {
			t.Fatalf("look up backend %d: %v", out[i].value.backendID(), err)
		}
	}
	return out
}
