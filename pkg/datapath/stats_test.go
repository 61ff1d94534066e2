package datapath

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/model"
)

func TestShortMapName(t *testing.T) {
	for pin, want := range map[string]string{
		"sluice_conntrack_v2": "conntrack", "sluice_ct_new_v1": "ct_new", "sluice_ct_gc": "ct_gc",
		"sluice_services_v12": "services", "sluice_udp_stick_v1": "udp_stick", "sluice_vx": "vx",
		"sluice6_services_v1": "services6", "sluice6_aff_fix_v1": "aff_fix6",
	} {
		if got := shortMapName(pin); got != want {
			t.Errorf("shortMapName(%q) = %q, want %q", pin, got, want)
		}
	}
}

// MapFill counts every hash-like map the programs share, whatever its
// type (hash, LRU, LPM trie), by the kernel's count where it has one
// (Features.MapCount) or by walking it: the counts are what was written.
func TestMapFill(t *testing.T) {
	forMapCountMethods(t, testMapFill)
}

// forMapCountMethods runs test with the kernel's element counts, where
// this kernel has them, and with the walk an older kernel gets.
func forMapCountMethods(t *testing.T, test func(t *testing.T)) {
	for _, kernel := range []bool{true, false} {
		t.Run(map[bool]string{true: "kernel_count", false: "walk"}[kernel], func(t *testing.T) {
			if kernel && haveMapCount() != nil {
				t.Skipf("no bpf_map_sum_elem_count here: %v", haveMapCount())
			}
			if !kernel {
				override(t, &haveMapCount, func() error { return ebpf.ErrNotSupported })
			}
			test(t)
		})
	}
}

func testMapFill(t *testing.T) {
	d := newTestDatapath(t)
	if d.Features().MapCount != (haveMapCount() == nil) {
		t.Fatalf("Features().MapCount = %v with the kfunc probe answering %v", d.Features().MapCount, haveMapCount())
	}
	lb := l4("192.168.1.200", 80, model.TCP)
	st := model.NewState()
	st.Services.Set(lb, &model.Service{Kind: model.LoadBalancer, Frontend: lb,
		Backends:     []model.Backend{{L4Addr: beTCP.addr}, {L4Addr: beUDP.addr}},
		SourceRanges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24"), netip.MustParsePrefix("10.0.1.0/24")}})
	st.Services.Set(vipTCP, clusterIP(vipTCP, beTCP.addr))
	applyServices(t, d, st.Services.Get(lb), st.Services.Get(vipTCP))

	fill, err := d.MapFill()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]MapFill{}
	for _, f := range fill {
		got[f.Name] = f
	}
	cfg := smallConfig("")
	for name, want := range map[string][2]int{
		"services":   {2, cfg.MaxServices},       // two masters, one per service id
		"slots":      {3, cfg.MaxServiceEntries}, // their three slots, of the bound of masters and slots
		"backends":   {2, cfg.MaxBackends},
		"rev_nat":    {2, cfg.MaxServices},
		"src_ranges": {2, -1},
		"conntrack":  {0, cfg.MaxConntrack},
		"ct_new":     {0, cfg.MaxConntrackNew},
		"sock_rev":   {0, cfg.MaxSockRev},
		"udp_stick":  {0, cfg.MaxSockRev},
	} {
		f, ok := got[name]
		if !ok {
			t.Errorf("no fill for map %s; have %v", name, fill)
			continue
		}
		if f.Entries != want[0] || want[1] >= 0 && f.Capacity != want[1] {
			t.Errorf("%s (%s, %s): %d of %d entries, want %d of %d", name, f.Pin, f.Type, f.Entries, f.Capacity, want[0], want[1])
		}
	}
	if _, ok := got["metrics"]; ok {
		t.Error("the per-CPU counter array has a fill; arrays are always full")
	}
}

// TestMapCountAgreesWithWalk: the kernel's element counts are the number
// of entries a walk finds, through what changes them: inserts, deletes,
// replacing an entry, and an LRU map evicting when full.
func TestMapCountAgreesWithWalk(t *testing.T) {
	testutil.Privileged(t)
	if err := haveMapCount(); err != nil {
		t.Skipf("no bpf_map_sum_elem_count here: %v", err)
	}
	d := newTestDatapath(t)
	if d.counter == nil {
		t.Fatal("the kfunc is here but no map counter was loaded")
	}
	check := func(step string, m *ebpf.Map, want int) {
		t.Helper()
		counts, err := d.counter.counts()
		if err != nil {
			t.Fatal(err)
		}
		info, err := m.Info()
		if err != nil {
			t.Fatal(err)
		}
		got, err := countFrom(m, info, counts)
		if err != nil {
			t.Fatal(err)
		}
		walked, err := countEntries(m)
		if err != nil {
			t.Fatal(err)
		}
		if got != walked || want >= 0 && got != want {
			t.Errorf("%s: %s counts %d, a walk finds %d (want %d)", step, m, got, walked, want)
		}
	}
	ct, ctNew := d.maps.conntrack, d.maps.ctNew // a hash and an LRU hash
	if ct.Type() != ebpf.Hash || ctNew.Type() != ebpf.LRUHash {
		t.Fatalf("conntrack is %s and ct_new %s; the test wants a hash and an LRU hash", ct.Type(), ctNew.Type())
	}
	key := func(i int) sockCt4Key {
		return sockCt4Key{Saddr: uint32(i), Daddr: 1, Sport: uint16(i), Dport: 80, Proto: uint8(model.TCP)}
	}
	for _, m := range []*ebpf.Map{ct, ctNew} {
		check("empty", m, 0)
	}
	for i := range 1000 {
		if err := ct.Put(key(i), sockCt4Entry{Expires: 1}); err != nil {
			t.Fatal(err)
		}
	}
	check("1000 inserted", ct, 1000)
	for i := range 100 {
		if err := ct.Put(key(i), sockCt4Entry{Expires: 2}); err != nil { // replaced
			t.Fatal(err)
		}
		if err := ct.Delete(key(500 + i)); err != nil {
			t.Fatal(err)
		}
	}
	check("100 replaced, 100 deleted", ct, 900)

	// An LRU hash evicts to take an insert when full: its count stays
	// what it holds.
	for i := range 2 * int(ctNew.MaxEntries()) {
		if err := ctNew.Put(key(i), sockCt4Entry{Expires: 1}); err != nil {
			t.Fatal(err)
		}
	}
	check("LRU filled twice over", ctNew, -1)
}

// TestMapMemory: MapFill reports each map's memory as the kernel
// estimates it: the service maps, which allocate as they grow, hold more
// after Services are programmed, in proportion to them; conntrack and the
// backends arrays, which are preallocated, hold their capacity's worth
// from the start. The test logs what one Service and one backend cost
// (README's figures: 1,000
// Services of 10 endpoints each), over IPv4, then over IPv6 in the
// sluice6_* maps (MapFill's services6, rev_nat6, backends6), the other
// family's maps unchanged.
func TestMapMemory(t *testing.T) {
	forFamilies(t, testMapMemory)
}

// mapBytes is the memory d's maps hold (MapFill's Bytes), by key's name
// of each map.
func mapBytes(t *testing.T, d *Datapath, key func(MapFill) string) map[string]uint64 {
	t.Helper()
	fill, err := d.MapFill()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, f := range fill {
		out[key(f)] = f.Bytes
	}
	return out
}

func testMapMemory(t *testing.T, v6 bool) {
	testutil.Privileged(t)
	d := openTest(t, Config{BPFFS: testPinDir(t), DeferDryRun: true})
	bytes := func() map[string]uint64 {
		t.Helper()
		return mapBytes(t, d, func(f MapFill) string { return f.Name })
	}
	// The family's maps by their MapFill names, and the other's.
	fam, other := "", "6"
	if v6 {
		fam, other = other, fam
	}
	before := bytes()
	if before["conntrack"+fam] == 0 || before["services"+fam] == 0 {
		t.Fatalf("no memory reported: %v", before)
	}
	const services, endpoints = 1000, 10
	var svcs []*model.Service
	for i := range services {
		fe := netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})
		var bes []model.L4Addr
		for j := range endpoints {
			be := netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})
			bes = append(bes, l4(twinAddr(v6, be.String()), uint16(8000+j), model.TCP))
		}
		svcs = append(svcs, clusterIP(l4(twinAddr(v6, fe.String()), 80, model.TCP), bes...))
	}
	applyServices(t, d, svcs...)
	after := bytes()
	for _, name := range []string{"conntrack" + fam, "backends" + fam, "services" + other, "rev_nat" + other, "backends" + other} {
		if after[name] != before[name] {
			t.Errorf("%s went from %d to %d bytes with no flow and no Service of its family", name, before[name], after[name])
		}
	}
	grew := func(name string) float64 {
		if after[name] <= before[name] {
			t.Errorf("%s held %d bytes before %d Services, %d after: it allocates as it grows", name, before[name], services, after[name])
		}
		return float64(after[name] - before[name])
	}
	// A Service port: a master and one slot per endpoint in services, its
	// reverse-NAT entry; a backend: its entry in backends, preallocated
	// for every id.
	perService := (grew("services"+fam) + grew("rev_nat"+fam)) / services
	slots := backendSlots(Config{}.withDefaults())
	t.Logf("per Service of %d endpoints: %.0f bytes (services%s, rev_nat%s); backends%s %.1f MiB preallocated (%d entries of %d bytes); conntrack%s %d MiB preallocated (%d entries)",
		endpoints, perService, fam, fam, fam, float64(after["backends"+fam])/(1<<20), slots, after["backends"+fam]/uint64(slots), fam, after["conntrack"+fam]>>20, DefaultMaxConntrack)
}

// BenchmarkCountFullConntrack counts a full sluice_conntrack of the
// default size (262144 entries), as a scrape of sluice_bpf_map_entries does.
func BenchmarkCountFullConntrack(b *testing.B) {
	cfg := smallConfig(testPinDir(b))
	cfg.MaxConntrack = DefaultMaxConntrack
	d := openTest(b, cfg)
	m := d.maps.conntrack
	const batch = 4096
	keys := make([]sockCt4Key, batch)
	vals := make([]sockCt4Entry, batch)
	for i := 0; i < DefaultMaxConntrack; i += batch {
		for j := range keys {
			n := uint32(i + j)
			keys[j] = sockCt4Key{Saddr: n, Daddr: 1, Sport: uint16(n), Dport: 80, Proto: uint8(model.TCP)}
			vals[j] = sockCt4Entry{Expires: 1 << 62}
		}
		if _, err := m.BatchUpdate(keys, vals, nil); err != nil {
			b.Fatal(err)
		}
	}
	info, err := m.Info()
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for _, kernel := range []bool{false, true} {
		b.Run(map[bool]string{true: "kernel_count", false: "walk"}[kernel], func(b *testing.B) {
			if kernel && d.counter == nil {
				b.Skip("no bpf_map_sum_elem_count here")
			}
			for b.Loop() {
				var counts map[ebpf.MapID]int
				if kernel {
					var err error
					if counts, err = d.counter.counts(); err != nil {
						b.Fatal(err)
					}
				}
				n, err := countFrom(m, info, counts)
				if err != nil || n != DefaultMaxConntrack {
					b.Fatalf("counted %d (%v), want %d", n, err, DefaultMaxConntrack)
				}
			}
		})
	}
}

// BenchmarkMapFillEmpty counts every map of a datapath of the default
// sizes holding nothing: the floor of a scrape's cost.
func BenchmarkMapFillEmpty(b *testing.B) {
	for _, kernel := range []bool{false, true} {
		b.Run(map[bool]string{true: "kernel_count", false: "walk"}[kernel], func(b *testing.B) {
			if kernel && haveMapCount() != nil {
				b.Skip("no bpf_map_sum_elem_count here")
			}
			if !kernel {
				override(b, &haveMapCount, func() error { return ebpf.ErrNotSupported })
			}
			d := openTest(b, Config{BPFFS: testPinDir(b)})
			for b.Loop() {
				if _, err := d.MapFill(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestConntrackEntries: the agent's poll of the conntrack table's fill
// counts expired entries too (the GC has not deleted them: they take room
// all the same), by the kernel's count, with the table's size; the fuller
// family's.
func TestConntrackEntries(t *testing.T) {
	testutil.Privileged(t)
	if err := haveMapCount(); err != nil {
		t.Skipf("no bpf_map_sum_elem_count here: %v", err)
	}
	d := newTestDatapath(t)
	for i := range 300 {
		k := sockCt4Key{Saddr: uint32(i), Daddr: 1, Sport: uint16(i), Dport: 80, Proto: uint8(model.TCP)}
		if err := d.maps.conntrack.Put(k, sockCt4Entry{Expires: 1}); err != nil { // long expired
			t.Fatal(err)
		}
	}
	n, size, err := d.ConntrackEntries()
	if err != nil {
		t.Fatal(err)
	}
	if want := smallConfig("").MaxConntrack; n != 300 || size != want {
		t.Errorf("ConntrackEntries() = %d of %d, want 300 of %d", n, size, want)
	}
}
