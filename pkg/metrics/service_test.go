package metrics

import (
	"errors"
	"fmt"
	"net/http/httptest"
	"net/netip"
	"slices"
	"testing"

	"github.com/sluice-lb/sluice/pkg/datapath"
	"github.com/sluice-lb/sluice/pkg/model"
)

// fakeServiceStats returns fixed counters.
type fakeServiceStats struct {
	stats []datapath.ServiceStats
	err   error
}

func (f *fakeServiceStats) ServiceStats() ([]datapath.ServiceStats, error) { return f.stats, f.err }

// drops returns counters by reason, given as reason, count pairs.
func drops(kv ...any) []uint64 {
	reasons := datapath.ServiceDropReasons()
	d := make([]uint64, len(reasons))
	for i := 0; i < len(kv); i += 2 {
		d[slices.Index(reasons, kv[i].(string))] = uint64(kv[i+1].(int))
	}
	return d
}

// TestServiceCountersScraped: the frontends of one Service port (its
// ClusterIP and NodePort) are added into one series, named after the
// programmed Service; a frontend no Service wants is left out. (The
// counting itself, from real traffic through a live agent: test/e2e
// TestServiceMetrics.)
func TestServiceCountersScraped(t *testing.T) {
	web := model.ServicePortName{Namespace: "shop", Name: "web", Port: "http"}
	dns := model.ServicePortName{Namespace: "kube-system", Name: "dns", Port: "dns"}
	cip, np := l4("10.96.0.10", 80), l4("192.168.1.1", 30080)
	dnsFE := model.L4Addr{Addr: netip.MustParseAddr("10.96.0.53"), Port: 53, Proto: model.UDP}
	orphan := l4("10.96.0.99", 80)
	st := model.NewState()
	st.Services.Set(cip, &model.Service{Name: web, Kind: model.ClusterIP, Frontend: cip})
	st.Services.Set(np, &model.Service{Name: web, Kind: model.NodePort, Frontend: np})
	st.Services.Set(dnsFE, &model.Service{Name: dns, Kind: model.ClusterIP, Frontend: dnsFE})

	m := New()
	src := &fakeServiceStats{stats: []datapath.ServiceStats{
		{Frontend: cip, NewFlows: 3, Packets: 10, Bytes: 1000, Drops: drops("no_endpoints", 2)},
		{Frontend: np, NewFlows: 1, Packets: 5, Bytes: 500, Drops: drops("source_range", 4)},
		{Frontend: dnsFE, NewFlows: 7, Packets: 7, Bytes: 420, Drops: drops()},
		{Frontend: orphan, NewFlows: 100, Packets: 100, Bytes: 100, Drops: drops()},
	}}
	m.SetServiceStats(src)
	if got := scrape(t, m); got[`sluice_service_packets_total{namespace="shop",port="http",protocol="TCP",service="web"}`] != 0 {
		t.Errorf("series before any programmed state: %v", got)
	}
	m.SetProgrammed(st)
	got := scrape(t, m)
	// Labels in the exposition format's order: sorted by name.
	webL := `namespace="shop",port="http",protocol="TCP",service="web"`
	dnsL := `namespace="kube-system",port="dns",protocol="UDP",service="dns"`
	webDrop := func(r string) string {
		return `sluice_service_drops_total{namespace="shop",port="http",protocol="TCP",reason="` + r + `",service="web"}`
	}
	for series, want := range map[string]float64{
		`sluice_service_new_flows_total{` + webL + `}`: 4,
		`sluice_service_packets_total{` + webL + `}`:   15,
		`sluice_service_bytes_total{` + webL + `}`:     1500,
		webDrop("no_endpoints"):                        2,
		webDrop("source_range"):                        4,
		`sluice_service_new_flows_total{` + dnsL + `}`: 7,
		`sluice_service_bytes_total{` + dnsL + `}`:     420,
	} {
		v, ok := got[series]
		if !ok {
			t.Errorf("%s missing", series)
			continue
		}
		if v != want {
			t.Errorf("%s = %v, want %v", series, v, want)
		}
	}
	n := 0
	for s := range got {
		if len(s) > len("sluice_service_") && s[:len("sluice_service_")] == "sluice_service_" && !isUnprogrammed(s) {
			n++
		}
	}
	// Two Service ports, three families each, and the two drop reasons
	// seen (no series for reasons never counted).
	if want := 2*3 + 2; n != want {
		t.Errorf("%d per-Service series, want %d (the orphan frontend left out): %v", n, want, got)
	}

	// A read that fails makes the scrape say so.
	src.err = errors.New("boom")
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code == 200 {
		t.Errorf("scrape with a failing read: %d, want an error", rec.Code)
	}
}

func isUnprogrammed(s string) bool {
	const p = "sluice_service_unprogrammed_frontends"
	return len(s) >= len(p) && s[:len(p)] == p
}

// BenchmarkServiceScrape30k is a whole /metrics scrape (every collector,
// the exposition format written) of an agent with 30,000 Services with
// --service-metrics, their counters given (the kernel read is
// pkg/datapath's BenchmarkServiceStatsRead30k).
func BenchmarkServiceScrape30k(b *testing.B) {
	const n = 30000
	st := model.NewState()
	src := &fakeServiceStats{}
	for i := range n {
		fe := model.L4Addr{Addr: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Port: 80, Proto: model.TCP}
		st.Services.Set(fe, &model.Service{Name: model.ServicePortName{Namespace: fmt.Sprintf("ns%d", i%100), Name: fmt.Sprintf("svc%d", i), Port: "http"},
			Kind: model.ClusterIP, Frontend: fe})
		src.stats = append(src.stats, datapath.ServiceStats{Frontend: fe, NewFlows: uint64(i), Packets: uint64(10 * i), Bytes: uint64(1000 * i), Drops: drops("no_endpoints", i%3)})
	}
	m := New()
	m.SetProgrammed(st)
	m.SetServiceStats(src)
	b.ReportAllocs()
	for b.Loop() {
		rec := httptest.NewRecorder()
		m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		if rec.Code != 200 {
			b.Fatalf("scrape: %d", rec.Code)
		}
		b.SetBytes(int64(rec.Body.Len()))
	}
}
