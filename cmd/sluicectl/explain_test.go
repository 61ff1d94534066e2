package main

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/pkg/datapath"
)

// The dry runs themselves are tested in pkg/datapath (explain_test.go)
// and against a live agent in test/explain; here, explain's flags and
// its table.

func TestExplainFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"explain"}, "--device, --from and --to are required"},
		{[]string{"explain", "--device", "eth0", "--from", "10.0.0.1", "--to", "10.96.0.10:80", "--proto", "sctp"}, `--proto "sctp"`},
		{[]string{"explain", "--device", "eth0", "--from", "nope", "--to", "10.96.0.10:80"}, `--from "nope"`},
		{[]string{"explain", "--device", "eth0", "--from", "10.0.0.1", "--to", "10.96.0.10"}, `--to "10.96.0.10"`},
		{[]string{"explain", "--device", "eth0", "--from", "fd00::1", "--to", "[fd00::2]:80"}, "IPv4 addresses only"},
		{[]string{"explain", "--socket"}, "--to is required"},
		{[]string{"explain", "--socket", "--device", "eth0", "--to", "10.96.0.10:80"}, "--socket takes no --device or --egress"},
		{[]string{"explain", "--socket", "--egress", "--to", "10.96.0.10:80"}, "--socket takes no --device or --egress"},
		{[]string{"explain", "--socket", "--from", "10.0.0.1:5", "--to", "10.96.0.10:80"}, `--from "10.0.0.1:5"`},
		{[]string{"explain", "--socket", "--to", "10.96.0.10:80", "--unconnected"}, "--unconnected is a UDP socket's"},
		{[]string{"explain", "--socket", "--to", "10.96.0.10:80", "--proto", "sctp"}, `--proto "sctp"`},
		{[]string{"explain", "--device", "eth0", "--from", "10.0.0.1", "--to", "10.96.0.10:80", "--unconnected"}, "--unconnected needs --socket"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(c.args, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("%q: exit %d, stderr %q; want 2 and %q", c.args, code, stderr.String(), c.want)
		}
	}
	req, err := explainRequest("eth0", "10.0.0.1", "10.96.0.10:80", "UDP", false)
	if err != nil || req.From != netip.MustParseAddrPort("10.0.0.1:40000") || req.Proto != unix.IPPROTO_UDP {
		t.Errorf("explainRequest: %+v, %v", req, err)
	}
}

func TestExplainSocketFlags(t *testing.T) {
	req, err := socketRequest("", "10.96.0.10:53", "udp", true)
	if err != nil || req.From.IsValid() || req.To != netip.MustParseAddrPort("10.96.0.10:53") || req.Proto != unix.IPPROTO_UDP || !req.Unconnected {
		t.Errorf("socketRequest: %+v, %v", req, err)
	}
	req, err = socketRequest("10.0.0.7", "10.96.0.10:80", "TCP", false)
	if err != nil || req.From != netip.MustParseAddr("10.0.0.7") || req.Proto != unix.IPPROTO_TCP || req.Unconnected {
		t.Errorf("socketRequest with --from: %+v, %v", req, err)
	}
}

func TestExplainSocketTable(t *testing.T) {
	o := &explainOut{Program: "sluice_ingress", ProgramID: 9, Device: "eth0", Direction: "ingress", Verdict: "pass",
		Frontend: "10.96.0.10:80/TCP", Service: "default/web:http", Kind: "ClusterIP"}
	o.Scope = "default"
	e := &datapath.Explanation{Socket: true, Frontend: true, DNAT: true, AffinityHit: true,
		Backend: netip.MustParseAddrPort("10.1.1.2:8080")}
	socketOut(o, datapath.SocketExplainRequest{To: netip.MustParseAddrPort("10.96.0.10:80"), Proto: unix.IPPROTO_TCP}, e)
	o.Program = "sluice_sock_explain"
	got := explainTable(o)
	for _, want := range []string{
		"PROGRAM\tsluice_sock_explain: a dry run of connect4's selection, loaded by sluicectl\n",
		"SOCKET\tTCP socket from the route's source -> 10.96.0.10:80\n",
		"DNAT\tconnect to 10.1.1.2:8080 (the socket's destination is rewritten; no packet NAT)\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
	refused := &explainOut{Program: "sluice_sock_explain", Verdict: "reject"}
	socketOut(refused, datapath.SocketExplainRequest{To: netip.MustParseAddrPort("10.96.0.10:53"), Proto: unix.IPPROTO_UDP, Unconnected: true},
		&datapath.Explanation{Socket: true, Errno: "ECONNREFUSED"})
	got = explainTable(refused)
	for _, want := range []string{"sendmsg4 (a new unconnected socket)", "SOCKET\tUDP socket from the route's source -> 10.96.0.10:53\n", "ERRNO\tECONNREFUSED\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("refused table lacks %q:\n%s", want, got)
		}
	}
}

func TestExplainTable(t *testing.T) {
	o := &explainOut{Program: "sluice_ingress", ProgramID: 9, Device: "eth0", Direction: "ingress",
		Packet: "TCP 10.0.0.1:40000 -> 10.96.0.10:80", Frontend: "10.96.0.10:80/TCP", Service: "default/web:http", Kind: "ClusterIP",
		Scope: "default", Candidates: []candidateOut{{Slot: 1, BackendID: 3, Addr: "10.1.1.2:8080"}},
		Backend: "10.1.1.2:8080", BackendID: 3, Why: "conntrack: an existing flow keeps its backend", DNAT: "10.1.1.2:8080",
		Verdict: "pass", Reasons: []string{"tc_dnat_ct"}}
	got := explainTable(o)
	for _, want := range []string{
		"PROGRAM\tsluice_ingress (id 9), eth0 ingress\n",
		"FRONTEND\t10.96.0.10:80/TCP  default/web:http ClusterIP\n",
		"CANDIDATES\t10.1.1.2:8080 (slot 1, id 3)\n",
		"BACKEND\t10.1.1.2:8080 (id 3): conntrack: an existing flow keeps its backend\n",
		"VERDICT\tpass\n",
		"COUNTED\ttc_dnat_ct\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "SNAT") || strings.Contains(got, "REASON\t") {
		t.Errorf("table shows empty fields:\n%s", got)
	}
	none := explainTable(&explainOut{Program: "sluice_ingress", Packet: "TCP 10.0.0.1:1 -> 192.0.2.1:80", Verdict: "pass"})
	if !strings.Contains(none, "FRONTEND\tnone: not a Service frontend\n") {
		t.Errorf("no frontend:\n%s", none)
	}
}
