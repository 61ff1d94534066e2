package datapath

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/packet"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// Packets the parser once passed untranslated (B8): IPv4 BIG TCP, whose
// GSO packets over 64k carry tot_len 0, and packets on L3 devices (tun,
// wireguard, ipip), where tc sees no Ethernet header.

// gsoCtx is struct __sk_buff up to gso_size, laid out byte for byte (the
// context is copied in as is): BPF_PROG_TEST_RUN takes ifindex, gso_segs
// and gso_size from it.
type gsoCtx struct {
	_       [10]uint32 // len .. ingress_ifindex
	Ifindex uint32
	_       [25]uint32 // tc_index .. data_meta
	_       uint64     // flow_keys
	_       uint64     // tstamp
	_       uint32     // wire_len
	GSOSegs uint32
	_       uint64 // sk
	GSOSize uint32
	_       uint32 // padding
}

func init() {
	if off := unsafe.Offsetof(gsoCtx{}.GSOSize); off != 176 {
		panic(fmt.Sprintf("gsoCtx.GSOSize at %d, want 176 (struct __sk_buff)", off))
	}
}

func runCtx(t *testing.T, prog *ebpf.Program, ctx any, in []byte) (uint32, []byte) {
	t.Helper()
	opts := ebpf.RunOptions{Data: append([]byte(nil), in...), DataOut: make([]byte, len(in)+256), Context: ctx}
	ret, err := prog.Run(&opts)
	if err != nil {
		t.Fatalf("BPF_PROG_TEST_RUN: %v", err)
	}
	return ret, opts.DataOut
}

// TestTCBigTCP: a GSO packet with tot_len 0 (IPv4 BIG TCP) is translated,
// its length taken from the skb, as the kernel does (iph_totlen); tot_len
// 0 on a packet that is not TCP GSO is still malformed. Its IPv6 twin
// takes both forms of IPv6 BIG TCP (ipv6_big_tcp, parse6.h): payload
// length 0 behind a hop-by-hop header holding only a jumbo payload option,
// what Linux 6.0 to 6.19 (this one, 6.18) put on a GSO packet over 64 KiB
// both ways (ip6_xmit, ipv6_gro_complete: a packet socket on a device with
// gso_max_size 200000 sees "00 c2 04" after the fixed header), and
// payload length 0 straight before TCP, Linux 7.0's form, IPv4's.
func TestTCBigTCP(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		d := newTestDatapath(t)
		vip := twinL4(v6, l4("10.96.0.70", 80, model.TCP))
		be := testBackend{71, twinL4(v6, l4("10.1.7.1", 8080, model.TCP))}
		addService(t, d.Maps(), 1, vip, be)
		vipS, beS := vip.Addr.String(), be.addr.Addr.String()
		client := twinAddr(v6, "10.0.0.7")
		// BPF_PROG_TEST_RUN takes at most a page: 2400 bytes, 2 segments.
		data := bytes.Repeat([]byte("big tcp "), 300)
		// seg is a segment of the GSO packet, IPv6's with the jumbo
		// header of Linux before 7.0 unless noHBH.
		seg := func(src string, sport uint16, dst string, dport uint16, noHBH bool) []byte {
			p := tcpPacket(src, sport, dst, dport, 0x18, data)
			p.FragOff, p.ZeroTotalLen = packet.DF, true
			if v6 && !noHBH { // option 0xc2 (IPV6_TLV_JUMBO), 4 bytes: the payload length
				jumbo := binary.BigEndian.AppendUint32([]byte{0xc2, 4}, uint32(8+20+len(data)))
				p.IPv6.Ext = []packet.ExtHeader{packet.HopByHopHeader(jumbo)}
			}
			return ether(p)
		}
		gso := gsoCtx{GSOSegs: 2, GSOSize: 1448}

		type step struct {
			name    string
			prog    *ebpf.Program
			ctx     gsoCtx
			in, out []byte // out nil: unchanged
		}
		steps := []step{
			{"request_dnat", d.TCIngress(), gso, seg(client, 40000, vipS, 80, false), seg(client, 40000, beS, 8080, false)},
			{"reply_rev_nat_egress", d.TCEgress(), gso, seg(beS, 8080, client, 40000, false), seg(vipS, 80, client, 40000, false)},
			{"not_gso_malformed", d.TCIngress(), gsoCtx{}, seg(client, 40001, vipS, 80, false), nil},
		}
		if v6 {
			steps = append(steps,
				step{"request_dnat_no_hbh", d.TCIngress(), gso, seg(client, 40002, vipS, 80, true), seg(client, 40002, beS, 8080, true)},
				step{"reply_rev_nat_egress_no_hbh", d.TCEgress(), gso, seg(beS, 8080, client, 40002, true), seg(vipS, 80, client, 40002, true)},
				step{"not_gso_no_hbh_malformed", d.TCIngress(), gsoCtx{}, seg(client, 40003, vipS, 80, true), nil})
		}
		malformed := 0
		for _, c := range steps {
			if c.out == nil {
				malformed++
			}
			t.Run(c.name, func(t *testing.T) {
				verdict, out := runCtx(t, c.prog, c.ctx, c.in)
				want := c.out
				if want == nil {
					want = c.in
				}
				if verdict != tcActOK || !bytes.Equal(out, want) {
					t.Fatalf("verdict %d (want %d), output %s", verdict, tcActOK, packet.Diff(out, want))
				}
			})
		}
		cs := counters(t, d)
		if cs["tc_malformed"] != uint64(malformed) {
			t.Errorf("tc_malformed = %d, want %d (length 0 without GSO)", cs["tc_malformed"], malformed)
		}
	})
}

// tunIfreq is struct ifreq for TUNSETIFF.
type tunIfreq struct {
	name  [unix.IFNAMSIZ]byte
	flags uint16
	_     [22]byte
}

// openTun creates the tun device name (IFF_TUN, no packet information) in
// the calling thread's network namespace and returns its file, closed (and
// the device gone) when the test ends.
func openTun(t *testing.T, name string) *os.File {
	t.Helper()
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		t.Skipf("no tun: %v", err)
	}
	var req tunIfreq
	copy(req.name[:], name)
	req.flags = unix.IFF_TUN | unix.IFF_NO_PI
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETIFF, uintptr(unsafe.Pointer(&req))); errno != 0 {
		unix.Close(fd)
		t.Fatalf("TUNSETIFF %s: %v", name, errno)
	}
	f := os.NewFile(uintptr(fd), "/dev/net/tun")
	t.Cleanup(func() { f.Close() })
	return f
}

// tunNetns makes a namespace that forwards between two tun devices,
// tun0 (10.77.0.1/24, the clients' side) and tun1 (10.78.0.1/24, with the
// route to the backends 10.1.6.0/24), or with v6 between their IPv6 twins
// (twinAddr, twinPrefix), and has an Ethernet device eth0 whose MAC starts
// with 0x46 (0x66 with v6: what the first byte of an IPv4 (IPv6) header
// reads like); it enters it and returns the tuns' files and eth0's
// ifindex. The test is the far end of both tunnels: what it writes into a
// tun arrives on that device, what the node sends through it the test
// reads.
func tunNetns(t *testing.T, v6 bool) (ns *topology.NS, tun0, tun1 *os.File, ethIdx int) {
	t.Helper()
	ns = topology.NewNS(t, "tun")
	ns.Enter(t)
	sysctls := map[string]string{
		"ipv4/conf/all/forwarding":       "1",
		"ipv6/conf/all/disable_ipv6":     "1", // no router solicitations on the tuns
		"ipv6/conf/default/disable_ipv6": "1",
	}
	if v6 {
		// No link-local addresses (so no router solicitations) and no
		// DAD; readIP skips what neighbour discovery and MLD still send.
		sysctls = map[string]string{
			"ipv6/conf/all/forwarding":        "1",
			"ipv6/conf/default/addr_gen_mode": "1",
			"ipv6/conf/default/accept_dad":    "0",
		}
	}
	for key, val := range sysctls {
		if err := ns.Sysctl("net/"+key, val); err != nil {
			t.Fatal(err)
		}
	}
	tun0, tun1 = openTun(t, "tun0"), openTun(t, "tun1")
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0",
		HardwareAddr: net.HardwareAddr{ipVersion(v6)<<4 | 6, 0, 0, 0, 0, 1}}, PeerName: "wire0"}); err != nil {
		t.Fatalf("add veth: %v", err)
	}
	for _, name := range []string{"tun0", "tun1", "eth0", "wire0"} {
		l, err := netlink.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := netlink.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
		if name == "eth0" {
			ethIdx = l.Attrs().Index
		}
	}
	for dev, a := range map[string]string{"tun0": "10.77.0.1", "tun1": "10.78.0.1"} {
		if err := ns.AddAddr(dev, netip.PrefixFrom(addr(twinAddr(v6, a)), twinPrefix(v6, a+"/24").Bits())); err != nil {
			t.Fatal(err)
		}
	}
	if err := ns.AddRouteDev(twinPrefix(v6, "10.1.6.0/24"), "tun1"); err != nil {
		t.Fatal(err)
	}
	return ns, tun0, tun1, ethIdx
}

// ipVersion is the IP version of v6's family, 4 or 6.
func ipVersion(v6 bool) byte {
	if v6 {
		return 6
	}
	return 4
}

// readIP returns the next IPv4 (with v6: IPv6) packet the node sends
// through tun, or nil after 5 s without one. The stack's own IPv6
// chatter (neighbour discovery, MLD: ICMPv6 informational messages, the
// latter behind a hop-by-hop header) is skipped. Every caller expects a
// packet, so the bound is only waited out by a failing run (1 s failed
// a run whose backend, a process, the machine held back that long).
func readIP(t *testing.T, tun *os.File, v6 bool) []byte {
	t.Helper()
	buf := make([]byte, 4096)
	tun.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		n, err := tun.Read(buf)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil
		}
		if err != nil {
			t.Fatalf("read tun: %v", err)
		}
		if n == 0 || buf[0]>>4 != ipVersion(v6) {
			continue
		}
		if v6 && n >= 41 && (buf[6] == packet.HopByHop || buf[6] == packet.ICMPv6 && buf[40] >= 128) {
			continue
		}
		return append([]byte(nil), buf[:n]...)
	}
}

// TestTCL3Device: on a device without a link-layer header (a tun here;
// wireguard and ipip alike), tc's packet starts at the IPv4 (IPv6) header.
// The agent records such devices (AttachDevices), and the programs
// translate their packets like any other. BPF_PROG_TEST_RUN cannot show
// it (it hands a tc program an Ethernet header whatever the device), so
// the packets go through real tun devices: each is written into one tun
// and read, forwarded by the node (TTL one less), from the other, or from
// the same one when tc answers it itself. Over each family, IPv6 with the
// twins of the addresses.
func TestTCL3Device(t *testing.T) {
	testutil.Privileged(t)
	forFamilies(t, testTCL3Device)
}

func testTCL3Device(t *testing.T, v6 bool) {
	_, tun0, tun1, ethIdx := tunNetns(t, v6)
	d := openTest(t, smallConfig(testPinDir(t)))
	if err := d.AttachDevices([]string{"tun0", "tun1", "eth0"}); err != nil {
		t.Fatal(err)
	}
	m := d.Maps()
	tw := func(a string) string { return twinAddr(v6, a) }
	vip := twinL4(v6, l4("10.96.0.60", 80, model.TCP))
	vipU := twinL4(v6, l4("10.96.0.60", 53, model.UDP))
	empty := twinL4(v6, l4("10.96.0.61", 80, model.TCP))
	be := testBackend{61, twinL4(v6, l4("10.1.6.1", 8080, model.TCP))}
	beU := testBackend{62, twinL4(v6, l4("10.1.6.1", 5353, model.UDP))}
	addService(t, m, 1, vip, be)
	addService(t, m, 2, vipU, beU)
	addService(t, m, 3, empty)
	client := tw("10.77.0.2")
	vipS, beS := vip.Addr.String(), be.addr.Addr.String()
	tcpPkt := func(src string, sport uint16, dst string, dport uint16, flags uint8, ttl uint8) packet.Packet {
		return tcpPacket(src, sport, dst, dport, flags, nil).With(func(p *packet.Packet) { p.TTL = ttl })
	}
	tcp := func(src string, sport uint16, dst string, dport uint16, flags uint8, ttl uint8) []byte {
		return tcpPkt(src, sport, dst, dport, flags, ttl).L3()
	}
	udp := dgramOf(bytes.Repeat([]byte("l3 "), 600))
	forwarded := func(p packet.Packet) []byte { p.TTL = 63; return p.L3() }
	frags := udp(0x6161, client, 5300, vipS, 53).Fragments(1200)
	fragsNAT := udp(0x6161, client, 5300, beS, 5353).Fragments(1200)
	syn := tcp(client, 40003, empty.Addr.String(), 80, 0, 0)

	for _, s := range []struct {
		name string
		in   *os.File // the tun the packet arrives on
		pkt  []byte
		out  *os.File // the tun it leaves by
		want []byte
	}{
		{"tcp_dnat", tun0, tcp(client, 40000, vipS, 80, 0, 0), tun1, tcp(client, 40000, beS, 8080, 0, 63)},
		{"tcp_reply_rev_nat", tun1, tcp(beS, 8080, client, 40000, 0x12, 0), tun0, tcp(vipS, 80, client, 40000, 0x12, 63)},
		{"udp_first_fragment", tun0, frags[0].L3(), tun1, forwarded(fragsNAT[0])},
		{"udp_later_fragment", tun0, frags[1].L3(), tun1, forwarded(fragsNAT[1])},
		{"not_a_service", tun0, tcp(client, 40001, tw("10.1.6.9"), 80, 0, 0), tun1, tcp(client, 40001, tw("10.1.6.9"), 80, 0, 63)},
		// A service without backends: an ICMP (ICMPv6) port
		// unreachable back out of the tun, without a link-layer
		// header either.
		{"no_backend_icmp", tun0, syn, tun0,
			icmpMsg(empty.Addr.String(), client, icmpPortUnreach, 0, syn).L3()},
	} {
		if _, err := s.in.Write(s.pkt); err != nil {
			t.Fatalf("%s: write: %v", s.name, err)
		}
		got := readIP(t, s.out, v6)
		if got == nil {
			t.Errorf("%s: nothing came out", s.name)
			continue
		}
		if !bytes.Equal(got, s.want) {
			t.Errorf("%s: output %s", s.name, packet.Diff(got, s.want))
		}
	}

	// A NodePort on tun0's address whose backend is behind tun1, a node
	// device with an address: source-NATed to it and redirected from one
	// L3 device to the other, and the reply back.
	np := l4(tw("10.77.0.1"), 30080, model.TCP)
	addExternal(t, m, 4, np, reconciler.FlagExternal, be)
	if _, err := tun0.Write(tcp(client, 40010, np.Addr.String(), np.Port, 0, 0)); err != nil {
		t.Fatal(err)
	}
	got := readIP(t, tun1, v6)
	hl := ipHdrLen(v6)
	if len(got) != hl+20 {
		cs, _ := d.Counters()
		t.Fatalf("NodePort SYN through tun1: got %x; counters %v", got, cs)
	}
	sp := binary.BigEndian.Uint16(got[hl:])
	if want := tcp(tw("10.78.0.1"), sp, beS, 8080, 0, 63); !bytes.Equal(got, want) {
		t.Errorf("NodePort SYN, source-NATed out of tun1: %s", packet.Diff(got, want))
	}
	if _, err := tun1.Write(tcp(beS, 8080, tw("10.78.0.1"), sp, 0x12, 0)); err != nil {
		t.Fatal(err)
	}
	got = readIP(t, tun0, v6)
	if want := tcp(np.Addr.String(), np.Port, client, 40010, 0x12, 63); !bytes.Equal(got, want) {
		t.Errorf("NodePort SYN-ACK back out of tun0: %s", packet.Diff(got, want))
	}

	// An Ethernet device whose MAC's first byte reads like an IP
	// header's: its frames are still parsed as Ethernet.
	mac := [6]byte{ipVersion(v6)<<4 | 6, 0, 0, 0, 0, 1}
	in := frame(mac, clientMAC, tcpPkt(client, 40002, vipS, 80, 0, 0))
	want := frame(mac, clientMAC, tcpPkt(client, 40002, beS, 8080, 0, 0))
	verdict, out := runCtx(t, d.TCIngress(), skbCtx{Ifindex: uint32(ethIdx)}, in)
	if verdict != tcActOK || !bytes.Equal(out, want) {
		t.Errorf("Ethernet, MAC %x:...: verdict %d, output %s", mac[0], verdict, packet.Diff(out, want))
	}
}

// TestTCL3DeviceEndToEnd runs real traffic through a tun device: the test
// is the far end of the tunnel. A UDP query to a ClusterIP written into
// the tun arrives on tun0, where tc DNATs it to a backend on the node; the
// answer leaves through tun0, where tc restores the VIP, and is read back
// from the tun. Over each family: IPv6 with the twins of the addresses
// and an IPv6 backend.
func TestTCL3DeviceEndToEnd(t *testing.T) {
	testutil.Privileged(t)
	forFamilies(t, func(t *testing.T, v6 bool) {
		ns, tun, _, _ := tunNetns(t, v6)
		d := openTest(t, smallConfig(testPinDir(t)))
		backends := sockBackends
		if v6 {
			backends = sockBackends6
		}
		addLoopbackAddrs(t, ns, backends...)
		startBackends(t, backends...)
		vip := twinL4(v6, l4("10.96.0.62", 53, model.UDP))
		addService(t, d.Maps(), 1, vip, testBackend{1, l4(backends[0], 5353, model.UDP)})
		if err := d.AttachDevices([]string{"tun0"}); err != nil {
			t.Fatal(err)
		}

		client := twinAddr(v6, "10.77.0.2")
		q := udpPacket(client, 4000, vip.Addr.String(), 53, []byte("q"))
		q.ID = 1
		if _, err := tun.Write(q.L3()); err != nil {
			t.Fatalf("write to tun: %v", err)
		}
		// The answer, or nil after 5 s: the stack's own chatter
		// skipped, and anything that is not UDP.
		var p []byte
		for p = readIP(t, tun, v6); p != nil; p = readIP(t, tun, v6) {
			if v6 && len(p) >= 48 && p[6] == packet.UDP || !v6 && len(p) >= 28 && p[9] == packet.UDP {
				break
			}
		}
		if p == nil {
			t.Fatalf("no answer through tun0 to a query to %s", vip)
		}
		hl, src, dst := int(p[0]&0xf)*4, net.IP(p[12:16]), net.IP(p[16:20])
		if v6 {
			hl, src, dst = 40, net.IP(p[8:24]), net.IP(p[24:40])
		}
		sport := binary.BigEndian.Uint16(p[hl:])
		payload := string(p[hl+8:])
		if src.String() != vip.Addr.String() || sport != 53 || !isBackendReply(payload) {
			t.Fatalf("answer from %s:%d %q, want a backend's from the VIP %s", src, sport, payload, vip)
		}
		want := packet.L4Checksum4(src, dst, packet.UDP, p[hl:])
		if v6 {
			want = packet.L4Checksum6(src, dst, packet.UDP, p[hl:])
		}
		if got := binary.BigEndian.Uint16(p[hl+6:]); got != want || dst.String() != client {
			t.Errorf("answer to %s, UDP checksum %#04x, recomputed %#04x", dst, got, want)
		}
	})
}
