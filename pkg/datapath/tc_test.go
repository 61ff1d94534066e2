package datapath

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/internal/testutil/packet"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// Packet tables for the tc programs, run through BPF_PROG_TEST_RUN with the
// maps seeded through reconciler.Apply (the production writer), or through
// Maps where a test needs ids or a write order of its own. Expected packets
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

type packetCase struct {
	name    string
	egress  bool
	in      packet.Packet
	verdict uint32
	out     *packet.Packet // nil: the output must equal the input byte for byte
}

func runPacketCases(t *testing.T, d *Datapath, cases []packetCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			prog := d.TCIngress()
			if c.egress {
				prog = d.TCEgress()
			}
			in := c.in.Bytes()
			verdict, out := runProg(t, prog, in)
			if verdict != c.verdict {
				t.Fatalf("verdict %d, want %d", verdict, c.verdict)
			}
			want := in
			if c.out != nil {
				want = c.out.Bytes()
			}
			if !bytes.Equal(out, want) {
				t.Fatalf("output packet\n got %x\nwant %x", out, want)
			}
			if c.in.Src.IsValid() && (c.in.Proto == packet.TCP || c.in.Proto == packet.UDP) && c.in.FragOff&0x1fff == 0 {
				checkChecksums(t, out)
			}
		})
	}
}

// icmpOut is the ICMP port unreachable tc answers in with, as a packet to
// compare with: from where the kernel's reject would come (kernelRejectSrc), quoting its IPv4 and L4 headers.
func icmpOut(in packet.Packet) *packet.Packet {
	b := in.Bytes()
	n := 20 + 8
	if in.Proto == packet.TCP {
		n = 20 + 20
	}
	return &packet.Packet{SrcMAC: in.DstMAC, DstMAC: in.SrcMAC, Src: kernelRejectSrc("lo", in.Dst, in.Src), Dst: in.Src, Proto: packet.ICMP,
		ICMPType: 3, ICMPCode: 3, Payload: b[14 : 14+n]}
}

// with returns a copy of p with f applied, for a case's out.
func with(p packet.Packet, f func(*packet.Packet)) *packet.Packet {
	q := p.With(f)
	return &q
}

func tcpSYN(src string, sport uint16, dst string, dport uint16) packet.Packet {
	return packet.Packet{SrcMAC: clientMAC, DstMAC: nodeMAC, Src: addr(src), Dst: addr(dst), SrcPort: sport, DstPort: dport, Proto: packet.TCP}
}

func udpDgram(src string, sport uint16, dst string, dport uint16) packet.Packet {
	return packet.Packet{SrcMAC: clientMAC, DstMAC: nodeMAC, Src: addr(src), Dst: addr(dst), SrcPort: sport, DstPort: dport, Proto: packet.UDP,
		Payload: []byte("sluice says hello")}
}

func toBackend(b testBackend) func(*packet.Packet) {
	return func(p *packet.Packet) { p.Dst, p.DstPort = b.addr.Addr, b.addr.Port }
}

func TestTCPacketTable(t *testing.T) {
	d := newTestDatapath(t)
	applyServices(t, d, clusterIP(vipTCP, beTCP.addr), clusterIP(vipUDP, beUDP.addr))

	synToVIP := tcpSYN("10.0.0.1", 40000, "10.96.0.10", 80)
	udpToVIP := udpDgram("10.0.0.1", 5300, "10.96.0.11", 53)
	udpNoCsum := udpDgram("10.0.0.1", 5301, "10.96.0.11", 53)
	udpNoCsum.NoUDPChecksum = true
	withOpts := tcpSYN("10.0.0.1", 40001, "10.96.0.10", 80)
	withOpts.IPOptions = []byte{1, 1, 1, 0, 0x44, 8, 5, 0} // NOP NOP NOP EOL, timestamp option
	firstFrag := udpToVIP
	firstFrag.SrcPort = 5302
	firstFrag.FragOff = 0x2000 // MF, offset 0
	// A later fragment of firstFrag's datagram (same addresses and IP
	// id): its payload starts with bytes that look like a UDP header
	// (with a zero checksum), which must stay as they are.
	laterFrag := udpToVIP
	laterFrag.FragOff = 185 // offset 1480
	laterFrag.NoUDPChecksum = true
	strayFrag := laterFrag
	strayFrag.Src = addr("10.0.0.9") // no first fragment seen
	tcpReply := packet.Packet{SrcMAC: nodeMAC, DstMAC: clientMAC, Src: addr("10.1.0.1"), Dst: addr("10.0.0.1"), SrcPort: 8080, DstPort: 40000, Proto: packet.TCP}
	udpReply := packet.Packet{SrcMAC: nodeMAC, DstMAC: clientMAC, Src: addr("10.1.0.2"), Dst: addr("10.0.0.1"), SrcPort: 5353, DstPort: 5300, Proto: packet.UDP,
		Payload: []byte("answer")}
	fromVIP := func(p *packet.Packet) { p.Src, p.SrcPort = addr("10.96.0.10"), 80 }
	fromUDPVIP := func(p *packet.Packet) { p.Src, p.SrcPort = addr("10.96.0.11"), 53 }
	icmpEcho := packet.Packet{SrcMAC: clientMAC, DstMAC: nodeMAC, Src: addr("10.0.0.1"), Dst: addr("10.96.0.10"), Proto: packet.ICMP,
		ICMPType: packet.ICMPEcho}

	runPacketCases(t, d, []packetCase{
		{name: "tcp_dnat", in: synToVIP, verdict: tcActOK, out: with(synToVIP, toBackend(beTCP))},
		{name: "tcp_dnat_again_same_flow", in: synToVIP, verdict: tcActOK, out: with(synToVIP, toBackend(beTCP))},
		{name: "udp_dnat", in: udpToVIP, verdict: tcActOK, out: with(udpToVIP, toBackend(beUDP))},
		{name: "udp_zero_checksum_stays_zero", in: udpNoCsum, verdict: tcActOK, out: with(udpNoCsum, toBackend(beUDP))},
		{name: "tcp_dnat_ip_options", in: withOpts, verdict: tcActOK, out: with(withOpts, toBackend(beTCP))},
		{name: "udp_first_fragment_dnat", in: firstFrag, verdict: tcActOK, out: with(firstFrag, toBackend(beUDP))},
		// Issue 11: a later fragment gets its first's translation, of
		// its addresses only (fragments_test.go has the full story).
		{name: "udp_later_fragment_follows_first", in: laterFrag, verdict: tcActOK,
			out: with(laterFrag, func(p *packet.Packet) { p.Dst = beUDP.addr.Addr })},
		{name: "udp_later_fragment_without_first_untouched", in: strayFrag, verdict: tcActOK},
		{name: "tcp_reply_egress_rev_nat", egress: true, in: tcpReply, verdict: tcActOK, out: with(tcpReply, fromVIP)},
		{name: "tcp_reply_ingress_rev_nat", in: tcpReply, verdict: tcActOK, out: with(tcpReply, fromVIP)},
		{name: "udp_reply_egress_rev_nat", egress: true, in: udpReply, verdict: tcActOK, out: with(udpReply, fromUDPVIP)},
		{name: "udp_reply_ingress_rev_nat", in: udpReply, verdict: tcActOK, out: with(udpReply, fromUDPVIP)},
		{name: "reply_of_unknown_flow_untouched", egress: true, in: tcpReply.With(func(p *packet.Packet) { p.DstPort = 40999 }), verdict: tcActOK},
		{name: "egress_to_vip_untouched", egress: true, in: tcpSYN("10.0.0.1", 40002, "10.96.0.10", 80), verdict: tcActOK},
		{name: "non_service_addr_untouched", in: tcpSYN("10.0.0.1", 40000, "10.96.0.99", 80), verdict: tcActOK},
		// A ClusterIP's other ports and protocols are rejected (the
		// exact ICMP errors: semantics_test.go).
		{name: "non_service_port_rejected", in: tcpSYN("10.0.0.1", 40000, "10.96.0.10", 81), verdict: tcActRedirect,
			out: icmpOut(tcpSYN("10.0.0.1", 40000, "10.96.0.10", 81))},
		{name: "wrong_proto_for_port_rejected", in: udpDgram("10.0.0.1", 40000, "10.96.0.10", 80), verdict: tcActRedirect,
			out: icmpOut(udpDgram("10.0.0.1", 40000, "10.96.0.10", 80))},
		// So are its other protocols' (TestTCOtherProtocols).
		{name: "icmp_echo_to_vip_rejected", in: icmpEcho, verdict: tcActRedirect, out: icmpOut(icmpEcho)},
		{name: "ipv6_untouched", in: packet.Packet{SrcMAC: clientMAC, DstMAC: nodeMAC, EtherType: packet.EtherTypeIPv6, Payload: bytes.Repeat([]byte{0x60}, 60)}, verdict: tcActOK},
		{name: "arp_untouched", in: packet.Packet{SrcMAC: clientMAC, DstMAC: nodeMAC, EtherType: packet.EtherTypeARP, Payload: make([]byte, 28)}, verdict: tcActOK},
	})

	expectCounted(t, d, "tc_dnat_new", "tc_dnat_ct", "tc_rev_nat", "tc_fragment", "tc_frag_later", "tc_unknown_port")
}

// TestTCConntrackStickiness sends many packets of many flows to a service
// with four backends: every packet of a flow must reach the backend its
// first packet got, and the flows must spread over all backends. Per
// family (twinAddr).
func TestTCConntrackStickiness(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		d := newTestDatapath(t)
		var bes []model.L4Addr
		for _, a := range []string{"10.1.1.1", "10.1.1.2", "10.1.1.3", "10.1.1.4"} {
			bes = append(bes, l4(twinAddr(v6, a), 8080, model.TCP))
		}
		applyServices(t, d, clusterIP(twinL4(v6, vipTCP), bes...))

		seen := map[string]int{}
		for flow := range 64 {
			in := tcpSYN(twinAddr(v6, "10.0.0.2"), uint16(30000+flow), twinAddr(v6, "10.96.0.10"), 80)
			var first string
			for i := range 16 {
				verdict, out := runProg(t, d.TCIngress(), in.Bytes())
				if verdict != tcActOK {
					t.Fatalf("flow %d packet %d: verdict %d", flow, i, verdict)
				}
				checkChecksums(t, out)
				dst := outDst(out)
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
	})
}

// TestTCBackendChange: when a backend leaves its service, an established
// TCP flow keeps it (as kube-proxy keeps established connections) while a
// UDP flow moves to a backend that still exists. FlushConntrack forgets
// both. (A new SYN on the TCP flow's tuple would select again:
// TestCTBackendGoneSYNReselects.) Per family (twinAddr).
func TestTCBackendChange(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		d := newTestDatapath(t)
		m := d.Maps()
		be := func(id reconciler.BackendID, a string, port uint16, proto model.Protocol) testBackend {
			return testBackend{id, l4(twinAddr(v6, a), port, proto)}
		}
		oldTCP, newTCP := be(21, "10.1.2.1", 8080, model.TCP), be(22, "10.1.2.2", 8080, model.TCP)
		oldUDP, newUDP := be(23, "10.1.2.3", 5353, model.UDP), be(24, "10.1.2.4", 5353, model.UDP)
		vipT, vipU := twinL4(v6, vipTCP), twinL4(v6, vipUDP)
		addService(t, m, 1, vipT, oldTCP)
		addService(t, m, 2, vipU, oldUDP)

		client := twinAddr(v6, "10.0.0.3")
		tcpIn := tcpSYN(client, 41000, vipT.Addr.String(), 80)
		udpIn := udpDgram(client, 41000, vipU.Addr.String(), 53)
		expect := func(name string, in packet.Packet, b testBackend) {
			t.Helper()
			verdict, out := runProg(t, d.TCIngress(), in.Bytes())
			if want := in.With(toBackend(b)).Bytes(); verdict != tcActOK || !bytes.Equal(out, want) {
				t.Fatalf("%s: verdict %d, output\n got %x\nwant %x", name, verdict, out, want)
			}
		}
		expect("tcp before", tcpIn, oldTCP)
		expect("udp before", udpIn, oldUDP)

		// The reconciler replaces the backends: new backend and slot
		// first, then the old backend goes.
		addService(t, m, 1, vipT, newTCP)
		addService(t, m, 2, vipU, newUDP)
		if err := m.DeleteBackend(oldTCP.id); err != nil {
			t.Fatal(err)
		}
		if err := m.DeleteBackend(oldUDP.id); err != nil {
			t.Fatal(err)
		}
		tcpData := tcpIn
		tcpData.TCPFlags = packet.ACK
		// Counted as following a flow whose backend is gone, once per
		// packet: the IPv6 path follows the entry its first lookup found
		// (lb6_has_flow) and must carry that finding to the follow.
		gone := counters(t, d)["tc_ct_backend_gone"]
		expect("tcp after removal keeps its backend", tcpData, oldTCP)
		if n := counters(t, d)["tc_ct_backend_gone"] - gone; n != 1 {
			t.Errorf("tc_ct_backend_gone counted %d for a packet of a flow whose backend left, want 1", n)
		}
		expect("udp after removal re-balances", udpIn, newUDP)

		if err := m.FlushConntrack([]model.L4Addr{oldTCP.addr}); err != nil {
			t.Fatal(err)
		}
		// No entry names the old backend: as the NAT address of a
		// forward entry, or the source of a reverse one.
		names := func(dir uint8, src, nat netip.Addr) bool {
			return (dir == ctForward && nat == oldTCP.addr.Addr) || (dir == ctReverse && src == oldTCP.addr.Addr)
		}
		if v6 {
			var k tcCt6Key
			var v tcCt6Entry
			for _, cm := range []*ebpf.Map{d.tc.Sluice6ConntrackV1, d.tc.Sluice6CtNewV1} {
				for it := cm.Iterate(); it.Next(&k, &v); {
					if names(k.Dir, netip.AddrFrom16(k.Saddr.Addr), netip.AddrFrom16(v.NatAddr.Addr)) {
						t.Errorf("conntrack entry of %s survived FlushConntrack: %+v -> %+v", oldTCP.addr, k, v)
					}
				}
			}
		} else {
			var k sockCt4Key
			var v sockCt4Entry
			for _, cm := range ctMaps(m) {
				for it := cm.Iterate(); it.Next(&k, &v); {
					if names(k.Dir, addrFromBE32(k.Saddr), addrFromBE32(v.NatAddr)) {
						t.Errorf("conntrack entry of %s survived FlushConntrack: %+v -> %+v", oldTCP.addr, k, v)
					}
				}
			}
		}
		expect("tcp after flush", tcpData, newTCP)
	})
}

// TestTCConntrackTimeout: an idle UDP flow forgets its backend. Per
// family (twinAddr). The flow's idle time is made by moving its entries'
// expiry back past the timeout (no sleep: a short timeout with a sleep
// failed whenever the test stalled between two packets).
func TestTCConntrackTimeout(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		const timeout = 30 * time.Second
		d := openTestWith(t, smallConfig, func(cfg *Config) {
			cfg.CTTimeoutUDP = timeout
		})
		m := d.Maps()
		vip := twinL4(v6, vipUDP)
		a, b := testBackend{31, l4(twinAddr(v6, "10.1.3.1"), 5353, model.UDP)}, testBackend{32, l4(twinAddr(v6, "10.1.3.2"), 5353, model.UDP)}
		addService(t, m, 1, vip, a)
		in := udpDgram(twinAddr(v6, "10.0.0.4"), 42000, vip.Addr.String(), 53)
		dstOf := func() string {
			_, out := runProg(t, d.TCIngress(), in.Bytes())
			return outDst(out)
		}
		if got := dstOf(); got != a.addr.Addr.String() {
			t.Fatalf("first packet to %s", got)
		}
		// Slot 1 now names b, but a still exists: the live flow stays on a.
		if err := m.UpsertBackend(b.id, b.addr); err != nil {
			t.Fatal(err)
		}
		if err := m.UpsertSlot(reconciler.DefaultScope(vip), 1, b.id); err != nil {
			t.Fatal(err)
		}
		if got := dstOf(); got != a.addr.Addr.String() {
			t.Fatalf("live flow moved to %s", got)
		}
		client := twinAddr(v6, "10.0.0.4")
		for _, k := range []ctK{
			ctKeyOf(client, 42000, vip.Addr.String(), vip.Port, model.UDP, ctForward),
			ctKeyOf(a.addr.Addr.String(), a.addr.Port, client, 42000, model.UDP, ctReverse),
		} {
			if _, ok := twAlive(t, m, k); !ok {
				t.Fatalf("%s: no live entry after two packets", k)
			}
			twShift(t, m, k, -(timeout + time.Second))
		}
		if got := dstOf(); got != b.addr.Addr.String() {
			t.Fatalf("idle flow still sent to %s after its timeout", got)
		}
	})
}

// TestTCTruncated runs every prefix of valid packets to services (IPv4 and
// IPv6) through both programs: the output must be the unchanged prefix or
// a drop, never a rewrite of bytes that are not there.
func TestTCTruncated(t *testing.T) {
	d := newTestDatapath(t)
	applyServices(t, d, clusterIP(vipTCP, beTCP.addr), clusterIP(vipUDP, beUDP.addr), clusterIP(vipEmpty),
		clusterIP(vip6TCP, be6TCP), clusterIP(vip6UDP, be6UDP), clusterIP(vip6Empty))

	withOpts := tcpSYN("10.0.0.5", 43000, "10.96.0.10", 80)
	withOpts.IPOptions = []byte{1, 1, 1, 0}
	withExt := tcpSYN(client6, 43005, "2001:db8:96::10", 80)
	withExt.IPv6.Ext = []packet.ExtHeader{packet.HopByHopHeader(), packet.DestOptsHeader([]byte{0x1e, 2, 0, 0})}
	full := map[string][]byte{
		"tcp":         tcpSYN("10.0.0.5", 43001, "10.96.0.10", 80).Bytes(),
		"udp":         udpDgram("10.0.0.5", 43002, "10.96.0.11", 53).Bytes(),
		"tcp_options": withOpts.Bytes(),
		"no_backend":  tcpSYN("10.0.0.5", 43003, "10.96.0.12", 80).Bytes(),
		"reply":       packet.Packet{SrcMAC: nodeMAC, DstMAC: clientMAC, Src: addr("10.1.0.1"), Dst: addr("10.0.0.5"), SrcPort: 8080, DstPort: 43001, Proto: packet.TCP}.Bytes(),
		// IPv6 (tc6.h).
		"tcp6":        tcpSYN(client6, 43001, "2001:db8:96::10", 80).Bytes(),
		"udp6":        udpDgram(client6, 43002, "2001:db8:96::11", 53).Bytes(),
		"tcp6_ext":    withExt.Bytes(),
		"no_backend6": tcpSYN(client6, 43003, "2001:db8:96::12", 80).Bytes(),
		"reply6":      packet.Packet{SrcMAC: nodeMAC, DstMAC: clientMAC, Src: be6TCP.Addr, Dst: addr(client6), SrcPort: 8080, DstPort: 43001, Proto: packet.TCP}.Bytes(),
	}
	// Create the conntrack entries the "reply" packets match.
	runProg(t, d.TCIngress(), full["tcp"])
	runProg(t, d.TCIngress(), full["tcp6"])

	for name, p := range full {
		for _, fixLen := range []bool{false, true} {
			for n := 0; n < len(p); n++ {
				in := append([]byte(nil), p[:n]...)
				v6 := binary.BigEndian.Uint16(p[12:]) == packet.EtherTypeIPv6
				switch {
				case fixLen && v6 && n >= 14+6:
					// The same with the IPv6 payload length.
					binary.BigEndian.PutUint16(in[18:], uint16(n-14-40))
				case fixLen && !v6 && n >= 14+4:
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
					if (n < 14+20 || v6 && n < 14+40) && err != nil {
						// BPF_PROG_TEST_RUN refuses an IP frame
						// shorter than Ethernet plus a minimal
						// IP header (EINVAL): such lengths cannot
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
	applyServices(t, d, clusterIP(vipEmpty), clusterIP(vipEmptU))

	udpOpts := udpDgram("10.0.0.6", 44001, "10.96.0.12", 53)
	udpOpts.IPOptions = []byte{1, 1, 1, 0, 0x44, 8, 5, 0}
	big := tcpSYN("10.0.0.6", 44002, "10.96.0.12", 80)
	big.Payload = bytes.Repeat([]byte("x"), 1000)
	for name, p := range map[string]packet.Packet{
		"tcp_syn":         tcpSYN("10.0.0.6", 44000, "10.96.0.12", 80),
		"udp_ip_options":  udpOpts,
		"tcp_big_payload": big,
	} {
		t.Run(name, func(t *testing.T) {
			in := p.Bytes()
			verdict, out := runProg(t, d.TCIngress(), in)
			if verdict != tcActRedirect {
				t.Fatalf("verdict %d, want TC_ACT_REDIRECT (%d)", verdict, tcActRedirect)
			}
			// The quote: the original IPv4 header and the whole
			// fixed L4 header (at least the 8 bytes RFC 792 asks).
			ihl := 20 + len(p.IPOptions)
			l4len := 8
			if p.Proto == packet.TCP {
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
			if src, dst, want := netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20])), kernelRejectSrc("lo", p.Dst, p.Src); src != want || dst != p.Src {
				t.Errorf("reply %s -> %s, want %s -> %s", src, dst, want, p.Src)
			}
			// The IPv4 header and ICMP checksums, recomputed.
			checkChecksums(t, out)
			icmp := out[34:]
			if icmp[0] != 3 || icmp[1] != 3 {
				t.Errorf("ICMP type %d code %d, want 3/3 (port unreachable)", icmp[0], icmp[1])
			}
			if !bytes.Equal(icmp[4:8], []byte{0, 0, 0, 0}) {
				t.Errorf("ICMP unused field %x, want zero", icmp[4:8])
			}
			if !bytes.Equal(icmp[8:], quote) {
				t.Errorf("quoted bytes\n got %x\nwant %x", icmp[8:], quote)
			}
		})
	}
	cs := counters(t, d)
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
	// IPv4: addresses at 26..34 (and the header checksum before them),
	// L4 after the options.
	addrs, l4, proto := [2]int{24, 34}, 14+int(a[14]&0xf)*4, a[23]
	if binary.BigEndian.Uint16(a[12:]) == packet.EtherTypeIPv6 {
		// IPv6: addresses at 22..54, L4 after the extension headers.
		addrs, l4, proto = [2]int{22, 54}, 54, a[20]
		for (proto == packet.HopByHop || proto == packet.DestOpts) && l4+2 <= len(a) {
			proto, l4 = a[l4], l4+(int(a[l4+1])+1)*8
		}
	}
	csum := l4 + 16
	if proto == 17 {
		csum = l4 + 6
	}
	for i := range a {
		natField := (i >= addrs[0] && i < addrs[1]) || (i >= l4 && i < l4+4) || (i >= csum && i < csum+2)
		if a[i] != b[i] && !natField {
			return false
		}
	}
	return true
}

// twoFrontends is a datapath with two ClusterIP frontends A and B of the
// family v6 says (port fePort), each with one backend (port bePort).
func twoFrontends(t *testing.T, v6 bool, fePort, bePort uint16, proto model.Protocol) (d *Datapath, feA, feB, beA, beB model.L4Addr) {
	t.Helper()
	d = newTestDatapath(t)
	feA, feB = twinL4(v6, l4("10.96.0.20", fePort, proto)), twinL4(v6, l4("10.96.0.21", fePort, proto))
	beA, beB = twinL4(v6, l4("10.1.3.1", bePort, proto)), twinL4(v6, l4("10.1.3.2", bePort, proto))
	applyServices(t, d, clusterIP(feA, beA), clusterIP(feB, beB))
	return d, feA, feB, beA, beB
}

// dstAt and srcFrom rewrite a packet's destination or source to a, for a
// case's out.
func dstAt(a model.L4Addr) func(*packet.Packet) {
	return func(p *packet.Packet) { p.Dst, p.DstPort = a.Addr, a.Port }
}

func srcFrom(a model.L4Addr) func(*packet.Packet) {
	return func(p *packet.Packet) { p.Src, p.SrcPort = a.Addr, a.Port }
}

// TestTCReplyToFrontend: tc's ingress looks a packet to a frontend up as
// its flow's first, and as a reply only when it has no flow (tc_ingress
// in bpf/tc.c says why that order is sound). Two flows meet where a
// client's address and port are a frontend's (UDP: a resolver that
// forwards queries from its own port 53; two Services, A and B):
//
//   - the reply of a flow whose client is B's frontend, addressed to
//     <B>, is still a reply: its source becomes A's frontend, and it is
//     not taken for a new flow to B;
//   - a flow to B from A's frontend, whose reply tuple is the tuple of an
//     established flow to A (from B's backend), does not take that
//     flow's packets: the older flow keeps them, as netfilter keeps a
//     tuple to one flow.
func TestTCReplyToFrontend(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		d, feA, feB, beA, beB := twoFrontends(t, v6, 53, 53, model.UDP)
		dgram := func(from, to model.L4Addr) packet.Packet {
			return udpDgram(from.Addr.String(), from.Port, to.Addr.String(), to.Port)
		}
		at, from := dstAt, srcFrom
		runPacketCases(t, d, []packetCase{
			// B's frontend asks A: DNAT to A's backend.
			{name: "request_from_frontend", in: dgram(feB, feA), verdict: tcActOK, out: with(dgram(feB, feA), at(beA))},
			// A's backend answers <beA -> feB>: a reply, not a flow
			// to B.
			{name: "reply_to_frontend", in: dgram(beA, feB), verdict: tcActOK, out: with(dgram(beA, feB), from(feA))},
			// B's backend asks A, from its own port: a flow to A.
			{name: "backend_asks_a", in: dgram(beB, feA), verdict: tcActOK, out: with(dgram(beB, feA), at(beA))},
			// A's frontend, as a client, asks B: its reply tuple
			// <beB -> feA> is the flow above's.
			{name: "frontend_asks_b", in: dgram(feA, feB), verdict: tcActOK, out: with(dgram(feA, feB), at(beB))},
			// B's backend asks A again: its flow's, to A's backend,
			// not a reply of the newer flow from A's frontend.
			{name: "backend_asks_a_again", in: dgram(beB, feA), verdict: tcActOK, out: with(dgram(beB, feA), at(beA))},
		})
	})
}

// TestTCSynToFrontendIsNotAReply checks that a pure TCP SYN addressed to
// a frontend starts a flow to it even where its tuple is a live flow's
// reply tuple (tc_ingress does not look it up as a reply: a backend
// answers with a SYN-ACK, never a pure SYN), while that flow's SYN-ACK
// and ACK, addressed to the same frontend, are still its replies.
func TestTCSynToFrontendIsNotAReply(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		d, feA, feB, beA, beB := twoFrontends(t, v6, 80, 8080, model.TCP)
		seg := func(from, to model.L4Addr, flags uint8) packet.Packet {
			return tcpPacket(from.Addr.String(), from.Port, to.Addr.String(), to.Port, flags, nil)
		}
		at, from := dstAt, srcFrom
		runPacketCases(t, d, []packetCase{
			// B's frontend, as a client, opens a connection to A.
			{name: "syn_from_frontend", in: seg(feB, feA, packet.SYN), verdict: tcActOK, out: with(seg(feB, feA, packet.SYN), at(beA))},
			// A's backend answers <beA -> feB>: a reply.
			{name: "synack_to_frontend", in: seg(beA, feB, packet.SYN|packet.ACK), verdict: tcActOK, out: with(seg(beA, feB, packet.SYN|packet.ACK), from(feA))},
			{name: "ack_to_frontend", in: seg(beA, feB, packet.ACK), verdict: tcActOK, out: with(seg(beA, feB, packet.ACK), from(feA))},
			// A pure SYN on that reply tuple opens a connection to B.
			{name: "syn_to_frontend", in: seg(beA, feB, packet.SYN), verdict: tcActOK, out: with(seg(beA, feB, packet.SYN), at(beB))},
		})
	})
}

// TestTCOtherProtocols: a packet of another protocol than TCP and UDP
// (ICMP echo, GRE, SCTP, none of which Sluice serves) to a ClusterIP is
// rejected with the ICMP (ICMPv6) port unreachable kube-proxy's nftables
// mode sends (its cluster-ips-check chain: `ip daddr @cluster-ips
// reject`, for new connections), quoting the IP header and 8 bytes of
// the packet; one to an unallocated address of the service CIDR is
// dropped; a later fragment to a ClusterIP, which has no header to quote,
// is dropped. What conntrack would not call a new connection (an echo
// reply) passes, as it does kube-proxy's `ct state new` match, and so do
// packets to an ExternalIP, a LoadBalancer IP (that set holds ClusterIPs
// only) or an address that is no service's. At egress (the node's own
// packets) nothing is rejected: see the README. Per family.
func TestTCOtherProtocols(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		tw := twinOf(v6)
		d := openTestWith(t, smallConfig, func(c *Config) { c.ServiceCIDRs = []netip.Prefix{twinPrefix(v6, "10.96.0.0/16")} })
		ext := func(kind model.FrontendKind, fe string) *model.Service {
			f := l4(tw(fe), 80, model.TCP)
			return &model.Service{Name: model.ServicePortName{Namespace: "test", Name: fe}, Kind: kind, Frontend: f,
				Backends: []model.Backend{{L4Addr: l4(tw("10.1.0.1"), 8080, model.TCP)}}}
		}
		applyServices(t, d, clusterIP(l4(tw("10.96.0.10"), 80, model.TCP), l4(tw("10.1.0.1"), 8080, model.TCP)),
			ext(model.ExternalIP, "192.0.2.10"), ext(model.LoadBalancer, "192.0.2.11"))

		echo, echoReply, icmpProto := packet.ICMPEcho, packet.ICMPEchoReply, packet.ICMP
		if v6 {
			echo, echoReply, icmpProto = packet.ICMPv6EchoRequest, packet.ICMPv6EchoReply, packet.ICMPv6
		}
		pkt := func(dst string, proto, typ uint8) packet.Packet {
			p := packet.Packet{SrcMAC: clientMAC, DstMAC: nodeMAC, Src: addr(tw("10.0.0.1")), Dst: addr(tw(dst)), Proto: proto,
				Payload: []byte("sluice says hello")}
			if proto == icmpProto {
				p.ICMPType = typ
				binary.BigEndian.PutUint32(p.ICMPRest[:], 0x12340001) // id, sequence
			}
			return p
		}
		// The ICMP error kube-proxy's reject sends about in (its
		// quote: the IP header and 8 bytes).
		rejected := func(in packet.Packet) *packet.Packet {
			hdr, typ, code := 20, packet.ICMPUnreachable, uint8(3)
			if v6 {
				hdr, typ, code = 40, packet.ICMPv6Unreachable, packet.ICMPv6PortUnreach
			}
			return &packet.Packet{SrcMAC: in.DstMAC, DstMAC: in.SrcMAC, Src: kernelRejectSrc("lo", in.Dst, in.Src), Dst: in.Src, Proto: icmpProto,
				ICMPType: typ, ICMPCode: code, Payload: in.L3()[:hdr+8]}
		}
		later := pkt("10.96.0.10", 47, 0)
		if v6 {
			later.IPv6.Ext = []packet.ExtHeader{packet.FragmentHeader(185, false, 9)}
		} else {
			later.FragOff = 185
		}
		const gre, sctp = 47, 132
		runPacketCases(t, d, []packetCase{
			{name: "icmp_echo_to_clusterip_rejected", in: pkt("10.96.0.10", icmpProto, echo), verdict: tcActRedirect,
				out: rejected(pkt("10.96.0.10", icmpProto, echo))},
			{name: "gre_to_clusterip_rejected", in: pkt("10.96.0.10", gre, 0), verdict: tcActRedirect, out: rejected(pkt("10.96.0.10", gre, 0))},
			{name: "sctp_to_clusterip_rejected", in: pkt("10.96.0.10", sctp, 0), verdict: tcActRedirect, out: rejected(pkt("10.96.0.10", sctp, 0))},
			{name: "later_fragment_to_clusterip_dropped", in: later, verdict: tcActShot},
			{name: "icmp_echo_to_unallocated_dropped", in: pkt("10.96.5.5", icmpProto, echo), verdict: tcActShot},
			{name: "gre_to_unallocated_dropped", in: pkt("10.96.5.5", gre, 0), verdict: tcActShot},
			{name: "icmp_echo_reply_to_clusterip_untouched", in: pkt("10.96.0.10", icmpProto, echoReply), verdict: tcActOK},
			{name: "icmp_echo_to_externalip_untouched", in: pkt("192.0.2.10", icmpProto, echo), verdict: tcActOK},
			{name: "icmp_echo_to_lb_ip_untouched", in: pkt("192.0.2.11", icmpProto, echo), verdict: tcActOK},
			{name: "gre_to_externalip_untouched", in: pkt("192.0.2.10", gre, 0), verdict: tcActOK},
			{name: "icmp_echo_beyond_service_cidr_untouched", in: pkt("10.97.0.1", icmpProto, echo), verdict: tcActOK},
			{name: "icmp_echo_to_clusterip_at_egress_untouched", egress: true, in: pkt("10.96.0.10", icmpProto, echo), verdict: tcActOK},
		})
		expectCounted(t, d, "tc_unknown_port", "tc_service_cidr_drop")
	})
}

// TestTCRejectAnswersWhomTheKernelWould: the ICMP (ICMPv6) port
// unreachable tc sends in place of kube-proxy's reject goes only where
// the kernel would send it. A frame to a link-layer broadcast or
// multicast address (pkt_type, which BPF_PROG_TEST_RUN's eth_type_trans
// sets from the destination MAC) and a packet from a source that names no
// single host (0.0.0.0/8, 127/8, 224/4, 255.255.255.255; ::, ::1,
// ff00::/8: RFC 1122 3.2.2, RFC 4443 2.4(e)) are dropped untouched,
// counted as the reason (tc_unknown_port, tc_no_backend), never as
// tc_rewrite_err; otherwise every node on a segment answers a broadcast
// frame. A packet of another protocol with less than 8 bytes after its
// headers (IPv4 GRE with 4, IPv6 next header 59 with none) is answered
// quoting what it has, and padding after it is not quoted. Per family.
func TestTCRejectAnswersWhomTheKernelWould(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		tw := twinOf(v6)
		d := openTest(t, smallConfig(testPinDir(t)))
		applyServices(t, d, clusterIP(l4(tw("10.96.0.10"), 80, model.TCP), l4(tw("10.1.0.1"), 8080, model.TCP)),
			clusterIP(l4(tw("10.96.0.11"), 80, model.TCP)))

		const gre, noNext = 47, 59
		icmpProto, hdr := packet.ICMP, 20
		if v6 {
			icmpProto, hdr = packet.ICMPv6, 40
		}
		pkt := func(src, dst string, proto uint8, payload []byte) packet.Packet {
			p := packet.Packet{SrcMAC: clientMAC, DstMAC: nodeMAC, Src: addr(src), Dst: addr(dst), Proto: proto, Payload: payload}
			if proto == packet.TCP {
				p.SrcPort, p.DstPort = 40000, 80
			}
			return p
		}
		hello := []byte("sluice says hello")
		// The port unreachable the kernel sends about in: its quote is
		// the IP header and 8 bytes, or what the packet has.
		rejected := func(in packet.Packet) *packet.Packet {
			typ, code := packet.ICMPUnreachable, uint8(3)
			if v6 {
				typ, code = packet.ICMPv6Unreachable, packet.ICMPv6PortUnreach
			}
			l3 := in.L3()
			return &packet.Packet{SrcMAC: in.DstMAC, DstMAC: in.SrcMAC, Src: kernelRejectSrc("lo", in.Dst, in.Src), Dst: in.Src, Proto: icmpProto,
				ICMPType: typ, ICMPCode: code, Payload: l3[:min(len(l3), hdr+8)]}
		}
		client := tw("10.0.0.1")
		bcast, mcast := [6]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, [6]byte{0x01, 0x00, 0x5e, 0, 0, 1}
		if v6 {
			mcast = [6]byte{0x33, 0x33, 0, 0, 0, 1}
		}
		withMAC := func(p packet.Packet, mac [6]byte) packet.Packet { p.DstMAC = mac; return p }
		unserved := pkt(client, tw("10.96.0.10"), packet.TCP, nil)
		unserved.DstPort = 81
		badSources := []string{"0.0.0.0", "0.1.2.3", "127.0.0.1", "224.0.0.1", "239.255.255.255", "255.255.255.255"}
		if v6 {
			badSources = []string{"::", "::1", "ff02::1", "ff0e::1"}
		}

		cases := []packetCase{
			// The guards let the ordinary reject through (as TestTCOtherProtocols).
			{name: "gre_from_unicast_rejected", in: pkt(client, tw("10.96.0.10"), gre, hello), verdict: tcActRedirect,
				out: rejected(pkt(client, tw("10.96.0.10"), gre, hello))},
		}
		for _, mac := range []struct {
			name string
			mac  [6]byte
		}{{"broadcast", bcast}, {"multicast", mcast}} {
			cases = append(cases,
				packetCase{name: "gre_to_" + mac.name + "_mac_dropped", in: withMAC(pkt(client, tw("10.96.0.10"), gre, hello), mac.mac), verdict: tcActShot},
				packetCase{name: "tcp_unserved_port_to_" + mac.name + "_mac_dropped",
					in: withMAC(unserved, mac.mac), verdict: tcActShot},
				packetCase{name: "tcp_no_backend_to_" + mac.name + "_mac_dropped",
					in: withMAC(pkt(client, tw("10.96.0.11"), packet.TCP, nil), mac.mac), verdict: tcActShot})
		}
		for _, src := range badSources {
			cases = append(cases,
				packetCase{name: "gre_from_" + src + "_dropped", in: pkt(src, tw("10.96.0.10"), gre, hello), verdict: tcActShot},
				packetCase{name: "tcp_no_backend_from_" + src + "_dropped", in: pkt(src, tw("10.96.0.11"), packet.TCP, nil), verdict: tcActShot})
		}
		// A packet with less than 8 bytes after its IP header(s): quoted whole.
		short := pkt(client, tw("10.96.0.10"), gre, []byte{0, 0, 0x08, 0})
		if v6 {
			short = pkt(client, tw("10.96.0.10"), noNext, nil)
		}
		cases = append(cases, packetCase{name: "short_payload_rejected", in: short, verdict: tcActRedirect, out: rejected(short)})
		runPacketCases(t, d, cases)

		// The same, padded to Ethernet's 60 bytes (as a NIC delivers it):
		// the padding is not quoted.
		t.Run("short_payload_padded_rejected", func(t *testing.T) {
			in := short.Bytes()
			in = append(in, make([]byte, max(0, 60-len(in)))...)
			in = append(in, 0xee, 0xee, 0xee, 0xee)
			verdict, out := runProg(t, d.TCIngress(), in)
			if want := rejected(short).Bytes(); verdict != tcActRedirect || !bytes.Equal(out, want) {
				t.Fatalf("verdict %d, output packet\n got %x\nwant %x", verdict, out, want)
			}
		})

		cs := expectCounted(t, d, "tc_unknown_port", "tc_no_backend")
		if cs["tc_rewrite_err"] != 0 {
			t.Errorf("tc_rewrite_err %d, want 0", cs["tc_rewrite_err"])
		}
	})
}
