package packet

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
)

// Parse reads a frame Bytes could have built back into a Packet: the
// Ethernet header, and for IPv4 the network header and the TCP, UDP or
// ICMP header, whatever their checksums. A frame of another EtherType
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
	if p.EtherType != EtherTypeIPv4 {
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
	switch p.Proto {
	case TCP:
		if len(l4) < 20 || int(l4[12]>>4)*4 != 20 {
			return p, fmt.Errorf("TCP header: %d bytes, data offset %d: want 20 bytes without options", len(l4), int(l4[12]>>4)*4)
		}
		p.SrcPort, p.DstPort = binary.BigEndian.Uint16(l4[0:]), binary.BigEndian.Uint16(l4[2:])
		p.Seq, p.Ack = binary.BigEndian.Uint32(l4[4:]), binary.BigEndian.Uint32(l4[8:])
		p.TCPFlags, p.Window = l4[13], binary.BigEndian.Uint16(l4[14:])
		p.Payload = l4[20:]
	case UDP:
		if len(l4) < 8 {
			return p, fmt.Errorf("UDP header: %d bytes", len(l4))
		}
		p.SrcPort, p.DstPort = binary.BigEndian.Uint16(l4[0:]), binary.BigEndian.Uint16(l4[2:])
		p.NoUDPChecksum = binary.BigEndian.Uint16(l4[6:]) == 0
		p.Payload = l4[8:]
	case ICMP:
		if len(l4) < 8 {
			return p, fmt.Errorf("ICMP header: %d bytes", len(l4))
		}
		p.ICMPType, p.ICMPCode = l4[0], l4[1]
		p.ICMPRest = [4]byte(l4[4:8])
		p.Payload = l4[8:]
	default:
		p.Payload = l4
	}
	return p, nil
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

// Verify recomputes from scratch every checksum of an IPv4 frame (the
// header's, and that of a TCP, UDP or ICMP message that is not a later
// fragment) and returns an error naming each that differs from the one in
// the frame. A UDP checksum of 0 ("none") is accepted. Frames of other
// EtherTypes have no checksum Verify knows and pass.
func Verify(frame []byte) error {
	if len(frame) < 14 {
		return fmt.Errorf("frame of %d bytes: shorter than an Ethernet header", len(frame))
	}
	if binary.BigEndian.Uint16(frame[12:]) != EtherTypeIPv4 {
		return nil
	}
	ip, l4, err := splitIPv4(frame[14:])
	if err != nil {
		return err
	}
	var errs []error
	if got, want := binary.BigEndian.Uint16(ip[10:]), ipv4HeaderChecksum(ip); got != want {
		errs = append(errs, fmt.Errorf("IPv4 header checksum %#04x, recomputed %#04x", got, want))
	}
	proto, fragOff := ip[9], binary.BigEndian.Uint16(ip[6:])
	name := map[uint8]string{TCP: "TCP", UDP: "UDP", ICMP: "ICMP"}[proto]
	if name == "" || fragOff&0x1fff != 0 {
		return errors.Join(errs...)
	}
	off := csumOffset(proto)
	if len(l4) < off+2 {
		return errors.Join(append(errs, fmt.Errorf("%s header truncated: %d bytes", name, len(l4)))...)
	}
	got := binary.BigEndian.Uint16(l4[off:])
	var pseudo uint32
	if proto != ICMP {
		pseudo = pseudoHeader4(ip[12:16], ip[16:20], proto, len(l4))
	}
	if want := l4Checksum(proto, pseudo, l4); got != want && !(proto == UDP && got == 0) {
		errs = append(errs, fmt.Errorf("%s checksum %#04x, recomputed %#04x", name, got, want))
	}
	return errors.Join(errs...)
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
