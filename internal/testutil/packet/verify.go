package packet

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
)

// Parse reads a frame Bytes could have built back into a Packet: the
// Ethernet header, and for IPv4 and IPv6 the network header (IPv6's
// extension headers too) and the TCP, UDP or ICMP(v6) header, whatever
// their checksums. A frame of another EtherType
// comes back raw (EtherType and Payload). A later fragment has no L4
// header: its L4 bytes come back as Payload.
func Parse(frame []byte) (Packet, error) {
	var p Packet
	if len(frame) < 14 {
		return p, fmt.Errorf("frame of %d bytes: shorter than an Ethernet header", len(frame))
	}
	copy(p.DstMAC[:], frame[0:6])
	copy(p.SrcMAC[:], frame[6:12])
	p.EtherType = binary.BigEndian.Uint16(frame[12:])
	switch p.EtherType {
	case EtherTypeIPv4:
	case EtherTypeIPv6:
		return p, parseIPv6(&p, frame[14:])
	default:
		p.Payload = frame[14:]
		return p, nil
	}
	ip, l4, err := splitIPv4(frame[14:])
	if err != nil {
		return p, err
	}
	p.Src, p.Dst = netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
	p.Proto, p.TTL = ip[9], ip[8]
	p.ID, p.FragOff = binary.BigEndian.Uint16(ip[4:]), binary.BigEndian.Uint16(ip[6:])
	if len(ip) > 20 {
		p.IPOptions = ip[20:]
	}
	if p.FragOff&0x1fff != 0 {
		p.Payload = l4
		return p, nil
	}
	return p, parseL4(&p, l4)
}

// parseIPv6 reads the IPv6 header, extension headers and upper layer of
// b into p.
func parseIPv6(p *Packet, b []byte) error {
	ip, ext, proto, l4, err := splitIPv6(b)
	if err != nil {
		return err
	}
	v := binary.BigEndian.Uint32(ip)
	p.IPv6 = IPv6{TrafficClass: uint8(v >> 20), FlowLabel: v & 0xfffff, Ext: ext}
	p.Src, p.Dst = netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40]))
	p.Proto, p.TTL = proto, ip[7]
	if laterFragment6(ext) {
		p.Payload = l4
		return nil
	}
	return parseL4(p, l4)
}

// laterFragment6 says whether ext holds a fragment header of a fragment
// other than the first: its upper-layer bytes are data, with no header.
func laterFragment6(ext []ExtHeader) bool {
	for _, e := range ext {
		if off, _, ok := e.FragOffset(); ok && off != 0 {
			return true
		}
	}
	return false
}

// parseL4 reads the TCP, UDP or ICMP(v6) header of l4 into p.
func parseL4(p *Packet, l4 []byte) error {
	switch p.Proto {
	case TCP:
		if len(l4) < 20 {
			return fmt.Errorf("TCP header: %d bytes", len(l4))
		}
		if int(l4[12]>>4)*4 != 20 {
			return fmt.Errorf("TCP header: data offset %d: want 20 bytes without options", int(l4[12]>>4)*4)
		}
		p.SrcPort, p.DstPort = binary.BigEndian.Uint16(l4[0:]), binary.BigEndian.Uint16(l4[2:])
		p.Seq, p.Ack = binary.BigEndian.Uint32(l4[4:]), binary.BigEndian.Uint32(l4[8:])
		p.TCPFlags, p.Window = l4[13], binary.BigEndian.Uint16(l4[14:])
		p.Payload = l4[20:]
	case UDP:
		if len(l4) < 8 {
			return fmt.Errorf("UDP header: %d bytes", len(l4))
		}
		p.SrcPort, p.DstPort = binary.BigEndian.Uint16(l4[0:]), binary.BigEndian.Uint16(l4[2:])
		p.NoUDPChecksum = binary.BigEndian.Uint16(l4[6:]) == 0
		p.Payload = l4[8:]
	case ICMP, ICMPv6:
		if len(l4) < 8 {
			return fmt.Errorf("ICMP header: %d bytes", len(l4))
		}
		p.ICMPType, p.ICMPCode = l4[0], l4[1]
		p.ICMPRest = [4]byte(l4[4:8])
		p.Payload = l4[8:]
	default:
		p.Payload = l4
	}
	return nil
}

// splitIPv4 returns the IPv4 header of b (options included) and the L4
// bytes its total length covers.
func splitIPv4(b []byte) (ip, l4 []byte, err error) {
	if len(b) < 20 || b[0]>>4 != 4 {
		return nil, nil, fmt.Errorf("IPv4 header: %d bytes, version %d", len(b), b[0]>>4)
	}
	ihl := int(b[0]&0xf) * 4
	total := int(binary.BigEndian.Uint16(b[2:]))
	if ihl < 20 || total < ihl || total > len(b) {
		return nil, nil, fmt.Errorf("IPv4 header length %d, total length %d, in %d bytes", ihl, total, len(b))
	}
	return b[:ihl], b[ihl:total], nil
}

// Verify recomputes from scratch every checksum of an IPv4 or IPv6 frame
// (the IPv4 header's, and that of a TCP, UDP, ICMP or ICMPv6 message that
// is not a later fragment) and returns an error naming each that differs
// from the one in the frame. A UDP checksum of 0 ("none") is accepted in
// IPv4 and refused in IPv6, where it is invalid (RFC 8200 8.1). Frames of
// other EtherTypes have no checksum Verify knows and pass.
func Verify(frame []byte) error {
	if len(frame) < 14 {
		return fmt.Errorf("frame of %d bytes: shorter than an Ethernet header", len(frame))
	}
	switch binary.BigEndian.Uint16(frame[12:]) {
	case EtherTypeIPv4:
		return verifyIPv4(frame[14:])
	case EtherTypeIPv6:
		p, err := Parse(frame)
		if err != nil {
			return err
		}
		ip, ext, proto, l4, _ := splitIPv6(frame[14:])
		if laterFragment6(ext) {
			return nil
		}
		p.Dst = netip.AddrFrom16([16]byte(ip[24:40]))
		return verifyL4(proto, pseudoHeader6(ip[8:24], p.finalDst(), proto, len(l4)), l4, true)
	}
	return nil
}

// verifyIPv4 is Verify of the IPv4 packet b.
func verifyIPv4(b []byte) error {
	ip, l4, err := splitIPv4(b)
	if err != nil {
		return err
	}
	var errs []error
	if got, want := binary.BigEndian.Uint16(ip[10:]), ipv4HeaderChecksum(ip); got != want {
		errs = append(errs, fmt.Errorf("IPv4 header checksum %#04x, recomputed %#04x", got, want))
	}
	proto, fragOff := ip[9], binary.BigEndian.Uint16(ip[6:])
	if fragOff&0x1fff != 0 || proto == ICMPv6 {
		return errors.Join(errs...)
	}
	var pseudo uint32
	if proto != ICMP {
		pseudo = pseudoHeader4(ip[12:16], ip[16:20], proto, len(l4))
	}
	return errors.Join(append(errs, verifyL4(proto, pseudo, l4, false))...)
}

// verifyL4 checks the checksum of the L4 part l4 of protocol proto under
// the pseudo-header sum pseudo; v6 refuses a UDP checksum of 0.
func verifyL4(proto uint8, pseudo uint32, l4 []byte, v6 bool) error {
	name := map[uint8]string{TCP: "TCP", UDP: "UDP", ICMP: "ICMP", ICMPv6: "ICMPv6"}[proto]
	if name == "" {
		return nil
	}
	off := csumOffset(proto)
	if len(l4) < off+2 {
		return fmt.Errorf("%s header truncated: %d bytes", name, len(l4))
	}
	got := binary.BigEndian.Uint16(l4[off:])
	if proto == UDP && got == 0 {
		if v6 {
			return errors.New("UDP checksum 0: invalid in IPv6")
		}
		return nil
	}
	if want := l4Checksum(proto, pseudo, l4); got != want {
		return fmt.Errorf("%s checksum %#04x, recomputed %#04x", name, got, want)
	}
	return nil
}

// Diff says how the frame got differs from want, for a failure message:
// their lengths, the first offset where they differ and the bytes from a
// little before it (whole frames of a few kilobytes are unreadable).
func Diff(got, want []byte) string {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	from := max(0, i-8)
	show := func(b []byte) []byte { return b[min(from, len(b)):min(from+48, len(b))] }
	return fmt.Sprintf("%d bytes, want %d; first difference at byte %d:\n got ...%x\nwant ...%x", len(got), len(want), i, show(got), show(want))
}
