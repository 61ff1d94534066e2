package metrics

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/packet"
	"github.com/sluice-lb/sluice/pkg/datapath"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// scrape serves one /metrics request and returns its samples by series
// (name{labels} as the exposition format spells it).
func scrape(t *testing.T, m *Metrics) map[string]float64 {
	t.Helper()
	out, err := testutil.Samples(strings.NewReader(testutil.Scrape(t, m.Handler())), nil)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// openDatapath loads the datapath with small maps into a pin directory of
// the test's own (root only).
func openDatapath(t *testing.T) *datapath.Datapath {
	t.Helper()
	d, err := datapath.Open(datapath.Config{BPFFS: testutil.PinDir(t),
		MaxServices: 64, MaxBackends: 128, MaxServiceEntries: 256, MaxConntrack: 512, MaxConntrackNew: 256, MaxSockRev: 128})
	if err != nil {
		t.Fatalf("datapath.Open: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func run(t *testing.T, prog *ebpf.Program, p packet.Packet) uint32 {
	t.Helper()
	in := p.Bytes()
	opts := ebpf.RunOptions{Data: in, DataOut: make([]byte, len(in)+256)}
	ret, err := prog.Run(&opts)
	if err != nil {
		t.Fatalf("BPF_PROG_TEST_RUN: %v", err)
	}
	return ret
}

// Packets run through the loaded tc program move the counters that a
// scrape of /metrics shows by exactly what they did: three new flows to a
// Service, one packet of the first again, one to a Service without
// endpoints. The conntrack entries they made are counted in the map fill,
// and the tc ingress program's run count is the number of packets.
func TestDatapathCountersScraped(t *testing.T) {
	d := openDatapath(t)
	stats, err := datapath.EnableStats()
	if err != nil {
		t.Fatal(err)
	}
	defer stats.Close()

	tcp := func(a string, port uint16) model.L4Addr {
		return model.L4Addr{Addr: netip.MustParseAddr(a), Port: port, Proto: model.TCP}
	}
	vip, empty, be := tcp("10.96.0.10", 80), tcp("10.96.0.12", 80), tcp("10.1.0.1", 8080)
	st := model.NewState()
	st.Services.Set(vip, &model.Service{Name: model.ServicePortName{Namespace: "default", Name: "web"}, Frontend: vip,
		Backends: []model.Backend{{L4Addr: be}}})
	st.Services.Set(empty, &model.Service{Name: model.ServicePortName{Namespace: "default", Name: "empty"}, Frontend: empty})
	if err := reconciler.New(d.Maps(), nil).Apply(st); err != nil {
		t.Fatal(err)
	}

	m := New()
	m.SetDatapath(d)
	before := scrape(t, m)
	for _, series := range []string{
		`sluice_datapath_tc_total{reason="dnat_new"}`, `sluice_datapath_tc_total{reason="dnat_ct"}`,
		`sluice_datapath_tc_total{reason="no_backend"}`, `sluice_datapath_sock_total{reason="xlate"}`,
		`sluice_datapath_xdp_total{reason="fwd"}`,
		`sluice_bpf_program_runs_total{program="sluice_ingress"}`,
	} {
		if v, ok := before[series]; !ok || v != 0 {
			t.Errorf("before any packet: %s = %v (exported: %v), want 0", series, v, ok)
		}
	}
	for _, want := range []struct {
		series string
		value  float64
	}{
		{`sluice_bpf_map_entries{map="services"}`, 2}, // web's master, empty's master
		{`sluice_bpf_map_entries{map="slots"}`, 1},    // web's slot
		{`sluice_bpf_map_entries{map="backends"}`, 1},
		{`sluice_bpf_map_entries{map="rev_nat"}`, 2},
		{`sluice_bpf_map_capacity{map="conntrack"}`, 512},
		{`sluice_bpf_map_capacity{map="ct_new"}`, 256},
		{`sluice_bpf_map_entries{map="ct_new"}`, 0},
	} {
		if got, ok := before[want.series]; !ok || got != want.value {
			t.Errorf("%s = %v (exported: %v), want %v", want.series, got, ok, want.value)
		}
	}

	for _, name := range []string{"conntrack", "services", "backends"} {
		if v := before[`sluice_bpf_map_memory_bytes{map="`+name+`"}`]; v <= 0 {
			t.Errorf("sluice_bpf_map_memory_bytes{map=%q} = %v, want the kernel's estimate (> 0)", name, v)
		}
	}

	client := [6]byte{2, 0, 0, 0, 0, 1}
	// The loopback device's MAC, all zeros: BPF_PROG_TEST_RUN receives
	// the frame there, so it is this host's (PACKET_HOST), and a reject
	// is answered (a frame to another MAC is not).
	node := [6]byte{}
	syn := func(sport uint16, dst model.L4Addr) packet.Packet {
		return packet.Packet{SrcMAC: client, DstMAC: node, Src: netip.MustParseAddr("10.0.0.1"), Dst: dst.Addr,
			SrcPort: sport, DstPort: dst.Port, Proto: packet.TCP}
	}
	const tcOK, tcRedirect = 0, 7
	for _, sport := range []uint16{40000, 40001, 40002, 40000} {
		if v := run(t, d.TCIngress(), syn(sport, vip)); v != tcOK {
			t.Fatalf("SYN from port %d: verdict %d, want TC_ACT_OK", sport, v)
		}
	}
	if v := run(t, d.TCIngress(), syn(40003, empty)); v != tcRedirect {
		t.Fatalf("SYN to a Service without endpoints: verdict %d, want the ICMP reply redirected (%d)", v, tcRedirect)
	}

	after := scrape(t, m)
	for _, want := range []struct {
		series string
		delta  float64
	}{
		{`sluice_datapath_tc_total{reason="dnat_new"}`, 3},
		{`sluice_datapath_tc_total{reason="dnat_ct"}`, 1},
		{`sluice_datapath_tc_total{reason="no_backend"}`, 1},
		{`sluice_datapath_tc_total{reason="rev_nat"}`, 0},
		{`sluice_datapath_sock_total{reason="xlate"}`, 0},
		// A forward and a reverse entry per flow not answered yet, in
		// the established table's half-open share (64 flows here).
		{`sluice_bpf_map_entries{map="conntrack"}`, 6},
		{`sluice_bpf_map_entries{map="ct_new"}`, 0},
		{`sluice_bpf_program_runs_total{program="sluice_ingress"}`, 5},
		{`sluice_bpf_program_runs_total{program="sluice_egress"}`, 0},
	} {
		if got := after[want.series] - before[want.series]; got != want.delta {
			t.Errorf("%s moved by %v, want %v", want.series, got, want.delta)
		}
	}
	if s := after[`sluice_bpf_program_run_seconds_total{program="sluice_ingress"}`]; s <= 0 || s > 1 {
		t.Errorf("sluice_ingress ran 5 times in %vs, want some time under a second", s)
	}
	// Every reason of the BPF object is exported, under its path.
	for _, name := range datapath.CounterNames() {
		path, reason := counterPath(name)
		if _, ok := after["sluice_datapath_"+path+`_total{reason="`+reason+`"}`]; !ok {
			t.Errorf("counter %s not exported as sluice_datapath_%s_total{reason=%q}", name, path, reason)
		}
	}
}

func TestCounterPath(t *testing.T) {
	for name, want := range map[string][2]string{
		"tc_dnat_new": {"tc", "dnat_new"}, "sock_xlate": {"sock", "xlate"}, "xdp_fwd": {"xdp", "fwd"}, "odd": {"other", "odd"},
	} {
		if p, r := counterPath(name); p != want[0] || r != want[1] {
			t.Errorf("counterPath(%q) = %q, %q, want %q, %q", name, p, r, want[0], want[1])
		}
	}
}
