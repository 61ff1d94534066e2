package datapath

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/pkg/model"
)

// Packet tables for the tc programs, run through BPF_PROG_TEST_RUN with the
// maps seeded through Maps (the reconciler's write path). Expected packets
// are built from scratch, checksums included, so a byte-for-byte match
// proves the kernel's incremental checksum updates exact.

const (
	tcActOK       = 0
	tcActShot     = 2
	tcActRedirect = 7
)

var (
	vipTCP   = l4("10.96.0.10", 80, model.TCP)
	vipUDP   = l4("10.96.0.11", 53, model.UDP)
	vipEmpty = l4("10.96.0.12", 80, model.TCP)
	vipEmptU = l4("10.96.0.12", 53, model.UDP)
	beTCP    = testBackend{1, l4("10.1.0.1", 8080, model.TCP)}
	beUDP    = testBackend{2, l4("10.1.0.2", 5353, model.UDP)}
)

func runProg(t *testing.T, prog *ebpf.Program, in []byte) (uint32, []byte) {
	t.Helper()
	ret, out, err := runProgErr(prog, in)
	if err != nil {
		t.Fatalf("BPF_PROG_TEST_RUN: %v", err)
	}
	return ret, out
}

func runProgErr(prog *ebpf.Program, in []byte) (uint32, []byte, error) {
	opts := ebpf.RunOptions{Data: append([]byte(nil), in...), DataOut: make([]byte, len(in)+256)}
	ret, err := prog.Run(&opts)
	return ret, opts.DataOut, err
}

// checkChecksums recomputes the IPv4 header checksum and the TCP/UDP
// checksum of an Ethernet frame from scratch and compares them with the
// frame's.
func checkChecksums(t *testing.T, frame []byte) {
	t.Helper()
	ip := frame[14:]
	ihl := int(ip[0]&0xf) * 4
	if got, want := binary.BigEndian.Uint16(ip[10:]), ipv4HeaderChecksum(ip[:ihl]); got != want {
		t.Errorf("IPv4 header checksum %#04x, recomputed %#04x", got, want)
	}
	totLen := int(binary.BigEndian.Uint16(ip[2:]))
	seg := ip[ihl:totLen]
	switch ip[9] {
	case 6:
		if got, want := binary.BigEndian.Uint16(seg[16:]), l4Checksum(ip[12:16], ip[16:20], 6, seg); got != want {
			t.Errorf("TCP checksum %#04x, recomputed %#04x", got, want)
		}
	case 17:
		got := binary.BigEndian.Uint16(seg[6:])
		if want := l4Checksum(ip[12:16], ip[16:20], 17, seg); got != 0 && got != want {
			t.Errorf("UDP checksum %#04x, recomputed %#04x", got, want)
		}
	}
}

type packetCase struct {
	name    string
	egress  bool
	in      pkt
	verdict uint32
	out     *pkt // nil: the output must equal the input byte for byte
}

func runPacketCases(t *testing.T, d *Datapath, cases []packetCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			prog := d.TCIngress()
			if c.egress {
				prog = d.TCEgress()
			}
			in := c.in.bytes()
			verdict, out := runProg(t, prog, in)
			if verdict != c.verdict {
				t.Fatalf("verdict %d, want %d", verdict, c.verdict)
			}
			want := in
			if c.out != nil {
				want = c.out.bytes()
			}
			if !bytes.Equal(out, want) {
				t.Fatalf("output packet\n got %x\nwant %x", out, want)
			}
			if c.in.etherType == 0 && (c.in.proto == 6 || c.in.proto == 17) && c.in.fragOff&0x1fff == 0 {
				checkChecksums(t, out)
			}
		})
	}
}

// with returns a copy of p with f applied.
func (p pkt) with(f func(*pkt)) *pkt {
	f(&p)
	return &p
}

func tcpSYN(src string, sport uint16, dst string, dport uint16) pkt {
	return pkt{srcMAC: clientMAC, dstMAC: nodeMAC, src: src, dst: dst, sport: sport, dport: dport, proto: 6}
}

func udpDgram(src string, sport uint16, dst string, dport uint16) pkt {
	return pkt{srcMAC: clientMAC, dstMAC: nodeMAC, src: src, dst: dst, sport: sport, dport: dport, proto: 17,
		payload: []byte("sluice says hello")}
}

func toBackend(b testBackend) func(*pkt) {
	return func(p *pkt) { p.dst, p.dport = b.addr.Addr.String(), b.addr.Port }
}

func TestTCPacketTable(t *testing.T) {
	d := newTestDatapath(t)
	m := d.Maps()
	addService(t, m, 1, vipTCP, beTCP)
	addService(t, m, 2, vipUDP, beUDP)

	synToVIP := tcpSYN("10.0.0.1", 40000, "10.96.0.10", 80)
	udpToVIP := udpDgram("10.0.0.1", 5300, "10.96.0.11", 53)
	udpNoCsum := udpDgram("10.0.0.1", 5301, "10.96.0.11", 53)
	udpNoCsum.udpNoCsum = true
	withOpts := tcpSYN("10.0.0.1", 40001, "10.96.0.10", 80)
	withOpts.ipOpts = []byte{1, 1, 1, 0, 0x44, 8, 5, 0} // NOP NOP NOP EOL, timestamp option
	firstFrag := udpToVIP
	firstFrag.sport = 5302
	firstFrag.fragOff = 0x2000 // MF, offset 0
	// A later fragment of firstFrag's datagram (same addresses and IP
	// id): its payload starts with bytes that look like a UDP header
	// (with a zero checksum), which must stay as they are.
	laterFrag := udpToVIP
	laterFrag.fragOff = 185 // offset 1480
	laterFrag.udpNoCsum = true
	strayFrag := laterFrag
	strayFrag.src = "10.0.0.9" // no first fragment seen
	tcpReply := pkt{srcMAC: nodeMAC, dstMAC: clientMAC, src: "10.1.0.1", dst: "10.0.0.1", sport: 8080, dport: 40000, proto: 6}
	udpReply := pkt{srcMAC: nodeMAC, dstMAC: clientMAC, src: "10.1.0.2", dst: "10.0.0.1", sport: 5353, dport: 5300, proto: 17,
		payload: []byte("answer")}
	fromVIP := func(p *pkt) { p.src, p.sport = "10.96.0.10", 80 }
	fromUDPVIP := func(p *pkt) { p.src, p.sport = "10.96.0.11", 53 }

	runPacketCases(t, d, []packetCase{
		{name: "tcp_dnat", in: synToVIP, verdict: tcActOK, out: synToVIP.with(toBackend(beTCP))},
		{name: "tcp_dnat_again_same_flow", in: synToVIP, verdict: tcActOK, out: synToVIP.with(toBackend(beTCP))},
		{name: "udp_dnat", in: udpToVIP, verdict: tcActOK, out: udpToVIP.with(toBackend(beUDP))},
		{name: "udp_zero_checksum_stays_zero", in: udpNoCsum, verdict: tcActOK, out: udpNoCsum.with(toBackend(beUDP))},
		{name: "tcp_dnat_ip_options", in: withOpts, verdict: tcActOK, out: withOpts.with(toBackend(beTCP))},
		{name: "udp_first_fragment_dnat", in: firstFrag, verdict: tcActOK, out: firstFrag.with(toBackend(beUDP))},
		// Issue 11: a later fragment gets its first's translation, of
		// its addresses only (fragments_test.go has the full story).
		{name: "udp_later_fragment_follows_first", in: laterFrag, verdict: tcActOK,
			out: laterFrag.with(func(p *pkt) { p.dst = beUDP.addr.Addr.String() })},
		{name: "udp_later_fragment_without_first_untouched", in: strayFrag, verdict: tcActOK},
		{name: "tcp_reply_egress_rev_nat", egress: true, in: tcpReply, verdict: tcActOK, out: tcpReply.with(fromVIP)},
		{name: "tcp_reply_ingress_rev_nat", in: tcpReply, verdict: tcActOK, out: tcpReply.with(fromVIP)},
		{name: "udp_reply_egress_rev_nat", egress: true, in: udpReply, verdict: tcActOK, out: udpReply.with(fromUDPVIP)},
		{name: "udp_reply_ingress_rev_nat", in: udpReply, verdict: tcActOK, out: udpReply.with(fromUDPVIP)},
		{name: "reply_of_unknown_flow_untouched", egress: true, in: tcpReply.with(func(p *pkt) { p.dport = 40999 }).value(), verdict: tcActOK},
		{name: "egress_to_vip_untouched", egress: true, in: tcpSYN("10.0.0.1", 40002, "10.96.0.10", 80), verdict: tcActOK},
		{name: "non_service_addr_untouched", in: tcpSYN("10.0.0.1", 40000, "10.96.0.99", 80), verdict: tcActOK},
		{name: "non_service_port_untouched", in: tcpSYN("10.0.0.1", 40000, "10.96.0.10", 81), verdict: tcActOK},
		{name: "wrong_proto_for_port_untouched", in: udpDgram("10.0.0.1", 40000, "10.96.0.10", 80), verdict: tcActOK},
		{name: "icmp_to_vip_untouched", in: pkt{srcMAC: clientMAC, dstMAC: nodeMAC, src: "10.0.0.1", dst: "10.96.0.10", proto: 1,
			payload: []byte{8, 0, 0xf7, 0xff, 0, 0, 0, 0}}, verdict: tcActOK},
		{name: "ipv6_untouched", in: pkt{srcMAC: clientMAC, dstMAC: nodeMAC, etherType: 0x86dd, payload: bytes.Repeat([]byte{0x60}, 60)}, verdict: tcActOK},
		{name: "arp_untouched", in: pkt{srcMAC: clientMAC, dstMAC: nodeMAC, etherType: 0x0806, payload: make([]byte, 28)}, verdict: tcActOK},
	})

	cs, err := d.Counters()
	if err != nil {
		t.Fatal(err)
	}
	for _, reason := range []string{"tc_dnat_new", "tc_dnat_ct", "tc_rev_nat", "tc_fragment", "tc_frag_later"} {
		if cs[reason] == 0 {
			t.Errorf("counter %s is 0 after the table; counters: %v", reason, cs)
		}
	}
}

func (p *pkt) value() pkt { return *p }

// TestTCConntrackStickiness sends many packets of many flows to a service
// with four backends: every packet of a flow must reach the backend its
// first packet got, and the flows must spread over all backends.
func TestTCConntrackStickiness(t *testing.T) {
	d := newTestDatapath(t)
	bes := []testBackend{
		{11, l4("10.1.1.1", 8080, model.TCP)},
		{12, l4("10.1.1.2", 8080, model.TCP)},
		{13, l4("10.1.1.3", 8080, model.TCP)},
		{14, l4("10.1.1.4", 8080, model.TCP)},
	}
	addService(t, d.Maps(), 1, vipTCP, bes...)

	seen := map[string]int{}
	for flow := range 64 {
		in := tcpSYN("10.0.0.2", uint16(30000+flow), "10.96.0.10", 80)
		var first string
		for i := range 16 {
			verdict, out := runProg(t, d.TCIngress(), in.bytes())
			if verdict != tcActOK {
				t.Fatalf("flow %d packet %d: verdict %d", flow, i, verdict)
			}
			checkChecksums(t, out)
			dst := netip.AddrFrom4([4]byte(out[30:34])).String()
			if i == 0 {
				first = dst
				seen[dst]++
			} else if dst != first {
				t.Fatalf("flow %d packet %d went to %s, first packet to %s", flow, i, dst, first)
			}
		}
	}
	if len(seen) != len(bes) {
		t.Errorf("64 flows reached %d of %d backends: %v", len(seen), len(bes), seen)
	}
}

// TestTCBackendChange: when a backend leaves its service, an established
// TCP flow keeps it (as kube-proxy keeps established connections) while a
// UDP flow moves to a backend that still exists. FlushConntrack forgets
// both. (A new SYN on the TCP flow's tuple would select again:
// TestCTBackendGoneSYNReselects.)
func TestTCBackendChange(t *testing.T) {
	d := newTestDatapath(t)
	m := d.Maps()
	oldTCP, newTCP := testBackend{21, l4("10.1.2.1", 8080, model.TCP)}, testBackend{22, l4("10.1.2.2", 8080, model.TCP)}
	oldUDP, newUDP := testBackend{23, l4("10.1.2.3", 5353, model.UDP)}, testBackend{24, l4("10.1.2.4", 5353, model.UDP)}
	addService(t, m, 1, vipTCP, oldTCP)
	addService(t, m, 2, vipUDP, oldUDP)

	tcpIn := tcpSYN("10.0.0.3", 41000, "10.96.0.10", 80)
	udpIn := udpDgram("10.0.0.3", 41000, "10.96.0.11", 53)
	expect := func(name string, in pkt, b testBackend) {
		t.Helper()
		verdict, out := runProg(t, d.TCIngress(), in.bytes())
		if want := in.with(toBackend(b)).bytes(); verdict != tcActOK || !bytes.Equal(out, want) {
			t.Fatalf("%s: verdict %d, output\n got %x\nwant %x", name, verdict, out, want)
		}
	}
	expect("tcp before", tcpIn, oldTCP)
	expect("udp before", udpIn, oldUDP)

	// The reconciler replaces the backends: new backend and slot first,
	// then the old backend goes.
	addService(t, m, 1, vipTCP, newTCP)
	addService(t, m, 2, vipUDP, newUDP)
	if err := m.DeleteBackend(oldTCP.id); err != nil {
		t.Fatal(err)
	}
	if err := m.DeleteBackend(oldUDP.id); err != nil {
		t.Fatal(err)
	}
	tcpData := tcpIn
	tcpData.tcpFlags = 0x10
	expect("tcp after removal keeps its backend", tcpData, oldTCP)
	expect("udp after removal re-balances", udpIn, newUDP)

	if err := m.FlushConntrack([]model.L4Addr{oldTCP.addr}); err != nil {
		t.Fatal(err)
	}
	var k sockCt4Key
	var v sockCt4Entry
	for _, cm := range ctMaps(m) {
		for it := cm.Iterate(); it.Next(&k, &v); {
			if (k.Dir == ctForward && v.NatAddr == be32(oldTCP.addr.Addr)) || (k.Dir == ctReverse && k.Saddr == be32(oldTCP.addr.Addr)) {
				t.Errorf("conntrack entry of %s survived FlushConntrack: %+v -> %+v", oldTCP.addr, k, v)
			}
		}
	}
	expect("tcp after flush", tcpData, newTCP)
}

// TestTCConntrackTimeout: an idle UDP flow forgets its backend.
func TestTCConntrackTimeout(t *testing.T) {
	requireRoot(t)
	cfg := smallConfig(testPinDir(t))
	cfg.CTTimeoutUDP = 500 * time.Millisecond
	d := openTest(t, cfg)
	m := d.Maps()
	a, b := testBackend{31, l4("10.1.3.1", 5353, model.UDP)}, testBackend{32, l4("10.1.3.2", 5353, model.UDP)}
	addService(t, m, 1, vipUDP, a)
	in := udpDgram("10.0.0.4", 42000, "10.96.0.11", 53)
	dstOf := func() string {
		_, out := runProg(t, d.TCIngress(), in.bytes())
		return netip.AddrFrom4([4]byte(out[30:34])).String()
	}
	if got := dstOf(); got != "10.1.3.1" {
		t.Fatalf("first packet to %s", got)
	}
	// Slot 1 now names b, but a still exists: the live flow stays on a.
	if err := m.UpsertBackend(b.id, b.addr); err != nil {
		t.Fatal(err)
	}
	if err := m.UpsertSlot(vipUDP, 1, b.id); err != nil {
		t.Fatal(err)
	}
	if got := dstOf(); got != "10.1.3.1" {
		t.Fatalf("live flow moved to %s", got)
	}
	time.Sleep(1200 * time.Millisecond)
	if got := dstOf(); got != "10.1.3.2" {
		t.Fatalf("idle flow still sent to %s after its timeout", got)
	}
}

// TestTCTruncated runs every prefix of valid packets to services through
// both programs: the output must be the unchanged prefix or a drop, never a
// rewrite of bytes that are not there.
func TestTCTruncated(t *testing.T) {
	d := newTestDatapath(t)
	addService(t, d.Maps(), 1, vipTCP, beTCP)
	addService(t, d.Maps(), 2, vipUDP, beUDP)
	addService(t, d.Maps(), 3, vipEmpty)

	withOpts := tcpSYN("10.0.0.5", 43000, "10.96.0.10", 80)
	withOpts.ipOpts = []byte{1, 1, 1, 0}
	full := map[string][]byte{
		"tcp":         tcpSYN("10.0.0.5", 43001, "10.96.0.10", 80).bytes(),
		"udp":         udpDgram("10.0.0.5", 43002, "10.96.0.11", 53).bytes(),
		"tcp_options": withOpts.bytes(),
		"no_backend":  tcpSYN("10.0.0.5", 43003, "10.96.0.12", 80).bytes(),
		"reply":       pkt{srcMAC: nodeMAC, dstMAC: clientMAC, src: "10.1.0.1", dst: "10.0.0.5", sport: 8080, dport: 43001, proto: 6}.bytes(),
	}
	// Create the conntrack entries the "reply" packet matches.
	runProg(t, d.TCIngress(), full["tcp"])

	for name, p := range full {
		for _, fixLen := range []bool{false, true} {
			for n := 0; n < len(p); n++ {
				in := append([]byte(nil), p[:n]...)
				if fixLen && n >= 14+4 {
					// Make the IPv4 total length agree with the
					// truncated frame, so only the L4 header is short.
					binary.BigEndian.PutUint16(in[16:], uint16(n-14))
				}
				for _, egress := range []bool{false, true} {
					prog := d.TCIngress()
					if egress {
						prog = d.TCEgress()
					}
					verdict, out, err := runProgErr(prog, in)
					if n < 14+20 && err != nil {
						// BPF_PROG_TEST_RUN refuses an IPv4 frame
						// shorter than Ethernet plus a minimal
						// IPv4 header (EINVAL): such lengths cannot
						// be run, only the longer ones.
						continue
					}
					if err != nil {
						t.Fatalf("%s[:%d] egress=%v fixLen=%v: %v", name, n, egress, fixLen, err)
					}
					if verdict == tcActShot {
						continue
					}
					if verdict == tcActOK && fixLen && len(out) == len(in) && onlyNATFieldsDiffer(in, out) {
						// With a consistent total length and the
						// whole L4 header present this is a valid
						// (short) packet: translating it in place
						// is fine.
						continue
					}
					if verdict != tcActOK || !bytes.Equal(out, in) {
						t.Errorf("%s[:%d] egress=%v fixLen=%v: verdict %d, output changed\n got %x\nwant %x",
							name, n, egress, fixLen, verdict, out, in)
					}
				}
			}
		}
	}
}

// TestTCNoBackendICMP: a packet to a service without backends comes back as
// an ICMP port unreachable from the VIP, redirected out of the ingress
// device.
func TestTCNoBackendICMP(t *testing.T) {
	d := newTestDatapath(t)
	addService(t, d.Maps(), 3, vipEmpty)
	addService(t, d.Maps(), 4, vipEmptU)

	udpOpts := udpDgram("10.0.0.6", 44001, "10.96.0.12", 53)
	udpOpts.ipOpts = []byte{1, 1, 1, 0, 0x44, 8, 5, 0}
	big := tcpSYN("10.0.0.6", 44002, "10.96.0.12", 80)
	big.payload = bytes.Repeat([]byte("x"), 1000)
	for name, p := range map[string]pkt{
		"tcp_syn":         tcpSYN("10.0.0.6", 44000, "10.96.0.12", 80),
		"udp_ip_options":  udpOpts,
		"tcp_big_payload": big,
	} {
		t.Run(name, func(t *testing.T) {
			in := p.bytes()
			verdict, out := runProg(t, d.TCIngress(), in)
			if verdict != tcActRedirect {
				t.Fatalf("verdict %d, want TC_ACT_REDIRECT (%d)", verdict, tcActRedirect)
			}
			// The quote: the original IPv4 header and the whole
			// fixed L4 header (at least the 8 bytes RFC 792 asks).
			ihl := 20 + len(p.ipOpts)
			l4len := 8
			if p.proto == 6 {
				l4len = 20
			}
			quote := in[14 : 14+ihl+l4len]
			if want := 14 + 20 + 8 + len(quote); len(out) != want {
				t.Fatalf("reply is %d bytes, want %d: %x", len(out), want, out)
			}
			if !bytes.Equal(out[0:6], in[6:12]) || !bytes.Equal(out[6:12], in[0:6]) || binary.BigEndian.Uint16(out[12:]) != 0x0800 {
				t.Errorf("Ethernet header %x: want MACs swapped from %x", out[:14], in[:14])
			}
			ip := out[14:34]
			if ip[0] != 0x45 || ip[9] != 1 || ip[8] == 0 {
				t.Errorf("IPv4 header %x: want version 4, ihl 5, protocol ICMP, ttl > 0", ip)
			}
			if got, want := int(binary.BigEndian.Uint16(ip[2:])), 20+8+len(quote); got != want {
				t.Errorf("IPv4 total length %d, want %d", got, want)
			}
			if fragOff := binary.BigEndian.Uint16(ip[6:]); fragOff&0x3fff != 0 {
				t.Errorf("reply is a fragment: frag_off %#x", fragOff)
			}
			if src, dst := netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20])); src.String() != p.dst || dst.String() != p.src {
				t.Errorf("reply %s -> %s, want %s -> %s", src, dst, p.dst, p.src)
			}
			if got, want := binary.BigEndian.Uint16(ip[10:]), ipv4HeaderChecksum(ip); got != want {
				t.Errorf("IPv4 header checksum %#04x, recomputed %#04x", got, want)
			}
			icmp := out[34:]
			if icmp[0] != 3 || icmp[1] != 3 {
				t.Errorf("ICMP type %d code %d, want 3/3 (port unreachable)", icmp[0], icmp[1])
			}
			sum := csumAdd(0, icmp[:2])
			sum = csumAdd(sum, icmp[4:])
			if got, want := binary.BigEndian.Uint16(icmp[2:]), csumFold(sum); got != want {
				t.Errorf("ICMP checksum %#04x, recomputed %#04x", got, want)
			}
			if !bytes.Equal(icmp[4:8], []byte{0, 0, 0, 0}) {
				t.Errorf("ICMP unused field %x, want zero", icmp[4:8])
			}
			if !bytes.Equal(icmp[8:], quote) {
				t.Errorf("quoted bytes\n got %x\nwant %x", icmp[8:], quote)
			}
		})
	}
	cs, err := d.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if cs["tc_no_backend"] != 3 {
		t.Errorf("tc_no_backend = %d, want 3", cs["tc_no_backend"])
	}
}

// onlyNATFieldsDiffer reports whether a and b (same length) differ only in
// the bytes address and port translation may change: the IPv4 checksum and
// addresses, the L4 ports and the L4 checksum.
func onlyNATFieldsDiffer(a, b []byte) bool {
	if len(a) < 34 {
		return bytes.Equal(a, b)
	}
	l4 := 14 + int(a[14]&0xf)*4
	csum := l4 + 16
	if a[23] == 17 {
		csum = l4 + 6
	}
	for i := range a {
		natField := (i >= 24 && i < 34) || (i >= l4 && i < l4+4) || (i >= csum && i < csum+2)
		if a[i] != b[i] && !natField {
			return false
		}
	}
	return true
}
