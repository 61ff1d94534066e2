package datapath

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"

	"github.com/sluice-lb/sluice/internal/testutil/packet"
)

// A from-scratch IPv4 packet builder for the edge-case tables (fragments,
// ICMP errors, L3 devices, TTL and MTU on redirect paths). Every header
// field can be set, and every checksum is computed over the bytes from
// scratch (internal/testutil/packet's checksums), independently of the
// kernel's incremental updates, so a byte-for-byte match of a program's
// output with a packet built here proves its checksum updates exact.

// ip4 is an IPv4 packet: its header fields and the bytes it carries.
type ip4 struct {
	src, dst string
	proto    uint8
	id       uint16
	df, mf   bool   // don't fragment, more fragments
	off      uint16 // fragment offset, in 8-byte units
	ttl      uint8  // 0 means 64
	opts     []byte // IP options (a multiple of 4 bytes)
	zeroLen  bool   // tot_len 0, as IPv4 BIG TCP sends packets over 64k
	payload  []byte // the L4 datagram, or the piece of it this fragment carries
}

func addr4(s string) [4]byte { return netip.MustParseAddr(s).As4() }

// l4Sum is the TCP or UDP checksum of seg (checksum field zero) between
// src and dst; UDP's zero is sent as 0xffff.
func l4Sum(src, dst string, proto uint8, seg []byte) uint16 {
	s, d := addr4(src), addr4(dst)
	return packet.L4Checksum4(s[:], d[:], proto, seg)
}

// udpDatagram is a UDP header and data, checksummed (noCsum: checksum 0,
// "none").
func udpDatagram(src, dst string, sport, dport uint16, data []byte, noCsum bool) []byte {
	b := make([]byte, 8, 8+len(data))
	binary.BigEndian.PutUint16(b[0:], sport)
	binary.BigEndian.PutUint16(b[2:], dport)
	binary.BigEndian.PutUint16(b[4:], uint16(8+len(data)))
	b = append(b, data...)
	if !noCsum {
		binary.BigEndian.PutUint16(b[6:], l4Sum(src, dst, 17, b))
	}
	return b
}

// tcpSegment is a 20-byte TCP header (flags as given, 0 meaning SYN) and
// data, checksummed.
func tcpSegment(src, dst string, sport, dport uint16, flags uint8, data []byte) []byte {
	if flags == 0 {
		flags = 0x02
	}
	b := make([]byte, 20, 20+len(data))
	binary.BigEndian.PutUint16(b[0:], sport)
	binary.BigEndian.PutUint16(b[2:], dport)
	binary.BigEndian.PutUint32(b[4:], 0x01020304) // seq
	b[12] = 5 << 4
	b[13] = flags
	binary.BigEndian.PutUint16(b[14:], 64240)
	b = append(b, data...)
	binary.BigEndian.PutUint16(b[16:], l4Sum(src, dst, 6, b))
	return b
}

// icmpMessage is an ICMP message of type typ and code, with the 32 bits
// after the checksum set to rest (the next-hop MTU of a FRAG_NEEDED is its
// low 16 bits) and data after them, checksummed.
func icmpMessage(typ, code uint8, rest uint32, data []byte) []byte {
	b := make([]byte, 8, 8+len(data))
	b[0], b[1] = typ, code
	binary.BigEndian.PutUint32(b[4:], rest)
	b = append(b, data...)
	binary.BigEndian.PutUint16(b[2:], packet.Checksum(b))
	return b
}

// bytes returns the packet from its IPv4 header on.
func (h ip4) bytes() []byte {
	ihl := 20 + len(h.opts)
	b := make([]byte, ihl, ihl+len(h.payload))
	b[0] = 0x40 | byte(ihl/4)
	if !h.zeroLen {
		binary.BigEndian.PutUint16(b[2:], uint16(ihl+len(h.payload)))
	}
	binary.BigEndian.PutUint16(b[4:], h.id)
	frag := h.off & 0x1fff
	if h.df {
		frag |= 0x4000
	}
	if h.mf {
		frag |= 0x2000
	}
	binary.BigEndian.PutUint16(b[6:], frag)
	b[8] = h.ttl
	if b[8] == 0 {
		b[8] = 64
	}
	b[9] = h.proto
	s, d := addr4(h.src), addr4(h.dst)
	copy(b[12:], s[:])
	copy(b[16:], d[:])
	copy(b[20:], h.opts)
	binary.BigEndian.PutUint16(b[10:], packet.Checksum(b))
	return append(b, h.payload...)
}

// fragments splits h into fragments carrying at most size bytes of its
// payload each (size a multiple of 8), as a stack fragments a datagram.
func (h ip4) fragments(size int) []ip4 {
	var out []ip4
	for at := 0; at < len(h.payload); at += size {
		f := h
		end := min(at+size, len(h.payload))
		f.payload = h.payload[at:end]
		f.off = uint16(at / 8)
		f.mf = end < len(h.payload)
		out = append(out, f)
	}
	return out
}

// frame puts an Ethernet header (IPv4) in front of l3.
func frame(dst, src [6]byte, l3 []byte) []byte {
	b := make([]byte, 14, 14+len(l3))
	copy(b[0:], dst[:])
	copy(b[6:], src[:])
	binary.BigEndian.PutUint16(b[12:], 0x0800)
	return append(b, l3...)
}

// ether is frame with the client and node MACs of the tc tables.
func ether(l3 []byte) []byte { return frame(nodeMAC, clientMAC, l3) }

// fwdTTL is the TTL of a packet (sent with 64) that tc or XDP forwarded
// to its next hop itself: one less, as the stack's forwarding would.
const fwdTTL = 63

// packetDiff describes how got differs from want: their lengths, the
// first differing offset and the bytes from a little before it (whole
// packets of a few kilobytes are unreadable in a failure message).
func packetDiff(got, want []byte) string {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	from := max(0, i-8)
	show := func(b []byte) []byte { return b[min(from, len(b)):min(from+48, len(b))] }
	return fmt.Sprintf("%d bytes, want %d; first difference at byte %d:\n got ...%x\nwant ...%x", len(got), len(want), i, show(got), show(want))
}

// edgeStep is one packet through tc ingress (or egress): the verdict and
// the packet expected (nil: unchanged).
type edgeStep struct {
	name    string
	egress  bool
	in      []byte
	verdict uint32
	want    []byte // nil: the output is the input
}

// runEdgeSteps runs the steps in order, in the caller's network namespace.
func runEdgeSteps(t *testing.T, d *Datapath, steps []edgeStep) {
	t.Helper()
	for _, s := range steps {
		prog := d.TCIngress()
		if s.egress {
			prog = d.TCEgress()
		}
		verdict, out := runProg(t, prog, s.in)
		want := s.want
		if want == nil {
			want = s.in
		}
		if verdict != s.verdict || !bytes.Equal(out, want) {
			t.Errorf("%s: verdict %d (want %d), output %s", s.name, verdict, s.verdict, packetDiff(out, want))
		}
	}
}
