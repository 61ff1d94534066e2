package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/internal/namesfile"
	"github.com/sluice-lb/sluice/pkg/datapath"
)

// explain asks the tc program of a device what it would do with one
// packet (datapath.Explain: the program's own dry run, against the live
// maps, changing none of them), and adds what the pins and the names file
// say about the frontend it matched: its Service and the candidate
// backends of the scope that served the client. With --socket it asks the
// socket path instead (datapath.ExplainSocket: connect4's, or sendmsg4's,
// selection in a dry run) what a connect from the network namespace it
// runs in (the node's, or a pod's) would do.
//
// Both families: an IPv6 packet runs through the IPv6 program's dry twin,
// an IPv6 socket is connect6's (sendmsg6's), written [IPv6]:PORT where a
// port goes. An IPv4-mapped destination (::ffff:a.b.c.d) is a socket's
// only (connect6 reaches the IPv4 service): no packet carries one.

// explainOut is explain's answer; -o json prints it as it is.
type explainOut struct {
	Device    string `json:"device,omitempty"` // empty for --socket
	Direction string `json:"direction"`
	Program   string `json:"program"`
	ProgramID uint32 `json:"programID"`
	Packet    string `json:"packet"` // PROTO FROM -> TO
	// Frontend is empty if the destination is no frontend.
	Frontend string `json:"frontend,omitempty"` // 10.96.0.10:80/TCP
	Service  string `json:"service,omitempty"`  // namespace/name:port
	Kind     string `json:"kind,omitempty"`
	// Scope: internal (the short-circuit scope of externalTrafficPolicy
	// Local, for cluster clients) or default.
	Scope        string         `json:"scope,omitempty"`
	Client       string         `json:"client,omitempty"` // internal, external, or other
	Policies     []string       `json:"policies,omitempty"`
	Candidates   []candidateOut `json:"candidates,omitempty"`
	Backend      string         `json:"backend,omitempty"`
	BackendID    uint32         `json:"backendID,omitempty"`
	Slot         uint16         `json:"slot,omitempty"`
	Why          string         `json:"why,omitempty"`
	DNAT         string         `json:"dnat,omitempty"`
	SNAT         string         `json:"snat,omitempty"`
	Reply        bool           `json:"reply,omitempty"`
	ReplyFrom    string         `json:"replyFrom,omitempty"`
	Verdict      string         `json:"verdict"`
	Reason       string         `json:"reason,omitempty"` // why a drop or reject
	Reasons      []string       `json:"reasons"`          // every datapath reason the run would count
	Out          string         `json:"out,omitempty"`    // the packet as the program left it
	ConntrackHit bool           `json:"conntrackHit"`
	AffinityHit  bool           `json:"affinityHit"`
	// The socket path (--socket): its stickiness, and the errno a
	// refused socket gets.
	Socket    bool   `json:"socket,omitempty"`
	StickyHit bool   `json:"stickyHit,omitempty"`
	Errno     string `json:"errno,omitempty"`
	// NotServed: the agent's socket programs serve the host's network
	// namespace only (--socket-lb-host-netns-only) and this is another:
	// the socket passes untranslated, the packet path decides.
	NotServed bool `json:"notServed,omitempty"`
}

type candidateOut struct {
	Slot      uint16 `json:"slot"`
	BackendID uint32 `json:"backendID"`
	Addr      string `json:"addr"`
}

// svcFlag names of the frontend flags explain shows (bpf/lib/structs.h).
var svcFlagNames = []struct {
	bit  uint32
	name string
}{
	{1, "external"}, {2, "externalTrafficPolicy=Local"}, {4, "loadBalancerSourceRanges"},
	{16, "drop-when-no-local-endpoint"}, {32, "sessionAffinity=ClientIP"}, {64, "retired"},
}

// dropReasons are the datapath reasons that end a packet (the verdict's
// reason, shown first when present).
var dropReasons = map[string]string{
	"tc_src_range_deny":      "source outside the frontend's loadBalancerSourceRanges",
	"tc_icmp_ratelimited":    "the ICMP error it would get is over the kernel's rate limits (net.ipv4.icmp_ratelimit, net.ipv6.icmp.ratelimit, net.ipv4.icmp_msgs_per_sec): not sent, the packet dropped",
	"tc_no_backend":          "the Service has no endpoints (ICMP port unreachable, or a drop where the kernel would send none or its rate limits stop it)",
	"tc_unknown_port":        "a ClusterIP's port or protocol it does not serve (ICMP port unreachable, or a drop where the kernel would send none or its rate limits stop it)",
	"tc_local_no_backend":    "externalTrafficPolicy/internalTrafficPolicy Local without a local endpoint",
	"tc_service_cidr_drop":   "an unallocated address of the service CIDR",
	"tc_loopback_drop":       "a loopback address (127.0.0.0/8) from a device other than lo, as destination or source: dropped whatever net.ipv4.conf.*.route_localnet says, as kube-proxy's KUBE-FIREWALL drops one to it (CVE-2020-8558)",
	"tc_frag_drop":           "a later fragment without its first",
	"tc_tcp_stray":           "a TCP packet that cannot open a connection (a RST, a FIN, a SYN-ACK, or neither SYN nor ACK) with no conntrack entry (or whose frontend port is gone): dropped untranslated, as netfilter finds it INVALID (to a ClusterIP, on a port it serves or not: no port unreachable either, or an ExternalIP or LoadBalancer IP that is not the node's)",
	"tc_ct_full":             "the conntrack table is full",
	"tc_ct_est_full":         "the established conntrack table is full",
	"tc_ct_clash":            "the reply tuple belongs to another flow, and the flow cannot move to another client port; or a conntrack key the flow needs holds an entry being deleted (a flush, the GC, a new flow on the tuple): the client's next try goes through",
	"tc_snat_exhausted":      "no source port free for SNAT",
	"tc_snat_half_open_full": "the conntrack table's half-open share is taken by flows not answered yet (a flood of new connections): a new source-NATed flow is refused until they are answered or time out (--conntrack-half-open-max)",
	"tc_snat_lost":           "the flow's SNAT port was lost",
	"tc_backend_missing":     "a slot names a backend that does not exist",
	"tc_fib_err":             "no route to the backend",
	"tc_mtu_drop":            "too big for the route to the backend",
	"tc_ttl_exceeded":        "TTL exceeded",
	"tc_frag_needed":         "fragmentation needed (ICMP)",
	"tc_rewrite_err":         "the packet could not be rewritten",
	"tc_malformed":           "malformed",
	"sock_no_backend":        "the Service has no endpoints (the socket gets ECONNREFUSED)",
	"sock_unknown_port":      "a ClusterIP's port or protocol it does not serve (ECONNREFUSED)",
	"sock_drop":              "no endpoint for this client, a source outside loadBalancerSourceRanges, or an unallocated address of the service CIDR (EHOSTUNREACH)",
	"sock_backend_missing":   "a slot names a backend that does not exist (ECONNREFUSED)",
}

// strayUp explains tc_tcp_stray_up, a pass (not among dropReasons).
const strayUp = "a TCP packet that cannot open a connection (a RST, a FIN, a SYN-ACK, or neither SYN nor ACK) with no conntrack entry, to a NodePort, ExternalIP or LoadBalancer IP the node does not forward (one of its addresses): passed up untranslated to the node's stack (which answers a FIN or an ACK with a RST), as kube-proxy leaves netfilter's INVALID"

func explainCmd(fs *flag.FlagSet) runner {
	dev := fs.String("device", "", "device whose tc program runs the packet (required)")
	from := fs.String("from", "", "client address IP, IP:PORT or [IPv6]:PORT (required; port 40000 if not given)")
	to := fs.String("to", "", "destination IP:PORT or [IPv6]:PORT (required), of --from's family")
	proto := fs.String("proto", "tcp", "tcp (a SYN) or udp")
	egress := fs.Bool("egress", false, "run the device's egress program instead of its ingress one")
	socket := fs.Bool("socket", false, "ask the socket path (connect4, or connect6 for an IPv6 --to; an IPv4-mapped one is the IPv4 service) what a connect from this network namespace (the node's, or a pod's) would do; --from is then the socket's source address (default: an unbound socket's, the agent's node address of the family, as its programs take it; the route's if no agent program is attached)")
	unconnected := fs.Bool("unconnected", false, "with --socket and --proto udp: a datagram of a new unconnected socket (sendmsg4, sendmsg6)")
	var req datapath.ExplainRequest
	var sreq datapath.SocketExplainRequest
	return runner{
		check: func(c *ctx) error {
			var err error
			if *socket {
				if *dev != "" || *egress {
					return errors.New("--socket takes no --device or --egress")
				}
				sreq, err = socketRequest(*from, *to, *proto, *unconnected)
				return err
			}
			if *unconnected {
				return errors.New("--unconnected needs --socket")
			}
			if req, err = explainRequest(*dev, *from, *to, *proto, *egress); err != nil {
				return err
			}
			return nil
		},
		run: func(c *ctx) error {
			var e *datapath.Explanation
			var se *datapath.SocketExplanation
			var err error
			if *socket {
				req = datapath.ExplainRequest{From: netip.AddrPortFrom(sreq.From, 0), To: sreq.To, Proto: sreq.Proto}
				if se, err = datapath.ExplainSocketDetail(c.bpffs, sreq); err == nil {
					e = se.Explanation
				}
			} else {
				e, err = datapath.Explain(req)
			}
			if err != nil {
				return err
			}
			out, err := describe(c, req, e)
			if err != nil {
				return err
			}
			if *socket {
				socketOut(out, sreq, se)
			}
			if c.output == "json" {
				return writeJSON(c.stdout, out)
			}
			return tabulate(c.stdout, explainTable(out))
		},
	}
}

// explainProto is explain's --proto, which it needs: the IP protocol
// number of tcp or udp (model's protocols are those numbers).
func explainProto(s string) (uint8, error) {
	p, err := parseProto(s)
	if err != nil || p == 0 {
		return 0, fmt.Errorf("--proto %q: want tcp or udp", s)
	}
	return uint8(p), nil
}

// explainRequest validates explain's flags.
func explainRequest(dev, from, to, proto string, egress bool) (datapath.ExplainRequest, error) {
	req := datapath.ExplainRequest{Device: dev, Egress: egress}
	if dev == "" || from == "" || to == "" {
		return req, errors.New("--device, --from and --to are required")
	}
	var err error
	if req.Proto, err = explainProto(proto); err != nil {
		return req, err
	}
	if req.From, err = parseAddrPort("--from", from, 40000); err != nil {
		return req, err
	}
	if req.To, err = parseAddrPort("--to", to, 0); err != nil {
		return req, err
	}
	if err := datapath.CheckPacketFamilies(req.From.Addr(), req.To.Addr()); err != nil {
		if req.To.Addr().Is4In6() {
			return req, fmt.Errorf("--to %s: %w (or ask the socket path: --socket)", req.To, err)
		}
		return req, fmt.Errorf("--from %s --to %s: %w", req.From, req.To, err)
	}
	return req, nil
}

// parseAddrPort parses flag's value s: IP:PORT, [IPv6]:PORT, or with a
// default port (defPort, not 0: a client's) a bare IP. Its errors say what is wrong:
// the address, or the port and its range.
func parseAddrPort(flag, s string, defPort uint16) (netip.AddrPort, error) {
	want := "IP:PORT or [IPv6]:PORT"
	if defPort != 0 {
		want = "IP, IP:PORT or [IPv6]:PORT"
	}
	if a, err := netip.ParseAddr(s); err == nil {
		if defPort == 0 {
			return netip.AddrPort{}, fmt.Errorf("%s %q: no port: want %s", flag, s, want)
		}
		if a.Zone() != "" {
			return netip.AddrPort{}, fmt.Errorf("%s %q: an address with a zone is no service address", flag, s)
		}
		return netip.AddrPortFrom(a, defPort), nil
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%s %q: want %s", flag, s, want)
	}
	a, err := netip.ParseAddr(host)
	if err != nil || a.Zone() != "" {
		return netip.AddrPort{}, fmt.Errorf("%s %q: %q is not an IP address (want %s)", flag, s, host, want)
	}
	n, err := strconv.ParseUint(port, 10, 64)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%s %q: port %q is not a number", flag, s, port)
	}
	// A client's port 0 is an ephemeral one (ExplainRequest); a
	// destination's must be a port.
	lo := uint64(1)
	if defPort != 0 {
		lo = 0
	}
	if n < lo || n > 65535 {
		return netip.AddrPort{}, fmt.Errorf("%s %q: port %d out of range (%d-65535)", flag, s, n, lo)
	}
	return netip.AddrPortFrom(a, uint16(n)), nil
}

// socketRequest validates explain --socket's flags.
func socketRequest(from, to, proto string, unconnected bool) (datapath.SocketExplainRequest, error) {
	var req datapath.SocketExplainRequest
	if to == "" {
		return req, errors.New("--to is required")
	}
	var err error
	if req.Proto, err = explainProto(proto); err != nil {
		return req, err
	}
	if unconnected && req.Proto != unix.IPPROTO_UDP {
		return req, errors.New("--unconnected is a UDP socket's: add --proto udp")
	}
	req.Unconnected = unconnected
	if from != "" {
		a, err := netip.ParseAddr(from)
		if err != nil || a.Zone() != "" {
			return req, fmt.Errorf("--from %q: with --socket, the socket's source IP (no port)", from)
		}
		req.From = a
	}
	if req.To, err = parseAddrPort("--to", to, 0); err != nil {
		return req, err
	}
	if err := datapath.CheckSocketFamilies(req.From, req.To.Addr()); err != nil {
		return req, fmt.Errorf("--from %s --to %s: %w", from, req.To, err)
	}
	return req, nil
}

// socketHook names the hook a socket request asks about: connect4 or
// connect6 (sendmsg4, sendmsg6), by its destination's family (an
// IPv4-mapped one is an IPv6 socket's).
func socketHook(req datapath.SocketExplainRequest) string {
	return req.Hook()
}

// socketOut makes describe's answer the socket path's: the hook asked,
// the socket and the source it was judged by, its client (the namespace
// it counted as in), the errno of a refusal, and why a pod's loopback
// destination has no frontend (lib/socklb.h sock_loopback_served); or, asked from a
// namespace the agent's programs do not serve, that the socket passes
// untranslated and where to ask instead.
func socketOut(out *explainOut, req datapath.SocketExplainRequest, se *datapath.SocketExplanation) {
	e := se.Explanation
	protoName, hook := "TCP", socketHook(req)
	if req.Proto == unix.IPPROTO_UDP {
		protoName = "UDP"
	}
	if req.Unconnected {
		hook += " (a new unconnected socket)"
	}
	out.Socket, out.Device, out.Direction, out.ProgramID = true, "", hook, 0
	out.Packet = fmt.Sprintf("%s socket from %s -> %s", protoName, socketSource(req, se), req.To)
	if req.To.Addr().Is4In6() {
		out.Packet += fmt.Sprintf(" (IPv4-mapped: the IPv4 service %s)", netip.AddrPortFrom(req.To.Addr().Unmap(), req.To.Port()))
	}
	out.Errno, out.StickyHit = e.Errno, e.StickyHit
	if e.NotServed {
		out.NotServed, out.ProgramID = true, e.ProgramID
		out.Verdict = "pass (untranslated: the socket reaches " + req.To.String() + " itself)"
		out.Reason = "--socket-lb-host-netns-only: the agent's socket programs translate the host's network namespace's sockets only, and this is another; " +
			"the packet path translates this one where tc runs: ask it with sluicectl explain --device DEV --from SOURCE --to " + req.To.String() +
			" (without --socket; DEV the pod's host-side device or its bridge, SOURCE the pod's address)"
		return
	}
	if out.Client != "" {
		out.Client = socketClient(se)
	}
	if !e.Frontend && se.Netns == datapath.NetnsOther && req.To.Addr().Unmap().Is4() && req.To.Addr().Unmap().IsLoopback() {
		// Whether a localhost NodePort is there at all (the port may have
		// none, or --localhost-nodeports be off) this run does not know:
		// it stopped before the lookup. The reason holds either way.
		out.Reason = "a loopback destination, no frontend for a pod's socket: a localhost NodePort (--localhost-nodeports), if one is there, serves the node's sockets (the agent's network namespace) only, as kube-proxy's; " +
			"a pod's 127.0.0.1 is its own: the socket reaches whatever listens on " + req.To.String() + " in this namespace"
	}
	if e.DNAT {
		out.DNAT = "connect to " + e.Backend.String() + " (the socket's destination is rewritten; no packet NAT)"
	}
}

// socketSource says the source a socket dry run judged and where it came
// from.
func socketSource(req datapath.SocketExplainRequest, se *datapath.SocketExplanation) string {
	src := "no address"
	if se.Source.IsValid() {
		src = se.Source.String()
	}
	switch se.SourceFrom {
	case datapath.SourceGiven:
		return src + " (--from)"
	case datapath.SourceNodeIP:
		if !se.Source.IsValid() {
			return src + " (unbound, and the agent has no node address of the family)"
		}
		return src + " (unbound: the agent's node address, as its programs judge an unbound socket)"
	case datapath.SourceRoute:
		if !se.Source.IsValid() {
			return src + " (unbound: no agent program attached to read the node's address from, and no route to the destination)"
		}
		return src + " (unbound: the route's source; no agent program attached to read the node's address from)"
	}
	if req.From.IsValid() { // not run (NotServed)
		return req.From.String()
	}
	return "an unbound socket"
}

// socketClient says which namespace the socket counted as in, as the
// programs choose a two-scope frontend's scope by it.
func socketClient(se *datapath.SocketExplanation) string {
	const affinity = "; the socket path's client of session affinity"
	switch se.Netns {
	case datapath.NetnsAgent:
		return "this node (the agent's network namespace" + affinity + ")"
	case datapath.NetnsOther:
		if se.Detector {
			return "a pod (a network namespace other than the agent's; with a local traffic detector, taken for a cluster client" + affinity + ")"
		}
		return "a pod (a network namespace other than the agent's; no local traffic detector (--cluster-cidr): not a cluster client, so externalTrafficPolicy Local serves it this node's endpoints only" + affinity + ")"
	}
	return "this network namespace, counted as the node's (no agent's namespace known: no agent program attached, or one older than the check; every socket counts as the node's" + affinity + ")"
}

// describe adds names and candidates to the program's explanation.
func describe(c *ctx, req datapath.ExplainRequest, e *datapath.Explanation) (*explainOut, error) {
	protoName := "TCP"
	if req.Proto == unix.IPPROTO_UDP {
		protoName = "UDP"
	}
	out := &explainOut{
		Device: req.Device, Direction: "ingress", Program: e.Program, ProgramID: e.ProgramID,
		Packet:  fmt.Sprintf("%s %s -> %s", protoName, req.From, req.To),
		Verdict: e.Verdict, Reasons: e.Reasons, ConntrackHit: e.ConntrackHit, AffinityHit: e.AffinityHit,
	}
	if req.Egress {
		out.Direction = "egress"
	}
	if e.OutDst.IsValid() {
		out.Out = fmt.Sprintf("%s -> %s", e.OutSrc, e.OutDst)
	}
	for _, r := range e.Reasons {
		if d, ok := dropReasons[r]; ok {
			out.Reason = r + ": " + d
			break
		}
	}
	if e.Reply {
		out.Reply = true
		out.ReplyFrom = e.FrontendAddr.String()
		if e.SNAT {
			out.SNAT = "destination " + e.SNATTo.String()
		}
		return out, nil
	}
	if !e.Frontend {
		return out, nil
	}
	fe := fmt.Sprintf("%s/%s", e.FrontendAddr, protoName)
	out.Frontend = fe
	names, err := namesfile.Read(c.namesFile, c.bpffs)
	if err != nil {
		warn(c.stderr, "sluicectl explain: %v (Service names left out)\n", err)
	}
	if n, ok := names[fe]; ok {
		out.Service, out.Kind = n.Service, n.Kind
	}
	for _, f := range svcFlagNames {
		if e.SvcFlags&f.bit != 0 {
			out.Policies = append(out.Policies, f.name)
		}
	}
	if e.Scoped {
		// Classified only after the source ranges let it pass.
		switch {
		case e.Internal:
			out.Client = "internal (cluster CIDR)"
		case e.Outside:
			out.Client = "external (through a node device)"
		default:
			out.Client = "other (this node, or no cluster CIDR set)"
		}
		out.Scope = "default"
		if e.Scope == 1 {
			out.Scope = "internal (short-circuit: all endpoints for cluster clients)"
		}
		cands, err := c.pins.Candidates(e.FrontendAddr, req.Proto, e.Scope)
		if err != nil {
			return nil, err
		}
		for _, cd := range cands {
			out.Candidates = append(out.Candidates, candidateOut{Slot: cd.Slot, BackendID: cd.BackendID, Addr: cd.Addr.String()})
		}
	}
	if e.DNAT {
		out.Backend, out.BackendID, out.Slot = e.Backend.String(), e.BackendID, e.Slot
		out.DNAT = e.Backend.String()
		switch {
		case e.StickyHit:
			out.Why = "UDP stickiness: the socket's entry names it"
		case e.ConntrackHit:
			out.Why = "conntrack: an existing flow keeps its backend"
		case e.AffinityHit:
			out.Why = "session affinity: the client's entry names it"
		default:
			out.Why = fmt.Sprintf("new flow: slot %d picked at random of %d (the scope's endpoints after topology and traffic policies)", e.Slot, e.ScopeCount)
		}
	}
	if e.SNAT {
		out.SNAT = e.SNATTo.String()
	}
	return out, nil
}

// explainTable renders the answer as aligned FIELD VALUE lines.
func explainTable(o *explainOut) string {
	rows := [][]string{
		{"PROGRAM", fmt.Sprintf("%s (id %d), %s %s", o.Program, o.ProgramID, o.Device, o.Direction)},
		{"PACKET", o.Packet},
	}
	if o.Socket {
		rows[0][1] = fmt.Sprintf("%s: a dry run of %s's selection, loaded by sluicectl", o.Program, o.Direction)
		rows[1][0] = "SOCKET"
	}
	if o.NotServed {
		rows[0][1] = fmt.Sprintf("%s (id %d), the agent's %s program: not run", o.Program, o.ProgramID, o.Direction)
		rows = append(rows, []string{"NETNS", "not the host's: --socket-lb-host-netns-only leaves this namespace's sockets to the packet path"},
			[]string{"VERDICT", o.Verdict}, []string{"REASON", o.Reason})
		var b strings.Builder
		for _, r := range rows {
			b.WriteString(r[0] + "\t" + r[1] + "\n")
		}
		return b.String()
	}
	add := func(k, v string) {
		if v != "" {
			rows = append(rows, []string{k, v})
		}
	}
	snat := o.SNAT
	if o.Reply {
		// A clash-remapped reply's destination (SNAT) is given back
		// where its source is: here, or at that egress ("there").
		if snat != "" {
			snat = "destination becomes " + strings.TrimPrefix(snat, "destination ")
		}
		if slices.Contains(o.Reasons, "tc_rev_at_egress") {
			add("REPLY", "of a translated flow, passed up untranslated: translated at the egress of the device its route leaves by (source becomes "+o.ReplyFrom+" there)")
			if snat != "" {
				snat += " there"
			}
		} else {
			add("REPLY", "of a translated flow: source becomes "+o.ReplyFrom)
		}
	}
	if o.Frontend != "" {
		svc := o.Service
		if svc == "" {
			svc = "(no name: names file missing)"
		}
		add("FRONTEND", fmt.Sprintf("%s  %s %s", o.Frontend, svc, o.Kind))
		add("POLICIES", strings.Join(o.Policies, ", "))
		add("CLIENT", o.Client)
		add("SCOPE", o.Scope)
		var cs []string
		for _, c := range o.Candidates {
			cs = append(cs, fmt.Sprintf("%s (slot %d, id %d)", c.Addr, c.Slot, c.BackendID))
		}
		add("CANDIDATES", strings.Join(cs, ", "))
	} else if !o.Reply {
		add("FRONTEND", "none: not a Service frontend")
	}
	if o.Backend != "" {
		add("BACKEND", fmt.Sprintf("%s (id %d): %s", o.Backend, o.BackendID, o.Why))
	}
	add("DNAT", o.DNAT)
	add("SNAT", snat)
	if slices.Contains(o.Reasons, "tc_tcp_stray_up") {
		// Not a drop: the pass verdict's why.
		add("STRAY", strayUp)
	}
	add("VERDICT", o.Verdict)
	add("ERRNO", o.Errno)
	add("REASON", o.Reason)
	add("COUNTED", strings.Join(o.Reasons, ", "))
	add("OUT", o.Out)
	var b strings.Builder
	for _, r := range rows {
		b.WriteString(r[0] + "\t" + r[1] + "\n")
	}
	return b.String()
}
