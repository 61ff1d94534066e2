package datapath

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// Per-Service counters (svcstats.go, bpf/lib/svcstats.h), through
// BPF_PROG_TEST_RUN with the maps seeded by the reconciler. The socket
// path's counting is shown end to end (test/e2e's service metrics test).

// statsOf returns the counters of fe in stats, failing t if it is absent.
func statsOf(t *testing.T, stats []ServiceStats, fe model.L4Addr) ServiceStats {
	t.Helper()
	for _, s := range stats {
		if s.Frontend == fe {
			return s
		}
	}
	t.Fatalf("no counters for %s in %+v", fe, stats)
	return ServiceStats{}
}

func TestServiceStatsTC(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		a := twinOf(v6)
		vipTCP, vipUDP, vipEmpty := twinL4(v6, vipTCP), twinL4(v6, vipUDP), twinL4(v6, vipEmpty)
		beTCP, beUDP := twinL4(v6, beTCP.addr), twinL4(v6, beUDP.addr)
		testutil.Privileged(t)
		cfg := smallConfig(testPinDir(t))
		cfg.ServiceMetrics = true
		d := openTest(t, cfg)
		if got, want := d.maps.svcStats.MaxEntries(), uint32(cfg.MaxServices+reconciler.ServiceIDQuarantine+1); got != want {
			t.Errorf("sluice_svc_stats has %d entries, want %d", got, want)
		}
		applyServices(t, d, clusterIP(vipTCP, beTCP), clusterIP(vipUDP, beUDP), clusterIP(vipEmpty))

		syn := tcpSYN(a("10.0.0.1"), 40000, a("10.96.0.10"), 80)
		dgram := udpDgram(a("10.0.0.1"), 5300, a("10.96.0.11"), 53)
		for _, c := range []struct {
			name    string
			in      []byte
			verdict uint32
		}{
			{"tcp new flow", syn.Bytes(), tcActOK},
			{"tcp same flow", syn.Bytes(), tcActOK},
			{"tcp second flow", tcpSYN(a("10.0.0.1"), 40001, a("10.96.0.10"), 80).Bytes(), tcActOK},
			{"udp new flow", dgram.Bytes(), tcActOK},
			{"rejected: no endpoints", tcpSYN(a("10.0.0.1"), 40002, a("10.96.0.12"), 80).Bytes(), tcActRedirect},
			{"reply: not counted", tcpSYN(a("10.1.0.1"), 8080, a("10.0.0.1"), 40000).Bytes(), tcActOK},
		} {
			if v, _ := runProg(t, d.TCIngress(), c.in); v != c.verdict {
				t.Fatalf("%s: verdict %d, want %d", c.name, v, c.verdict)
			}
		}

		stats, err := d.Maps().ServiceStats()
		if err != nil {
			t.Fatal(err)
		}
		if len(stats) != 3 {
			t.Errorf("%d frontends counted, want 3: %+v", len(stats), stats)
		}
		// The IPv4 total length (IPv6: 40 and the payload length): the
		// frame without its Ethernet header.
		synLen, dgramLen := uint64(len(syn.Bytes())-14), uint64(len(dgram.Bytes())-14)
		tcp := statsOf(t, stats, vipTCP)
		if tcp.NewFlows != 2 || tcp.Packets != 3 || tcp.Bytes != 3*synLen {
			t.Errorf("%s: new flows %d, packets %d, bytes %d; want 2, 3, %d", vipTCP, tcp.NewFlows, tcp.Packets, tcp.Bytes, 3*synLen)
		}
		udp := statsOf(t, stats, vipUDP)
		if udp.NewFlows != 1 || udp.Packets != 1 || udp.Bytes != dgramLen {
			t.Errorf("%s: new flows %d, packets %d, bytes %d; want 1, 1, %d", vipUDP, udp.NewFlows, udp.Packets, udp.Bytes, dgramLen)
		}
		empty := statsOf(t, stats, vipEmpty)
		if empty.DropsByReason()["no_endpoints"] != 1 || empty.NewFlows != 0 || empty.Packets != 0 {
			t.Errorf("%s: %+v, want one no_endpoints drop and nothing else", vipEmpty, empty)
		}
		for _, s := range stats {
			if len(s.Drops) != len(ServiceDropReasons()) {
				t.Errorf("%s: drops %v, want every reason of %v", s.Frontend, s.Drops, ServiceDropReasons())
			}
			if s.Frontend != vipEmpty {
				for r, n := range s.DropsByReason() {
					if n != 0 {
						t.Errorf("%s: %d drops %s, want none", s.Frontend, n, r)
					}
				}
			}
		}

		// A released id handed to another frontend starts from zero: the
		// reconciler resets it at allocation (TestServiceStatsResetAtAllocation
		// shows when); here the datapath's reset itself.
		if err := d.Maps().ResetServiceStats(reconciler.ServiceID(tcpIDOf(t, d, vipTCP))); err != nil {
			t.Fatal(err)
		}
		stats, err = d.Maps().ServiceStats()
		if err != nil {
			t.Fatal(err)
		}
		if tcp := statsOf(t, stats, vipTCP); tcp.NewFlows != 0 || tcp.Packets != 0 || tcp.Bytes != 0 {
			t.Errorf("after the reset: %+v, want zeros", tcp)
		}
		if udp := statsOf(t, stats, vipUDP); udp.Packets != 1 {
			t.Errorf("the reset of another id changed %s: %+v", vipUDP, udp)
		}
	})
}

// tcpIDOf returns the service id of fe's default scope.
func tcpIDOf(t *testing.T, d *Datapath, fe model.L4Addr) uint32 {
	t.Helper()
	ks := mustDump(t, d.Maps())
	m, ok := ks.Masters[reconciler.DefaultScope(fe)]
	if !ok {
		t.Fatalf("no master for %s", fe)
	}
	return uint32(m.ID)
}

// TestServiceStatsOff: without --service-metrics the programs count
// nothing (the verifier pruned the counting) and the array has one entry.
func TestServiceStatsOff(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		a := twinOf(v6)
		vipTCP, vipEmpty, beTCP := twinL4(v6, vipTCP), twinL4(v6, vipEmpty), twinL4(v6, beTCP.addr)
		d := newTestDatapath(t)
		if n := d.maps.svcStats.MaxEntries(); n != 1 {
			t.Errorf("sluice_svc_stats has %d entries with --service-metrics off, want 1", n)
		}
		applyServices(t, d, clusterIP(vipTCP, beTCP), clusterIP(vipEmpty))
		runProg(t, d.TCIngress(), tcpSYN(a("10.0.0.1"), 40000, a("10.96.0.10"), 80).Bytes())
		runProg(t, d.TCIngress(), tcpSYN(a("10.0.0.1"), 40002, a("10.96.0.12"), 80).Bytes())
		expectCounted(t, d, "tc_dnat_new", "tc_no_backend")
		stats, err := d.Maps().ServiceStats()
		if err != nil {
			t.Fatal(err)
		}
		if len(stats) != 2 {
			t.Errorf("%d frontends listed, want 2", len(stats))
		}
		for _, s := range stats {
			if s.NewFlows != 0 || s.Packets != 0 || s.Bytes != 0 {
				t.Errorf("%s counted with --service-metrics off: %+v", s.Frontend, s)
			}
			for r, n := range s.DropsByReason() {
				if n != 0 {
					t.Errorf("%s: %d drops %s with --service-metrics off", s.Frontend, n, r)
				}
			}
		}
	})
}

// TestServiceStatsResize: turning --service-metrics on over pins made
// without it resizes the array (migrate.go) and counting starts.
func TestServiceStatsResize(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		a := twinOf(v6)
		vipTCP, beTCP := twinL4(v6, vipTCP), twinL4(v6, beTCP.addr)
		testutil.Privileged(t)
		dir := testPinDir(t)
		cfg := smallConfig(dir)
		d, err := Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		d.Close()
		cfg.ServiceMetrics = true
		d = openTest(t, cfg)
		pinned, err := ebpf.LoadPinnedMap(dir+"/sluice/"+mapSvcStats, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer pinned.Close()
		if got, want := pinned.MaxEntries(), uint32(svcStatsSize(cfg.withDefaults())); got != want {
			t.Errorf("pinned sluice_svc_stats has %d entries, want %d", got, want)
		}
		applyServices(t, d, clusterIP(vipTCP, beTCP))
		runProg(t, d.TCIngress(), tcpSYN(a("10.0.0.1"), 40000, a("10.96.0.10"), 80).Bytes())
		stats, err := d.Maps().ServiceStats()
		if err != nil {
			t.Fatal(err)
		}
		if s := statsOf(t, stats, vipTCP); s.NewFlows != 1 {
			t.Errorf("%s after the resize: %+v, want one new flow", vipTCP, s)
		}
	})
}

// BenchmarkServiceStatsRead30k is the kernel side of a scrape with
// --service-metrics at 30,000 frontends: the rev-NAT map and the per-CPU
// counters read with batch lookups and summed (pkg/metrics'
// BenchmarkServiceScrape30k is the rest: the series and the exposition
// format).
//
//	SLUICE_PRIVILEGED_TESTS=1 go test -run '^$' -bench ServiceStatsRead30k ./pkg/datapath
func BenchmarkServiceStatsRead30k(b *testing.B) {
	testutil.Privileged(b)
	const n = 30000
	cfg := smallConfig(testPinDir(b))
	cfg.MaxServices = 32768
	cfg.ServiceMetrics = true
	d := openTest(b, cfg)
	m := d.Maps()
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		b.Fatal(err)
	}
	v := make([]sockSvcStats, cpus)
	for i := range v {
		v[i] = sockSvcStats{NewFlows: 1, Packets: 10, Bytes: 1000, Drops: [8]uint64{1}}
	}
	for i := 1; i <= n; i++ {
		fe := model.L4Addr{Addr: addrFromBE32(uint32(i)), Port: 80, Proto: model.TCP}
		if err := m.UpsertRevNat(reconciler.ServiceID(i), reconciler.DefaultScope(fe)); err != nil {
			b.Fatal(err)
		}
		if err := m.svcStats.Put(uint32(i), v); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		stats, err := m.ServiceStats()
		if err != nil {
			b.Fatal(err)
		}
		if len(stats) != n || stats[0].Packets != uint64(10*cpus) {
			b.Fatalf("read %d frontends, the first %+v", len(stats), stats[0])
		}
	}
}

// TestServiceStatsLoadsWithEveryOption: the programs of both families,
// counting, pass the verifier with every per-node option that adds paths
// on (masquerade, cluster and service CIDRs of both families, XDP), as
// they do counting nothing. Counting
// nothing, the counting is gone from the programs the kernel runs (the
// verifier removed it as dead code: service_metrics is a constant), so
// they are shorter.
func TestServiceStatsLoadsWithEveryOption(t *testing.T) {
	testutil.Privileged(t)
	xlated := map[bool]map[string]int{}
	for _, on := range []bool{false, true} {
		cfg := xdpConfig(testPinDir(t))
		cfg.NodeIPs = []netip.Addr{addr("192.168.1.1"), addr(nsNodeIP6)}
		cfg.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), twinPrefix(true, "10.0.0.0/8")}
		cfg.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), twinPrefix(true, "10.96.0.0/16")}
		cfg.MasqueradeAll = true
		cfg.ServiceMetrics = on
		d, err := Open(cfg)
		if err != nil {
			t.Fatalf("Open with --service-metrics=%v: %v", on, err)
		}
		xlated[on] = map[string]int{}
		for name, p := range map[string]*ebpf.Program{"tc ingress": d.TCIngress(), "xdp": d.XDP(), "connect4": d.sock.Connect4,
			"tc ingress (IPv6)": d.tc.Sluice6Ingress, "xdp (IPv6)": d.xdp.Sluice6Xdp, "connect6": d.sock.Connect6} {
			info := progInfo(t, p)
			insns, err := info.Instructions()
			if err != nil {
				t.Fatal(err)
			}
			xlated[on][name] = len(insns)
		}
		d.Close()
	}
	for name, off := range xlated[false] {
		t.Logf("%s: %d instructions counting nothing, %d counting", name, off, xlated[true][name])
		if off >= xlated[true][name] {
			t.Errorf("%s: %d instructions counting nothing, not fewer than the %d counting", name, off, xlated[true][name])
		}
	}
}
