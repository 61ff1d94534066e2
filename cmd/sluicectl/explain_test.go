package main

import (
	"bytes"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/internal/testutil"
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
		{[]string{"explain", "--device", "eth0", "--from", "10.0.0.1", "--to", "[2001:db8:96::10]:80"}, "different families (IPv4 and IPv6)"},
		{[]string{"explain", "--device", "eth0", "--from", "2001:db8::1", "--to", "10.96.0.10:80"}, "different families (IPv4 and IPv6)"},
		{[]string{"explain", "--device", "eth0", "--from", "10.0.0.1", "--to", "[::ffff:10.96.0.10]:80"}, "is IPv4-mapped: a packet carries the IPv4 address 10.96.0.10 (or ask the socket path: --socket)"},
		{[]string{"explain", "--device", "eth0", "--from", "2001:db8::1", "--to", "[2001:db8:96::10]:70000"}, "port 70000 out of range (1-65535)"},
		{[]string{"explain", "--device", "eth0", "--from", "[2001:db8::1]:0", "--to", "[2001:db8:96::10]:0"}, `--to "[2001:db8:96::10]:0": port 0 out of range (1-65535)`},
		{[]string{"explain", "--device", "eth0", "--from", "[2001:db8::1]:65536", "--to", "[2001:db8:96::10]:80"}, "port 65536 out of range (0-65535)"},
		{[]string{"explain", "--device", "eth0", "--from", "2001:db8::1", "--to", "[2001:db8:96::10]:http"}, `port "http" is not a number`},
		{[]string{"explain", "--device", "eth0", "--from", "2001:db8::1", "--to", "[2001:db8:96::zz]:80"}, `"2001:db8:96::zz" is not an IP address`},
		{[]string{"explain", "--device", "eth0", "--from", "2001:db8::1", "--to", "2001:db8:96::10"}, `--to "2001:db8:96::10": no port: want IP:PORT or [IPv6]:PORT`},
		{[]string{"explain", "--device", "eth0", "--from", "2001:db8::1:80:", "--to", "[2001:db8:96::10]:80"}, `--from "2001:db8::1:80:"`},
		{[]string{"explain", "--socket", "--from", "10.0.0.1", "--to", "[2001:db8:96::10]:80"}, "different families (IPv4 and IPv6)"},
		{[]string{"explain", "--socket", "--from", "2001:db8::1", "--to", "[::ffff:10.96.0.10]:80"}, "different families (IPv4 and IPv6)"},
		{[]string{"explain", "--socket", "--to", "[2001:db8:96::10]:65536"}, "port 65536 out of range"},
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
	for _, from := range []string{"2001:db8::1", "[2001:db8::1]:40000"} {
		req, err = explainRequest("eth0", from, "[2001:db8:96::10]:80", "tcp", false)
		if err != nil || req.From != netip.MustParseAddrPort("[2001:db8::1]:40000") || req.To != netip.MustParseAddrPort("[2001:db8:96::10]:80") {
			t.Errorf("explainRequest IPv6 from %s: %+v, %v", from, req, err)
		}
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
	req, err = socketRequest("2001:db8::7", "[2001:db8:96::10]:80", "tcp", false)
	if err != nil || req.From != netip.MustParseAddr("2001:db8::7") || req.To != netip.MustParseAddrPort("[2001:db8:96::10]:80") {
		t.Errorf("socketRequest IPv6: %+v, %v", req, err)
	}
	// An IPv4-mapped destination is connect6's, from an IPv4 source.
	req, err = socketRequest("10.0.0.7", "[::ffff:10.96.0.10]:80", "tcp", false)
	if err != nil || req.To.Addr() != netip.MustParseAddr("::ffff:10.96.0.10") {
		t.Errorf("socketRequest IPv4-mapped: %+v, %v", req, err)
	}
}

func TestExplainSocketTable(t *testing.T) {
	o := &explainOut{Program: "sluice_ingress", ProgramID: 9, Device: "eth0", Direction: "ingress", Verdict: "pass",
		Frontend: "10.96.0.10:80/TCP", Service: "default/web:http", Kind: "ClusterIP"}
	o.Scope = "default"
	e := &datapath.Explanation{Socket: true, Frontend: true, DNAT: true, AffinityHit: true,
		Backend: netip.MustParseAddrPort("10.1.1.2:8080")}
	o.Client = "other (this node, or no cluster CIDR set)"
	socketOut(o, datapath.SocketExplainRequest{To: netip.MustParseAddrPort("10.96.0.10:80"), Proto: unix.IPPROTO_TCP},
		&datapath.SocketExplanation{Explanation: e, Source: netip.MustParseAddr("10.0.0.7"), SourceFrom: datapath.SourceNodeIP, Netns: datapath.NetnsAgent})
	o.Program = "sluice_sock_explain"
	got := explainTable(o)
	testutil.ContainsAll(t, "table", got,
		"PROGRAM\tsluice_sock_explain: a dry run of connect4's selection, loaded by sluicectl\n",
		"SOCKET\tTCP socket from 10.0.0.7 (unbound: the agent's node address, as its programs judge an unbound socket) -> 10.96.0.10:80\n",
		"CLIENT\tthis node (the agent's network namespace; the socket path's client of session affinity)\n",
		"DNAT\tconnect to 10.1.1.2:8080 (the socket's destination is rewritten; no packet NAT)\n",
	)
	refused := &explainOut{Program: "sluice_sock_explain", Verdict: "reject"}
	socketOut(refused, datapath.SocketExplainRequest{To: netip.MustParseAddrPort("10.96.0.10:53"), Proto: unix.IPPROTO_UDP, Unconnected: true},
		&datapath.SocketExplanation{Explanation: &datapath.Explanation{Socket: true, Errno: "ECONNREFUSED"},
			Source: netip.MustParseAddr("10.0.0.1"), SourceFrom: datapath.SourceRoute, Netns: datapath.NetnsAny})
	got = explainTable(refused)
	testutil.ContainsAll(t, "refused table", got, "sendmsg4 (a new unconnected socket)",
		"SOCKET\tUDP socket from 10.0.0.1 (unbound: the route's source; no agent program attached to read the node's address from) -> 10.96.0.10:53\n", "ERRNO\tECONNREFUSED\n")

	// No agent program attached and no route: no source, said so, not
	// "the agent has no node address"; every namespace the node's.
	bare := &explainOut{Program: "sluice_sock_explain", Verdict: "reject", Frontend: "10.96.0.21:80/TCP", Client: "other (this node, or no cluster CIDR set)"}
	socketOut(bare, datapath.SocketExplainRequest{To: netip.MustParseAddrPort("10.96.0.21:80"), Proto: unix.IPPROTO_TCP},
		&datapath.SocketExplanation{Explanation: &datapath.Explanation{Socket: true}, SourceFrom: datapath.SourceRoute, Netns: datapath.NetnsAny})
	testutil.ContainsAll(t, "bare table", explainTable(bare),
		"SOCKET\tTCP socket from no address (unbound: no agent program attached to read the node's address from, and no route to the destination) -> 10.96.0.21:80\n",
		"CLIENT\tthis network namespace, counted as the node's (no agent's namespace known: ")

	// Asked from a pod's namespace with --socket-lb-host-netns-only: the
	// attached program's answer, not a dry run's, and the packet path
	// named.
	notServed := &explainOut{Program: "sluice_connect4", Verdict: "pass"}
	socketOut(notServed, datapath.SocketExplainRequest{To: netip.MustParseAddrPort("10.96.0.10:80"), Proto: unix.IPPROTO_TCP},
		&datapath.SocketExplanation{Explanation: &datapath.Explanation{Socket: true, NotServed: true, Program: "sluice_connect4", ProgramID: 42, Verdict: "pass", Reasons: []string{}}})
	got = explainTable(notServed)
	testutil.ContainsAll(t, "not-served table", got,
		"PROGRAM\tsluice_connect4 (id 42), the agent's connect4 program: not run\n",
		"NETNS\tnot the host's: --socket-lb-host-netns-only",
		"VERDICT\tpass (untranslated: the socket reaches 10.96.0.10:80 itself)\n",
		"sluicectl explain --device DEV --from SOURCE --to 10.96.0.10:80 (without --socket;",
	)
	if strings.Contains(got, "FRONTEND") {
		t.Errorf("not-served table names a frontend:\n%s", got)
	}

	// IPv6 sockets: connect6, and for an IPv4-mapped destination the
	// IPv4 service it reaches.
	for _, c := range []struct {
		to   string
		want []string
	}{
		{"[2001:db8:96::10]:80", []string{"a dry run of connect6's selection", "SOCKET\tTCP socket from 2001:db8::7 (--from) -> [2001:db8:96::10]:80\n", "DNAT\tconnect to [2001:db8:1::2]:8080 "}},
		{"[::ffff:10.96.0.10]:80", []string{"a dry run of connect6's selection", "-> [::ffff:10.96.0.10]:80 (IPv4-mapped: the IPv4 service 10.96.0.10:80)\n"}},
	} {
		o := &explainOut{Program: "sluice_sock_explain", Verdict: "connect to backend"}
		socketOut(o, datapath.SocketExplainRequest{To: netip.MustParseAddrPort(c.to), Proto: unix.IPPROTO_TCP},
			&datapath.SocketExplanation{Explanation: &datapath.Explanation{Socket: true, DNAT: true, Backend: netip.MustParseAddrPort("[2001:db8:1::2]:8080")},
				Source: netip.MustParseAddr("2001:db8::7"), SourceFrom: datapath.SourceGiven, Netns: datapath.NetnsAgent})
		got := explainTable(o)
		testutil.ContainsAll(t, c.to+": table", got, c.want...)
	}
}

// TestExplainSocketPodLoopback: asked from a pod's namespace, a localhost
// NodePort has no frontend (the programs serve 127.0.0.0/8 to the node's
// sockets only), and the answer says why; from the node's, nothing of it.
// The reason does not say a NodePort is there: the dry run stops before the
// lookup, so the same answer comes where none is (another port,
// --localhost-nodeports=false); before, it said localhost NodePorts serve
// the node only as if one were there. (The dry run itself: pkg/datapath
// TestSockLoopbackNodePortNodeOnly.)
func TestExplainSocketPodLoopback(t *testing.T) {
	for _, to := range []string{"127.0.0.1:30080", "[::ffff:127.0.0.1]:30080"} {
		for _, netns := range []string{datapath.NetnsOther, datapath.NetnsAgent} {
			o := &explainOut{Program: "sluice_sock_explain", Verdict: "pass"}
			socketOut(o, datapath.SocketExplainRequest{To: netip.MustParseAddrPort(to), Proto: unix.IPPROTO_TCP},
				&datapath.SocketExplanation{Explanation: &datapath.Explanation{Socket: true, Verdict: "pass"},
					Source: netip.MustParseAddr("10.0.0.7"), SourceFrom: datapath.SourceNodeIP, Netns: netns})
			got := explainTable(o)
			const want = "REASON\ta loopback destination, no frontend for a pod's socket: a localhost NodePort (--localhost-nodeports), if one is there, serves the node's sockets (the agent's network namespace) only"
			if netns == datapath.NetnsOther {
				testutil.ContainsAll(t, to+" pod table", got, want, "a pod's 127.0.0.1 is its own: the socket reaches whatever listens on "+to+" in this namespace\n")
			} else if strings.Contains(got, "REASON") {
				t.Errorf("%s from the node's namespace gives a reason:\n%s", to, got)
			}
		}
	}
}

// TestExplainSocketPodClient: run in a pod's namespace without a local
// traffic detector, the CLIENT line says a pod, not this node, beside the
// default scope it gets; with one, a pod taken for a cluster client.
// (The namespace and detector themselves: pkg/datapath
// TestSockExplainPodClient, a real pod namespace.)
func TestExplainSocketPodClient(t *testing.T) {
	for _, detector := range []bool{false, true} {
		o := &explainOut{Program: "sluice_sock_explain", Verdict: "drop", Frontend: "10.210.0.3:30080/TCP",
			Client: "other (this node, or no cluster CIDR set)", Scope: "default"}
		socketOut(o, datapath.SocketExplainRequest{To: netip.MustParseAddrPort("10.210.0.3:30080"), Proto: unix.IPPROTO_TCP},
			&datapath.SocketExplanation{Explanation: &datapath.Explanation{Socket: true, Frontend: true, Scoped: true, Errno: "EHOSTUNREACH"},
				Source: netip.MustParseAddr("10.0.0.7"), SourceFrom: datapath.SourceNodeIP, Netns: datapath.NetnsOther, Detector: detector})
		got := explainTable(o)
		want := "CLIENT\ta pod (a network namespace other than the agent's; no local traffic detector (--cluster-cidr): "
		if detector {
			want = "CLIENT\ta pod (a network namespace other than the agent's; with a local traffic detector, taken for a cluster client;"
		}
		testutil.ContainsAll(t, "pod table", got, want)
		if strings.Contains(got, "CLIENT\tthis node") {
			t.Errorf("a pod's socket (detector %v) labelled the node's:\n%s", detector, got)
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
	testutil.ContainsAll(t, "table", got,
		"PROGRAM\tsluice_ingress (id 9), eth0 ingress\n",
		"FRONTEND\t10.96.0.10:80/TCP  default/web:http ClusterIP\n",
		"CANDIDATES\t10.1.1.2:8080 (slot 1, id 3)\n",
		"BACKEND\t10.1.1.2:8080 (id 3): conntrack: an existing flow keeps its backend\n",
		"VERDICT\tpass\n",
		"COUNTED\ttc_dnat_ct\n",
	)
	if strings.Contains(got, "SNAT") || strings.Contains(got, "REASON\t") {
		t.Errorf("table shows empty fields:\n%s", got)
	}
	// A DNAT-only reply at a pod device's ingress that is passed up for
	// the client device's egress (tc_rev_at_egress) is not translated
	// here: neither its source nor, for a clash-remapped flow, its
	// destination (the client's port given back, SNAT).
	for _, c := range []struct {
		reasons []string
		snat    string
		want    []string
	}{
		{[]string{"tc_rev_nat"}, "", []string{"REPLY\tof a translated flow: source becomes 10.96.0.10:80\n"}},
		{[]string{"tc_rev_at_egress"}, "", []string{"REPLY\tof a translated flow, passed up untranslated: translated at the egress of the device its route leaves by (source becomes 10.96.0.10:80 there)\n"}},
		{[]string{"tc_rev_nat"}, "destination 10.0.0.1:40000", []string{
			"REPLY\tof a translated flow: source becomes 10.96.0.10:80\n",
			"SNAT\tdestination becomes 10.0.0.1:40000\n"}},
		{[]string{"tc_rev_at_egress"}, "destination 10.0.0.1:40000", []string{
			"REPLY\tof a translated flow, passed up untranslated: translated at the egress of the device its route leaves by (source becomes 10.96.0.10:80 there)\n",
			"SNAT\tdestination becomes 10.0.0.1:40000 there\n"}},
	} {
		reply := explainTable(&explainOut{Program: "sluice_ingress", Device: "pod0", Direction: "ingress", Packet: "TCP 10.1.1.2:8080 -> 10.0.0.1:40001",
			Reply: true, ReplyFrom: "10.96.0.10:80", SNAT: c.snat, Verdict: "pass", Reasons: c.reasons})
		testutil.ContainsAll(t, fmt.Sprintf("reply counted %v, SNAT %q", c.reasons, c.snat), reply, c.want...)
		if c.snat == "" && strings.Contains(reply, "SNAT") {
			t.Errorf("reply counted %v without SNAT shows one:\n%s", c.reasons, reply)
		}
	}
	// A TCP stray passed up to the node's stack is a pass, not a drop:
	// no REASON, its why beside the verdict.
	stray := explainTable(&explainOut{Program: "sluice_ingress", Packet: "TCP 10.0.0.1:1 -> 192.0.2.7:30080", Frontend: "192.0.2.7:30080/TCP",
		Kind: "NodePort", Verdict: "pass", Reasons: []string{"tc_tcp_stray_up"}})
	testutil.ContainsAll(t, "stray passed up", stray, "STRAY\t"+strayUp+"\n", "VERDICT\tpass\n", "COUNTED\ttc_tcp_stray_up\n")
	if strings.Contains(stray, "REASON\t") {
		t.Errorf("a stray passed up shows a drop reason:\n%s", stray)
	}
	if _, ok := dropReasons["tc_tcp_stray_up"]; ok {
		t.Errorf("tc_tcp_stray_up among the drop reasons")
	}
	none := explainTable(&explainOut{Program: "sluice_ingress", Packet: "TCP 10.0.0.1:1 -> 192.0.2.1:80", Verdict: "pass"})
	if !strings.Contains(none, "FRONTEND\tnone: not a Service frontend\n") {
		t.Errorf("no frontend:\n%s", none)
	}
}

// Every drop the tc and socket programs count by a name that says so
// (a _drop, _full or _exhausted reason) is explained.
func TestDropReasonsCoverTheDatapaths(t *testing.T) {
	for _, n := range datapath.CounterNames() {
		drop := strings.HasSuffix(n, "_drop") || strings.HasSuffix(n, "_full") || strings.HasSuffix(n, "_exhausted")
		if _, ok := dropReasons[n]; drop && !ok && (strings.HasPrefix(n, "tc_") || strings.HasPrefix(n, "sock_")) {
			t.Errorf("%s: no explanation among dropReasons", n)
		}
	}
}
