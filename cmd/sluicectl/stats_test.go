package main

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/internal/testutil/packet"
	"github.com/sluice-lb/sluice/pkg/datapath"
	"github.com/sluice-lb/sluice/pkg/model"
)

// `services --stats` shows the per-Service counters of live pins, after
// packets through the real tc program of an agent's datapath opened with
// --service-metrics.
func TestServicesStats(t *testing.T) {
	bpffs, dp := openSmallPins(t, func(c *datapath.Config) { c.ServiceMetrics = true })
	t.Cleanup(func() { dp.Close() })
	tcp := func(a string, port uint16) model.L4Addr {
		return model.L4Addr{Addr: netip.MustParseAddr(a), Port: port, Proto: model.TCP}
	}
	web, empty := tcp("10.96.0.10", 80), tcp("10.96.0.30", 80)
	st := model.NewState()
	st.Services.Set(web, &model.Service{Name: model.ServicePortName{Namespace: "default", Name: "web", Port: "http"}, Frontend: web,
		Backends: []model.Backend{{L4Addr: tcp("10.1.0.1", 8080)}}})
	st.Services.Set(empty, &model.Service{Name: model.ServicePortName{Namespace: "default", Name: "empty"}, Frontend: empty})
	names := programNamed(t, bpffs, dp, st)
	// node: the loopback device's MAC (all zeros), where BPF_PROG_TEST_RUN
	// receives the frame: this host's (PACKET_HOST).
	client, node := [6]byte{2, 0, 0, 0, 0, 1}, [6]byte{}
	syn := func(dst model.L4Addr, sport uint16) {
		in := packet.Packet{SrcMAC: client, DstMAC: node, Src: netip.MustParseAddr("10.0.0.1"),
			Dst: dst.Addr, SrcPort: sport, DstPort: dst.Port, Proto: packet.TCP}.Bytes()
		opts := ebpf.RunOptions{Data: in, DataOut: make([]byte, len(in)+256)}
		if _, err := dp.TCIngress().Run(&opts); err != nil {
			t.Fatalf("BPF_PROG_TEST_RUN: %v", err)
		}
	}
	syn(web, 40000)
	syn(web, 40000) // the same flow again
	syn(web, 40001)
	syn(empty, 40002) // rejected: no endpoints

	base := []string{"--bpffs", bpffs, "--names-file", names}
	rows := decode[[]ServiceRow](t, runOK(t, append(base, "services", "--stats", "-o", "json")...))
	if len(rows) != 2 {
		t.Fatalf("services --stats -o json: %+v", rows)
	}
	w, e := rows[0].Stats, rows[1].Stats
	if w == nil || e == nil {
		t.Fatalf("rows without stats: %+v", rows)
	}
	if w.NewFlows != 2 || w.Packets != 3 || w.Bytes != 3*40 {
		t.Errorf("web's stats %+v, want 2 new flows, 3 packets of 40 bytes", w)
	}
	if e.Drops["no_endpoints"] != 1 || e.NewFlows != 0 {
		t.Errorf("empty's stats %+v, want one no_endpoints drop", e)
	}
	table := runOK(t, append(base, "services", "--stats")...)
	lines := strings.Split(strings.TrimSpace(table), "\n")
	if len(lines) != 3 || strings.Join(strings.Fields(lines[0]), " ") != "FRONTEND SERVICE ID COUNT FLOWS PACKETS BYTES DROPS BACKENDS" {
		t.Fatalf("services --stats:\n%s", table)
	}
	if f := strings.Fields(lines[1]); len(f) < 8 || f[1] != "default/web:http" || f[4] != "2" || f[5] != "3" || f[6] != "120" || f[7] != "0" {
		t.Errorf("web's line %q: want 2 flows, 3 packets, 120 bytes, 0 drops", lines[1])
	}
	if f := strings.Fields(lines[2]); len(f) < 8 || f[1] != "default/empty" || f[7] != "1" {
		t.Errorf("empty's line %q: want 1 drop", lines[2])
	}
	// Without --stats the table is as it was.
	if plain := runOK(t, append(base, "services")...); strings.Contains(plain, "FLOWS") {
		t.Errorf("services without --stats shows counters:\n%s", plain)
	}
}
