package datapath

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/internal/testutil/packet"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// Packet tables for the tc programs' IPv6 path (bpf/lib/tc6.h), beside the
// IPv4 ones (tc_test.go): services programmed through reconciler.Apply,
// packets from internal/testutil/packet, whose checksums (over the IPv6
// pseudo-header) are computed from scratch, so a byte-for-byte match
// proves the incremental updates exact.

var (
	vip6TCP   = l4("2001:db8:96::10", 80, model.TCP)
	vip6UDP   = l4("2001:db8:96::11", 53, model.UDP)
	vip6Empty = l4("2001:db8:96::12", 80, model.TCP)
	be6TCP    = l4("2001:db8:1::1", 8080, model.TCP)
	be6UDP    = l4("2001:db8:1::3", 5353, model.UDP)
	client6   = "2001:db8::1"
)

// v6Step is an edgeStep that also names the counter it must move (""
// for none checked).
type v6Step struct {
	edgeStep
	counted string
}

func runV6Steps(t *testing.T, d *Datapath, steps []v6Step) {
	t.Helper()
	for _, s := range steps {
		before := counters(t, d)
		runEdgeSteps(t, d, []edgeStep{s.edgeStep})
		if s.counted != "" && counters(t, d)[s.counted] != before[s.counted]+1 {
			t.Errorf("%s: counter %s did not move by 1", s.name, s.counted)
		}
		// (A fragment's L4 checksum is its datagram's: the byte
		// comparison checks it.)
		if p, err := packet.Parse(s.want); s.want != nil && (err != nil || !slices.ContainsFunc(p.IPv6.Ext, isFragment)) {
			checkChecksums(t, s.want)
		}
	}
}

// isFragment says whether e is the fragment header of a fragment (not an
// atomic one).
func isFragment(e packet.ExtHeader) bool {
	off, more, ok := e.FragOffset()
	return ok && (off != 0 || more)
}

// icmp6Unreachable is the ICMPv6 port unreachable tc answers in with:
// from where the kernel's reject would come (kernelRejectSrc) to its source, back to the client's MAC,
// quoting in from its IPv6 header to the end of its fixed L4 header.
func icmp6Unreachable(in packet.Packet) []byte {
	l3 := in.L3()
	n := len(l3) - len(in.Payload)
	return frame(clientMAC, nodeMAC, packet.Packet{Src: kernelRejectSrc("lo", in.Dst, in.Src), Dst: in.Src, Proto: packet.ICMPv6,
		ICMPType: packet.ICMPv6Unreachable, ICMPCode: packet.ICMPv6PortUnreach, Payload: l3[:n]})
}

// dnat6 is p sent to backend be.
func dnat6(p packet.Packet, be model.L4Addr) packet.Packet {
	return p.With(func(p *packet.Packet) { p.Dst, p.DstPort = be.Addr, be.Port })
}

func TestTC6PacketTable(t *testing.T) {
	d := newTestDatapath(t)
	applyServices(t, d, clusterIP(vip6TCP, be6TCP), clusterIP(vip6UDP, be6UDP), clusterIP(vip6Empty))

	data := []byte("sluice says hello")
	syn := tcpPacket(client6, 40000, "2001:db8:96::10", 80, 0, nil)
	ack := tcpPacket(client6, 40000, "2001:db8:96::10", 80, packet.ACK|packet.PSH, data)
	reply := tcpPacket("2001:db8:1::1", 8080, client6, 40000, packet.ACK, data)
	udp := udpPacket(client6, 5300, "2001:db8:96::11", 53, data)
	udpReply := udpPacket("2001:db8:1::3", 5353, client6, 5300, data)
	ext := func(p packet.Packet, hs ...packet.ExtHeader) packet.Packet {
		return p.With(func(p *packet.Packet) { p.IPv6.Ext = hs })
	}
	hbh := packet.HopByHopHeader([]byte{5, 2, 0, 0}) // router alert
	dst := packet.DestOptsHeader()
	synExt := ext(tcpPacket(client6, 40001, "2001:db8:96::10", 80, 0, nil), hbh, dst)
	atomic := ext(udpPacket(client6, 5301, "2001:db8:96::11", 53, data), packet.FragmentHeader(0, false, 9))
	// A datagram in fragments, and what they become: the first carries
	// the UDP checksum of the whole datagram, the later ones only their
	// addresses change.
	dgram := udpPacket(client6, 5302, "2001:db8:96::11", 53, bytes.Repeat([]byte("0123456789abcdef"), 190))
	dgram.ID = 10
	frags, dnatFrags := dgram.Fragments(1232), dnat6(dgram, be6UDP).Fragments(1232)
	stray := frags[1].With(func(p *packet.Packet) { p.Src = addr("2001:db8::9") })
	ah := ext(tcpPacket(client6, 40002, "2001:db8:96::10", 80, 0, nil), packet.ExtHeader{Type: 51, Data: []byte{2, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0}})
	var long []packet.ExtHeader
	for range 7 {
		long = append(long, packet.DestOptsHeader())
	}
	tooLong := ext(tcpPacket(client6, 40003, "2001:db8:96::10", 80, 0, nil), long...)
	emptySyn := tcpPacket(client6, 40004, "2001:db8:96::12", 80, 0, nil)
	emptyUDPExt := ext(tcpPacket(client6, 40005, "2001:db8:96::12", 80, 0, nil), hbh)
	otherPort := tcpPacket(client6, 40006, "2001:db8:96::10", 81, 0, nil)
	noCsum := udp.With(func(p *packet.Packet) { p.SrcPort, p.NoUDPChecksum = 5303, true })

	// Malformed: an extension header running past the payload; a
	// payload length beyond the frame; a TCP header cut short.
	overrun := ether(synExt)
	overrun[14+40+1] = 200
	truncated := ether(syn)
	truncated = truncated[:len(truncated)-4]
	shortTCP := ether(syn.With(func(p *packet.Packet) { p.RawL4 = make([]byte, 12) }))

	// ICMPv6 errors quote an IPv6 header and 8 bytes of the packet they
	// are about, as it was where it failed.
	icmp6 := func(src, dst netip.Addr, typ, code uint8, rest uint32, about packet.Packet) packet.Packet {
		p := packet.Packet{Src: src, Dst: dst, Proto: packet.ICMPv6, ICMPType: typ, ICMPCode: code, Payload: about.L3()[:48]}
		binary.BigEndian.PutUint32(p.ICMPRest[:], rest)
		return p
	}
	router, c6 := addr("2001:db8:1::fe"), addr(client6)
	echo6 := packet.Packet{Src: c6, Dst: vip6TCP.Addr, Proto: packet.ICMPv6, ICMPType: packet.ICMPv6EchoRequest}
	revUDP := udpReply.With(func(p *packet.Packet) { p.Src, p.SrcPort = vip6UDP.Addr, 53 })

	runV6Steps(t, d, []v6Step{
		{edgeStep{"TCP SYN to the VIP: DNAT", false, ether(syn), tcActOK, ether(dnat6(syn, be6TCP))}, "tc_dnat_new"},
		{edgeStep{"the flow's next segment: conntrack", false, ether(ack), tcActOK, ether(dnat6(ack, be6TCP))}, "tc_dnat_ct"},
		{edgeStep{"the backend's reply at egress: reverse NAT", true, frame(clientMAC, nodeMAC, reply), tcActOK,
			frame(clientMAC, nodeMAC, reply.With(func(p *packet.Packet) { p.Src, p.SrcPort = vip6TCP.Addr, 80 }))}, "tc_rev_nat"},
		{edgeStep{"UDP to the VIP: DNAT", false, ether(udp), tcActOK, ether(dnat6(udp, be6UDP))}, "tc_dnat_new"},
		{edgeStep{"the UDP reply through ingress: reverse NAT", false, ether(udpReply), tcActOK,
			ether(udpReply.With(func(p *packet.Packet) { p.Src, p.SrcPort = vip6UDP.Addr, 53 }))}, "tc_rev_nat"},
		{edgeStep{"hop-by-hop and destination options before TCP: DNAT", false, ether(synExt), tcActOK, ether(dnat6(synExt, be6TCP))}, "tc_dnat_new"},
		{edgeStep{"an atomic fragment: DNAT", false, ether(atomic), tcActOK, ether(dnat6(atomic, be6UDP))}, "tc_dnat_new"},
		{edgeStep{"a first fragment: DNAT, its checksum the whole datagram's", false, ether(frags[0]), tcActOK, ether(dnatFrags[0])}, "tc_dnat_new"},
		{edgeStep{"a later fragment: its first's translation", false, ether(frags[1]), tcActOK, ether(dnatFrags[1])}, "tc_frag_later"},
		{edgeStep{"the last fragment: the same", false, ether(frags[2]), tcActOK, ether(dnatFrags[2])}, "tc_frag_later"},
		{edgeStep{"a later fragment whose first was not seen: passed", false, ether(stray), tcActOK, nil}, "tc_fragment"},
		{edgeStep{"an authentication header: passed", false, ether(ah), tcActOK, nil}, "tc6_ext_hdr"},
		{edgeStep{"seven extension headers: passed", false, ether(tooLong), tcActOK, nil}, "tc6_ext_hdr"},
		{edgeStep{"an extension header past the payload: passed", false, overrun, tcActOK, nil}, "tc_malformed"},
		{edgeStep{"payload length beyond the frame: passed", false, truncated, tcActOK, nil}, "tc_malformed"},
		{edgeStep{"a TCP header cut short: passed", false, shortTCP, tcActOK, nil}, "tc_malformed"},
		{edgeStep{"UDP without a checksum: passed", false, ether(noCsum), tcActOK, nil}, "tc6_udp_no_csum"},
		{edgeStep{"a service without endpoints: ICMPv6 port unreachable", false, ether(emptySyn), tcActRedirect, icmp6Unreachable(emptySyn)}, "tc_no_backend"},
		{edgeStep{"the same, quoting its extension headers", false, ether(emptyUDPExt), tcActRedirect, icmp6Unreachable(emptyUDPExt)}, "tc_no_backend"},
		{edgeStep{"a ClusterIP on a port it does not serve: ICMPv6 port unreachable", false, ether(otherPort), tcActRedirect, icmp6Unreachable(otherPort)}, "tc_unknown_port"},
		{edgeStep{"an address that is no service: passed", false, ether(tcpPacket(client6, 40007, "2001:db8:5::1", 80, 0, nil)), tcActOK, nil}, ""},
		{edgeStep{"an error about a request, from the backend: from the frontend, about the request to it", true,
			ether(icmp6(be6TCP.Addr, c6, packet.ICMPv6Unreachable, packet.ICMPv6PortUnreach, 0, dnat6(syn, be6TCP))), tcActOK,
			ether(icmp6(vip6TCP.Addr, c6, packet.ICMPv6Unreachable, packet.ICMPv6PortUnreach, 0, syn))}, "tc_icmp_xlate"},
		{edgeStep{"a packet too big about a request, from a router: about the request to the frontend", true,
			ether(icmp6(router, c6, packet.ICMPv6PacketTooBig, 0, 1280, dnat6(udp, be6UDP))), tcActOK,
			ether(icmp6(router, c6, packet.ICMPv6PacketTooBig, 0, 1280, udp))}, "tc_icmp_xlate"},
		{edgeStep{"an error about a reply, to the frontend: to the backend, about its reply (UDP checksum kept exact)", false,
			ether(icmp6(c6, vip6UDP.Addr, packet.ICMPv6Unreachable, packet.ICMPv6PortUnreach, 0, revUDP)), tcActOK,
			ether(icmp6(c6, be6UDP.Addr, packet.ICMPv6Unreachable, packet.ICMPv6PortUnreach, 0, udpReply))}, "tc_icmp_xlate"},
		{edgeStep{"an error about no flow: passed", true,
			ether(icmp6(router, c6, packet.ICMPv6TimeExceeded, 0, 0, tcpPacket(client6, 1, "2001:db8:5::1", 80, 0, nil))), tcActOK, nil}, ""},
		{edgeStep{"an echo request to a ClusterIP: ICMPv6 port unreachable (TestTCOtherProtocols)", false,
			ether(echo6), tcActRedirect, icmp6Unreachable(echo6)}, "tc_unknown_port"},
		{edgeStep{"IPv4 still translated", false, ether(tcpPacket("10.0.0.1", 40000, "10.96.0.99", 80, 0, nil)), tcActOK, nil}, ""},
	})
}

// The ICMPv6 error is the one a receiver takes: the exact bytes RFC 4443
// describes, its checksum over the pseudo-header verified from scratch.
func TestTC6UnreachableMessage(t *testing.T) {
	d := newTestDatapath(t)
	applyServices(t, d, clusterIP(vip6Empty))
	in := tcpPacket(client6, 40010, "2001:db8:96::12", 80, 0, []byte("ignored payload"))
	verdict, out := runProg(t, d.TCIngress(), ether(in))
	if verdict != tcActRedirect {
		t.Fatalf("verdict %d, want redirect", verdict)
	}
	out = out[:len(icmp6Unreachable(in))]
	got, err := packet.Parse(out)
	if err != nil {
		t.Fatal(err)
	}
	if src := kernelRejectSrc("lo", in.Dst, in.Src); got.Src != src || got.Dst != in.Src || got.Proto != packet.ICMPv6 || got.ICMPType != 1 || got.ICMPCode != 4 || got.TTL != 64 {
		t.Errorf("ICMPv6 %s -> %s proto %d type %d code %d hops %d, want %s -> %s 58 type 1 code 4 hops 64",
			got.Src, got.Dst, got.Proto, got.ICMPType, got.ICMPCode, got.TTL, src, in.Src)
	}
	if q := in.L3()[:40+20]; !bytes.Equal(got.Payload, q) {
		t.Errorf("quote %x, want the IPv6 and TCP headers %x", got.Payload, q)
	}
	checkChecksums(t, out)
}

// count6 is the number of entries of an IPv6 conntrack table.
func count6(t *testing.T, m *ebpf.Map) int {
	t.Helper()
	return mapLen(t, m)
}

// mapLen is the number of entries of the hash map m, by iteration.
func mapLen(t *testing.T, m *ebpf.Map) int {
	t.Helper()
	k, v := make([]byte, m.KeySize()), make([]byte, m.ValueSize())
	n := 0
	it := m.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestTC6Conntrack: an IPv6 flow keeps its backend (conntrack), its first
// reply and its client's ACK after it make it established, a Service emptied of endpoints keeps it
// while refusing new flows with ICMPv6, a flush of its backend forgets it,
// and the GC deletes expired IPv6 entries and keeps live ones.
func TestTC6Conntrack(t *testing.T) {
	// No half-open share: the flows go through sluice_ct_new and are
	// moved out of it by their first reply, whose counts this checks
	// (TestHalfOpenPromotedInPlace covers the share).
	d := openTestWith(t, smallConfig, func(c *Config) { c.CTHalfOpenMax = -1 })
	m := d.Maps()
	vip := l4("2001:db8:96::20", 80, model.TCP)
	var bes []model.L4Addr
	for i := range 8 {
		bes = append(bes, l4(fmt.Sprintf("2001:db8:1::%d", 0x20+i), 8080, model.TCP))
	}
	applyServices(t, d, clusterIP(vip, bes...))

	flowBackend := map[uint16]netip.Addr{}
	for port := uint16(41000); port < 41016; port++ {
		syn := tcpPacket(client6, port, "2001:db8:96::20", 80, 0, nil)
		_, out := runProg(t, d.TCIngress(), ether(syn))
		got, err := packet.Parse(out)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(bes, l4(got.Dst.String(), got.DstPort, model.TCP)) {
			t.Fatalf("SYN sent to [%s]:%d, no backend", got.Dst, got.DstPort)
		}
		flowBackend[port] = got.Dst
		for range 4 {
			ack := tcpPacket(client6, port, "2001:db8:96::20", 80, packet.ACK, []byte("more"))
			if _, out := runProg(t, d.TCIngress(), ether(ack)); !bytes.Equal(out[:len(ether(ack))], ether(ack.With(func(p *packet.Packet) { p.Dst, p.DstPort = got.Dst, 8080 }))) {
				t.Fatalf("flow from port %d left its backend %s", port, got.Dst)
			}
		}
	}
	if n := count6(t, d.tc.Sluice6CtNewV1); n != 2*16 {
		t.Errorf("%d half-open IPv6 entries, want 32 (a forward and a reply entry per flow)", n)
	}

	// The first flow's reply, then its client's ACK, make it
	// established: answered, a TCP flow stays in sluice_ct_new until
	// its client's ACK assures it (bpf/lib/conntrack.h, ct_assure).
	first := uint16(41000)
	be := flowBackend[first]
	reply := tcpPacket(be.String(), 8080, client6, first, packet.SYN|packet.ACK, nil)
	if v, out := runProg(t, d.TCEgress(), ether(reply)); v != tcActOK || !bytes.Equal(out[:len(ether(reply))], ether(reply.With(func(p *packet.Packet) { p.Src, p.SrcPort = vip.Addr, 80 }))) {
		t.Fatalf("reply not translated back (verdict %d)", v)
	}
	handshake := tcpPacket(client6, first, "2001:db8:96::20", 80, packet.ACK, nil)
	if v, _ := runProg(t, d.TCIngress(), ether(handshake)); v != tcActOK {
		t.Fatalf("the client's ACK: verdict %d", v)
	}
	if n := count6(t, d.tc.Sluice6ConntrackV1); n != 2 {
		t.Errorf("%d established IPv6 entries, want 2", n)
	}

	// No endpoints left: the established flow goes on, a new one is
	// refused.
	applyServices(t, d, clusterIP(vip))
	ack := tcpPacket(client6, first, "2001:db8:96::20", 80, packet.ACK, []byte("still here"))
	if v, out := runProg(t, d.TCIngress(), ether(ack)); v != tcActOK || !bytes.Equal(out[:len(ether(ack))], ether(ack.With(func(p *packet.Packet) { p.Dst, p.DstPort = be, 8080 }))) {
		t.Errorf("established flow not kept on its backend after the Service emptied (verdict %d)", v)
	}
	fresh := tcpPacket(client6, 42000, "2001:db8:96::20", 80, 0, nil)
	want := icmp6Unreachable(fresh)
	if v, out := runProg(t, d.TCIngress(), ether(fresh)); v != tcActRedirect || !bytes.Equal(out[:len(want)], want) {
		t.Errorf("new flow to the emptied Service: verdict %d, %s", v, packet.Diff(out[:min(len(out), len(want))], want))
	}

	// A flush of the first flow's backend forgets its entries only.
	before := count6(t, d.tc.Sluice6ConntrackV1) + count6(t, d.tc.Sluice6CtNewV1)
	if err := m.FlushConntrack([]model.L4Addr{l4(be.String(), 8080, model.TCP)}); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, b := range flowBackend {
		if b == be {
			n++
		}
	}
	if after := count6(t, d.tc.Sluice6ConntrackV1) + count6(t, d.tc.Sluice6CtNewV1); after != before-2*n {
		t.Errorf("flush of %s: %d IPv6 entries left of %d, want %d", be, after, before, before-2*n)
	}

	// The GC deletes an expired entry and keeps the live ones.
	now, err := monotonicNow()
	if err != nil {
		t.Fatal(err)
	}
	dead := tcCt6Key{Saddr: tcV6addr{Addr: addr("2001:db8::99").As16()}, Daddr: tcV6addr{Addr: vip.Addr.As16()}, Sport: be16(1), Dport: be16(80), Proto: uint8(model.TCP)}
	if err := d.tc.Sluice6ConntrackV1.Put(&dead, &tcCt6Entry{Expires: now - 1, Flags: ctFlagReplied, NatAddr: tcV6addr{Addr: bes[0].Addr.As16()}, NatPort: be16(8080)}); err != nil {
		t.Fatal(err)
	}
	live := count6(t, d.tc.Sluice6ConntrackV1) - 1
	st, err := m.GCConntrack()
	if err != nil {
		t.Fatal(err)
	}
	if st.Deleted != 1 || count6(t, d.tc.Sluice6ConntrackV1) != live {
		t.Errorf("GC deleted %d, %d IPv6 entries left; want 1 deleted, %d left", st.Deleted, count6(t, d.tc.Sluice6ConntrackV1), live)
	}
}

// TestTC6ConntrackListDelete: `sluicectl conntrack` lists IPv6 flows
// (Pinned.Conntrack) and deletes one whole by either of its entries,
// leaving the others; a half-open one is taken off the half-open count
// (once the GC has collected its lapsed forward entry).
func TestTC6ConntrackListDelete(t *testing.T) {
	d, bpffs := newTestDatapathAt(t)
	applyServices(t, d, clusterIP(vip6UDP, be6UDP))
	for _, port := range []uint16{42001, 42002} {
		runProg(t, d.TCIngress(), ether(udpPacket(client6, port, "2001:db8:96::11", 53, nil)))
	}
	for _, c := range []struct {
		name    string
		reverse bool
		port    uint16
		left    int
	}{{"by its forward entry", false, 42001, 2}, {"by its reverse entry", true, 42002, 0}} {
		p, es := pinnedEntries(t, bpffs)
		var sel []ConntrackEntry
		for _, e := range es {
			client, nat := e.Src, be6UDP
			if e.Reverse {
				client, nat = e.Dst, vip6UDP
			}
			if e.Reverse != c.reverse || client.Port() != c.port {
				continue
			}
			if want := netip.AddrPortFrom(nat.Addr, nat.Port); e.NAT != want || client.Addr() != addr(client6) || e.Proto != model.UDP || e.Established {
				t.Errorf("%s: entry %+v: want client %s, NAT %s, UDP, half-open", c.name, e, client6, want)
			}
			sel = append(sel, e)
		}
		if len(sel) != 1 {
			t.Fatalf("%s: %d entries selected of %v", c.name, len(sel), es)
		}
		if n, err := p.DeleteConntrack(sel); err != nil || n != 2 {
			t.Errorf("%s: deleted %d entries (%v), want 2", c.name, n, err)
		}
		// The flows are half-open in sluice6_conntrack_v1: the forward
		// entry is lapsed for the GC, whose claim takes the flow off
		// the half-open count.
		if _, err := d.Maps().GCConntrack(); err != nil {
			t.Fatal(err)
		}
		if n := count6(t, d.tc.Sluice6CtNewV1) + count6(t, d.tc.Sluice6ConntrackV1); n != c.left {
			t.Errorf("%s: %d IPv6 entries left, want %d", c.name, n, c.left)
		}
		if n, err := d.Maps().HalfOpenCounted(6); err != nil || n != int64(c.left/2) {
			t.Errorf("%s: %d half-open IPv6 flows counted (%v), want %d", c.name, n, err, c.left/2)
		}
		if n, err := p.DeleteConntrack(sel); err != nil || n != 0 {
			t.Errorf("%s again: deleted %d (%v), want 0", c.name, n, err)
		}
	}
}

// TestTC6SessionAffinity: with sessionAffinity ClientIP an IPv6 client's
// new flows all go to the backend its first one went to (its entry in
// sluice6_affinity_v1); without it they spread.
func TestTC6SessionAffinity(t *testing.T) {
	d := newTestDatapath(t)
	sticky, spread := l4("2001:db8:96::40", 80, model.TCP), l4("2001:db8:96::41", 80, model.TCP)
	var bes []model.L4Addr
	for i := range 8 {
		bes = append(bes, l4(fmt.Sprintf("2001:db8:1::%d", 0x40+i), 8080, model.TCP))
	}
	svc := clusterIP(sticky, bes...)
	svc.AffinityTimeout = time.Hour
	applyServices(t, d, svc, clusterIP(spread, bes...))
	for _, c := range []struct {
		vip  model.L4Addr
		want int // backends the flows reach: 1, or more than 1
	}{{sticky, 1}, {spread, 2}} {
		seen := map[netip.Addr]bool{}
		for port := uint16(43000); port < 43032; port++ {
			_, out := runProg(t, d.TCIngress(), ether(tcpPacket(client6, port, c.vip.Addr.String(), 80, 0, nil)))
			got, err := packet.Parse(out)
			if err != nil {
				t.Fatal(err)
			}
			seen[got.Dst] = true
		}
		if (len(seen) == 1) != (c.want == 1) {
			t.Errorf("32 flows to %s reached %d backends %v, want %d", c.vip, len(seen), seen, c.want)
		}
	}
}

// The IPv6 twin of the north-south tables' node (nodeNetns): eth0 also
// holds 2001:db8:100::1/64, the other node (2001:db8:100::2) routes the
// remote pods' 2001:db8:2::/64, the client is 2001:db8:100::50. Static
// neighbours, so the forwarded packets are exact.
const (
	nsNodeIP6   = "2001:db8:100::1"
	nsNode2IP6  = "2001:db8:100::2"
	nsClientIP6 = "2001:db8:100::50"
)

func addNodeIPv6(t testing.TB) {
	t.Helper()
	for _, f := range []string{"/proc/sys/net/ipv6/conf/all/forwarding", "/proc/sys/net/ipv6/conf/default/accept_dad"} {
		v := "1"
		if strings.HasSuffix(f, "accept_dad") {
			v = "0"
		}
		if err := os.WriteFile(f, []byte(v), 0); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
	eth0 := mustLink(t, "eth0")
	a, _ := netlink.ParseAddr(nsNodeIP6 + "/64")
	a.Flags = unix.IFA_F_NODAD
	if err := netlink.AddrAdd(eth0, a); err != nil {
		t.Fatalf("address eth0: %v", err)
	}
	_, remote, _ := net.ParseCIDR("2001:db8:2::/64")
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: remote, Gw: net.ParseIP(nsNode2IP6)}); err != nil {
		t.Fatalf("route to remote pods: %v", err)
	}
	for ip, mac := range map[string]net.HardwareAddr{nsNode2IP6: node2MAC, nsClientIP6: nsClientMAC} {
		if err := netlink.NeighAdd(&netlink.Neigh{LinkIndex: eth0.Attrs().Index, Family: netlink.FAMILY_V6,
			State: netlink.NUD_PERMANENT, IP: net.ParseIP(ip), HardwareAddr: mac}); err != nil {
			t.Fatalf("neighbour %s: %v", ip, err)
		}
	}
}

// The IPv6 NodePorts of the IPv6 north-south tables (nodeDatapath6), to
// backends on node 2.
var (
	np6Remote = l4(nsNodeIP6, 30080, model.TCP)
	np6UDP    = l4(nsNodeIP6, 30053, model.UDP)
	be6Remote = testBackend{11, l4("2001:db8:2::7", 8080, model.TCP)}
	be6RemU   = testBackend{12, l4("2001:db8:2::8", 5353, model.UDP)}
)

// nodeDatapath6 is nodeDatapath on eth0, eth0 with its IPv6 address too
// (addNodeIPv6, attached again for sluice6_devices_v1), and the NodePorts
// np6Remote and np6UDP (ids 11 and 12).
func nodeDatapath6(t testing.TB, base func(bpffs string) Config) (*topology.NS, int, *Datapath) {
	t.Helper()
	ns, ifindex, d := nodeDatapath(t, base, "eth0")
	addNodeIPv6(t)
	if err := d.AttachDevices([]string{"eth0"}); err != nil {
		t.Fatal(err)
	}
	addExternal(t, d.Maps(), 11, np6Remote, reconciler.FlagExternal, be6Remote)
	addExternal(t, d.Maps(), 12, np6UDP, reconciler.FlagExternal, be6RemU)
	return ns, ifindex, d
}

// snatPort6Of is snatPortOf for an IPv6 flow, source-NATed to nsNodeIP6.
func snatPort6Of(t testing.TB, d *Datapath, client string, cport uint16, fe model.L4Addr) uint16 {
	t.Helper()
	k := tcCt6Key{Saddr: tcV6addr{Addr: addr(client).As16()}, Daddr: tcV6addr{Addr: fe.Addr.As16()},
		Sport: be16(cport), Dport: be16(fe.Port), Proto: uint8(fe.Proto), Dir: ctForward}
	var v tcCt6Entry
	if err := d.tc.Sluice6CtNewV1.Lookup(&k, &v); err != nil {
		if err := d.tc.Sluice6ConntrackV1.Lookup(&k, &v); err != nil {
			t.Fatalf("no forward conntrack entry of [%s]:%d -> %s", client, cport, fe)
		}
	}
	if v.Flags&ctFlagSNAT == 0 || netip.AddrFrom16(v.SnatAddr.Addr) != addr(nsNodeIP6) {
		t.Fatalf("flow [%s]:%d -> %s not source-NATed to %s: %+v", client, cport, fe, nsNodeIP6, v)
	}
	return portFromBE16(v.SnatPort)
}

// TestTC6NorthSouthPacketTable: an IPv6 NodePort whose backend is on
// another node, as TestNorthSouthPacketTable for IPv4: DNAT and SNAT to
// eth0's IPv6 address with a reserved port, sent to node 2 one hop less;
// the reply reverse-NATed and sent back to the client; ICMPv6 errors
// about the flow translated and sent on both ways; a hop limit of 1
// answered with ICMPv6 time exceeded, a packet over the egress MTU with
// packet too big; an unallocated address of the IPv6 service CIDR
// dropped.
func TestTC6NorthSouthPacketTable(t *testing.T) {
	_, ifindex, d := nodeDatapath6(t, configWith(smallConfig, func(c *Config) {
		c.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("2001:db8:96::/112")}
	}))
	np, npU, be, beU := np6Remote, np6UDP, be6Remote, be6RemU
	ing := d.TCIngress()
	eth, n2 := macOf(nodeEthMAC), macOf(node2MAC)

	fromClient := func(p packet.Packet) packet.Packet { p.SrcMAC, p.DstMAC = clientMAC, eth; return p }
	fromNode2 := func(p packet.Packet) packet.Packet {
		p.SrcMAC, p.DstMAC = n2, eth
		return p
	}
	data := []byte("nodeport datagram")

	// TCP: the SYN, DNATed and SNATed, to node 2; again the same; the
	// SYN-ACK back to the client.
	syn := fromClient(tcpPacket(nsClientIP6, 40000, nsNodeIP6, 30080, 0, nil))
	verdict, out := runOn(t, ing, ifindex, syn.Bytes())
	sp := snatPort6Of(t, d, nsClientIP6, 40000, np)
	if sp < DefaultSNATPortMin {
		t.Fatalf("SNAT port %d outside %d-%d", sp, DefaultSNATPortMin, DefaultSNATPortMax)
	}
	expectPacket(t, "SYN: DNAT, SNAT to the node, redirect", verdict, tcActRedirect, out, toRemote(syn, sp, be))
	expectRun(t, "the SYN again: the same port", ing, ifindex, syn, tcActRedirect, toRemote(syn, sp, be))
	synAck := fromNode2(tcpPacket("2001:db8:2::7", 8080, nsNodeIP6, sp, 0x12, nil))
	expectRun(t, "the SYN-ACK: reverse NAT, redirect to the client", ing, ifindex, synAck, tcActRedirect, toClient(synAck, np, 40000))

	// ICMPv6 errors about the source-NATed flow, sent on where it goes
	// (icmp6_snat_xlate), one hop less. A packet too big from node 2
	// about the SYN it forwarded, to the node: to the client, about the
	// SYN it sent, [C -> F].
	icmpAbout := func(srcMAC, dstMAC [6]byte, src, dst string, typ uint8, rest uint32, about packet.Packet) packet.Packet {
		p := packet.Packet{SrcMAC: srcMAC, DstMAC: dstMAC, Src: addr(src), Dst: addr(dst), Proto: packet.ICMPv6,
			ICMPType: typ, Payload: about.L3()[:48]}
		binary.BigEndian.PutUint32(p.ICMPRest[:], rest)
		return p
	}
	synThere := syn
	synThere.TTL = fwdTTL
	ptb := icmpAbout(n2, eth, nsNode2IP6, nsNodeIP6, packet.ICMPv6PacketTooBig, 1280, toRemote(syn, sp, be))
	want := icmpAbout(eth, clientMAC, nsNode2IP6, nsClientIP6, packet.ICMPv6PacketTooBig, 1280, synThere)
	want.TTL = fwdTTL
	expectRun(t, "packet too big about the request: to the client, about [C -> F]", ing, ifindex, ptb, tcActRedirect, want)
	// The client's port unreachable about the SYN-ACK it got, [F -> C]:
	// from the node's port to the backend, about [B -> N:sp].
	unreach := icmpAbout(clientMAC, eth, nsClientIP6, nsNodeIP6, packet.ICMPv6Unreachable, 0,
		toClient(synAck, np, 40000))
	unreach.ICMPCode = packet.ICMPv6PortUnreach
	synAckThere := synAck // (its hop limit as it reached the client)
	synAckThere.TTL = fwdTTL
	want = icmpAbout(eth, n2, nsNodeIP6, "2001:db8:2::7", packet.ICMPv6Unreachable, 0, synAckThere)
	want.ICMPCode, want.TTL = packet.ICMPv6PortUnreach, fwdTTL
	expectRun(t, "port unreachable about the reply: to the backend, about [B -> N:sp]", ing, ifindex, unreach, tcActRedirect, want)

	// UDP, the same way.
	udp := fromClient(udpPacket(nsClientIP6, 5300, nsNodeIP6, 30053, data))
	verdict, out = runOn(t, ing, ifindex, udp.Bytes())
	spU := snatPort6Of(t, d, nsClientIP6, 5300, npU)
	expectPacket(t, "UDP: DNAT, SNAT, redirect", verdict, tcActRedirect, out, toRemote(udp, spU, beU))
	udpReply := fromNode2(udpPacket("2001:db8:2::8", 5353, nsNodeIP6, spU, []byte("answer")))
	expectRun(t, "the UDP reply: reverse NAT, redirect", ing, ifindex, udpReply, tcActRedirect, toClient(udpReply, npU, 5300))

	// Hop limit 1: ICMPv6 time exceeded, from the NodePort, back out of
	// eth0 to the client; nothing forwarded.
	last := fromClient(tcpPacket(nsClientIP6, 40001, nsNodeIP6, 30080, 0, nil))
	last.TTL = 1
	in := last.Bytes()
	verdict, out = runOn(t, ing, ifindex, in)
	l3 := in[14:]
	want = packet.Packet{SrcMAC: eth, DstMAC: clientMAC, Src: addr(nsNodeIP6), Dst: addr(nsClientIP6), Proto: packet.ICMPv6,
		ICMPType: packet.ICMPv6TimeExceeded, ICMPCode: 0, Payload: l3[:40+20]}
	expectPacket(t, "hop limit 1: time exceeded", verdict, tcActRedirect, out[:len(want.Bytes())], want)

	// Larger than eth0's MTU (1280 now): ICMPv6 packet too big with the
	// MTU, from the NodePort, whatever the packet (IPv6 routers never
	// fragment).
	setMTUHere(t, "eth0", 1280)
	big := fromClient(tcpPacket(nsClientIP6, 40003, nsNodeIP6, 30080, packet.ACK, bytes.Repeat([]byte("m"), 1300)))
	in = big.Bytes()
	verdict, out = runOn(t, ing, ifindex, in)
	want = packet.Packet{SrcMAC: eth, DstMAC: clientMAC, Src: addr(nsNodeIP6), Dst: addr(nsClientIP6), Proto: packet.ICMPv6,
		ICMPType: packet.ICMPv6PacketTooBig, ICMPCode: 0, Payload: in[14 : 14+40+20]}
	binary.BigEndian.PutUint32(want.ICMPRest[:], 1280)
	expectPacket(t, "over the MTU: packet too big", verdict, tcActRedirect, out[:len(want.Bytes())], want)

	// An address of the service CIDR that no Service holds: dropped.
	unalloc := fromClient(tcpPacket(nsClientIP6, 40002, "2001:db8:96::99", 80, 0, nil))
	if verdict, _ := runOn(t, ing, ifindex, unalloc.Bytes()); verdict != tcActShot {
		t.Errorf("unallocated service IP: verdict %d, want drop (%d)", verdict, tcActShot)
	}

	expectCounted(t, d, "tc_snat_new", "tc_rev_nat", "tc_icmp_xlate", "tc_ttl_exceeded", "tc_frag_needed", "tc_service_cidr_drop")
}

// TestNodePortPodDeviceEndToEndIPv6: TestNodePortPodDeviceEndToEnd over
// IPv6, the pod's device in the devices and without a global address (the
// node answers the pod at fe80::1 on it): the pod's reply, reverse-NATed
// at pod0's ingress to come from the node's own NodePort address, reaches
// the client through the stack, for both traffic policies.
func TestNodePortPodDeviceEndToEndIPv6(t *testing.T) {
	d := newTestDatapath(t)
	topo := topology.NewT(t)
	client, node, pod := topo.AddNST(t, "client"), topo.AddNST(t, "node"), topo.AddNST(t, "pod")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	p := netip.MustParsePrefix
	must(topo.Veth(client, "eth0", node, "eth0"))
	must(topo.Veth(node, "pod0", pod, "eth0"))
	must(client.AddAddr("eth0", p("2001:db8:a::1/64")))
	must(node.AddAddr("eth0", p("2001:db8:a::2/64")))
	must(node.AddAddr("pod0", p("fe80::1/64")))
	must(pod.AddAddr("eth0", p("2001:db8:b::2/128")))
	must(node.Sysctl("net/ipv6/conf/all/forwarding", "1"))
	must(node.AddRouteDev(p("2001:db8:b::2/128"), "pod0"))
	must(pod.Do(func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}, Gw: net.ParseIP("fe80::1")})
	}))
	for _, w := range []struct {
		ns *topology.NS
		a  string
	}{{client, "2001:db8:a::1"}, {node, "2001:db8:a::2"}, {pod, "2001:db8:b::2"}} {
		must(w.ns.WaitLocal(addr(w.a)))
	}
	if _, err := pod.ServeTCPEcho("[2001:db8:b::2]:8080", "pod"); err != nil {
		t.Fatal(err)
	}

	nodePortsReachPod(t, d, node, client, "tcp6", "2001:db8:a::2", "2001:db8:b::2")
	// The replies were reverse-NATed (at pod0's ingress, the first
	// program they meet) and the stack forwarded them: IPv6 takes a
	// packet from the node's own address that IPv4 drops as a martian
	// (rev_dnat's direct send), so the IPv6 path needs none.
	if cs := counters(t, d); cs["tc_rev_nat"] == 0 || cs["tc_rev_redirect"] != 0 {
		t.Errorf("tc_rev_nat %d, tc_rev_redirect %d; want replies reverse-NATed and passed to the stack", cs["tc_rev_nat"], cs["tc_rev_redirect"])
	}
}
