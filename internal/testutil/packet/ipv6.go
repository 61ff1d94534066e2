package packet

import (
	"encoding/binary"
	"fmt"
)

// IPv6 (RFC 8200): the fixed header, extension headers, and the
// pseudo-header that TCP, UDP and ICMPv6 checksums cover.

// IPv6 extension header types (the next header values that name them).
const (
	HopByHop    uint8 = 0
	Routing     uint8 = 43
	FragmentExt uint8 = 44
	DestOpts    uint8 = 60
	NoNextHdr   uint8 = 59
)

// ICMPv6 types this package's callers use (RFC 4443).
const (
	ICMPv6Unreachable   uint8 = 1
	ICMPv6PacketTooBig  uint8 = 2
	ICMPv6TimeExceeded  uint8 = 3
	ICMPv6ParamProblem  uint8 = 4
	ICMPv6EchoRequest   uint8 = 128
	ICMPv6EchoReply     uint8 = 129
	ICMPv6PortUnreach   uint8 = 4 // code of ICMPv6Unreachable
	ICMPv6AdminProhibit uint8 = 1 // code of ICMPv6Unreachable
)

// IPv6 holds what an IPv6 header has beyond the fields Packet shares with
// IPv4 (addresses, Proto as the last next header, TTL as the hop limit).
type IPv6 struct {
	TrafficClass uint8
	FlowLabel    uint32 // 20 bits
	// Ext are the extension headers between the fixed header and the
	// upper layer (Proto), in order; each one's next header field is
	// filled in from its successor.
	Ext []ExtHeader
}

// ExtHeader is an IPv6 extension header: its Type (the next header value
// of the header before it) and Data, everything after its own next header
// byte (the length byte included, for the headers that have one), as it
// goes on the wire. The constructors below build well-formed ones; a test
// of a malformed header writes Data itself.
type ExtHeader struct {
	Type uint8
	Data []byte
}

// HopByHopHeader and DestOptsHeader are an options header carrying the
// options opts (each a whole TLV), padded to a multiple of 8 bytes with
// Pad1/PadN as RFC 8200 4.2 says.
func HopByHopHeader(opts ...[]byte) ExtHeader { return optionsHeader(HopByHop, opts) }

// DestOptsHeader: see HopByHopHeader.
func DestOptsHeader(opts ...[]byte) ExtHeader { return optionsHeader(DestOpts, opts) }

func optionsHeader(typ uint8, opts [][]byte) ExtHeader {
	d := []byte{0} // the length byte, set below
	for _, o := range opts {
		d = append(d, o...)
	}
	switch pad := (8 - (len(d)+1)%8) % 8; pad {
	case 0:
	case 1:
		d = append(d, 0) // Pad1
	default:
		d = append(d, 1, byte(pad-2)) // PadN
		d = append(d, make([]byte, pad-2)...)
	}
	d[0] = byte((len(d)+1)/8 - 1)
	return ExtHeader{Type: typ, Data: d}
}

// RoutingHeader is a routing header of routing type typ (0 or 2: a
// reserved word and then addresses) with segsLeft segments left, listing
// addrs. With segments left, the last address is the final destination,
// which the upper-layer checksum's pseudo-header names (RFC 8200 8.1).
func RoutingHeader(typ, segsLeft uint8, addrs ...[16]byte) ExtHeader {
	d := []byte{byte(2 * len(addrs)), typ, segsLeft, 0, 0, 0, 0}
	for _, a := range addrs {
		d = append(d, a[:]...)
	}
	return ExtHeader{Type: Routing, Data: d}
}

// FragmentHeader is a fragment header: offset in 8-byte units, more
// fragments, identification id.
func FragmentHeader(offset uint16, more bool, id uint32) ExtHeader {
	d := make([]byte, 7)
	v := offset << 3
	if more {
		v |= 1
	}
	binary.BigEndian.PutUint16(d[1:], v)
	binary.BigEndian.PutUint32(d[3:], id)
	return ExtHeader{Type: FragmentExt, Data: d}
}

// FragOffset returns the offset (in 8-byte units) and M flag of a
// fragment header, and false for another header or a truncated one.
func (e ExtHeader) FragOffset() (offset uint16, more, ok bool) {
	if e.Type != FragmentExt || len(e.Data) < 3 {
		return 0, false, false
	}
	v := binary.BigEndian.Uint16(e.Data[1:])
	return v >> 3, v&1 != 0, true
}

// finalDst is the destination the upper-layer pseudo-header names: the
// last address of a type 0 or 2 routing header with segments left, else
// Dst.
func (p Packet) finalDst() []byte {
	for _, e := range p.IPv6.Ext {
		if e.Type == Routing && len(e.Data) >= 7+16 && e.Data[2] > 0 && (e.Data[1] == 0 || e.Data[1] == 2) {
			return e.Data[len(e.Data)-16:]
		}
	}
	return p.Dst.AsSlice()
}

// ipv6 renders the packet from its IPv6 header on.
func (p Packet) ipv6() []byte {
	l4 := p.RawL4
	if l4 == nil {
		l4 = p.checksummedL4()
	}
	var ext []byte
	for i, e := range p.IPv6.Ext {
		next := p.Proto
		if i+1 < len(p.IPv6.Ext) {
			next = p.IPv6.Ext[i+1].Type
		}
		ext = append(append(ext, next), e.Data...)
	}
	h := make([]byte, 40, 40+len(ext)+len(l4))
	binary.BigEndian.PutUint32(h[0:], 6<<28|uint32(p.IPv6.TrafficClass)<<20|p.IPv6.FlowLabel&0xfffff)
	if !p.ZeroTotalLen {
		binary.BigEndian.PutUint16(h[4:], uint16(len(ext)+len(l4)))
	}
	h[6] = p.Proto
	if len(p.IPv6.Ext) > 0 {
		h[6] = p.IPv6.Ext[0].Type
	}
	h[7] = p.TTL
	if h[7] == 0 {
		h[7] = DefaultTTL
	}
	src, dst := p.Src.As16(), p.Dst.As16()
	copy(h[8:], src[:])
	copy(h[24:], dst[:])
	return append(append(h, ext...), l4...)
}

// pseudoHeader6 is the sum of the IPv6 pseudo-header (RFC 8200 8.1):
// source, final destination, upper-layer length (32 bits), next header.
func pseudoHeader6(src, dst []byte, proto uint8, l4len int) uint32 {
	acc := sum(sum(0, src), dst)
	return acc + uint32(l4len>>16) + uint32(l4len&0xffff) + uint32(proto)
}

// L4Checksum6 is the checksum of seg, a TCP, UDP or ICMPv6 header and its
// payload (its checksum field skipped), between the IPv6 addresses src
// and dst (the final destination). A UDP checksum of 0 is sent as 0xffff.
func L4Checksum6(src, dst []byte, proto uint8, seg []byte) uint16 {
	return l4Checksum(proto, pseudoHeader6(src, dst, proto, len(seg)), seg)
}

// splitIPv6 returns the fixed header of b, its extension headers (Data
// without their next header byte, which the chain implies), the upper
// layer protocol and the bytes the payload length covers after them.
func splitIPv6(b []byte) (ip []byte, ext []ExtHeader, proto uint8, l4 []byte, err error) {
	if len(b) < 40 || b[0]>>4 != 6 {
		return nil, nil, 0, nil, fmt.Errorf("IPv6 header: %d bytes, version %d", len(b), b[0]>>4)
	}
	plen := int(binary.BigEndian.Uint16(b[4:]))
	if 40+plen > len(b) {
		return nil, nil, 0, nil, fmt.Errorf("IPv6 payload length %d, in %d bytes", plen, len(b)-40)
	}
	ip, rest, next := b[:40], b[40:40+plen], b[6]
	for next == HopByHop || next == Routing || next == DestOpts || next == FragmentExt {
		n := 8
		if next != FragmentExt && len(rest) >= 2 {
			n = (int(rest[1]) + 1) * 8
		}
		if len(rest) < n {
			return nil, nil, 0, nil, fmt.Errorf("IPv6 extension header %d: %d bytes, %d left", next, n, len(rest))
		}
		ext = append(ext, ExtHeader{Type: next, Data: rest[1:n]})
		next, rest = rest[0], rest[n:]
	}
	return ip, ext, next, rest, nil
}
