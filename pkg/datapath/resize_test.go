package datapath

import (
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/model"
)

// pinnedMaxEntries returns the size of the map pinned as name.
func pinnedMaxEntries(t *testing.T, bpffs, name string) uint32 {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(bpffs, "sluice", name), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	return m.MaxEntries()
}

// ctEntry is an established forward entry of a TCP flow client:cport ->
// vip:80 translated to backend, expiring in an hour.
func ctEntry(t *testing.T, client string, cport uint16, vip, backend string) (sockCt4Key, sockCt4Entry) {
	t.Helper()
	now, err := monotonicNow()
	if err != nil {
		t.Fatal(err)
	}
	k := sockCt4Key{Saddr: be32(addr(client)), Daddr: be32(addr(vip)), Sport: be16(cport), Dport: be16(80),
		Proto: uint8(model.TCP), Dir: ctForward}
	v := sockCt4Entry{Expires: now + 3600e9, Flags: ctFlagReplied, NatAddr: be32(addr(backend)), NatPort: be16(8080),
		BackendId: 1, RevNatId: 1}
	return k, v
}

// TestOpenResizesPinnedMaps (C4): an agent started with other map sizes
// than the pins were made with migrates every map to its size, keeping
// the entries (services, conntrack, source ranges, devices, ...), and
// refuses only a size too small for what a map holds, saying which map
// and what to do. Before, any other size was refused until `sluice
// cleanup` dropped all state.
func TestOpenResizesPinnedMaps(t *testing.T) {
	testutil.Privileged(t)
	bpffs := testPinDir(t)
	d := openTest(t, smallConfig(bpffs))
	fe := l4("10.96.5.1", 80, model.TCP)
	addService(t, d.Maps(), 4, fe, testBackend{3, l4("10.2.5.1", 8080, model.TCP)})
	if err := d.Maps().UpsertSourceRange(fe, netip.MustParsePrefix("192.168.0.0/16")); err != nil {
		t.Fatal(err)
	}
	want, err := d.Maps().Dump()
	if err != nil {
		t.Fatal(err)
	}
	k, v := ctEntry(t, "10.0.0.9", 40000, "10.96.5.1", "10.2.5.1")
	if err := d.Maps().conntrack.Put(&k, &v); err != nil {
		t.Fatal(err)
	}
	if err := d.Maps().setNodeDevice(7, addr("192.168.1.1"), 0); err != nil {
		t.Fatal(err)
	}
	d.Close()

	cfg := smallConfig(bpffs)
	cfg.MaxConntrack, cfg.MaxConntrackNew, cfg.MaxServices, cfg.MaxBackends = 8192, 2048, 512, 2048
	cfg.MaxServiceEntries, cfg.MaxSockRev, cfg.MaxSourceRanges, cfg.MaxDevices = 8192, 2048, 100, 16
	d2, err := Open(cfg)
	if err != nil {
		t.Fatalf("Open with other sizes: %v", err)
	}
	defer d2.Close()
	for name, n := range cfg.withDefaults().maxEntries() {
		if got := pinnedMaxEntries(t, bpffs, name); got != uint32(n) {
			t.Errorf("pinned %s has %d entries, configured %d", name, got, n)
		}
	}
	got, err := d2.Maps().Dump()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("state after the resize\n got %+v\nwant %+v", got, want)
	}
	var gotV sockCt4Entry
	if err := d2.Maps().conntrack.Lookup(&k, &gotV); err != nil || gotV != v {
		t.Errorf("conntrack entry after the resize: %+v, %v; want %+v", gotV, err, v)
	}
	var dev sockNodeDev
	if err := d2.Maps().devices.Lookup(uint32(7), &dev); err != nil {
		t.Errorf("node device after the resize: %v", err)
	}
	// No pin of the migration is left behind.
	entries, _ := os.ReadDir(filepath.Join(bpffs, "sluice"))
	for _, e := range entries {
		if strings.Contains(e.Name(), "resizing") {
			t.Errorf("stray pin %s", e.Name())
		}
	}
	d2.Close()

	// Too small for what it holds: refused, naming the map and sizes,
	// and the pins are left as they were.
	cfg.MaxDevices = 1
	seedDevices(t, bpffs, 2)
	d3, err := Open(cfg)
	if err == nil {
		d3.Close()
		t.Fatal("Open shrinking sluice_devices below its entries succeeded")
	}
	if msg := err.Error(); !strings.Contains(msg, mapDevices) || !strings.Contains(msg, "from 16 to 1") || !strings.Contains(msg, "too small") {
		t.Errorf("error does not say which map, the sizes and why: %v", err)
	}
	if n := pinnedMaxEntries(t, bpffs, mapDevices); n != 16 {
		t.Errorf("a refused resize left %s with %d entries, want the 16 it had", mapDevices, n)
	}
}

// seedDevices puts n entries into the pinned sluice_devices.
func seedDevices(t *testing.T, bpffs string, n int) {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(bpffs, "sluice", mapDevices), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for i := range n {
		if err := m.Put(uint32(100+i), &sockNodeDev{}); err != nil {
			t.Fatal(err)
		}
	}
}
