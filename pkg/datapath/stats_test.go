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
