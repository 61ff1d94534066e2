package main

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/internal/namesfile"
	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/packet"
	"github.com/sluice-lb/sluice/pkg/datapath"
	"github.com/sluice-lb/sluice/pkg/health"
	"github.com/sluice-lb/sluice/pkg/metrics"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// liveArgs makes liveDatapath's pins and names file and returns the
// flags that point sluicectl at them.
func liveArgs(t *testing.T) []string {
	t.Helper()
	bpffs, names, _ := liveDatapath(t)
	return []string{"--bpffs", bpffs, "--names-file", names}
}

// liveDatapath programs two Services into pins of the test's own, writes
// their names file as the agent does, and sends two flows from
// 10.0.0.1 through the tc program (BPF_PROG_TEST_RUN): two SYNs to web's
// ClusterIP, one of them answered by the backend.
func liveDatapath(t *testing.T) (bpffs, names string, st *model.State) {
	t.Helper()
	bpffs, dp := openSmallPins(t)
	t.Cleanup(func() { dp.Close() })
	tcp := func(a string, port uint16) model.L4Addr {
		return model.L4Addr{Addr: netip.MustParseAddr(a), Port: port, Proto: model.TCP}
	}
	web, db := tcp("10.96.0.10", 80), tcp("10.96.0.20", 5432)
	st = model.NewState()
	st.Services.Set(web, &model.Service{Name: model.ServicePortName{Namespace: "default", Name: "web", Port: "http"}, Frontend: web,
		Backends: []model.Backend{{L4Addr: tcp("10.1.0.1", 8080)}, {L4Addr: tcp("10.1.0.2", 8080)}}})
	st.Services.Set(db, &model.Service{Name: model.ServicePortName{Namespace: "prod", Name: "db"}, Frontend: db,
		Backends: []model.Backend{{L4Addr: tcp("10.1.0.1", 5432)}}})
	names = programNamed(t, bpffs, dp, st)

	// node: the loopback device's MAC (all zeros), where BPF_PROG_TEST_RUN
	// receives the frame: this host's (PACKET_HOST).
	client, node := [6]byte{2, 0, 0, 0, 0, 1}, [6]byte{}
	runTC := func(prog *ebpf.Program, p packet.Packet) []byte {
		in := p.Bytes()
		opts := ebpf.RunOptions{Data: in, DataOut: make([]byte, len(in)+256)}
		if _, err := prog.Run(&opts); err != nil {
			t.Fatalf("BPF_PROG_TEST_RUN: %v", err)
		}
		return opts.DataOut
	}
	for _, sport := range []uint16{40000, 40001} {
		out := runTC(dp.TCIngress(), packet.Packet{SrcMAC: client, DstMAC: node, Src: netip.MustParseAddr("10.0.0.1"),
			Dst: web.Addr, SrcPort: sport, DstPort: 80, Proto: packet.TCP})
		if sport != 40000 {
			continue
		}
		// The backend the program chose answers the first, and its
		// client's ACK establishes it (a TCP flow answered is
		// unassured until then: bpf/lib/conntrack.h, ct_assure).
		be := netip.AddrFrom4([4]byte(out[14+16 : 14+20]))
		runTC(dp.TCEgress(), packet.Packet{SrcMAC: node, DstMAC: client, Src: be, Dst: netip.MustParseAddr("10.0.0.1"),
			SrcPort: 8080, DstPort: sport, Proto: packet.TCP, TCPFlags: packet.SYN | packet.ACK})
		runTC(dp.TCIngress(), packet.Packet{SrcMAC: client, DstMAC: node, Src: netip.MustParseAddr("10.0.0.1"),
			Dst: web.Addr, SrcPort: sport, DstPort: 80, Proto: packet.TCP, TCPFlags: packet.ACK})
	}
	return bpffs, names, st
}

func runOK(t *testing.T, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if code := run(args, &stdout, &stderr); code != 0 {
		t.Fatalf("sluicectl %q: exit %d, stderr %q", args, code, stderr.String())
	}
	return stdout.String()
}

func decode[T any](t *testing.T, s string) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("output is not the JSON it should be: %v\n%s", err, s)
	}
	return v
}

// Every command answers -o json with the rows of its table, read from live
// pins after real packets; the names come from the agent's names file.
func TestCommandsJSON(t *testing.T) {
	bpffs, names, _ := liveDatapath(t)
	base := []string{"--bpffs", bpffs, "--names-file", names}

	svcs := decode[[]ServiceRow](t, runOK(t, append(base, "services", "-o", "json")...))
	if len(svcs) != 2 || svcs[0].Frontend != "10.96.0.10:80/TCP" || svcs[0].Service != "default/web:http" || svcs[0].Count != 2 ||
		len(svcs[0].Backends) != 2 || svcs[1].Service != "prod/db" {
		t.Errorf("services -o json: %+v", svcs)
	}
	table := runOK(t, append(base, "services")...)
	if !strings.Contains(table, "10.96.0.20:5432/TCP  prod/db ") {
		t.Errorf("services table lacks db's name:\n%s", table)
	}

	bes := decode[[]BackendRow](t, runOK(t, append(base, "backends", "-o", "json")...))
	if len(bes) != 3 || bes[0].Backend != "10.1.0.1:5432/TCP" || strings.Join(bes[0].Services, ",") != "prod/db" ||
		bes[1].Backend != "10.1.0.1:8080/TCP" || strings.Join(bes[1].Frontends, ",") != "10.96.0.10:80/TCP" {
		t.Errorf("backends -o json: %+v", bes)
	}

	// Flow 40000 was answered and acknowledged: established, both
	// directions. Flow 40001 was not: new, both directions.
	cts := decode[[]ConntrackRow](t, runOK(t, append(base, "conntrack", "-o", "json")...))
	var est, half int
	for _, r := range cts {
		if r.Service != "default/web:http" || r.Proto != "TCP" || r.Expires == "expired" {
			t.Errorf("conntrack row %+v: want web's, TCP, live", r)
		}
		if r.State == "established" {
			est++
			if !strings.Contains(r.Src+r.Dst, ":40000") {
				t.Errorf("established row %+v is not the answered flow's", r)
			}
		} else {
			half++
		}
	}
	if est != 2 || half != 2 || len(cts) != 4 {
		t.Errorf("conntrack: %d established and %d new of %d, want 2, 2 of 4:\n%+v", est, half, len(cts), cts)
	}
	if cts[0].State != "established" {
		t.Errorf("established entries are not listed first: %+v", cts)
	}
	// Filters: by the client's port, by an address on the backend's
	// side, by protocol.
	if got := decode[[]ConntrackRow](t, runOK(t, append(base, "conntrack", "--port", "40001", "-o", "json")...)); len(got) != 2 || got[0].State != "new" {
		t.Errorf("conntrack --port 40001: %+v, want the two entries of the unanswered flow", got)
	}
	if got := decode[[]ConntrackRow](t, runOK(t, append(base, "conntrack", "--addr", "10.96.0.10", "--port", "80", "-o", "json")...)); len(got) != 4 {
		t.Errorf("conntrack --addr 10.96.0.10 --port 80: %d rows, want all 4", len(got))
	}
	if got := decode[[]ConntrackRow](t, runOK(t, append(base, "conntrack", "--proto", "udp", "-o", "json")...)); len(got) != 0 {
		t.Errorf("conntrack --proto udp: %+v, want none", got)
	}
	if got := decode[[]ConntrackRow](t, runOK(t, append(base, "conntrack", "--addr", "10.9.9.9", "-o", "json")...)); len(got) != 0 {
		t.Errorf("conntrack --addr 10.9.9.9: %+v, want none", got)
	}
	ct := runOK(t, append(base, "conntrack", "--port", "40000")...)
	if lines := strings.Split(strings.TrimSpace(ct), "\n"); len(lines) != 3 || !strings.HasPrefix(lines[0], "STATE ") ||
		!strings.HasPrefix(lines[1], "established  forward  TCP    10.0.0.1:40000  10.96.0.10:80") {
		t.Errorf("conntrack table:\n%s", ct)
	}

	counters := decode[[]CounterRow](t, runOK(t, append(base, "counters", "-o", "json")...))
	byReason := map[string]uint64{}
	for _, c := range counters {
		byReason[c.Reason] = c.Count
	}
	if len(counters) != len(datapath.CounterNames()) || byReason["tc_dnat_new"] != 2 || byReason["tc_rev_nat"] != 1 {
		t.Errorf("counters -o json: tc_dnat_new %d, tc_rev_nat %d (of %d), want 2, 1", byReason["tc_dnat_new"], byReason["tc_rev_nat"], len(counters))
	}

	// A names file of other pins names nothing here.
	other := filepath.Join(t.TempDir(), "other.json")
	b, err := namesfile.Of("/elsewhere", model.NewState())
	if err != nil {
		t.Fatal(err)
	}
	b = bytes.Replace(b, []byte(`"frontends":[]`), []byte(`"frontends":[{"frontend":"10.96.0.10:80/TCP","service":"x/wrong"}]`), 1)
	if err := os.WriteFile(other, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if out := runOK(t, "--bpffs", bpffs, "--names-file", other, "services"); strings.Contains(out, "wrong") {
		t.Errorf("another bpffs's names were used:\n%s", out)
	}
}

func serve(t *testing.T, h http.Handler) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String()
}

// status reports what the agent's real endpoints say (pkg/health's
// readiness, pkg/metrics's last sync and unprogrammed Services) and the
// pins' fill; with no agent answering, it says so and still counts.
func TestStatus(t *testing.T) {
	bpffs, names, st := liveDatapath(t)
	m := metrics.New()
	m.ObserveSync(time.Millisecond, nil)
	m.SetProgrammed(st)
	failures := []*reconciler.FrontendError{{Service: model.ServicePortName{Namespace: "default", Name: "big"},
		Frontend: model.L4Addr{Addr: netip.MustParseAddr("10.96.0.99"), Port: 80, Proto: model.TCP}, Err: reconciler.ErrCapacity}}
	m.SetFailures(failures)
	unprogrammed := health.NewUnprogrammed()
	unprogrammed.SetFailures(failures)
	healthAddr := serve(t, health.Handler(func() error { return nil }, unprogrammed))
	metricsAddr := serve(t, m.Handler())
	base := []string{"--bpffs", bpffs, "--names-file", names, "status", "--health-addr", healthAddr, "--metrics-addr", metricsAddr}

	s := decode[Status](t, runOK(t, append(base, "-o", "json")...))
	if !s.Agent.Reachable || !s.Agent.Ready || s.Agent.LastSync == nil || time.Since(*s.Agent.LastSync) > time.Minute ||
		s.Agent.Services == nil || *s.Agent.Services != 2 || len(s.Agent.Unprogrammed) != 1 || !strings.Contains(s.Agent.Unprogrammed[0], "default/big (capacity)") {
		t.Errorf("status agent: %+v", s.Agent)
	}
	fill := map[string]datapath.MapFill{}
	for _, f := range s.Maps {
		fill[f.Name] = f
	}
	// The unanswered flow's entries are there too, half-open (the
	// table's half-open share has room).
	if f := fill["conntrack"]; f.Entries != 4 || f.Capacity != 256 {
		t.Errorf("conntrack fill %+v, want 4 of 256 (the answered flow's two entries, the unanswered one's two)", f)
	}
	// The masters in the services map, their slots in the slots array.
	if f, sl := fill["services"], fill["slots"]; f.Entries+sl.Entries != 5 || f.Entries != 2 {
		t.Errorf("services fill %+v and slots fill %+v, want 5 entries (two masters, three slots)", f, sl)
	}
	table := runOK(t, base...)
	testutil.ContainsAll(t, "status table", table, "Agent:           ready\n", "Last sync:       ", "Frontends:       2 programmed\n",
		"Not programmed:  default/big (capacity): 1 frontends\n", "\nMAP ")
	// The map table's columns are as wide as its longest map name.
	if !regexp.MustCompile(`\nconntrack +4 +256 +1\.6%\n`).MatchString(table) {
		t.Errorf("status table lacks conntrack's 4 of 256 entries, 1.6%%:\n%s", table)
	}

	// No agent: said, and the maps are still counted.
	down := runOK(t, "--bpffs", bpffs, "status", "--health-addr", "127.0.0.1:1", "--metrics-addr", "127.0.0.1:1")
	if !strings.HasPrefix(down, "Agent:  not reachable (") || !strings.Contains(down, "\nconntrack ") {
		t.Errorf("status without an agent:\n%s", down)
	}
}

func TestUsageErrorsOfNewCommands(t *testing.T) {
	for _, args := range [][]string{
		{"services", "-o", "yaml"}, {"conntrack", "--addr", "not-an-ip"}, {"conntrack", "--proto", "sctp"},
		{"conntrack", "--port", "70000"}, {"backends", "extra"}, {"services", "--raw", "-o", "json"},
	} {
		bpffs := t.TempDir()
		var stdout, stderr bytes.Buffer
		if code := run(append([]string{"--bpffs", bpffs}, args...), &stdout, &stderr); code != 2 {
			t.Errorf("%q: exit %d, want 2 (stderr %q)", args, code, stderr.String())
		}
	}
}
