// Package packet builds the frames of Sluice's packet tests and checks the
// frames its programs put out: the one packet builder of the module, used
// by the BPF_PROG_TEST_RUN tables of pkg/datapath (the edge cases too: IP
// options, fragments, BIG TCP's zero total length, packets of L3 devices
// without an Ethernet header) and by the benchmarks.
//
// A Packet is a plain value describing an Ethernet frame (IPv4 with TCP,
// UDP or ICMP, IPv6 with extension headers and TCP, UDP or ICMPv6, or a
// raw payload under any EtherType); Bytes renders it with every length and
// checksum computed from scratch, as RFC 791, 793, 768, 792, 8200 and 4443
// define them, and never through the incremental updates the BPF
// programs make. So a program's output compared byte for byte with an
// expected Packet proves its checksum arithmetic exact, and Verify, which
// recomputes the checksums of any frame, proves it where the expected
// bytes are not known (a port chosen by the program, an ICMP error).
//
// The address family comes from Src and Dst, not from a field of its own:
// IPv6 (issue 10, ipv6.go) adds its header's own fields in Packet.IPv6,
// and callers written for IPv4 keep compiling and keep their meaning.
package packet

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
)

// IP protocol numbers (the IPv4 protocol field, IPv6's next header).
const (
	ICMP   uint8 = 1
	TCP    uint8 = 6
	UDP    uint8 = 17
	ICMPv6 uint8 = 58
)

// TCP flags (the flags byte of the TCP header).
const (
	FIN uint8 = 0x01
	SYN uint8 = 0x02
	RST uint8 = 0x04
	PSH uint8 = 0x08
	ACK uint8 = 0x10
)

// EtherTypes.
const (
	EtherTypeIPv4 uint16 = 0x0800
	EtherTypeARP  uint16 = 0x0806
	EtherTypeIPv6 uint16 = 0x86dd
)

// ICMP types this package's callers use.
const (
	ICMPEchoReply   uint8 = 0
	ICMPUnreachable uint8 = 3
	ICMPEcho        uint8 = 8
)

// IPv4 flags, in FragOff.
const (
	DF uint16 = 0x4000 // don't fragment
	MF uint16 = 0x2000 // more fragments
)

// Defaults for the fields whose zero value is not a useful packet.
const (
	DefaultTTL    = 64
	DefaultWindow = 64240
)

// Packet describes one Ethernet frame. The zero value of a field is its
// natural default unless the field says otherwise.
type Packet struct {
	SrcMAC, DstMAC [6]byte

	// Src and Dst are the IP addresses; their family picks the network
	// header, IPv4 or IPv6. Without them the frame is the Ethernet header,
	// EtherType and Payload as they are: an ARP frame, or bytes a program
	// must pass untouched.
	Src, Dst netip.Addr
	// EtherType is needed only for a frame without addresses; with
	// addresses it may stay 0 and follows their family.
	EtherType uint16

	// Proto is the IP protocol (in IPv6 the next header after the
	// extension headers): TCP, UDP, ICMP and ICMPv6 get their header and
	// checksum built; any other value carries Payload as the whole L4.
	Proto uint8
	// TTL is the IPv4 time to live or the IPv6 hop limit; 0 means
	// DefaultTTL.
	TTL uint8
	// ID is the IPv4 identification field (and, widened, the
	// identification of the fragment headers Fragments adds to IPv6).
	ID uint16
	// FragOff is the IPv4 flags and fragment offset field, host order
	// (DF, MF, the low 13 bits the offset in 8-byte units). It changes
	// only that field: a later fragment of a UDP Packet still carries the
	// bytes of a UDP header, now as data, as the middle of a datagram
	// would. Fragments builds the real fragments of a datagram.
	FragOff uint16
	// ZeroTotalLen leaves the IPv4 total length (the IPv6 payload length)
	// 0, as BIG TCP sends a GSO packet over 64 KiB (the kernel takes the
	// length from the skb). Parse and Verify refuse such a frame, as the
	// stack would without GSO.
	ZeroTotalLen bool
	// IPOptions are IPv4 options, appended to the 20-byte header; their
	// length must be a multiple of 4.
	IPOptions []byte

	// SrcPort and DstPort are the TCP or UDP ports.
	SrcPort, DstPort uint16
	// TCPFlags is the TCP flags byte; 0 means SYN, the packet most tests
	// start a flow with.
	TCPFlags uint8
	// Seq and Ack are the TCP sequence and acknowledgment numbers.
	Seq, Ack uint32
	// Window is the TCP window; 0 means DefaultWindow.
	Window uint16
	// NoUDPChecksum sends UDP with checksum 0, "no checksum" in IPv4 and
	// invalid in IPv6 (RFC 8200 8.1), where Verify refuses it.
	NoUDPChecksum bool

	// IPv6 is the IPv6 header's fields IPv4 has not (ipv6.go); ignored
	// for IPv4.
	IPv6 IPv6

	// ICMPType and ICMPCode are the ICMP (or ICMPv6) message type and
	// code, ICMPRest
	// the four bytes after the checksum (an echo's identifier and
	// sequence number; unused in a port unreachable).
	ICMPType, ICMPCode uint8
	ICMPRest           [4]byte

	// Payload follows the L4 header (or the Ethernet header, for a frame
	// without addresses).
	Payload []byte
	// RawL4, when not nil, is everything after the IPv4 header (the
	// IPv6 extension headers), as it is: no L4 header or checksum is
	// built from the fields above. A fragment from Fragments carries its
	// piece of the datagram here.
	RawL4 []byte
}

// Bytes renders the frame. It panics on a Packet it cannot render (mixed
// address families, options of a length the header cannot hold): a
// mistake in the test, not in the program under test.
func (p Packet) Bytes() []byte {
	b := make([]byte, 0, 14+60+20+len(p.Payload))
	b = append(b, p.DstMAC[:]...)
	b = append(b, p.SrcMAC[:]...)
	if !p.Src.IsValid() && !p.Dst.IsValid() {
		b = binary.BigEndian.AppendUint16(b, p.EtherType)
		return append(b, p.Payload...)
	}
	l3 := p.L3()
	b = binary.BigEndian.AppendUint16(b, map[byte]uint16{4: EtherTypeIPv4, 6: EtherTypeIPv6}[l3[0]>>4])
	return append(b, l3...)
}

// L3 renders the packet from its IPv4 or IPv6 header on, without the
// Ethernet header: what a device without a link layer (tun, wireguard,
// ipip) carries, and what an ICMP error quotes. It panics where Bytes
// does, and on a Packet without addresses.
func (p Packet) L3() []byte {
	if p.Src.Is6() && p.Dst.Is6() {
		return p.ipv6()
	}
	if !p.Src.Is4() || !p.Dst.Is4() {
		panic(fmt.Sprintf("packet: %s -> %s: not two addresses of one family", p.Src, p.Dst))
	}
	l4 := p.RawL4
	if l4 == nil {
		l4 = p.checksummedL4()
	}
	return append(p.ipv4Header(len(l4)), l4...)
}

// checksummedL4 renders the L4 header and payload with its checksum.
func (p Packet) checksummedL4() []byte {
	l4 := p.l4()
	if p.Src.Is6() {
		p.setL4Checksum(l4, pseudoHeader6(p.Src.AsSlice(), p.finalDst(), p.Proto, len(l4)))
		return l4
	}
	src, dst := p.Src.As4(), p.Dst.As4()
	p.setL4Checksum(l4, pseudoHeader4(src[:], dst[:], p.Proto, len(l4)))
	return l4
}

// Fragments splits p's datagram (its L4 header and payload, the checksum
// computed over all of it) into fragments carrying at most size bytes of
// it each, size a multiple of 8, as a sending stack fragments: each a copy
// of p with its piece in RawL4 and its offset and MF in FragOff (DF kept).
// A datagram that fits is one fragment, p itself as a raw datagram.
// An IPv6 datagram's fragments carry a fragment header (identification
// ID), after p's extension headers, instead, and even one that fits is
// a fragment (an atomic one, RFC 6946).
func (p Packet) Fragments(size int) []Packet {
	if size <= 0 || size%8 != 0 {
		panic(fmt.Sprintf("packet: fragments of %d bytes: want a positive multiple of 8", size))
	}
	whole := p.checksummedL4()
	var out []Packet
	for at := 0; at < len(whole); at += size {
		end := min(at+size, len(whole))
		f := p
		f.RawL4 = whole[at:end]
		more := end < len(whole)
		if p.Src.Is6() {
			f.IPv6.Ext = append(slices.Clip(p.IPv6.Ext), FragmentHeader(uint16(at/8), more, uint32(p.ID)))
		} else {
			f.FragOff = p.FragOff&DF | uint16(at/8)
			if more {
				f.FragOff |= MF
			}
		}
		out = append(out, f)
	}
	return out
}

// l4 renders the L4 header and payload, checksum field zero.
func (p Packet) l4() []byte {
	var h []byte
	switch p.Proto {
	case TCP:
		h = make([]byte, 20)
		binary.BigEndian.PutUint16(h[0:], p.SrcPort)
		binary.BigEndian.PutUint16(h[2:], p.DstPort)
		binary.BigEndian.PutUint32(h[4:], p.Seq)
		binary.BigEndian.PutUint32(h[8:], p.Ack)
		h[12] = 5 << 4 // data offset: 20 bytes, no options
		h[13] = p.TCPFlags
		if h[13] == 0 {
			h[13] = SYN
		}
		w := p.Window
		if w == 0 {
			w = DefaultWindow
		}
		binary.BigEndian.PutUint16(h[14:], w)
	case UDP:
		h = make([]byte, 8)
		binary.BigEndian.PutUint16(h[0:], p.SrcPort)
		binary.BigEndian.PutUint16(h[2:], p.DstPort)
		binary.BigEndian.PutUint16(h[4:], uint16(8+len(p.Payload)))
	case ICMP, ICMPv6:
		h = []byte{p.ICMPType, p.ICMPCode, 0, 0}
		h = append(h, p.ICMPRest[:]...)
	}
	return append(h, p.Payload...)
}

// ipv4Header renders the IPv4 header, options and checksum included, for
// an L4 part of l4len bytes.
func (p Packet) ipv4Header(l4len int) []byte {
	if len(p.IPOptions)%4 != 0 || len(p.IPOptions) > 40 {
		panic(fmt.Sprintf("packet: %d bytes of IPv4 options: want a multiple of 4, at most 40", len(p.IPOptions)))
	}
	ihl := 20 + len(p.IPOptions)
	h := make([]byte, ihl)
	h[0] = 0x40 | byte(ihl/4)
	if !p.ZeroTotalLen {
		binary.BigEndian.PutUint16(h[2:], uint16(ihl+l4len))
	}
	binary.BigEndian.PutUint16(h[4:], p.ID)
	binary.BigEndian.PutUint16(h[6:], p.FragOff)
	h[8] = p.TTL
	if h[8] == 0 {
		h[8] = DefaultTTL
	}
	h[9] = p.Proto
	src, dst := p.Src.As4(), p.Dst.As4()
	copy(h[12:], src[:])
	copy(h[16:], dst[:])
	copy(h[20:], p.IPOptions)
	binary.BigEndian.PutUint16(h[10:], ipv4HeaderChecksum(h))
	return h
}

// setL4Checksum computes the checksum of the L4 part l4 and stores it,
// given the sum of its pseudo-header (0 for ICMP, which has none; ICMPv6
// has one).
func (p Packet) setL4Checksum(l4 []byte, pseudo uint32) {
	switch p.Proto {
	case TCP:
		binary.BigEndian.PutUint16(l4[16:], l4Checksum(TCP, pseudo, l4))
	case UDP:
		if !p.NoUDPChecksum {
			binary.BigEndian.PutUint16(l4[6:], l4Checksum(UDP, pseudo, l4))
		}
	case ICMP:
		binary.BigEndian.PutUint16(l4[2:], l4Checksum(ICMP, 0, l4))
	case ICMPv6:
		binary.BigEndian.PutUint16(l4[2:], l4Checksum(ICMPv6, pseudo, l4))
	}
}

// With returns a copy of p changed by f: the expected output of a program
// is usually its input with a few fields rewritten. Slices (Payload,
// IPOptions, RawL4) are shared; f should replace them rather than write
// into them.
func (p Packet) With(f func(*Packet)) Packet {
	f(&p)
	return p
}
