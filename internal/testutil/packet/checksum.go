package packet

import "encoding/binary"

// The Internet checksum (RFC 1071), computed from scratch over whole
// headers: the reference the BPF programs' incremental updates (RFC 1624)
// are checked against.

// sum adds b to a one's complement sum as 16-bit big-endian words, an odd
// last byte padded with zero.
func sum(acc uint32, b []byte) uint32 {
	for i := 0; i+1 < len(b); i += 2 {
		acc += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		acc += uint32(b[len(b)-1]) << 8
	}
	return acc
}

// fold folds the carries of acc into 16 bits and complements it.
func fold(acc uint32) uint16 {
	for acc>>16 != 0 {
		acc = acc&0xffff + acc>>16
	}
	return ^uint16(acc)
}

// Checksum is the Internet checksum of b, whose checksum field the caller
// has zeroed: an IPv4 header's, or an ICMP message's.
func Checksum(b []byte) uint16 { return fold(sum(0, b)) }

// L4Checksum4 is the checksum of seg, a TCP, UDP or ICMP header and its
// payload (its checksum field skipped), between the IPv4 addresses src and
// dst (ICMP has no pseudo-header). A UDP checksum of 0 is sent as 0xffff.
func L4Checksum4(src, dst []byte, proto uint8, seg []byte) uint16 {
	var pseudo uint32
	if proto != ICMP {
		pseudo = pseudoHeader4(src, dst, proto, len(seg))
	}
	return l4Checksum(proto, pseudo, seg)
}

// ipv4HeaderChecksum is the checksum of an IPv4 header (options
// included), its own checksum field skipped.
func ipv4HeaderChecksum(h []byte) uint16 {
	return fold(sum(sum(0, h[:10]), h[12:]))
}

// pseudoHeader4 is the sum of the IPv4 pseudo-header TCP and UDP
// checksums cover.
func pseudoHeader4(src, dst []byte, proto uint8, l4len int) uint32 {
	acc := sum(sum(0, src), dst)
	return acc + uint32(proto) + uint32(l4len)
}

// csumOffset is where the checksum of an L4 header of proto sits.
func csumOffset(proto uint8) int {
	switch proto {
	case TCP:
		return 16
	case UDP:
		return 6
	default: // ICMP
		return 2
	}
}

// l4Checksum is the checksum of the L4 part l4 (header and payload, its
// checksum field skipped) under the pseudo-header sum pseudo. A UDP
// checksum that computes to 0 is sent as 0xffff: 0 means "none".
func l4Checksum(proto uint8, pseudo uint32, l4 []byte) uint16 {
	off := csumOffset(proto)
	c := fold(sum(sum(pseudo, l4[:off]), l4[off+2:]))
	if proto == UDP && c == 0 {
		c = 0xffff
	}
	return c
}
