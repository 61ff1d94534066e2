package datapath

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// Test helpers shared by the packet, socket and attach tests: a datapath
// in a pin directory of its own, service seeding through the production
// Maps API, and a from-scratch packet builder whose checksums are computed
// independently of the kernel's incremental updates.

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: loads BPF programs, creates network namespaces and cgroups")
	}
}

func randomSuffix() string {
	var b [6]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// testPinDir returns a fresh directory on bpffs, removed with everything
// under it when the test ends.
func testPinDir(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(DefaultBPFFS, "sluice-test-"+randomSuffix())
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatalf("create pin dir: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// smallConfig keeps test maps small: LRU maps are preallocated.
func smallConfig(bpffs string) Config {
	return Config{
		BPFFS:             bpffs,
		MaxServices:       256,
		MaxBackends:       1024,
		MaxServiceEntries: 4096,
		MaxConntrack:      4096,
		MaxConntrackNew:   4096,
		MaxSockRev:        1024,
	}
}

func openTest(t testing.TB, cfg Config) *Datapath {
	t.Helper()
	d, err := Open(cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func newTestDatapath(t *testing.T) *Datapath {
	t.Helper()
	requireRoot(t)
	return openTest(t, smallConfig(testPinDir(t)))
}

func l4(addr string, port uint16, proto model.Protocol) model.L4Addr {
	return model.L4Addr{Addr: netip.MustParseAddr(addr), Port: port, Proto: proto}
}

type testBackend struct {
	id   reconciler.BackendID
	addr model.L4Addr
}

// addService writes a service the way the reconciler does: backends, then
// slots, then the reverse-NAT entry and the master.
func addService(t testing.TB, m *Maps, id reconciler.ServiceID, fe model.L4Addr, bes ...testBackend) {
	t.Helper()
	for _, b := range bes {
		if err := m.UpsertBackend(b.id, b.addr); err != nil {
			t.Fatal(err)
		}
	}
	for i, b := range bes {
		if err := m.UpsertSlot(fe, uint32(i+1), b.id); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.UpsertRevNat(id, fe); err != nil {
		t.Fatal(err)
	}
	if err := m.UpsertMaster(fe, reconciler.Master{ID: id, Count: uint32(len(bes))}); err != nil {
		t.Fatal(err)
	}
}

// pkt describes an Ethernet/IPv4/TCP-or-UDP packet.
type pkt struct {
	srcMAC, dstMAC [6]byte
	src, dst       string
	sport, dport   uint16
	proto          uint8 // 6, 17 or anything else (then payload is the L4)
	ipOpts         []byte
	fragOff        uint16 // the frag_off field (flags and offset), host order
	ttl            uint8
	payload        []byte
	udpNoCsum      bool // UDP checksum 0: "no checksum"
	etherType      uint16
	tcpFlags       uint8 // TCP flags byte; 0 means SYN
}

var (
	clientMAC = [6]byte{0x02, 0, 0, 0, 0, 0x01}
	nodeMAC   = [6]byte{0x02, 0, 0, 0, 0, 0x02}
)

// csumAdd adds b to a one's complement sum, as 16-bit big-endian words.
func csumAdd(sum uint32, b []byte) uint32 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	return sum
}

func csumFold(sum uint32) uint16 {
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// ipv4HeaderChecksum computes the header checksum from scratch (the
// checksum field itself is skipped).
func ipv4HeaderChecksum(hdr []byte) uint16 {
	sum := csumAdd(0, hdr[:10])
	sum = csumAdd(sum, hdr[12:])
	return csumFold(sum)
}

// l4Checksum computes a TCP or UDP checksum from scratch over the
// pseudo-header and segment (whose checksum field is skipped).
func l4Checksum(src, dst []byte, proto uint8, seg []byte) uint16 {
	csumOff := 16
	if proto == 17 {
		csumOff = 6
	}
	var pseudo [12]byte
	copy(pseudo[0:4], src)
	copy(pseudo[4:8], dst)
	pseudo[9] = proto
	binary.BigEndian.PutUint16(pseudo[10:], uint16(len(seg)))
	sum := csumAdd(0, pseudo[:])
	sum = csumAdd(sum, seg[:csumOff])
	sum = csumAdd(sum, seg[csumOff+2:])
	c := csumFold(sum)
	if proto == 17 && c == 0 {
		c = 0xffff
	}
	return c
}

func (p pkt) bytes() []byte {
	et := p.etherType
	if et == 0 {
		et = 0x0800
	}
	b := make([]byte, 0, 128)
	b = append(b, p.dstMAC[:]...)
	b = append(b, p.srcMAC[:]...)
	b = binary.BigEndian.AppendUint16(b, et)
	if et != 0x0800 {
		return append(b, p.payload...)
	}

	var l4b []byte
	switch p.proto {
	case 6:
		l4b = make([]byte, 20)
		binary.BigEndian.PutUint16(l4b[0:], p.sport)
		binary.BigEndian.PutUint16(l4b[2:], p.dport)
		binary.BigEndian.PutUint32(l4b[4:], 0x01020304) // seq
		l4b[12] = 5 << 4
		l4b[13] = 0x02 // SYN
		if p.tcpFlags != 0 {
			l4b[13] = p.tcpFlags
		}
		binary.BigEndian.PutUint16(l4b[14:], 64240)
		l4b = append(l4b, p.payload...)
	case 17:
		l4b = make([]byte, 8)
		binary.BigEndian.PutUint16(l4b[0:], p.sport)
		binary.BigEndian.PutUint16(l4b[2:], p.dport)
		l4b = append(l4b, p.payload...)
		binary.BigEndian.PutUint16(l4b[4:], uint16(len(l4b)))
	default:
		l4b = append(l4b, p.payload...)
	}

	ihl := 20 + len(p.ipOpts)
	ip := make([]byte, ihl)
	ip[0] = 0x40 | byte(ihl/4)
	binary.BigEndian.PutUint16(ip[2:], uint16(ihl+len(l4b)))
	binary.BigEndian.PutUint16(ip[4:], 0x1234)
	binary.BigEndian.PutUint16(ip[6:], p.fragOff)
	ip[8] = p.ttl
	if ip[8] == 0 {
		ip[8] = 64
	}
	ip[9] = p.proto
	src, dst := netip.MustParseAddr(p.src).As4(), netip.MustParseAddr(p.dst).As4()
	copy(ip[12:], src[:])
	copy(ip[16:], dst[:])
	copy(ip[20:], p.ipOpts)
	binary.BigEndian.PutUint16(ip[10:], ipv4HeaderChecksum(ip))

	switch {
	case p.proto == 6:
		binary.BigEndian.PutUint16(l4b[16:], l4Checksum(src[:], dst[:], 6, l4b))
	case p.proto == 17 && !p.udpNoCsum:
		binary.BigEndian.PutUint16(l4b[6:], l4Checksum(src[:], dst[:], 17, l4b))
	}
	b = append(b, ip...)
	return append(b, l4b...)
}
