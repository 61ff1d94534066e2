package packet

import (
	"bytes"
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

func TestBytesRefusesIPv6Yet(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("an IPv6 packet was built; teach Bytes IPv6 and change this test")
		}
	}()
	Packet{Src: netip.MustParseAddr("fd00::1"), Dst: netip.MustParseAddr("fd00::2"), Proto: TCP}.Bytes()
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

// ZeroTotalLen leaves the total length 0 (BIG TCP) and nothing else
// changes: the header checksum covers the zero.
func TestZeroTotalLen(t *testing.T) {
	p := samples()["tcp"]
	b := p.With(func(p *Packet) { p.ZeroTotalLen = true }).Bytes()
	if hl := binary.BigEndian.Uint16(b[14+2:]); hl != 0 {
		t.Fatalf("total length %d, want 0", hl)
	}
	if s := fold(sum(0, b[14:14+20])); s != 0 {
		t.Errorf("IPv4 header sums to %#04x, want 0", ^s)
	}
	full := p.Bytes()
	if !bytes.Equal(b[14+20:], full[14+20:]) {
		t.Error("the TCP segment differs from the one with a total length")
	}
	if Verify(b) == nil {
		t.Error("Verify accepted a total length of 0")
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
