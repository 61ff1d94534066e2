package datapath

import (
	"net/netip"
	"testing"

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
// type (hash, LRU, LPM trie), by walking it: the counts are what was
// written.
func TestMapFill(t *testing.T) {
	d := newTestDatapath(t)
	lb := l4("192.168.1.200", 80, model.TCP)
	st := model.NewState()
	st.Services[lb] = &model.Service{Kind: model.LoadBalancer, Frontend: lb,
		Backends:     []model.Backend{{L4Addr: beTCP.addr}, {L4Addr: beUDP.addr}},
		SourceRanges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24"), netip.MustParsePrefix("10.0.1.0/24")}}
	st.Services[vipTCP] = clusterIP(vipTCP, beTCP.addr)
	applyServices(t, d, st.Services[lb], st.Services[vipTCP])

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
		"services":   {3 + 2, cfg.MaxServiceEntries}, // two masters, three slots
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
	b.ResetTimer()
	for b.Loop() {
		n, err := countEntries(m)
		if err != nil || n != DefaultMaxConntrack {
			b.Fatalf("counted %d (%v), want %d", n, err, DefaultMaxConntrack)
		}
	}
}

// BenchmarkMapFillEmpty counts every map of a datapath of the default
// sizes holding nothing: the floor of a scrape's cost.
func BenchmarkMapFillEmpty(b *testing.B) {
	d := openTest(b, Config{BPFFS: testPinDir(b)})
	for b.Loop() {
		if _, err := d.MapFill(); err != nil {
			b.Fatal(err)
		}
	}
}
