package packet

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

var (
	macA = [6]byte{0x02, 0, 0, 0, 0, 0x01}
	macB = [6]byte{0x02, 0, 0, 0, 0, 0x02}
	ipA  = netip.MustParseAddr("10.0.0.1")
	ipB  = netip.MustParseAddr("10.96.0.10")
)

// The example header of RFC 1071's companion texts (and Wikipedia's IPv4
// article): its checksum is b861.
func TestIPv4HeaderChecksumKnownAnswer(t *testing.T) {
	h := []byte{0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8, 0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7}
	if got := ipv4HeaderChecksum(h); got != 0xb861 {
		t.Errorf("checksum %#04x, want 0xb861", got)
	}
}

// An ICMP echo request with identifier and sequence 0 and no data has
// checksum ~0x0800 = 0xf7ff.
func TestICMPEchoKnownAnswer(t *testing.T) {
	b := Packet{SrcMAC: macA, DstMAC: macB, Src: ipA, Dst: ipB, Proto: ICMP, ICMPType: ICMPEcho}.Bytes()
	if got, want := b[34:], []byte{8, 0, 0xf7, 0xff, 0, 0, 0, 0}; !bytes.Equal(got, want) {
		t.Errorf("ICMP message %x, want %x", got, want)
	}
}

func samples() map[string]Packet {
	tcp := Packet{SrcMAC: macA, DstMAC: macB, Src: ipA, Dst: ipB, Proto: TCP, SrcPort: 40000, DstPort: 80,
		TCPFlags: ACK | PSH, Seq: 7, Ack: 9, Window: 512, TTL: 9, ID: 0x1234, Payload: []byte("GET / HTTP/1.0\r\n\r\n")}
	return map[string]Packet{
		"tcp":         tcp,
		"tcp_options": tcp.With(func(p *Packet) { p.IPOptions = []byte{1, 1, 1, 0, 0x44, 8, 5, 0} }),
		"udp_odd":     {SrcMAC: macA, DstMAC: macB, Src: ipA, Dst: ipB, Proto: UDP, SrcPort: 5300, DstPort: 53, Payload: []byte("odd")},
		"udp_none":    {SrcMAC: macA, DstMAC: macB, Src: ipA, Dst: ipB, Proto: UDP, SrcPort: 5300, DstPort: 53, NoUDPChecksum: true},
		"icmp":        {SrcMAC: macA, DstMAC: macB, Src: ipB, Dst: ipA, Proto: ICMP, ICMPType: ICMPUnreachable, ICMPCode: 3, Payload: []byte{0x45, 0, 0, 20}},
		"first_frag":  {SrcMAC: macA, DstMAC: macB, Src: ipA, Dst: ipB, Proto: UDP, SrcPort: 1, DstPort: 2, FragOff: 0x2000, Payload: []byte("x")},
		"later_frag":  {SrcMAC: macA, DstMAC: macB, Src: ipA, Dst: ipB, Proto: UDP, FragOff: 185, Payload: []byte("later bytes")},
		"other_proto": {SrcMAC: macA, DstMAC: macB, Src: ipA, Dst: ipB, Proto: 47, Payload: []byte{0, 0, 8, 0}},
		"arp":         {SrcMAC: macA, DstMAC: macB, EtherType: EtherTypeARP, Payload: make([]byte, 28)},
	}
}

// Every checksum Bytes writes makes the one's complement sum over what it
// covers (pseudo-header included) come out as 0xffff: the receiver's check,
// independent of how the checksum was computed.
func TestChecksumsVerifyAsAReceiverWould(t *testing.T) {
	for name, p := range samples() {
		b := p.Bytes()
		if p.EtherType != 0 || p.FragOff&0x1fff != 0 {
			continue
		}
		ip := b[14 : 14+20+len(p.IPOptions)]
		if s := fold(sum(0, ip)); s != 0 {
			t.Errorf("%s: IPv4 header sums to %#04x, want 0", name, ^s)
		}
		l4 := b[14+len(ip):]
		var pseudo uint32
		if p.Proto == TCP || p.Proto == UDP {
			pseudo = pseudoHeader4(ip[12:16], ip[16:20], p.Proto, len(l4))
		}
		if p.NoUDPChecksum || p.Proto == 47 {
			continue
		}
		if s := fold(sum(pseudo, l4)); s != 0 {
			t.Errorf("%s: L4 sums to %#04x, want 0", name, ^s)
		}
	}
}

func TestParseRoundTrip(t *testing.T) {
	for name, p := range samples() {
		got, err := Parse(p.Bytes())
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		want := p
		if want.Src.IsValid() {
			want.EtherType = EtherTypeIPv4
			if want.TTL == 0 {
				want.TTL = DefaultTTL
			}
			if want.Proto == TCP && want.Window == 0 {
				want.Window = DefaultWindow
			}
		}
		if want.FragOff&0x1fff != 0 {
			// A later fragment's data are bytes to Parse, whatever
			// header Bytes put in them.
			b := p.Bytes()
			want.Payload = b[14+20:]
		}
		if len(want.Payload) == 0 {
			want.Payload, got.Payload = nil, nil
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: Parse(Bytes()) =\n %+v\nwant\n %+v", name, got, want)
		}
	}
}

func TestVerify(t *testing.T) {
	for name, p := range samples() {
		if err := Verify(p.Bytes()); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	tcp := samples()["tcp"].Bytes()
	for _, c := range []struct {
		off  int
		want string
	}{
		{14 + 10, "IPv4 header checksum"},
		{14 + 20 + 16, "TCP checksum"},
	} {
		bad := bytes.Clone(tcp)
		bad[c.off] ^= 0x01
		if err := Verify(bad); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Verify of a frame with a wrong %s = %v", c.want, err)
		}
	}
	icmp := samples()["icmp"].Bytes()
	icmp[len(icmp)-1] ^= 0x80
	if err := Verify(icmp); err == nil || !strings.Contains(err.Error(), "ICMP checksum") {
		t.Errorf("Verify of a changed ICMP message = %v", err)
	}
	// A rewritten address without the checksum update: both checksums.
	moved := bytes.Clone(tcp)
	binary.BigEndian.PutUint16(moved[14+16:], 0x0a01)
	if err := Verify(moved); err == nil || !strings.Contains(err.Error(), "IPv4") || !strings.Contains(err.Error(), "TCP") {
		t.Errorf("Verify of a DNAT without checksum updates = %v, want both checksums named", err)
	}
	if err := Verify(tcp[:30]); err == nil {
		t.Error("Verify of a truncated frame passed")
	}
}

// L3 is the frame without its Ethernet header: what a tun device carries.
func TestL3(t *testing.T) {
	for name, p := range samples() {
		if p.EtherType != 0 {
			continue
		}
		if got, want := p.L3(), p.Bytes()[14:]; !bytes.Equal(got, want) {
			t.Errorf("%s: L3 %x, want %x", name, got, want)
		}
	}
}

// Fragments are what a stack sends: each piece at its offset, MF on all
// but the last, DF and the other header fields kept, and the pieces
// together the whole datagram, whose checksum (in the first) covers all
// of it.
func TestFragments(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789abcdef"), 190) // 3040 bytes
	p := Packet{SrcMAC: macA, DstMAC: macB, Src: ipA, Dst: ipB, Proto: UDP, SrcPort: 5300, DstPort: 53,
		ID: 0x1111, TTL: 9, Payload: data}
	whole := p.L3()[20:]
	frags := p.Fragments(1480)
	if len(frags) != 3 {
		t.Fatalf("%d fragments, want 3", len(frags))
	}
	var joined []byte
	for i, f := range frags {
		b := f.Bytes()
		got, err := Parse(b)
		if err != nil {
			t.Fatalf("fragment %d: %v", i, err)
		}
		wantOff := uint16(i * 1480 / 8)
		if i < 2 {
			wantOff |= MF
		}
		if got.FragOff != wantOff || got.ID != 0x1111 || got.TTL != 9 || got.Proto != UDP {
			t.Errorf("fragment %d: FragOff %#04x ID %#x TTL %d proto %d, want %#04x 0x1111 9 17", i, got.FragOff, got.ID, got.TTL, got.Proto, wantOff)
		}
		if hl := binary.BigEndian.Uint16(b[14+2:]); int(hl) != 20+len(f.RawL4) {
			t.Errorf("fragment %d: total length %d, want %d", i, hl, 20+len(f.RawL4))
		}
		joined = append(joined, f.RawL4...)
	}
	if !bytes.Equal(joined, whole) {
		t.Error("fragments do not add up to the datagram")
	}
	// The UDP checksum of the first fragment covers the whole datagram.
	if s := fold(sum(pseudoHeader4(ipA.AsSlice(), ipB.AsSlice(), UDP, len(whole)), whole)); s != 0 {
		t.Errorf("datagram sums to %#04x, want 0", ^s)
	}
	df := p.With(func(p *Packet) { p.FragOff = DF }).Fragments(1480)
	if df[0].FragOff != DF|MF || df[2].FragOff != DF|2*1480/8 {
		t.Errorf("DF datagram: fragment flags %#04x, %#04x; want DF kept", df[0].FragOff, df[2].FragOff)
	}
	if one := p.Fragments(4096); len(one) != 1 || one[0].FragOff != 0 || !bytes.Equal(one[0].Bytes(), p.Bytes()) {
		t.Error("a datagram that fits is not one unfragmented packet")
	}
}

// ZeroTotalLen leaves the total length (IPv6: the payload length) 0 (BIG
// TCP) and nothing else changes: the IPv4 header checksum covers the zero.
func TestZeroTotalLen(t *testing.T) {
	for _, c := range []struct {
		name       string
		p          Packet
		lenOff, hl int // the length field's offset in the frame, the IP header's length
	}{{"IPv4", samples()["tcp"], 14 + 2, 20}, {"IPv6", samples6()["tcp"], 14 + 4, 40}} {
		b := c.p.With(func(p *Packet) { p.ZeroTotalLen = true }).Bytes()
		if l := binary.BigEndian.Uint16(b[c.lenOff:]); l != 0 {
			t.Fatalf("%s: length %d, want 0", c.name, l)
		}
		if s := fold(sum(0, b[14:14+20])); c.name == "IPv4" && s != 0 {
			t.Errorf("IPv4 header sums to %#04x, want 0", ^s)
		}
		full := c.p.Bytes()
		if !bytes.Equal(b[:c.lenOff], full[:c.lenOff]) || !bytes.Equal(b[14+c.hl:], full[14+c.hl:]) {
			t.Errorf("%s: the frame differs from the one with a length beyond the length field", c.name)
		}
		if Verify(b) == nil {
			t.Errorf("%s: Verify accepted a length of 0", c.name)
		}
	}
}

// RawL4 is carried as it is, checksum and all.
func TestRawL4(t *testing.T) {
	raw := []byte{1, 2, 3, 4, 5, 6, 7, 8, 9}
	b := Packet{Src: ipA, Dst: ipB, Proto: TCP, SrcPort: 1, RawL4: raw}.L3()
	if !bytes.Equal(b[20:], raw) || binary.BigEndian.Uint16(b[2:]) != 29 || b[9] != TCP {
		t.Errorf("L3 with RawL4 = %x", b)
	}
}

func TestDiff(t *testing.T) {
	want := bytes.Repeat([]byte{0xaa}, 100)
	got := bytes.Clone(want)
	got[60] = 0xbb
	d := Diff(got, want[:90])
	for _, s := range []string{"100 bytes, want 90", "first difference at byte 60", "bbaa"} {
		if !strings.Contains(d, s) {
			t.Errorf("Diff = %q: no %q", d, s)
		}
	}
}

var (
	ip6A = netip.MustParseAddr("2001:db8::1")
	ip6B = netip.MustParseAddr("2001:db8::2")
)

// Known answers, computed by hand (and by a separate Python sum) over the
// IPv6 pseudo-header: an ICMPv6 echo request without data, 2001:db8::1 ->
// 2001:db8::2: 0x2448; UDP 5300 -> 53 carrying "odd": 0xbc15.
func TestIPv6KnownAnswers(t *testing.T) {
	for _, c := range []struct {
		p    Packet
		off  int
		want uint16
	}{
		{Packet{Src: ip6A, Dst: ip6B, Proto: ICMPv6, ICMPType: ICMPv6EchoRequest}, 2, 0x2448},
		{Packet{Src: ip6A, Dst: ip6B, Proto: UDP, SrcPort: 5300, DstPort: 53, Payload: []byte("odd")}, 6, 0xbc15},
		// Extension headers are not in the pseudo-header.
		{Packet{Src: ip6A, Dst: ip6B, Proto: UDP, SrcPort: 5300, DstPort: 53, Payload: []byte("odd"),
			IPv6: IPv6{Ext: []ExtHeader{HopByHopHeader(), DestOptsHeader([]byte{0x1e, 2, 0, 0})}}}, 6, 0xbc15},
	} {
		b := c.p.Bytes()
		if got := binary.BigEndian.Uint16(b[12:]); got != EtherTypeIPv6 {
			t.Fatalf("EtherType %#04x, want IPv6", got)
		}
		l4 := b[len(b)-len(c.p.l4()):]
		if got := binary.BigEndian.Uint16(l4[c.off:]); got != c.want {
			t.Errorf("%d %+v: checksum %#04x, want %#04x", c.p.Proto, c.p.IPv6, got, c.want)
		}
	}
}

func samples6() map[string]Packet {
	tcp := Packet{SrcMAC: macA, DstMAC: macB, Src: ip6A, Dst: ip6B, Proto: TCP, SrcPort: 40000, DstPort: 80,
		TCPFlags: ACK, Seq: 7, Ack: 9, Window: 512, TTL: 9, Payload: []byte("GET / HTTP/1.0\r\n\r\n"),
		IPv6: IPv6{TrafficClass: 0xb8, FlowLabel: 0x12345}}
	final := netip.MustParseAddr("2001:db8::99").As16()
	return map[string]Packet{
		"tcp":        tcp,
		"tcp_hbh_do": tcp.With(func(p *Packet) { p.IPv6.Ext = []ExtHeader{HopByHopHeader([]byte{5, 2, 0, 0}), DestOptsHeader()} }),
		"tcp_rh":     tcp.With(func(p *Packet) { p.IPv6.Ext = []ExtHeader{RoutingHeader(2, 1, final)} }),
		"udp_odd":    {SrcMAC: macA, DstMAC: macB, Src: ip6A, Dst: ip6B, Proto: UDP, SrcPort: 5300, DstPort: 53, Payload: []byte("odd")},
		"icmpv6":     {SrcMAC: macA, DstMAC: macB, Src: ip6B, Dst: ip6A, Proto: ICMPv6, ICMPType: ICMPv6Unreachable, ICMPCode: ICMPv6PortUnreach, Payload: []byte{0x60, 0, 0, 0}},
		"later_frag": {SrcMAC: macA, DstMAC: macB, Src: ip6A, Dst: ip6B, Proto: UDP, Payload: []byte("later bytes"),
			IPv6: IPv6{Ext: []ExtHeader{FragmentHeader(185, false, 7)}}},
	}
}

// Every IPv6 checksum sums to 0xffff with its pseudo-header, and a
// routing header's final destination is the one the pseudo-header names.
func TestIPv6ChecksumsVerifyAsAReceiverWould(t *testing.T) {
	for name, p := range samples6() {
		if laterFragment6(p.IPv6.Ext) {
			continue
		}
		l4 := p.l4()
		b := p.Bytes()
		seg := b[len(b)-len(l4):]
		dst := p.Dst.AsSlice()
		if name == "tcp_rh" {
			dst = seg[:0:0]
			dst = append(dst, netip.MustParseAddr("2001:db8::99").AsSlice()...)
		}
		if s := fold(sum(pseudoHeader6(p.Src.AsSlice(), dst, p.Proto, len(seg)), seg)); s != 0 {
			t.Errorf("%s: L4 sums to %#04x, want 0", name, ^s)
		}
	}
}

func TestIPv6ParseRoundTripAndVerify(t *testing.T) {
	for name, p := range samples6() {
		b := p.Bytes()
		if err := Verify(b); err != nil {
			t.Errorf("%s: Verify: %v", name, err)
		}
		got, err := Parse(b)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		want := p.With(func(w *Packet) {
			w.EtherType = EtherTypeIPv6
			w.TTL = cmp.Or(w.TTL, DefaultTTL)
			if w.Proto == TCP {
				w.Window = cmp.Or(w.Window, DefaultWindow)
			}
			if laterFragment6(w.IPv6.Ext) {
				w.Payload = w.checksummedL4() // data to Parse, whatever header they hold
			}
		})
		if len(want.Payload) == 0 {
			want.Payload, got.Payload = nil, nil
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: Parse(Bytes()) =\n %+v\nwant\n %+v", name, got, want)
		}
	}
	tcp := samples6()["tcp_hbh_do"].Bytes()
	for _, c := range []struct {
		name string
		mod  func(b []byte)
		want string
	}{
		{"checksum bit", func(b []byte) { b[len(b)-1] ^= 1 }, "TCP checksum"},
		{"destination without checksum update", func(b []byte) { b[14+39] ^= 1 }, "TCP checksum"},
		{"truncated", func(b []byte) { binary.BigEndian.PutUint16(b[14+4:], 2000) }, "payload length"},
		{"extension header overrunning", func(b []byte) { b[14+41] = 200 }, "extension header"},
	} {
		bad := bytes.Clone(tcp)
		c.mod(bad)
		if err := Verify(bad); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Verify of a frame with a %s = %v, want %q", c.name, err, c.want)
		}
	}
	udp0 := samples6()["udp_odd"].With(func(p *Packet) { p.NoUDPChecksum = true }).Bytes()
	if err := Verify(udp0); err == nil || !strings.Contains(err.Error(), "UDP checksum 0") {
		t.Errorf("Verify of IPv6 UDP without checksum = %v", err)
	}
}

// Options headers are padded to 8 bytes, with their length in 8-byte
// units past the first 8, and the chain of next headers leads to Proto.
func TestIPv6ExtensionHeaders(t *testing.T) {
	p := Packet{Src: ip6A, Dst: ip6B, Proto: UDP, SrcPort: 1, DstPort: 2,
		IPv6: IPv6{Ext: []ExtHeader{HopByHopHeader([]byte{0xc2, 4, 0, 1, 0, 0}), DestOptsHeader(bytes.Repeat([]byte{0}, 7))}}}
	b := p.L3()
	if binary.BigEndian.Uint32(b) != 6<<28 || !bytes.Equal(b[4:8], []byte{0, 8 + 16 + 8, HopByHop, DefaultTTL}) {
		t.Errorf("fixed header %x, want payload length 32, next header 0", b[:8])
	}
	if got := b[40:48]; !bytes.Equal(got, []byte{DestOpts, 0, 0xc2, 4, 0, 1, 0, 0}) {
		t.Errorf("hop-by-hop %x", got)
	}
	if got := b[48:64]; !bytes.Equal(got, append([]byte{UDP, 1}, append(make([]byte, 7), 1, 5, 0, 0, 0, 0, 0)...)) {
		t.Errorf("destination options %x (7 Pad1 options then PadN 5)", got)
	}
}

// IPv6 fragments carry a fragment header after the other extension
// headers, M on all but the last, and add up to the datagram.
func TestIPv6Fragments(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789abcdef"), 190)
	p := Packet{Src: ip6A, Dst: ip6B, Proto: UDP, SrcPort: 5300, DstPort: 53, ID: 0x1111, Payload: data,
		IPv6: IPv6{Ext: []ExtHeader{HopByHopHeader()}}}
	frags := p.Fragments(1232)
	if len(frags) != 3 {
		t.Fatalf("%d fragments, want 3", len(frags))
	}
	var joined []byte
	for i, f := range frags {
		got, err := Parse(f.Bytes())
		if err != nil {
			t.Fatalf("fragment %d: %v", i, err)
		}
		if len(got.IPv6.Ext) != 2 || got.IPv6.Ext[0].Type != HopByHop {
			t.Fatalf("fragment %d: extension headers %+v, want hop-by-hop, fragment", i, got.IPv6.Ext)
		}
		off, more, ok := got.IPv6.Ext[1].FragOffset()
		if !ok || int(off) != i*1232/8 || more != (i < 2) || binary.BigEndian.Uint32(got.IPv6.Ext[1].Data[3:]) != 0x1111 {
			t.Errorf("fragment %d: offset %d more %v id %x", i, off, more, got.IPv6.Ext[1].Data[3:])
		}
		joined = append(joined, f.RawL4...)
	}
	if s := fold(sum(pseudoHeader6(ip6A.AsSlice(), ip6B.AsSlice(), UDP, len(joined)), joined)); s != 0 {
		t.Errorf("datagram sums to %#04x, want 0", ^s)
	}
	if len(p.IPv6.Ext) != 1 {
		t.Error("Fragments changed the original's extension headers")
	}
}
