package datapath

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/internal/testutil/packet"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// Conntrack under races, floods and reuse (issue 11): targeted packet
// sequences through BPF_PROG_TEST_RUN, and concurrent runs from goroutines
// pinned to different CPUs where the bug is a race between CPUs. Each test
// names the finding of issue 11's datapath review it covers (A1, B2, ...).
//
// The few helpers that know the conntrack layout are at the top, so the
// tests themselves speak in flows and packets.

// ctKeyOf is the conntrack key of a packet <src:sport -> dst:dport>, in
// the tables of the addresses' family (ctK).
func ctKeyOf(src string, sport uint16, dst string, dport uint16, proto model.Protocol, dir uint8) ctK {
	return ctK{src: netip.AddrPortFrom(addr(src), sport), dst: netip.AddrPortFrom(addr(dst), dport), proto: proto, dir: dir}
}

// ctMaps are the conntrack maps: established, then half-open.
func ctMaps(m *Maps) []*ebpf.Map { return []*ebpf.Map{m.conntrack, m.ctNew} }

// ctGet returns the conntrack entry under k (established or half-open,
// alive or not), if any.
func ctGet(m *Maps, k sockCt4Key) (sockCt4Entry, bool) {
	var v sockCt4Entry
	for _, cm := range ctMaps(m) {
		if cm.Lookup(&k, &v) == nil {
			return v, true
		}
	}
	return v, false
}

// ctLifetime mirrors ct_lifetime in bpf/lib/conntrack.h.
func ctLifetime(cfg Config, proto uint8, flags uint32) time.Duration {
	switch {
	case proto != uint8(model.TCP):
		return cfg.CTTimeoutUDP
	case flags&ctFlagRST != 0 || flags&(ctFlagFinFwd|ctFlagFinRev) == ctFlagFinFwd|ctFlagFinRev:
		return cfg.CTTimeoutClose
	case flags&ctFlagChal != 0:
		return cfg.CTTimeoutSYN
	case flags&ctFlagReplied != 0 && !ctAwaiting(flags):
		return cfg.CTTimeoutTCP
	}
	return cfg.CTTimeoutSYN
}

// flushBackends flushes the conntrack of bes.
func flushBackends(m *Maps, bes ...model.L4Addr) error {
	return m.FlushConntrack(bes)
}

// Packets: a flow is a client's <addr:port> to a frontend; the backend's
// packets come back to the client (ClusterIP) through egress.

type flow struct {
	client string
	cport  uint16
	fe     model.L4Addr
}

func (f flow) pkt(flags uint8) packet.Packet {
	p := packet.Packet{SrcMAC: clientMAC, DstMAC: nodeMAC, Src: addr(f.client), SrcPort: f.cport,
		Dst: f.fe.Addr, DstPort: f.fe.Port, Proto: uint8(f.fe.Proto), TCPFlags: flags}
	if f.fe.Proto == model.UDP {
		p.Payload = []byte("query")
	}
	return p
}

func (f flow) from(be model.L4Addr, flags uint8) packet.Packet {
	p := packet.Packet{SrcMAC: nodeMAC, DstMAC: clientMAC, Src: be.Addr, SrcPort: be.Port,
		Dst: addr(f.client), DstPort: f.cport, Proto: uint8(be.Proto), TCPFlags: flags}
	if be.Proto == model.UDP {
		p.Payload = []byte("answer")
	}
	return p
}

func (f flow) fwdKey() ctK {
	return ctKeyOf(f.client, f.cport, f.fe.Addr.String(), f.fe.Port, f.fe.Proto, ctForward)
}

func (f flow) revKey(be model.L4Addr) ctK {
	return ctKeyOf(be.Addr.String(), be.Port, f.client, f.cport, be.Proto, ctReverse)
}

const (
	tcpSYN_ = packet.SYN
	tcpACK  = packet.ACK
	tcpSA   = packet.SYN | packet.ACK
	tcpFA   = packet.FIN | packet.ACK
	tcpRST  = packet.RST
)

// Fields of an output frame (Ethernet, then IPv4 without options or IPv6
// without extension headers).
func outSrc(b []byte) string {
	if out6(b) {
		return netip.AddrFrom16([16]byte(b[22:38])).String()
	}
	return netip.AddrFrom4([4]byte(b[26:30])).String()
}

func outDst(b []byte) string {
	if out6(b) {
		return netip.AddrFrom16([16]byte(b[38:54])).String()
	}
	return netip.AddrFrom4([4]byte(b[30:34])).String()
}

func outSport(b []byte) uint16 {
	if out6(b) {
		return binary.BigEndian.Uint16(b[54:])
	}
	return binary.BigEndian.Uint16(b[34:])
}

func outDport(b []byte) uint16 {
	if out6(b) {
		return binary.BigEndian.Uint16(b[56:])
	}
	return binary.BigEndian.Uint16(b[36:])
}

// out6 says whether an output frame is an IPv6 one.
func out6(b []byte) bool { return len(b) >= 54 && binary.BigEndian.Uint16(b[12:]) == 0x86dd }

// twinAddr is the IPv6 twin of an IPv4 test address when v6 is set
// (10.1.8.1 -> 2001:db8:a:1:8::1, each octet a group), so that a test
// written with IPv4 addresses runs over IPv6 with its twins. The twin is
// in canonical form (2001:db8:a:1::7 for 10.1.0.7), as Go prints it.
func twinAddr(v6 bool, a string) string {
	if !v6 {
		return a
	}
	b := netip.MustParseAddr(a).As4()
	return netip.MustParseAddr(fmt.Sprintf("2001:db8:%x:%x:%x::%x", b[0], b[1], b[2], b[3])).String()
}

// twinOf is twinAddr over one family: v6's twin of each IPv4 test
// address.
func twinOf(v6 bool) func(string) string {
	return func(s string) string { return twinAddr(v6, s) }
}

// twinL4 is twinAddr of a frontend or backend.
func twinL4(v6 bool, a model.L4Addr) model.L4Addr {
	a.Addr = addr(twinAddr(v6, a.Addr.String()))
	return a
}

// forFamilies runs f as a subtest over IPv4, then over IPv6 (v6).
func forFamilies(t *testing.T, f func(t *testing.T, v6 bool)) {
	for _, v6 := range []bool{false, true} {
		t.Run(map[bool]string{false: "IPv4", true: "IPv6"}[v6], func(t *testing.T) { f(t, v6) })
	}
}

// sendTo runs p through prog and returns the verdict and the backend
// address the output is sent to.
func sendTo(t *testing.T, prog *ebpf.Program, p packet.Packet) (uint32, string) {
	t.Helper()
	v, out := runProg(t, prog, p.Bytes())
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
		v, out := runProg(t, d.TCEgress(), f.from(b.addr, tcpSA).Bytes())
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

// onCPUs runs fn(cpu) on one goroutine per CPU in cpus, each locked to its
// thread and the thread pinned to the CPU, all released at once.
func onCPUs(t *testing.T, cpus []int, fn func(cpu int)) {
	t.Helper()
	if runtime.NumCPU() < len(cpus) {
		t.Skipf("needs %d CPUs", len(cpus))
	}
	var ready, done sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan error, len(cpus))
	for _, cpu := range cpus {
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var set unix.CPUSet
			set.Set(cpu)
			if err := unix.SchedSetaffinity(0, &set); err != nil {
				errs <- fmt.Errorf("pin to CPU %d: %w", cpu, err)
				ready.Done()
				return
			}
			ready.Done()
			<-start
			fn(cpu)
		}()
	}
	ready.Wait()
	close(start)
	done.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestCTConcurrentRefresh (A1): the packets of one established flow on two
// CPUs at once. Each program reads the clock once; the other CPU refreshes
// the entry in between. No reply may leave un-NATed and no client packet
// may be re-balanced.
func TestCTConcurrentRefresh(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		a, vip := twinOf(v6), twinL4(v6, vipTCP)
		d := newTestDatapath(t)
		bes := []testBackend{{41, l4(a("10.1.4.1"), 8080, model.TCP)}, {42, l4(a("10.1.4.2"), 8080, model.TCP)}}
		addService(t, d.Maps(), 1, vip, bes...)
		f := flow{a("10.0.4.1"), 45000, vip}
		be := establish(t, d, f, bes...)

		const n = 100000
		var mu sync.Mutex
		bad := map[string]int{}
		reply, ack := f.from(be.addr, tcpACK).Bytes(), f.pkt(tcpACK).Bytes()
		onCPUs(t, []int{0, 1}, func(cpu int) {
			untranslated, moved := 0, 0
			for i := range n {
				if i%2 == cpu%2 {
					v, out, err := runProgErr(d.TCEgress(), reply)
					if err != nil || v != tcActOK || outSrc(out) != f.fe.Addr.String() {
						untranslated++
					}
				} else {
					v, out, err := runProgErr(d.TCIngress(), ack)
					if err != nil || v != tcActOK || outDst(out) != be.addr.Addr.String() {
						moved++
					}
				}
			}
			mu.Lock()
			bad["replies un-NATed"] += untranslated
			bad["client packets re-balanced"] += moved
			mu.Unlock()
		})
		for what, c := range bad {
			if c != 0 {
				t.Errorf("%d of %d %s", c, n, what)
			}
		}
	})
}

// TestCTReverseCheckedWhenDue: a client packet of an established flow
// checks (refreshes, or re-creates) the flow's reply entry when its
// forward entry's refresh is due, and leaves it alone while it is not
// (ct_check_reverse_due: a cold lookup saved on most packets). The reply
// entry then still lives as long as the forward entry, less a second.
func TestCTReverseCheckedWhenDue(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		a, vip := twinOf(v6), twinL4(v6, vipTCP)
		d := newTestDatapath(t)
		m := d.Maps()
		bes := []testBackend{{47, l4(a("10.1.4.7"), 8080, model.TCP)}}
		addService(t, m, 1, vip, bes...)
		f := flow{a("10.0.4.7"), 45007, vip}
		be := establish(t, d, f, bes...)
		rev := f.revKey(be.addr)
		expires := func() uint64 {
			t.Helper()
			e, ok := ctLookup(t, m, rev)
			if !ok {
				t.Fatalf("no reply entry %s", rev)
			}
			return e.expires
		}
		client := func() {
			t.Helper()
			if v, dst := sendTo(t, d.TCIngress(), f.pkt(tcpACK)); v != tcActOK || dst != be.addr.Addr.String() {
				t.Fatalf("client packet: verdict %d to %s, want %s", v, dst, be.addr.Addr)
			}
		}

		// The forward entry needs no refresh (it looks refreshed ahead):
		// the reply entry, 5 s behind, is not touched.
		ctSetSeen(t, m, f.fwdKey(), 10*time.Second)
		ctSetSeen(t, m, rev, -5*time.Second)
		before := expires()
		client()
		if after := expires(); after != before {
			t.Errorf("reply entry's expiry moved by %v while the forward entry needed no refresh", time.Duration(after-before))
		}

		// Its refresh due, the reply entry is refreshed too.
		ctSetSeen(t, m, f.fwdKey(), -5*time.Second)
		client()
		if after := expires(); after <= before {
			t.Errorf("reply entry not refreshed with the forward entry: expiry %d, was %d", after, before)
		}

		// And a reply entry gone is re-created: the replies translate.
		ctRemove(t, m, rev)
		ctSetSeen(t, m, f.fwdKey(), -5*time.Second)
		client()
		if v, out := runProg(t, d.TCEgress(), f.from(be.addr, tcpACK).Bytes()); v != tcActOK || outSrc(out) != vip.Addr.String() {
			t.Errorf("reply after its entry was re-created: verdict %d, source %s, want the VIP", v, outSrc(out))
		}
	})
}

// TestCTRefreshedAhead (A1, deterministic): an entry another CPU refreshed
// after this program read the clock is alive, not expired.
func TestCTRefreshedAhead(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		a, vip := twinOf(v6), twinL4(v6, vipTCP)
		d := newTestDatapath(t)
		m := d.Maps()
		bes := []testBackend{{43, l4(a("10.1.4.3"), 8080, model.TCP)}, {44, l4(a("10.1.4.4"), 8080, model.TCP)}}
		addService(t, m, 1, vip, bes...)
		f := flow{a("10.0.4.2"), 45001, vip}
		be := establish(t, d, f, bes...)
		ctSetSeen(t, m, f.revKey(be.addr), 50*time.Millisecond)
		ctSetSeen(t, m, f.fwdKey(), 50*time.Millisecond)
		v, out := runProg(t, d.TCEgress(), f.from(be.addr, tcpACK).Bytes())
		if v != tcActOK || outSrc(out) != vip.Addr.String() {
			t.Errorf("reply: verdict %d, source %s, want the VIP", v, outSrc(out))
		}
		for range 8 {
			if v, dst := sendTo(t, d.TCIngress(), f.pkt(tcpACK)); v != tcActOK || dst != be.addr.Addr.String() {
				t.Fatalf("client packet: verdict %d to %s, want %s", v, dst, be.addr.Addr)
			}
		}
	})
}

// TestCTGCKeepsRecreatedFlows (A2): the GC runs while clients come back on
// the tuples of expired flows. Every flow re-created before, during or
// after the GC's pass must keep its entries.
func TestCTGCKeepsRecreatedFlows(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		a, vip := twinOf(v6), twinL4(v6, vipUDP)
		// Long enough that, on a loaded machine, most flows re-created while
		// the GC runs are still live when it ends: those are the ones checked.
		const udpTimeout = 2 * time.Second
		d := openTestWith(t, smallConfig, func(cfg *Config) {
			cfg.MaxConntrack = 65536
			cfg.CTTimeoutUDP = udpTimeout
		})
		m := d.Maps()
		be := testBackend{45, l4(a("10.1.4.5"), 5353, model.UDP)}
		addService(t, m, 1, vip, be)

		const n = 10000
		flows := make([]flow, n)
		for i := range flows {
			flows[i] = flow{a(fmt.Sprintf("10.0.%d.%d", 40+i/250, 1+i%250)), uint16(20000 + i), vip}
		}
		open := func(f flow) error {
			if v, _, err := runProgErr(d.TCIngress(), f.pkt(0).Bytes()); err != nil || v != tcActOK {
				return fmt.Errorf("datagram of %+v: verdict %d, %v", f, v, err)
			}
			if v, _, err := runProgErr(d.TCEgress(), f.from(be.addr, 0).Bytes()); err != nil || v != tcActOK {
				return fmt.Errorf("answer to %+v: verdict %d, %v", f, v, err)
			}
			return nil
		}
		for _, f := range flows {
			if err := open(f); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(udpTimeout + 200*time.Millisecond)

		var wg sync.WaitGroup
		var gcErr, openErr error
		var gcDone time.Time
		reopened := make([]time.Time, n)
		wg.Add(2)
		go func() {
			defer wg.Done()
			_, gcErr = m.GCConntrack()
			gcDone = time.Now()
		}()
		go func() {
			defer wg.Done()
			for i, f := range flows {
				if openErr = open(f); openErr != nil {
					return
				}
				reopened[i] = time.Now()
			}
		}()
		wg.Wait()
		if gcErr != nil || openErr != nil {
			t.Fatal(gcErr, openErr)
		}
		// A flow re-created so early that it expired again before the GC
		// ended may rightly be collected (a busy machine stretches the loop
		// past the timeout): only flows live for the whole GC must survive
		// it, and they must be present (expired or not by now).
		checked, lost := 0, 0
		for i, f := range flows {
			if !reopened[i].Add(udpTimeout).After(gcDone) {
				continue
			}
			checked++
			if _, ok := ctLookup(t, m, f.fwdKey()); !ok {
				lost++
			} else if _, ok := ctLookup(t, m, f.revKey(be.addr)); !ok {
				lost++
			}
		}
		if checked < n/2 {
			t.Fatalf("only %d of %d flows were live through the GC: the machine is too slow for this test to mean anything", checked, n)
		}
		if lost != 0 {
			t.Errorf("%d of %d flows re-created during the GC and live through it lost an entry", lost, checked)
		}
	})
}

// oneSNATPort leaves a single port for source NAT: a second flow needs
// the first one's.
func oneSNATPort(cfg *Config) { cfg.SNATPortMin, cfg.SNATPortMax = 62000, 62000 }

// snatHeld is a source-NATed flow holding the only SNAT port: a node
// datapath of smallConfig with oneSNATPort on eth0, an external NodePort
// to a remote backend, and a client's SYN to it; over IPv6 (v6) the IPv6
// node's (nodeDatapath6).
type snatHeld struct {
	d       *Datapath
	m       *Maps
	bpffs   string
	ifindex int
	syn     packet.Packet
	port    uint16       // the SNAT port the flow holds
	rev     ctK          // its reservation (the reply entry)
	fwd     ctK          // its forward key <client -> node port>
	client  string       // the SYN's source
	np      model.L4Addr // the node port (the family's)
	be      testBackend  // its backend (the family's)
}

// snatNode is a node datapath (eth0 its device, in a namespace of its
// own) of the family with the NodePort npRemote (np6Remote) served by
// beRemote (be6Remote), a remote backend: flows to it are source-NATed.
func snatNode(t *testing.T, v6 bool, base func(bpffs string) Config) (d *Datapath, ifindex int, np model.L4Addr, be testBackend) {
	t.Helper()
	if v6 {
		_, ifindex, d = nodeDatapath6(t, base)
		return d, ifindex, np6Remote, be6Remote
	}
	_, ifindex, d = nodeDatapath(t, base, "eth0")
	addExternal(t, d.Maps(), 1, npRemote, reconciler.FlagExternal, beRemote)
	return d, ifindex, npRemote, beRemote
}

func holdSNATPort(t *testing.T, v6 bool) snatHeld {
	t.Helper()
	var h snatHeld
	base := func(bpffs string) Config {
		h.bpffs = bpffs
		return configWith(smallConfig, oneSNATPort)(bpffs)
	}
	var np model.L4Addr
	var be testBackend
	h.d, h.ifindex, np, be = snatNode(t, v6, base)
	h.m = h.d.Maps()
	h.syn = nsClient(43000, np)
	h.client = h.syn.Src.String()
	if v, _ := runOn(t, h.d.TCIngress(), h.ifindex, h.syn.Bytes()); v != tcActRedirect {
		t.Fatalf("SYN: verdict %d", v)
	}
	h.port = snatPortIn(t, h.d, h.client, 43000, np)
	h.rev = ctKeyOf(be.addr.Addr.String(), be.addr.Port, ofFamily(np.Addr, nsNodeIP, nsNodeIP6).String(), h.port, model.TCP, ctReverse)
	h.fwd = ctKeyOf(h.client, 43000, np.Addr.String(), np.Port, model.TCP, ctForward)
	h.np, h.be = np, be
	return h
}

// TestCTGCKeepsLiveReservation (A2): the GC never deletes the SNAT port
// reservation (reply entry) of a flow whose forward entry is alive, and
// neither does a new flow looking for a port.
func TestCTGCKeepsLiveReservation(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		h := holdSNATPort(t, v6)
		d, m, ifindex, syn, sp, rev := h.d, h.m, h.ifindex, h.syn, h.port, h.rev
		ctSetSeen(t, m, rev, -7*time.Hour)
		if _, err := m.GCConntrack(); err != nil {
			t.Fatal(err)
		}
		if _, ok := ctLookup(t, m, rev); !ok {
			t.Errorf("GC deleted the port reservation %d of a live flow", sp)
		}
		other := syn
		other.Src = addr(twinAddr(v6, "172.16.0.30"))
		if v, out := runOn(t, d.TCIngress(), ifindex, other.Bytes()); v == tcActRedirect && outSport(out) == sp {
			t.Errorf("a new flow took the port %d of a live flow", sp)
		}
	})
}

// TestCTSNATFullTableOverflow: a source-NATed flow answered while the
// established table is full (its port reservation is there already, its
// forward entry cannot join it) stays established in sluice_ct_new
// (tc_ct_est_overflow): its reply is translated and its next packet still
// leaves from its port, where the reply was dropped and the flow refused.
func TestCTSNATFullTableOverflow(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		h := holdSNATPort(t, v6)
		be, np, est := h.be, h.np, h.m.conntrack
		if v6 {
			est = h.d.tc.Sluice6ConntrackV1
		}
		now, err := monotonicNow()
		if err != nil {
			t.Fatal(err)
		}
		// Live entries of other flows fill the table.
		for i := 0; ; i++ {
			var err error
			if v6 {
				k := tcCt6Key{Daddr: tcV6addr{Addr: [16]byte{15: 1}}, Sport: uint16(i), Dport: 80, Proto: 6}
				binary.BigEndian.PutUint32(k.Saddr.Addr[12:], uint32(i+1))
				err = est.Update(&k, &tcCt6Entry{Expires: now + uint64(time.Hour), Flags: ctFlagReplied}, ebpf.UpdateNoExist)
			} else {
				err = est.Update(&sockCt4Key{Saddr: uint32(i + 1), Daddr: 1, Sport: uint16(i), Dport: 80, Proto: 6},
					&sockCt4Entry{Expires: now + uint64(time.Hour), Flags: ctFlagReplied}, ebpf.UpdateNoExist)
			}
			if err != nil {
				if i == 0 {
					t.Fatal(err)
				}
				break
			}
		}
		v, out := runOn(t, h.d.TCIngress(), h.ifindex, replyFrom(be, h.port, tcpSA).Bytes())
		if v != tcActRedirect || outSrc(out) != np.Addr.String() || outDst(out) != h.client {
			t.Errorf("SYN-ACK with the table full: verdict %d from %s to %s, want %s to %s", v, outSrc(out), outDst(out), np.Addr, h.client)
		}
		if cs := counters(t, h.d); cs["tc_ct_est_overflow"] != 1 || cs["tc_ct_est_full"] != 0 {
			t.Errorf("tc_ct_est_overflow %d, tc_ct_est_full %d; want 1 and 0", cs["tc_ct_est_overflow"], cs["tc_ct_est_full"])
		}
		ack := h.syn
		ack.TCPFlags = tcpACK
		if v, out := runOn(t, h.d.TCIngress(), h.ifindex, ack.Bytes()); v != tcActRedirect || outSport(out) != h.port {
			t.Errorf("the client's ACK: verdict %d from port %d, want %d", v, outSport(out), h.port)
		}
		if r, ok := ctLookup(t, h.m, h.rev); !ok || r.flags&ctFlagReplied == 0 {
			t.Errorf("port reservation %+v (found %v), want it there and marked answered", r, ok)
		}
	})
}

// TestCTSNATReservationLost (A3): a flow whose port reservation was lost
// (evicted, or deleted) and taken by another flow must not send from that
// port any more; the other flow keeps it.
func TestCTSNATReservationLost(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		np, be := npRemote, beRemote
		var ns *topology.NS
		var ifindex int
		var d *Datapath
		if v6 {
			ns, ifindex, d = nodeDatapath6(t, configWith(xdpConfig, oneSNATPort))
			np, be = np6Remote, be6Remote
		} else {
			ns, ifindex, d = nodeDatapath(t, configWith(xdpConfig, oneSNATPort), "eth0")
			addExternal(t, d.Maps(), 1, npRemote, reconciler.FlagExternal, beRemote)
		}
		m := d.Maps()
		node := ofFamily(np.Addr, nsNodeIP, nsNodeIP6).String()
		client := func(src string, sport uint16, flags uint8) packet.Packet {
			p := nsClient(sport, np)
			p.Src, p.TCPFlags = addr(src), flags
			return p
		}
		for _, c := range []struct {
			name string
			run  func(t *testing.T, p packet.Packet) (uint32, []byte)
			a, b string
		}{
			{"tc", func(t *testing.T, p packet.Packet) (uint32, []byte) {
				return runOn(t, d.TCIngress(), ifindex, p.Bytes())
			}, twinAddr(v6, "172.16.0.10"), twinAddr(v6, "172.16.0.11")},
			{"xdp", func(t *testing.T, p packet.Packet) (uint32, []byte) { return runXDP(t, d.XDP(), ifindex, p.Bytes()) },
				twinAddr(v6, "172.16.0.20"), twinAddr(v6, "172.16.0.21")},
		} {
			t.Run(c.name, func(t *testing.T) {
				ns.Enter(t)
				if v, _ := c.run(t, client(c.a, 40000, tcpSYN_)); v != tcActRedirect && v != xdpTx {
					t.Fatalf("flow A SYN: verdict %d", v)
				}
				if sp := snatPortIn(t, d, c.a, 40000, np); sp != 62000 {
					t.Fatalf("flow A got port %d", sp)
				}
				rev := ctKeyOf(be.addr.Addr.String(), be.addr.Port, node, 62000, model.TCP, ctReverse)
				ctRemove(t, m, rev)
				if v, out := c.run(t, client(c.b, 40000, tcpSYN_)); (v == tcActRedirect || v == xdpTx) && outSport(out) != 62000 {
					t.Fatalf("flow B sent from port %d", outSport(out))
				}
				v, out := c.run(t, client(c.a, 40000, tcpACK))
				if (v == tcActRedirect || v == xdpTx) && outSrc(out) == node && outSport(out) == 62000 {
					if r, ok := ctLookup(t, m, rev); ok && r.snat.Addr().String() != c.a {
						t.Errorf("flow A sent from port 62000, which flow %s holds", r.snat.Addr())
					}
				}
				ctRemove(t, m, ctKeyOf(c.a, 40000, node, np.Port, model.TCP, ctForward))
				ctRemove(t, m, ctKeyOf(c.b, 40000, node, np.Port, model.TCP, ctForward))
				if _, ok := ctLookup(t, m, rev); ok {
					ctRemove(t, m, rev)
				}
			})
		}
	})
}

// TestTCZeroBackendsKeepsEstablished (A5): a Service that drops to zero
// endpoints keeps its established flows (kube-proxy rejects only new
// connections); new ones are refused with ICMP port unreachable.
func TestTCZeroBackendsKeepsEstablished(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		a, vip := twinOf(v6), twinL4(v6, vipTCP)
		d := newTestDatapath(t)
		m := d.Maps()
		be := testBackend{46, l4(a("10.1.4.6"), 8080, model.TCP)}
		addService(t, m, 1, vip, be)
		f := flow{a("10.0.4.3"), 45002, vip}
		establish(t, d, f, be)

		if err := m.UpsertMaster(reconciler.DefaultScope(vip), reconciler.Master{ID: 1, Count: 0}); err != nil {
			t.Fatal(err)
		}
		if err := m.DeleteSlot(reconciler.DefaultScope(vip), 1); err != nil {
			t.Fatal(err)
		}
		if v, dst := sendTo(t, d.TCIngress(), f.pkt(tcpACK)); v != tcActOK || dst != be.addr.Addr.String() {
			t.Errorf("established flow's data: verdict %d to %s, want %s", v, dst, be.addr.Addr)
		}
		if v, out := runProg(t, d.TCEgress(), f.from(be.addr, tcpACK).Bytes()); v != tcActOK || outSrc(out) != vip.Addr.String() {
			t.Errorf("established flow's reply: verdict %d, source %s", v, outSrc(out))
		}
		if v, _ := runProg(t, d.TCIngress(), flow{a("10.0.4.3"), 45003, vip}.pkt(tcpSYN_).Bytes()); v != tcActRedirect {
			t.Errorf("new connection: verdict %d, want the ICMP reply (redirect)", v)
		}
	})
}

// TestCTFloodKeepsEstablished (issue item 7, B3): with a small conntrack
// table, a flood of new flows to another Service never evicts established
// flows; once the table of established flows is full, new flows stay in
// the LRU of half-open ones (tc_ct_est_overflow), not the old ones out.
func TestCTFloodKeepsEstablished(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		a, vip := twinOf(v6), twinL4(v6, vipTCP)
		d := openTestWith(t, smallConfig, func(cfg *Config) {
			cfg.MaxConntrack = 1024
		})
		m := d.Maps()
		bes := []testBackend{
			{51, l4(a("10.1.5.1"), 8080, model.TCP)}, {52, l4(a("10.1.5.2"), 8080, model.TCP)},
			{53, l4(a("10.1.5.3"), 8080, model.TCP)}, {54, l4(a("10.1.5.4"), 8080, model.TCP)},
		}
		addService(t, m, 1, vip, bes...)
		other := l4(a("10.96.0.40"), 80, model.TCP)
		ob := testBackend{55, l4(a("10.1.5.5"), 8080, model.TCP)}
		addService(t, m, 2, other, ob)

		established := map[flow]testBackend{}
		for i := range 20 {
			f := flow{a("10.0.5.1"), uint16(46000 + i), vip}
			established[f] = establish(t, d, f, bes...)
		}
		check := func(phase string) {
			t.Helper()
			broken := 0
			for f, be := range established {
				v, dst := sendTo(t, d.TCIngress(), f.pkt(tcpACK))
				rv, out := runProg(t, d.TCEgress(), f.from(be.addr, tcpACK).Bytes())
				if v != tcActOK || dst != be.addr.Addr.String() || rv != tcActOK || outSrc(out) != vip.Addr.String() {
					broken++
				}
			}
			if broken != 0 {
				t.Errorf("%s: %d of %d established flows broken (re-balanced or replies un-NATed)", phase, broken, len(established))
			}
		}

		// 5000 new connections (SYNs nobody answers) to the other Service.
		for i := range 5000 {
			f := flow{a(fmt.Sprintf("10.0.%d.%d", 60+i/250, 1+i%250)), 50000, other}
			runProg(t, d.TCIngress(), f.pkt(tcpSYN_).Bytes())
		}
		check("after 5000 half-open flows")

		// 2000 connections that get answered and established (the
		// client's ACK assures each, and moves it from the LRU to the
		// table: conntrack.h, ct_assure): more than the table holds.
		refused := 0
		for i := range 2000 {
			f := flow{a(fmt.Sprintf("10.0.%d.%d", 90+i/250, 1+i%250)), 50001, other}
			runProg(t, d.TCIngress(), f.pkt(tcpSYN_).Bytes())
			if v, out := runProg(t, d.TCEgress(), f.from(ob.addr, tcpSA).Bytes()); v != tcActOK || outSrc(out) != other.Addr.String() {
				refused++
			}
			runProg(t, d.TCIngress(), f.pkt(tcpACK).Bytes())
		}
		check("after 2000 more established flows than fit")
		cs := counters(t, d)
		if refused != 0 || cs["tc_ct_est_full"] != 0 {
			t.Errorf("%d of 2000 answered flows refused (tc_ct_est_full %d), want none: those beyond the table stay in sluice_ct_new", refused, cs["tc_ct_est_full"])
		}
		// 2000 flows of 2 entries each, 40 of the table's 1024 taken.
		if got := cs["tc_ct_est_overflow"]; got < 2000-(1024-40)/2 {
			t.Errorf("tc_ct_est_overflow = %d, want >= %d (the flows beyond the table)", got, 2000-(1024-40)/2)
		}
	})
}

// TestCTFullOfClosedFlows: a burst of short connections fills the table of
// established flows with closed ones (in their close timeout, then
// expired), which only the agent's GC deletes. A new flow answered then
// works, kept in sluice_ct_new (tc_ct_est_overflow), where it was refused
// before (its SYN-ACK dropped: a second lost to the client's SYN
// retransmit); a flood of new flows evicts no established flow; and once
// the GC has run, a new flow is established in the table again.
func TestCTFullOfClosedFlows(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		a, vip := twinOf(v6), twinL4(v6, vipTCP)
		d := openTestWith(t, smallConfig, func(cfg *Config) {
			cfg.MaxConntrack = 64
			cfg.MaxConntrackNew = 1024
			cfg.CTTimeoutClose = 300 * time.Millisecond
		})
		m := d.Maps()
		be := testBackend{71, l4(a("10.1.7.1"), 8080, model.TCP)}
		addService(t, m, 1, vip, be)
		other := l4(a("10.96.0.41"), 80, model.TCP)
		ob := testBackend{72, l4(a("10.1.7.2"), 8080, model.TCP)}
		addService(t, m, 2, other, ob)
		est := m.conntrack
		if v6 {
			est = d.tc.Sluice6ConntrackV1
		}

		// 32 flows of 2 entries fill the table; 24 of them close.
		var live []flow
		for i := range 32 {
			f := flow{a("10.0.7.1"), uint16(47000 + i), vip}
			establish(t, d, f, be)
			if i < 24 {
				if v, _ := sendTo(t, d.TCIngress(), f.pkt(tcpRST)); v != tcActOK {
					t.Fatalf("RST of flow %d: verdict %d", i, v)
				}
			} else {
				live = append(live, f)
			}
		}
		if n := mapLen(t, est); n != 64 {
			t.Fatalf("%d entries in the established table, want it full (64)", n)
		}
		works := func(phase string, f flow, b testBackend, fl uint8) {
			t.Helper()
			if v, dst := sendTo(t, d.TCIngress(), f.pkt(fl)); v != tcActOK || dst != b.addr.Addr.String() {
				t.Errorf("%s: %v's packet: verdict %d to %s, want %s", phase, f, v, dst, b.addr.Addr)
			}
			if v, out := runProg(t, d.TCEgress(), f.from(b.addr, tcpACK).Bytes()); v != tcActOK || outSrc(out) != f.fe.Addr.String() {
				t.Errorf("%s: %v's reply: verdict %d from %s, want %s", phase, f, v, outSrc(out), f.fe.Addr)
			}
		}
		newFlow := func(phase string, f flow, b testBackend) {
			t.Helper()
			if v, dst := sendTo(t, d.TCIngress(), f.pkt(tcpSYN_)); v != tcActOK || dst != b.addr.Addr.String() {
				t.Fatalf("%s: SYN: verdict %d to %s", phase, v, dst)
			}
			if v, out := runProg(t, d.TCEgress(), f.from(b.addr, tcpSA).Bytes()); v != tcActOK || outSrc(out) != f.fe.Addr.String() {
				t.Errorf("%s: SYN-ACK: verdict %d from %s, want it translated (the flow refused?)", phase, v, outSrc(out))
			}
			works(phase, f, b, tcpACK)
		}

		// In the close timeout, and then expired: a new flow works.
		newFlow("table full of closed flows", flow{a("10.0.7.2"), 48000, vip}, be)
		time.Sleep(400 * time.Millisecond)
		newFlow("table full of expired flows", flow{a("10.0.7.2"), 48001, vip}, be)
		cs := counters(t, d)
		if cs["tc_ct_est_full"] != 0 || cs["tc_ct_est_overflow"] != 2 {
			t.Errorf("tc_ct_est_full %d, tc_ct_est_overflow %d; want 0 and 2", cs["tc_ct_est_full"], cs["tc_ct_est_overflow"])
		}
		// What the agent polls to collect at once.
		if r, err := m.ConntrackRefused(); err != nil || r != 2 {
			t.Errorf("ConntrackRefused = %d, %v; want the 2 flows kept out of the table", r, err)
		}

		// A flood of new flows, answered and not, evicts no established
		// flow (the flows kept in sluice_ct_new are fair game).
		for i := range 3000 {
			f := flow{a(fmt.Sprintf("10.0.%d.%d", 110+i/250, 1+i%250)), 50002, other}
			runProg(t, d.TCIngress(), f.pkt(tcpSYN_).Bytes())
			if i%2 == 0 {
				runProg(t, d.TCEgress(), f.from(ob.addr, tcpSA).Bytes())
			}
		}
		for _, f := range live {
			works("after the flood", f, be, tcpACK)
		}
		if n := mapLen(t, est); n != 64 {
			t.Errorf("%d entries in the established table after the flood, want 64 (nothing evicted, nothing added)", n)
		}

		// The GC deletes the expired flows; the next flow is established.
		if _, err := m.GCConntrack(); err != nil {
			t.Fatal(err)
		}
		before := counters(t, d)["tc_ct_est_overflow"]
		newFlow("after the GC", flow{a("10.0.7.2"), 48002, vip}, be)
		if got := counters(t, d)["tc_ct_est_overflow"]; got != before {
			t.Errorf("a flow after the GC was kept out of the table (tc_ct_est_overflow %d -> %d)", before, got)
		}
		if n := mapLen(t, est); n != 8*2+2 {
			t.Errorf("%d entries in the established table after the GC and a new flow, want %d", n, 8*2+2)
		}
	})
}

// TestCTSharedBackendClash (B1): a client port talking to two VIPs that
// share a backend: the second flow must not take over the first one's
// reply entry (replies would carry the wrong VIP). As netfilter's NAT does
// for kube-proxy, it keeps the backend it was sent to and leaves from
// another client port (lb4_remap, counted tc_ct_clash_remap), whose
// replies come back as the second VIP's to the client's own port.
func TestCTSharedBackendClash(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		a := twinOf(v6)
		d := newTestDatapath(t)
		m := d.Maps()
		shared := testBackend{61, l4(a("10.1.6.1"), 8080, model.TCP)}
		spare := testBackend{62, l4(a("10.1.6.2"), 8080, model.TCP)}
		vip1, vip2, vip3 := l4(a("10.96.0.50"), 80, model.TCP), l4(a("10.96.0.51"), 80, model.TCP), l4(a("10.96.0.52"), 80, model.TCP)
		addService(t, m, 1, vip1, shared)
		addService(t, m, 2, vip2, shared)
		addService(t, m, 3, vip3, shared, spare)
		remaps := func() uint64 { return counters(t, d)["tc_ct_clash_remap"] }

		// sendRemapped sends f's SYN and checks it reaches be, from
		// another client port when be is shared (whose reply then comes
		// back as f's frontend to f's port).
		sendRemapped := func(i int, f flow, bes ...testBackend) {
			t.Helper()
			n := remaps()
			v, out := runProg(t, d.TCIngress(), f.pkt(tcpSYN_).Bytes())
			if v != tcActOK || outSrc(out) != f.client {
				t.Fatalf("flow %d to %s: verdict %d from %s", i, f.fe, v, outSrc(out))
			}
			var be testBackend
			for _, b := range bes {
				if b.addr.Addr.String() == outDst(out) {
					be = b
				}
			}
			if be.id == 0 {
				t.Fatalf("flow %d to %s went to %s, not one of its backends", i, f.fe, outDst(out))
			}
			sp := outSport(out)
			if want := be.id == shared.id; (sp != f.cport) != want || (remaps()-n == 1) != want {
				t.Fatalf("flow %d to %s: to %s from port %d (the client's %d), tc_ct_clash_remap +%d", i, f.fe, be.addr, sp, f.cport, remaps()-n)
			}
			reply := f.from(be.addr, tcpSA)
			reply.DstPort = sp
			if v, out := runProg(t, d.TCEgress(), reply.Bytes()); v != tcActOK || outSrc(out) != f.fe.Addr.String() ||
				outSport(out) != f.fe.Port || outDst(out) != f.client || outDport(out) != f.cport {
				t.Fatalf("flow %d: reply to port %d: verdict %d, %s:%d -> %s:%d, want %s -> %s:%d", i, sp, v,
					outSrc(out), outSport(out), outDst(out), outDport(out), f.fe, f.client, f.cport)
			}
		}
		for i := range 16 {
			f1 := flow{a("10.0.6.1"), uint16(47000 + i), vip1}
			establish(t, d, f1, shared)
			f2, f3 := f1, f1
			f2.fe, f3.fe = vip2, vip3
			sendRemapped(i, f2, shared)
			sendRemapped(i, f3, shared, spare)
			for range 2 {
				if v, _ := sendTo(t, d.TCIngress(), f1.pkt(tcpACK)); v != tcActOK {
					t.Fatalf("flow %d to %s: verdict %d", i, vip1, v)
				}
				if v, out := runProg(t, d.TCEgress(), f1.from(shared.addr, tcpACK).Bytes()); v != tcActOK || outSrc(out) != vip1.Addr.String() {
					t.Fatalf("flow %d: reply from %s carries %s, want %s", i, shared.addr, outSrc(out), vip1.Addr)
				}
			}
		}
	})
}

// TestTCClashRemap: the packets of two flows from one client port to two
// VIPs sharing a backend, exactly, checksums included, over both families
// and protocols. The second flow leaves from the only SNAT port (62000,
// oneSNATPort) to the same backend; its replies, at the client's device's
// egress or at the backend's device's ingress, come back as the second
// VIP's to the client's own port; the first flow is untouched. What cannot
// be remapped clashes as before (tc_ct_clash): a TCP packet that is not a
// SYN, a flow with no port left, or a port whose tuple a half-open flow of
// the client holds (ct_snat_try).
func TestTCClashRemap(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		a := twinOf(v6)
		for _, proto := range []model.Protocol{model.TCP, model.UDP} {
			t.Run(proto.String(), func(t *testing.T) {
				d := openTestWith(t, smallConfig, oneSNATPort)
				m := d.Maps()
				be := testBackend{71, l4(a("10.1.7.1"), 8080, proto)}
				vip1, vip2, vip3 := l4(a("10.96.0.70"), 80, proto), l4(a("10.96.0.71"), 80, proto), l4(a("10.96.0.72"), 80, proto)
				addService(t, m, 1, vip1, be)
				addService(t, m, 2, vip2, be)
				addService(t, m, 3, vip3, be)
				const cport, remapped = 47300, 62000
				f1 := flow{a("10.0.7.1"), cport, vip1}
				f2, f3 := f1, f1
				f2.fe, f3.fe = vip2, vip3
				// A client whose half-open flow holds port 62000 (h1).
				h0, h1, h2 := flow{a("10.0.7.2"), cport, vip1}, flow{a("10.0.7.2"), remapped, vip1}, flow{a("10.0.7.2"), cport, vip2}
				syn, ack, sa := uint8(tcpSYN_), uint8(tcpACK), uint8(tcpSA)
				if proto == model.UDP {
					syn, ack, sa = 0, 0, 0
				}
				dnat := func(in packet.Packet, sport uint16) *packet.Packet {
					return with(in, func(p *packet.Packet) { p.Dst, p.DstPort, p.SrcPort = be.addr.Addr, be.addr.Port, sport })
				}
				reply := func(f flow, dport uint16, flags uint8) packet.Packet {
					p := f.from(be.addr, flags)
					p.DstPort = dport
					return p
				}
				unNAT := func(in packet.Packet, f flow) *packet.Packet {
					return with(in, func(p *packet.Packet) { p.Src, p.SrcPort, p.DstPort = f.fe.Addr, f.fe.Port, f.cport })
				}
				type step struct {
					name    string
					egress  bool
					in      packet.Packet
					verdict uint32
					out     *packet.Packet // nil: dropped
					counted string         // grows by one
				}
				steps := []step{
					{"first flow: DNAT", false, f1.pkt(syn), tcActOK, dnat(f1.pkt(syn), cport), "tc_dnat_new"},
					{"first flow's reply", true, reply(f1, cport, sa), tcActOK, unNAT(reply(f1, cport, sa), f1), "tc_rev_nat"},
				}
				if proto == model.TCP {
					steps = append(steps, step{"second flow's ACK, which opens nothing: clash", false, f2.pkt(ack), tcActShot, nil, "tc_ct_clash"})
				}
				steps = append(steps,
					step{"second flow: remapped to another client port", false, f2.pkt(syn), tcActOK, dnat(f2.pkt(syn), remapped), "tc_ct_clash_remap"},
					step{"second flow's reply at egress: the second VIP to the client's port", true, reply(f2, remapped, sa), tcActOK, unNAT(reply(f2, remapped, sa), f2), "tc_rev_nat"},
					step{"second flow's next packet: the remapped port", false, f2.pkt(ack), tcActOK, dnat(f2.pkt(ack), remapped), "tc_dnat_ct"},
					step{"first flow's next packet: its own port", false, f1.pkt(ack), tcActOK, dnat(f1.pkt(ack), cport), "tc_dnat_ct"},
					step{"first flow's next reply", true, reply(f1, cport, ack), tcActOK, unNAT(reply(f1, cport, ack), f1), "tc_rev_nat"},
					step{"second flow's reply at the backend device's ingress", false, reply(f2, remapped, ack), tcActOK, unNAT(reply(f2, remapped, ack), f2), "tc_rev_nat"},
					step{"third flow: no port left: clash", false, f3.pkt(syn), tcActShot, nil, "tc_ct_clash"},
					step{"a half-open flow from port 62000", false, h1.pkt(syn), tcActOK, dnat(h1.pkt(syn), remapped), "tc_dnat_new"},
					step{"the same client's first flow", false, h0.pkt(syn), tcActOK, dnat(h0.pkt(syn), cport), "tc_dnat_new"},
					step{"its second flow: port 62000 is the half-open flow's: clash", false, h2.pkt(syn), tcActShot, nil, "tc_ct_clash"},
				)
				for _, s := range steps {
					prog := d.TCIngress()
					if s.egress {
						prog = d.TCEgress()
					}
					n := counters(t, d)[s.counted]
					v, out := runProg(t, prog, s.in.Bytes())
					if v != s.verdict {
						t.Fatalf("%s: verdict %d, want %d", s.name, v, s.verdict)
					}
					if got := counters(t, d)[s.counted] - n; got != 1 {
						t.Errorf("%s: %s counted %d, want 1", s.name, s.counted, got)
					}
					if s.out == nil {
						continue
					}
					if want := s.out.Bytes(); !bytes.Equal(out, want) {
						t.Fatalf("%s: output packet\n got %x\nwant %x", s.name, out, want)
					}
					checkChecksums(t, out)
				}
			})
		}
	})
}

// TestCTClosedReplyTupleReopens: a client port whose flow to one VIP has
// closed (FINs both ways, or a RST either way) opens a new one to another
// VIP that has only the same backend. The old flow's reply entry still
// holds <B -> C:P> until the close timeout; a SYN takes it over, as
// netfilter reopens a closed TCP conntrack, instead of clashing on every
// retransmission until the old entry expires. An open flow keeps its
// tuple: a SYN to the other VIP leaves from another client port instead
// (TestCTSharedBackendClash); a packet that is not a SYN opens nothing and
// still clashes (counted tc_ct_clash).
func TestCTClosedReplyTupleReopens(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		a := twinOf(v6)
		d := newTestDatapath(t)
		m := d.Maps()
		shared := testBackend{63, l4(a("10.1.6.3"), 8080, model.TCP)}
		vip1, vip2 := l4(a("10.96.0.53"), 80, model.TCP), l4(a("10.96.0.54"), 80, model.TCP)
		addService(t, m, 1, vip1, shared)
		addService(t, m, 2, vip2, shared)
		toVIP := func(t *testing.T, f flow, flags uint8) (uint32, string) {
			return sendTo(t, d.TCIngress(), f.pkt(flags))
		}
		fromBackend := func(t *testing.T, f flow, flags uint8) (uint32, []byte) {
			return runProg(t, d.TCEgress(), f.from(shared.addr, flags).Bytes())
		}
		clashes := func(t *testing.T) uint64 { return counters(t, d)["tc_ct_clash"] }

		for i, c := range []struct {
			name     string
			halfOpen bool                       // the old flow saw no reply
			close    func(t *testing.T, f flow) // nil: the flow stays open
		}{
			{"FIN both ways", false, func(t *testing.T, f flow) { toVIP(t, f, tcpFA); fromBackend(t, f, tcpFA) }},
			{"RST from the client", false, func(t *testing.T, f flow) { toVIP(t, f, tcpRST) }},
			{"RST from the backend", false, func(t *testing.T, f flow) { fromBackend(t, f, tcpRST) }},
			{"half-open, RST from the client", true, func(t *testing.T, f flow) { toVIP(t, f, tcpRST) }},
			{"open", false, nil},
			{"half-open", true, nil},
		} {
			t.Run(c.name, func(t *testing.T) {
				f1 := flow{a("10.0.6.3"), uint16(47100 + i), vip1}
				if c.halfOpen {
					toVIP(t, f1, tcpSYN_)
				} else {
					establish(t, d, f1, shared)
				}
				f2 := f1
				f2.fe = vip2
				be := shared.addr.Addr.String()
				if c.close == nil {
					n := clashes(t)
					if v, out := runProg(t, d.TCIngress(), f2.pkt(tcpSYN_).Bytes()); v != tcActOK || outDst(out) != be || outSport(out) == f2.cport {
						t.Fatalf("SYN to %s: verdict %d to %s from port %d, want %s from another port than the open flow's to %s", vip2, v, outDst(out), outSport(out), be, vip1)
					}
					if got := clashes(t); got != n {
						t.Errorf("tc_ct_clash counted %d for the remapped SYN", got-n)
					}
					if v, out := fromBackend(t, f1, tcpSA); v != tcActOK || outSrc(out) != vip1.Addr.String() {
						t.Errorf("reply of the open flow carries %s, want %s", outSrc(out), vip1.Addr)
					}
					return
				}
				c.close(t, f1)
				// Not a SYN: no new connection; the closed flow keeps
				// its tuple.
				n := clashes(t)
				if v, dst := toVIP(t, f2, tcpACK); v == tcActOK && dst == be {
					t.Fatalf("an ACK to %s took the reply tuple of the closed flow to %s", vip2, vip1)
				}
				if clashes(t) == n {
					t.Errorf("ACK to %s refused, tc_ct_clash not counted", vip2)
				}

				n = clashes(t)
				if v, dst := toVIP(t, f2, tcpSYN_); v != tcActOK || dst != be {
					t.Fatalf("SYN to %s on the closed flow's tuple: verdict %d to %s, want %s", vip2, v, dst, be)
				}
				if got := clashes(t); got != n {
					t.Errorf("tc_ct_clash counted %d for the SYN that reopened the tuple", got-n)
				}
				if e, ok := ctLookup(t, m, f2.revKey(shared.addr)); !ok || e.nat != netip.AddrPortFrom(vip2.Addr, vip2.Port) || e.flags != 0 {
					t.Errorf("reply entry %s: %+v (present %v), want a new flow's naming %s", f2.revKey(shared.addr), e, ok, vip2)
				}
				if e, ok := ctLookup(t, m, f1.fwdKey()); ok {
					t.Errorf("the closed flow's forward entry %s is left: %+v", f1.fwdKey(), e)
				}
				if v, out := fromBackend(t, f2, tcpSA); v != tcActOK || outSrc(out) != vip2.Addr.String() || outSport(out) != vip2.Port {
					t.Fatalf("SYN-ACK from %s: verdict %d, source %s:%d, want %s", shared.addr, v, outSrc(out), outSport(out), vip2)
				}
				if v, dst := toVIP(t, f2, tcpACK); v != tcActOK || dst != be {
					t.Errorf("ACK of the new flow: verdict %d to %s", v, dst)
				}
				if e, ok := ctLookup(t, m, f2.fwdKey()); !ok || e.nat != netip.AddrPortFrom(shared.addr.Addr, shared.addr.Port) || e.flags&ctFlagReplied == 0 {
					t.Errorf("new flow's forward entry %+v (present %v), want established to %s", e, ok, shared.addr)
				}
			})
		}
	})
}

// TestCTStragglerKeepsNewFlow (B2, B10): after a flow closed and its tuple
// was reused for a new flow to another backend, a late FIN or RST of the
// old backend must not mark the new flow closed (whose SYN retransmission
// would then re-select a backend and split the connection).
func TestCTStragglerKeepsNewFlow(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		a, vip := twinOf(v6), twinL4(v6, vipTCP)
		d := newTestDatapath(t)
		m := d.Maps()
		bes := []testBackend{
			{71, l4(a("10.1.7.1"), 8080, model.TCP)}, {72, l4(a("10.1.7.2"), 8080, model.TCP)},
			{73, l4(a("10.1.7.3"), 8080, model.TCP)}, {74, l4(a("10.1.7.4"), 8080, model.TCP)},
		}
		for i, straggler := range []uint8{tcpRST, tcpFA} {
			addService(t, m, 1, vip, bes...)
			f := flow{a("10.0.7.1"), uint16(48000 + i), vip}
			old := establish(t, d, f, bes...)
			runProg(t, d.TCIngress(), f.pkt(tcpFA).Bytes())
			runProg(t, d.TCEgress(), f.from(old.addr, tcpFA).Bytes())
			var rest []testBackend
			for _, b := range bes {
				if b != old {
					rest = append(rest, b)
				}
			}
			addService(t, m, 1, vip, rest...) // the old backend leaves
			if err := m.DeleteSlot(reconciler.DefaultScope(vip), 4); err != nil {
				t.Fatal(err)
			}
			v, dst := sendTo(t, d.TCIngress(), f.pkt(tcpSYN_))
			if v != tcActOK || dst == old.addr.Addr.String() {
				t.Fatalf("new flow on the old tuple: verdict %d to %s", v, dst)
			}
			runProg(t, d.TCEgress(), f.from(old.addr, straggler).Bytes())
			if e, ok := ctLookup(t, m, f.fwdKey()); !ok || e.flags&(ctFlagRST|ctFlagFinRev) != 0 {
				t.Errorf("straggler %#x of the old backend: new flow's forward entry flags %#x (present %v)", straggler, e.flags, ok)
			}
			for range 4 {
				if v, got := sendTo(t, d.TCIngress(), f.pkt(tcpSYN_)); v != tcActOK || got != dst {
					t.Fatalf("straggler %#x: SYN retransmission to %s, the flow is on %s", straggler, got, dst)
				}
			}
			if err := m.UpsertBackend(old.id, old.addr); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// flowToLeave opens a datapath whose service 1 (vipTCP) has one backend,
// old (id 10n+1, 10.1.n.1:8080), and establishes the flow f from
// 10.0.n.1:cport to it; cur (id 10n+2, 10.1.n.2:8080) is the backend a
// test puts in old's place.
func flowToLeave(t *testing.T, v6 bool, n int, cport uint16) (d *Datapath, f flow, old, cur testBackend) {
	t.Helper()
	a := twinOf(v6)
	vip := twinL4(v6, vipTCP)
	d = newTestDatapath(t)
	old = testBackend{reconciler.BackendID(10*n + 1), l4(a(fmt.Sprintf("10.1.%d.1", n)), 8080, model.TCP)}
	cur = testBackend{reconciler.BackendID(10*n + 2), l4(a(fmt.Sprintf("10.1.%d.2", n)), 8080, model.TCP)}
	addService(t, d.Maps(), 1, vip, old)
	f = flow{a(fmt.Sprintf("10.0.%d.1", n)), cport, vip}
	establish(t, d, f, old)
	return d, f, old, cur
}

// TestCTBackendGoneSYNReselects (B4): a pure SYN on the tuple of a live
// TCP flow whose backend has left the service (a client that crashed and
// reuses its port) selects a current backend; the established flow's own
// packets keep their backend, as kube-proxy keeps established connections
// of terminating endpoints.
func TestCTBackendGoneSYNReselects(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		a := twinOf(v6)
		d, f, gone, cur := flowToLeave(t, v6, 8, 49000)
		m, vip := d.Maps(), f.fe
		g := flow{a("10.0.8.1"), 49001, vip}
		establish(t, d, g, gone)
		addService(t, m, 1, vip, cur)
		if err := m.DeleteBackend(gone.id); err != nil {
			t.Fatal(err)
		}
		if v, dst := sendTo(t, d.TCIngress(), g.pkt(tcpACK)); v != tcActOK || dst != gone.addr.Addr.String() {
			t.Errorf("established flow's data: verdict %d to %s, want its backend %s", v, dst, gone.addr.Addr)
		}
		if v, dst := sendTo(t, d.TCIngress(), f.pkt(tcpSYN_)); v != tcActOK || dst != cur.addr.Addr.String() {
			t.Errorf("new SYN on the tuple: verdict %d to %s, want %s", v, dst, cur.addr.Addr)
		}
		// An id reused for another address is gone too.
		h := flow{a("10.0.8.1"), 49002, vip}
		establish(t, d, h, cur)
		if err := m.UpsertBackend(cur.id, l4(a("10.1.8.3"), 8080, model.TCP)); err != nil {
			t.Fatal(err)
		}
		if v, dst := sendTo(t, d.TCIngress(), h.pkt(tcpSYN_)); v != tcActOK || dst != a("10.1.8.3") {
			t.Errorf("SYN on a flow whose backend id names another address: verdict %d to %s", v, dst)
		}
	})
}

// TestCTNewFlowSupersedesLapsed: a SYN on the tuple of a flow whose
// forward entry has lapsed while its reply entry lives (a server that kept
// sending) starts a new flow, which supersedes the old one: the old
// backend's reply entry goes, so that its stragglers are no longer sent
// back as the VIP. A new flow skips ct_supersede's lookups only when the
// forward key was not found at all (ct_create's @fresh), not when it was
// found lapsed.
func TestCTNewFlowSupersedesLapsed(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		d, f, old, cur := flowToLeave(t, v6, 9, 49100)
		m, vip := d.Maps(), f.fe
		fwd, ok := ctLookup(t, m, f.fwdKey())
		if !ok {
			t.Fatalf("no forward entry %s", f.fwdKey())
		}
		ctSetSeen(t, m, f.fwdKey(), -ctLifetime(m.cfg, uint8(model.TCP), fwd.flags)-time.Minute)
		addService(t, m, 1, vip, cur)
		if v, dst := sendTo(t, d.TCIngress(), f.pkt(tcpSYN_)); v != tcActOK || dst != cur.addr.Addr.String() {
			t.Fatalf("SYN on the lapsed flow's tuple: verdict %d to %s, want %s", v, dst, cur.addr.Addr)
		}
		if _, ok := ctLookup(t, m, f.revKey(old.addr)); ok {
			t.Errorf("the superseded flow's reply entry %s is still there", f.revKey(old.addr))
		}
		if v, out := runProg(t, d.TCEgress(), f.from(old.addr, tcpACK).Bytes()); v != tcActOK || outSrc(out) == vip.Addr.String() {
			t.Errorf("straggler of the old backend: verdict %d, source %s, want it untranslated", v, outSrc(out))
		}
	})
}

// TestTCSlotVanishes (B6): a reader that read a master's count before a
// shrink finds its slot (or the slot's backend) gone. It selects again
// rather than dropping the packet. The state is the one such a reader
// sees: the master says 2, slot 2 is gone.
func TestTCSlotVanishes(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		d := newTestDatapath(t)
		m := d.Maps()
		a, vip := twinOf(v6), twinL4(v6, vipTCP)
		b1, b2 := testBackend{91, l4(a("10.1.9.1"), 8080, model.TCP)}, testBackend{92, l4(a("10.1.9.2"), 8080, model.TCP)}
		addService(t, m, 1, vip, b1, b2)
		if err := m.DeleteSlot(reconciler.DefaultScope(vip), 2); err != nil {
			t.Fatal(err)
		}
		dropped := 0
		// 64 new flows from client, each of which must reach b1.
		newFlows := func(client string) {
			for i := range 64 {
				if v, dst := sendTo(t, d.TCIngress(), flow{client, uint16(50000 + i), vip}.pkt(tcpSYN_)); v != tcActOK || dst != b1.addr.Addr.String() {
					dropped++
				}
			}
		}
		newFlows(a("10.0.9.1"))
		// The slot is there but its backend is gone.
		addService(t, m, 1, vip, b1, b2)
		if err := m.DeleteBackend(b2.id); err != nil {
			t.Fatal(err)
		}
		newFlows(a("10.0.9.2"))
		if dropped != 0 {
			t.Errorf("%d of 128 new flows not sent to the remaining backend", dropped)
		}
	})
}

// TestCTConcurrentClose (C6): both ends send their FIN at the same time on
// two CPUs. Each FIN marks both entries of the flow; neither mark may be
// lost, or the flow stays "open" for the TCP idle timeout.
func TestCTConcurrentClose(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		a, vip := twinOf(v6), twinL4(v6, vipTCP)
		d := openTestWith(t, smallConfig, func(cfg *Config) {
			cfg.MaxConntrack = 65536
		})
		m := d.Maps()
		be := testBackend{93, l4(a("10.1.9.3"), 8080, model.TCP)}
		addService(t, m, 1, vip, be)
		const n = 3000
		flows := make([]flow, n)
		for i := range flows {
			flows[i] = flow{a(fmt.Sprintf("10.0.%d.%d", 100+i/250, 1+i%250)), 51000, vip}
			establish(t, d, flows[i], be)
		}
		// A spin barrier per flow: both CPUs start its FIN together.
		var arrived, failed atomic.Int64
		onCPUs(t, []int{0, 1}, func(cpu int) {
			for i, f := range flows {
				arrived.Add(1)
				for arrived.Load() < int64(2*(i+1)) {
				}
				var err error
				if cpu == 0 {
					_, _, err = runProgErr(d.TCIngress(), f.pkt(tcpFA).Bytes())
				} else {
					_, _, err = runProgErr(d.TCEgress(), f.from(be.addr, tcpFA).Bytes())
				}
				if err != nil {
					failed.Add(1) // counted, not returned: the other CPU waits at the barrier
				}
			}
		})
		if c := failed.Load(); c != 0 {
			t.Fatalf("%d of %d FINs did not run", c, 2*n)
		}
		lost := 0
		both := ctFlagFinFwd | ctFlagFinRev
		for _, f := range flows {
			fe, _ := ctLookup(t, m, f.fwdKey())
			re, _ := ctLookup(t, m, f.revKey(be.addr))
			if fe.flags&both != both || re.flags&both != both {
				lost++
			}
		}
		if lost != 0 {
			t.Errorf("%d of %d flows closed by both ends lost a FIN mark", lost, n)
		}
	})
}

// TestFlushConntrackSet (C2): one flush forgets the flows of every backend
// it names, in both directions, and no other.
func TestFlushConntrackSet(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		a := twinOf(v6)
		d := newTestDatapath(t)
		m := d.Maps()
		bes := []testBackend{{94, l4(a("10.1.9.4"), 5353, model.UDP)}, {95, l4(a("10.1.9.5"), 5353, model.UDP)}, {96, l4(a("10.1.9.6"), 5353, model.UDP)}}
		flows := map[flow]testBackend{}
		for i, b := range bes {
			fe := l4(a(fmt.Sprintf("10.96.0.%d", 60+i)), 53, model.UDP)
			addService(t, m, reconciler.ServiceID(1+i), fe, b)
			for j := range 8 {
				f := flow{a("10.0.9.9"), uint16(52000 + j), fe}
				runProg(t, d.TCIngress(), f.pkt(0).Bytes())
				runProg(t, d.TCEgress(), f.from(b.addr, 0).Bytes())
				flows[f] = b
			}
		}
		if err := flushBackends(m, bes[0].addr, bes[1].addr); err != nil {
			t.Fatal(err)
		}
		for f, b := range flows {
			_, fwd := ctLookup(t, m, f.fwdKey())
			_, rev := ctLookup(t, m, f.revKey(b.addr))
			if want := b == bes[2]; fwd != want || rev != want {
				t.Errorf("flow %+v to %s after the flush: forward entry %v, reply entry %v, want %v", f, b.addr, fwd, rev, want)
			}
		}
	})
}

// TestSockSlotVanishes (B6): connect4 and sendmsg4 (connect6 and
// sendmsg6, over IPv6) in the state a reader between a shrink's writes
// sees (master count 2, slot 2 gone) still translate: a connect never
// leaves the VIP in place, which nothing answers.
func TestSockSlotVanishes(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		f := sockLBFamilies[0] // the rows of TestSockLB: ipv4, ipv6
		d := newTestDatapath(t)
		ns, _ := sockNode(t, d, "slot", sockBackends...)
		if v6 {
			f = sockLBFamilies[1]
			addLoopbackAddrs(t, ns, sockBackends6...)
			startBackends(t, sockBackends6...)
		}
		m := d.Maps()
		addService(t, m, 1, f.tcp,
			testBackend{1, l4(f.backends[0], 8080, model.TCP)}, testBackend{2, l4(f.backends[1], 8080, model.TCP)})
		addService(t, m, 2, f.udp,
			testBackend{3, l4(f.backends[0], 5353, model.UDP)}, testBackend{4, l4(f.backends[1], 5353, model.UDP)})
		for _, fe := range []model.L4Addr{f.tcp, f.udp} {
			if err := m.DeleteSlot(reconciler.DefaultScope(fe), 2); err != nil {
				t.Fatal(err)
			}
		}
		failed := 0
		for i := range 32 {
			fd := newSocketIn(t, f.domain, unix.SOCK_STREAM)
			tv := unix.NsecToTimeval(int64(time.Second))
			if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv); err != nil {
				t.Fatal(err)
			}
			if err := unix.Connect(fd, sockaddrIn(f.domain, f.tcp)); err != nil {
				failed++
				t.Logf("TCP connect %d: %v", i, err)
			}
			ufd := newSocketIn(t, f.domain, unix.SOCK_DGRAM)
			if err := unix.Connect(ufd, sockaddrIn(f.domain, f.udp)); err != nil {
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
	})
}

// TestCTFloodRealTraffic (issue item 7, the probe): real TCP connections
// through the tc programs with a small conntrack table. 20 long-lived
// connections to one Service must survive 5000 new connections to
// another; new connections may be refused while the table of established
// flows is full, never the established ones. The agent's GC runs as it
// would (here every 100ms, with a short close timeout).
//
//	client ns: c0 10.202.0.2/24 -> node ns: n0 10.202.0.1/24 (tc), lo 10.200.0.2
//	(IPv6: c0 2001:db8:202::2/64 -> n0 2001:db8:202::1/64, lo 2001:db8:200::2)
func TestCTFloodRealTraffic(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		a, be, subnet, network := twinOf(v6), sockBackends[0], "10.202.0", "tcp4"
		if v6 {
			be, subnet, network = sockBackends6[0], "2001:db8:202::", "tcp6"
		}
		d := openTestWith(t, smallConfig, func(cfg *Config) {
			cfg.MaxConntrack = 1024
			cfg.CTTimeoutClose = 500 * time.Millisecond
		})
		m := d.Maps()
		echo := l4(a("10.96.0.70"), 80, model.TCP)
		greet := l4(a("10.96.0.71"), 80, model.TCP)
		// Four echo backends (one address, four ports): a flow re-balanced to
		// another one is reset.
		var echoBackends []testBackend
		for i := range 4 {
			echoBackends = append(echoBackends, testBackend{reconciler.BackendID(10 + i), l4(be, uint16(9090+i), model.TCP)})
		}
		addService(t, m, 1, echo, echoBackends...)
		addService(t, m, 2, greet, testBackend{2, l4(be, 8080, model.TCP)})

		must := func(err error) {
			t.Helper()
			if err != nil {
				t.Fatal(err)
			}
		}
		nodeNS, clientNS := clientAndNode(t, d, subnet)
		for _, b := range echoBackends {
			_, err := nodeNS.ServeTCPEcho(netip.AddrPortFrom(b.addr.Addr, b.addr.Port).String(), fmt.Sprint(b.addr.Port))
			must(err)
		}

		stop := make(chan struct{})
		gcDone := make(chan struct{})
		go func() {
			defer close(gcDone)
			tk := time.NewTicker(100 * time.Millisecond)
			defer tk.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tk.C:
					if _, err := m.GCConntrack(); err != nil {
						t.Errorf("GC while connections come and go: %v", err)
					}
				}
			}
		}()
		defer func() { close(stop); <-gcDone }()

		dial := func(a model.L4Addr, timeout time.Duration) (net.Conn, error) {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			return clientNS.DialContext(ctx, network, netip.AddrPortFrom(a.Addr, a.Port).String())
		}
		roundTrip := func(c net.Conn) error {
			c.SetDeadline(time.Now().Add(2 * time.Second))
			if _, err := c.Write([]byte("ping\n")); err != nil {
				return err
			}
			line, err := bufio.NewReader(c).ReadString('\n')
			if err == nil && !strings.HasSuffix(line, " ping\n") {
				err = fmt.Errorf("echo %q", line)
			}
			return err
		}
		var conns []net.Conn
		for range 20 {
			c, err := dial(echo, 2*time.Second)
			if err != nil {
				t.Fatalf("connect %s: %v", echo, err)
			}
			t.Cleanup(func() { c.Close() })
			if err := roundTrip(c); err != nil {
				t.Fatalf("echo: %v", err)
			}
			conns = append(conns, c)
		}

		// The flood: 5000 connections from 50 workers.
		var ok, refused atomic.Int64
		var wg sync.WaitGroup
		for w := range 50 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < 5000; i += 50 {
					c, err := dial(greet, 300*time.Millisecond)
					if err != nil {
						refused.Add(1)
						continue
					}
					c.SetReadDeadline(time.Now().Add(time.Second))
					buf := make([]byte, 64)
					if n, _ := c.Read(buf); isBackendReply(string(buf[:n])) {
						ok.Add(1)
					} else {
						refused.Add(1)
					}
					c.Close()
				}
			}()
		}
		wg.Wait()
		t.Logf("flood: %d connections answered, %d refused or timed out", ok.Load(), refused.Load())

		broken := 0
		for i, c := range conns {
			if err := roundTrip(c); err != nil {
				broken++
				t.Logf("established connection %d: %v", i, err)
			}
		}
		if broken != 0 {
			t.Errorf("%d of %d established connections broken by the flood", broken, len(conns))
		}
		cs := counters(t, d)
		t.Logf("counters: %v", cs)
	})
}

// BenchmarkConntrackGC measures a GC pass (sluice_ct_gc) over a full
// established table of the default size: "live" keeps every entry,
// "half-expired" deletes half of them (refilled between passes, untimed).
//
//	go test -run '^$' -bench ConntrackGC ./pkg/datapath
func BenchmarkConntrackGC(b *testing.B) {
	d := openTestWith(b, smallConfig, func(cfg *Config) {
		cfg.MaxConntrack = DefaultMaxConntrack
	})
	m := d.Maps()
	now, err := monotonicNow()
	if err != nil {
		b.Fatal(err)
	}
	n := DefaultMaxConntrack
	keys := make([]sockCt4Key, n)
	vals := make([]sockCt4Entry, n)
	fill := func(expiredEvery int) {
		for i := range keys {
			keys[i] = sockCt4Key{Saddr: uint32(i), Daddr: 1, Sport: uint16(i), Dport: 80, Proto: 6, Dir: uint8(i % 2)}
			vals[i] = sockCt4Entry{Expires: now + uint64(time.Hour), Flags: ctFlagReplied, NatAddr: 2, NatPort: 8080}
			if expiredEvery > 0 && i%expiredEvery == 0 {
				vals[i].Expires = 1
			}
		}
		if _, err := m.conntrack.BatchUpdate(keys, vals, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("live", func(b *testing.B) {
		fill(0)
		for b.Loop() {
			if st, err := m.GCConntrack(); err != nil || st.Live != n {
				b.Fatalf("%+v, %v", st, err)
			}
		}
	})
	b.Run("half-expired", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			fill(2)
			b.StartTimer()
			if st, err := m.GCConntrack(); err != nil || st.Deleted != n/2 {
				b.Fatalf("%+v, %v", st, err)
			}
		}
	})
}
