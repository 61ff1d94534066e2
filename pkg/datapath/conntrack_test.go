package datapath

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// Conntrack under races, floods and reuse (issue 11): targeted packet
// sequences through BPF_PROG_TEST_RUN, and concurrent runs from goroutines
// pinned to different CPUs where the bug is a race between CPUs. Each test
// names the review finding it covers (../../shared/reviews/datapath-audit.md).
//
// The few helpers that know the conntrack layout are at the top, so the
// tests themselves speak in flows and packets.

// Packets: a flow is a client's <addr:port> to a frontend; the backend's
// packets come back to the client (ClusterIP) through egress.

type flow struct {
	client string
	cport  uint16
	fe     model.L4Addr
}

func (f flow) pkt(flags uint8) pkt {
	p := pkt{srcMAC: clientMAC, dstMAC: nodeMAC, src: f.client, sport: f.cport,
		dst: f.fe.Addr.String(), dport: f.fe.Port, proto: uint8(f.fe.Proto), tcpFlags: flags}
	if f.fe.Proto == model.UDP {
		p.payload = []byte("query")
	}
	return p
}

func (f flow) from(be model.L4Addr, flags uint8) pkt {
	p := pkt{srcMAC: nodeMAC, dstMAC: clientMAC, src: be.Addr.String(), sport: be.Port,
		dst: f.client, dport: f.cport, proto: uint8(be.Proto), tcpFlags: flags}
	if be.Proto == model.UDP {
		p.payload = []byte("answer")
	}
	return p
}

const (
	tcpSYN_ = 0x02
	tcpACK  = 0x10
	tcpSA   = 0x12
	tcpFA   = 0x11
	tcpRST  = 0x04
)

// Fields of an output frame (Ethernet, IPv4 without options).
func outSrc(b []byte) string   { return netip.AddrFrom4([4]byte(b[26:30])).String() }
func outDst(b []byte) string   { return netip.AddrFrom4([4]byte(b[30:34])).String() }
func outSport(b []byte) uint16 { return binary.BigEndian.Uint16(b[34:]) }
func outDport(b []byte) uint16 { return binary.BigEndian.Uint16(b[36:]) }

// sendTo runs p through prog and returns the verdict and the backend
// address the output is sent to.
func sendTo(t *testing.T, prog *ebpf.Program, p pkt) (uint32, string) {
	t.Helper()
	v, out := runProg(t, prog, p.bytes())
	return v, outDst(out)
}

// establish opens f (SYN, the backend's SYN-ACK, the client's ACK) and
// returns the backend it went to, among bes.
func establish(t *testing.T, d *Datapath, f flow, bes ...testBackend) testBackend {
	t.Helper()
	v, dst := sendTo(t, d.TCIngress(), f.pkt(tcpSYN_))
	if v != tcActOK {
		t.Fatalf("SYN of %+v: verdict %d", f, v)
	}
	for _, b := range bes {
		if b.addr.Addr.String() != dst {
			continue
		}
		v, out := runProg(t, d.TCEgress(), f.from(b.addr, tcpSA).bytes())
		if v != tcActOK || outSrc(out) != f.fe.Addr.String() {
			t.Fatalf("SYN-ACK of %+v from %s: verdict %d, source %s", f, b.addr, v, outSrc(out))
		}
		if v, got := sendTo(t, d.TCIngress(), f.pkt(tcpACK)); v != tcActOK || got != dst {
			t.Fatalf("ACK of %+v: verdict %d to %s, want %s", f, v, got, dst)
		}
		return b
	}
	t.Fatalf("SYN of %+v went to %s, not a backend", f, dst)
	return testBackend{}
}

// TestTCZeroBackendsKeepsEstablished (A5): a Service that drops to zero
// endpoints keeps its established flows (kube-proxy rejects only new
// connections); new ones are refused with ICMP port unreachable.
func TestTCZeroBackendsKeepsEstablished(t *testing.T) {
	d := newTestDatapath(t)
	m := d.Maps()
	be := testBackend{46, l4("10.1.4.6", 8080, model.TCP)}
	addService(t, m, 1, vipTCP, be)
	f := flow{"10.0.4.3", 45002, vipTCP}
	establish(t, d, f, be)

	if err := m.UpsertMaster(vipTCP, reconciler.Master{ID: 1, Count: 0}); err != nil {
		t.Fatal(err)
	}
	if err := m.DeleteSlot(vipTCP, 1); err != nil {
		t.Fatal(err)
	}
	if v, dst := sendTo(t, d.TCIngress(), f.pkt(tcpACK)); v != tcActOK || dst != be.addr.Addr.String() {
		t.Errorf("established flow's data: verdict %d to %s, want %s", v, dst, be.addr.Addr)
	}
	if v, out := runProg(t, d.TCEgress(), f.from(be.addr, tcpACK).bytes()); v != tcActOK || outSrc(out) != vipTCP.Addr.String() {
		t.Errorf("established flow's reply: verdict %d, source %s", v, outSrc(out))
	}
	if v, _ := runProg(t, d.TCIngress(), flow{"10.0.4.3", 45003, vipTCP}.pkt(tcpSYN_).bytes()); v != tcActRedirect {
		t.Errorf("new connection: verdict %d, want the ICMP reply (redirect)", v)
	}
}

// TestTCSlotVanishes (B6): a reader that read a master's count before a
// shrink finds its slot (or the slot's backend) gone. It selects again
// rather than dropping the packet. The state is the one such a reader
// sees: the master says 2, slot 2 is gone.
func TestTCSlotVanishes(t *testing.T) {
	d := newTestDatapath(t)
	m := d.Maps()
	b1, b2 := testBackend{91, l4("10.1.9.1", 8080, model.TCP)}, testBackend{92, l4("10.1.9.2", 8080, model.TCP)}
	addService(t, m, 1, vipTCP, b1, b2)
	if err := m.DeleteSlot(vipTCP, 2); err != nil {
		t.Fatal(err)
	}
	dropped := 0
	for i := range 64 {
		if v, dst := sendTo(t, d.TCIngress(), flow{"10.0.9.1", uint16(50000 + i), vipTCP}.pkt(tcpSYN_)); v != tcActOK || dst != b1.addr.Addr.String() {
			dropped++
		}
	}
	// The slot is there but its backend is gone.
	addService(t, m, 1, vipTCP, b1, b2)
	if err := m.DeleteBackend(b2.id); err != nil {
		t.Fatal(err)
	}
	for i := range 64 {
		if v, dst := sendTo(t, d.TCIngress(), flow{"10.0.9.2", uint16(50000 + i), vipTCP}.pkt(tcpSYN_)); v != tcActOK || dst != b1.addr.Addr.String() {
			dropped++
		}
	}
	if dropped != 0 {
		t.Errorf("%d of 128 new flows not sent to the remaining backend", dropped)
	}
}

// TestSockSlotVanishes (B6): connect4 and sendmsg4 in the state a reader
// between a shrink's writes sees (master count 2, slot 2 gone) still
// translate: a connect never leaves the VIP in place, which nothing
// answers.
func TestSockSlotVanishes(t *testing.T) {
	d := newTestDatapath(t)
	ns := newTestNetns(t)
	cg := newTestCgroup(t)
	if err := d.AttachCgroup(cg); err != nil {
		t.Fatalf("AttachCgroup: %v", err)
	}
	enterCgroup(t, cg)
	enterNetns(t, ns)
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		t.Fatal(err)
	}
	for _, a := range sockBackends {
		if err := netlink.AddrAdd(lo, &netlink.Addr{IPNet: netlink.NewIPNet(net.ParseIP(a))}); err != nil {
			t.Fatalf("add %s: %v", a, err)
		}
	}
	startBackends(t)
	m := d.Maps()
	addService(t, m, 1, sockVIPTCP,
		testBackend{1, l4(sockBackends[0], 8080, model.TCP)}, testBackend{2, l4(sockBackends[1], 8080, model.TCP)})
	addService(t, m, 2, sockVIPUDP,
		testBackend{3, l4(sockBackends[0], 5353, model.UDP)}, testBackend{4, l4(sockBackends[1], 5353, model.UDP)})
	for _, fe := range []model.L4Addr{sockVIPTCP, sockVIPUDP} {
		if err := m.DeleteSlot(fe, 2); err != nil {
			t.Fatal(err)
		}
	}
	failed := 0
	for i := range 32 {
		fd := newSocket(t, unix.SOCK_STREAM)
		tv := unix.NsecToTimeval(int64(time.Second))
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv); err != nil {
			t.Fatal(err)
		}
		if err := unix.Connect(fd, sockaddr(sockVIPTCP)); err != nil {
			failed++
			t.Logf("TCP connect %d: %v", i, err)
		}
		ufd := newSocket(t, unix.SOCK_DGRAM)
		if err := unix.Connect(ufd, sockaddr(sockVIPUDP)); err != nil {
			failed++
			t.Logf("UDP connect %d: %v", i, err)
			continue
		}
		if _, err := unix.Write(ufd, []byte("q")); err != nil {
			failed++
			continue
		}
		if msg, _ := recvFrom(t, ufd); !isBackendReply(msg) {
			failed++
		}
	}
	if failed != 0 {
		t.Errorf("%d of 64 connects left on the VIP", failed)
	}
}
