package datapath

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// TestRevNatArraysMappedWhereWritten: the reverse-NAT entries are written
// as memory into the arrays (rnmem.go), which count in the agent's RSS
// only while it writes, and only where, as the backends arrays
// (TestArraysMappedWhereWritten). While a batch of IPv4 entries is stored,
// one window of the IPv4 array is mapped and nothing of the IPv6 one;
// once the calls return, nothing of either is mapped. The entries are in
// the kernel's arrays, present; a deleted one is absent there (its
// frontend kept), and neither Dump, the read-only OpenPinned (sluicectl,
// read with batch lookups) nor the per-Service counters name it any more.
// Fails with the entries written by system calls (no store into the
// mapped array), with windows left mapped, or with an absent entry read
// as a service.
func TestRevNatArraysMappedWhereWritten(t *testing.T) {
	testutil.Privileged(t)
	bpffs := testPinDir(t)
	d := openTest(t, configWith(smallConfig, func(c *Config) {
		c.MaxServices = 100_000 // 1.6 MB of IPv4 entries, 2.4 MB of IPv6
		c.ServiceMetrics = true
	})(bpffs))
	m := d.Maps()
	if !m.rnMapped() {
		t.Fatalf("reverse-NAT arrays not mapped: %v %v", m.rn4, m.rn6)
	}
	tables := map[string]*lazyArray{"rev_nat": m.rn4.a, "rev_nat6": m.rn6.a}
	none := func(when string) {
		t.Helper()
		for name, a := range tables {
			if rss := rssOf(t, a); a.count != 0 || rss != 0 {
				t.Errorf("%s %s: %d windows mapped, %d bytes in the RSS; want none", name, when, a.count, rss)
			}
		}
	}
	none("after Open")
	stores := 0
	m.rn4.onStore = func(int) {
		if stores++; stores > 1 {
			return
		}
		if rss := rssOf(t, m.rn4.a); m.rn4.a.count != 1 || rss != m.rn4.a.mappedBytes() || rss == 0 || rss >= len(m.rn4.a.mem) {
			t.Errorf("rev_nat while stored: %d windows mapped, %d bytes in the RSS; want one window's %d", m.rn4.a.count, rss, m.rn4.a.mappedBytes())
		}
		if rss := rssOf(t, m.rn6.a); rss != 0 {
			t.Errorf("rev_nat6 while IPv4 entries are stored: %d bytes in the RSS, want none", rss)
		}
	}
	// Ids far apart (16-byte entries: 1.4 MB apart, windows 0 and 5),
	// both scopes of a frontend, and an IPv6 one.
	fe1 := reconciler.DefaultScope(vipTCP)
	fe2 := reconciler.Frontend{L4Addr: l4("10.96.0.11", 53, model.UDP), Scope: reconciler.ScopeInternal}
	fe6 := reconciler.DefaultScope(l4("2001:db8:96::10", 443, model.TCP))
	es := []reconciler.RevNatEntry{{ID: 1, Frontend: fe1}, {ID: 90_000, Frontend: fe2}, {ID: 7, Frontend: fe6}}
	if n, err := m.UpsertRevNats(es); n != len(es) || err != nil {
		t.Fatalf("UpsertRevNats = %d, %v", n, err)
	}
	if stores == 0 {
		t.Fatal("no store into the mapped reverse-NAT array")
	}
	m.rn4.onStore = nil
	none("after UpsertRevNats")
	var v sockLb4RevNat
	must(t, m.revNat.Lookup(uint32(90_000), &v))
	if want := (sockLb4RevNat{Vip: be32(fe2.Addr), Port: be16(53), Proto: uint8(model.UDP), Scope: uint8(reconciler.ScopeInternal),
		Flags: rnPresent}); v != want {
		t.Errorf("rev_nat 90000 in the kernel: %+v, want %+v", v, want)
	}
	var v6 sockLb6RevNat
	must(t, m.revNat6.Lookup(uint32(7), &v6))
	if v6.Flags != rnPresent || v6.Vip != v6addr(fe6.Addr) {
		t.Errorf("rev_nat6 7 in the kernel: %+v, want %s present", v6, fe6)
	}
	// The single-entry call too.
	fe3 := reconciler.DefaultScope(l4("10.96.0.12", 80, model.TCP))
	must(t, m.UpsertRevNat(3, fe3))
	none("after UpsertRevNat")

	revNats := func(ks *reconciler.KernelState, err error) map[reconciler.ServiceID]reconciler.Frontend {
		t.Helper()
		if err != nil {
			t.Fatalf("Dump: %v", err)
		}
		return ks.RevNat
	}
	want := map[reconciler.ServiceID]reconciler.Frontend{1: fe1, 90_000: fe2, 7: fe6, 3: fe3}
	if got := revNats(m.Dump()); !reflect.DeepEqual(got, want) {
		t.Errorf("Dump: rev_nat %v, want %v", got, want)
	}
	none("after a Dump")

	// Deleted: absent in the kernel, the frontend kept; read by none.
	if n, err := m.DeleteRevNats([]reconciler.ServiceID{90_000, 7, 12345}); n != 3 || err != nil {
		t.Fatalf("DeleteRevNats = %d, %v", n, err)
	}
	must(t, m.DeleteRevNat(3))
	none("after the deletes")
	must(t, m.revNat.Lookup(uint32(90_000), &v))
	if v.Flags != 0 || v.Vip != be32(fe2.Addr) {
		t.Errorf("deleted rev_nat 90000: %+v, want its frontend kept, absent", v)
	}
	want = map[reconciler.ServiceID]reconciler.Frontend{1: fe1}
	if got := revNats(m.Dump()); !reflect.DeepEqual(got, want) {
		t.Errorf("Dump after the deletes: rev_nat %v, want %v", got, want)
	}
	p, err := OpenPinned(bpffs)
	must(t, err)
	got := revNats(p.Dump())
	ids, err := readRevNat(p.revNat, p.revNat6)
	p.Close()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("OpenPinned's Dump after the deletes: rev_nat %v, want %v", got, want)
	}
	if err != nil || !reflect.DeepEqual(ids, map[uint32]model.L4Addr{1: fe1.L4Addr}) {
		t.Errorf("OpenPinned's service ids for the counters: %v, %v; want only 1 (%s)", ids, err, fe1)
	}
	if fill := mapFillOf(t, d, mapRevNat); fill.Entries != 1 || fill.Capacity != 100_000 {
		t.Errorf("map fill of %s: %d of %d, want 1 of 100000", mapRevNat, fill.Entries, fill.Capacity)
	}
}

// mapFillOf is d's MapFill row of the map pinned as pin.
func mapFillOf(t *testing.T, d *Datapath, pin string) MapFill {
	t.Helper()
	fills, err := d.MapFill()
	must(t, err)
	for _, f := range fills {
		if f.Pin == pin {
			return f
		}
	}
	t.Fatalf("no map fill of %s in %+v", pin, fills)
	return MapFill{}
}

// TestOpenMigratesRevNatV1: the reverse-NAT maps were hashes under their
// _v1 names (sluice_rev_nat_v1, sluice6_rev_nat_v1), of values without
// flags, and are arrays as v2. Before the upgrade, the read-only
// OpenPinned (sluicectl) reads the v1 pins; an agent started over them
// converts them (each entry under its id's index, flagged present),
// removes the v1 pins, and reads back the state it had; the ids of both
// families are in one space. Fails without the conversion (the v1 pins
// stay, the new arrays are empty) or with an entry not flagged present.
func TestOpenMigratesRevNatV1(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		testutil.Privileged(t)
		bpffs := testPinDir(t)
		cfg := smallConfig(bpffs)
		dir := filepath.Join(bpffs, "sluice")
		fe := twinL4(v6, vipTCP)
		other := reconciler.Frontend{L4Addr: twinL4(!v6, l4("10.96.3.3", 53, model.UDP)), Scope: reconciler.ScopeInternal}

		// The previous agent: a Service of the family, a frontend of
		// the other, at the top of the ids the arrays hold.
		d, err := Open(cfg)
		must(t, err)
		addService(t, d.Maps(), 1, fe, testBackend{7, twinL4(v6, l4("10.1.2.7", 8080, model.TCP))})
		top := reconciler.ServiceID(serviceSlots(cfg.withDefaults()) - 1)
		must(t, d.Maps().UpsertRevNat(top, other))
		want, err := d.Maps().Dump()
		must(t, err)
		d.Close()

		// Its reverse-NAT maps, as v1 had them.
		spec, err := loadSock()
		must(t, err)
		for _, x := range []struct{ v1, v2 string }{{"sluice_rev_nat_v1", mapRevNat}, {"sluice6_rev_nat_v1", mapRevNat6}} {
			cur, err := ebpf.LoadPinnedMap(filepath.Join(dir, x.v2), nil)
			must(t, err)
			ms := spec.Maps[x.v2].Copy()
			ms.Name, ms.Type, ms.Flags, ms.MaxEntries = x.v1, ebpf.Hash, unix.BPF_F_NO_PREALLOC, uint32(cfg.MaxServices)
			ms.ValueSize -= 4 // pad and flags
			old, err := ebpf.NewMapWithOptions(ms, ebpf.MapOptions{PinPath: dir})
			if err != nil {
				t.Fatalf("create %s: %v", x.v1, err)
			}
			k, v := make([]byte, cur.KeySize()), make([]byte, cur.ValueSize())
			for it := cur.Iterate(); it.Next(&k, &v); {
				if !presentEntry(v) {
					continue
				}
				must(t, old.Put(k, v[:len(v)-4]))
			}
			old.Close()
			cur.Close()
			must(t, os.Remove(filepath.Join(dir, x.v2)))
		}
		p, err := OpenPinned(bpffs)
		if err != nil {
			t.Fatalf("OpenPinned over v1 pins: %v", err)
		}
		got, err := p.Dump()
		p.Close()
		if err != nil || !reflect.DeepEqual(got.RevNat, want.RevNat) {
			t.Errorf("OpenPinned over v1 pins: rev_nat %v, %v; want %v", got.RevNat, err, want.RevNat)
		}

		d = openTest(t, cfg)
		for _, name := range []string{"sluice_rev_nat_v1", "sluice6_rev_nat_v1"} {
			if _, err := os.Stat(filepath.Join(dir, name)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("pin %s still there after Open: %v", name, err)
			}
		}
		m := d.Maps()
		if got, err := m.Dump(); err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("Dump after migration: %+v, %v; want %+v", got, err, want)
		}
		for id, f := range want.RevNat {
			var flags uint8
			if is6(f.Addr) {
				var v sockLb6RevNat
				must(t, m.revNat6.Lookup(uint32(id), &v))
				flags = v.Flags
			} else {
				var v sockLb4RevNat
				must(t, m.revNat.Lookup(uint32(id), &v))
				flags = v.Flags
			}
			if flags != rnPresent {
				t.Errorf("rev_nat %d (%s) after migration: flags %d, want present", id, f, flags)
			}
		}
	})
}

// TestNoProgramReadsRevNat: no BPF program uses the reverse-NAT maps (a
// reply is reverse-NATed from its flow's conntrack entry, which names the
// frontend), so that the entries without RN_F_PRESENT need no check in
// BPF. A program that starts to read them must treat an absent entry as
// a missing one, as lookup_backend does: this test is where that is
// remembered. Fails if a program references sluice_rev_nat_v2 or its
// IPv6 twin.
func TestNoProgramReadsRevNat(t *testing.T) {
	for name, load := range map[string]func() (*ebpf.CollectionSpec, error){
		"sock": loadSock, "tc": loadTc, "xdp": loadXdp, "ctgc": loadCtgc, "sockdestroy": loadSockdestroy,
		"migrate": loadMigrate, "mapcount": loadMapcount,
	} {
		spec, err := load()
		must(t, err)
		for pname, ps := range spec.Programs {
			for _, ins := range ps.Instructions {
				if ref := ins.Reference(); ins.IsLoadFromMap() && strings.Contains(ref, "rev_nat") {
					t.Errorf("%s program %s uses %s (%v)", name, pname, ref, ins)
				}
			}
		}
	}
}

// TestShrinkKeepsServiceIDs: a --max-services whose reverse-NAT arrays
// (serviceSlots) would not hold a service id in use is refused before any
// pin changes, naming the size that keeps it, even where the services
// themselves are fewer than the flag: an id beyond the smaller array
// would lose its entry (and the frontend's master names it). That size
// then opens with the state as it was. Fails if the shrink check counts
// the services only (the resize's copy then fails without naming the
// flag).
func TestShrinkKeepsServiceIDs(t *testing.T) {
	d, bpffs := newTestDatapathAt(t)
	addService(t, d.Maps(), 300, vipTCP, testBackend{1, l4("10.2.0.1", 8080, model.TCP)})
	want, err := d.Maps().Dump()
	must(t, err)
	d.Close()
	cfg := smallConfig(bpffs)
	cfg.MaxServices = 4 // arrays of 4 + 257 entries: id 300 beyond
	if d, err := Open(cfg); err == nil {
		d.Close()
		t.Fatalf("Open with --max-services=4 over service id 300 succeeded")
	} else if w := "start the agent with --max-services=44 or more"; !strings.Contains(err.Error(), w) {
		t.Errorf("Open's error\n%v\ndoes not say %q", err, w)
	}
	if got := pinnedMaxEntries(t, bpffs, mapRevNat); got != 256+257 {
		t.Errorf("after the refusal, %s has %d entries, want 513 as before", mapRevNat, got)
	}
	cfg.MaxServices = 44
	d = openTest(t, cfg)
	if got, err := d.Maps().Dump(); err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("state with --max-services=44: %+v, %v; want %+v", got, err, want)
	}
	if got := pinnedMaxEntries(t, bpffs, mapRevNat); got != 44+257 {
		t.Errorf("%s has %d entries with --max-services=44, want 301", mapRevNat, got)
	}
}
