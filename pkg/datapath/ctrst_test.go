package datapath

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/internal/testutil/packet"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// TCP state against netfilter's (an audit of the per-packet conntrack):
// a RST the receiving stack ignored does not close the flow, and a RST or
// FIN with no flow opens none.

// ctExpiresWithin fails unless the entry under k exists, has none of the
// flags in no and all of those in want, and expires life after the
// programs' clock at some moment between lo and hi (monotonicNow readings
// around the packet that set it; a second of slack for CT_REFRESH_NS).
func ctExpiresWithin(t *testing.T, m *Maps, k ctK, want, no uint32, life time.Duration, lo, hi uint64, what string) {
	t.Helper()
	e, ok := ctLookup(t, m, k)
	if !ok {
		t.Errorf("%s: no entry under %+v", what, k)
		return
	}
	if e.flags&want != want || e.flags&no != 0 {
		t.Errorf("%s: entry %v flags %#x, want %#x set and %#x clear", what, k.dir, e.flags, want, no)
	}
	min, max := lo+uint64(life)-uint64(time.Second), hi+uint64(life)+uint64(time.Second)
	if e.expires < min || e.expires > max {
		t.Errorf("%s: entry %v expires %v after the packet, want %v", what, k.dir,
			time.Duration(int64(e.expires-lo)), life)
	}
}

func clockNow(t *testing.T) uint64 {
	t.Helper()
	now, err := monotonicNow()
	if err != nil {
		t.Fatal(err)
	}
	return now
}

// rstFlow is an established flow of a two-backend Service, for a RST
// from one side (fromBackend) and what both sides send after it.
type rstFlow struct {
	t           *testing.T
	d           *Datapath
	f           flow
	be          testBackend
	fromBackend bool
}

func (r rstFlow) run(fromBackend bool, p packet.Packet) {
	r.t.Helper()
	prog := r.d.TCIngress()
	if fromBackend {
		prog = r.d.TCEgress()
	}
	if v, _ := runProg(r.t, prog, p.Bytes()); v != tcActOK {
		r.t.Fatalf("packet (from backend %v, flags %#x): verdict %d", fromBackend, p.TCPFlags, v)
	}
}

// send sends a packet with flags and payload from the RST's sender
// (sender) or its receiver.
func (r rstFlow) send(sender bool, flags uint8, payload string) {
	r.t.Helper()
	fromBackend := sender == r.fromBackend
	p := r.f.pkt(flags)
	if fromBackend {
		p = r.f.from(r.be.addr, flags)
	}
	p.Payload = []byte(payload)
	r.run(fromBackend, p)
}

// rst sends the sender's RST, its sequence number far off whatever the
// flow uses (flags tcpRST, or tcpRST|tcpACK).
func (r rstFlow) rst(flags uint8) {
	r.t.Helper()
	p := r.f.pkt(flags)
	if r.fromBackend {
		p = r.f.from(r.be.addr, flags)
	}
	p.Seq = 0x80000000
	r.run(r.fromBackend, p)
}

// bits are the sender's RST and challenged RST marks.
func (r rstFlow) bits() (rst, chal uint32) {
	if r.fromBackend {
		return ctFlagRSTRev, ctFlagChalRev
	}
	return ctFlagRSTFwd, ctFlagChalFwd
}

func (r rstFlow) keys() []ctK { return []ctK{r.f.fwdKey(), r.f.revKey(r.be.addr)} }

func (r rstFlow) what() string {
	return map[bool]string{true: "backend's RST", false: "client's RST"}[r.fromBackend]
}

// forRSTSides runs body for a RST from each side of an established flow
// of its own (client port base+i).
func forRSTSides(t *testing.T, base uint16, body func(t *testing.T, r rstFlow, cfg Config)) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		a, vip := twinOf(v6), twinL4(v6, vipTCP)
		d := newTestDatapath(t)
		m := d.Maps()
		bes := []testBackend{{151, l4(a("10.1.15.1"), 8080, model.TCP)}, {152, l4(a("10.1.15.2"), 8080, model.TCP)}}
		addService(t, m, 1, vip, bes...)
		for i, fromBackend := range []bool{true, false} {
			f := flow{a("10.0.15.1"), base + uint16(i), vip}
			be := establish(t, d, f, bes...)
			body(t, rstFlow{t, d, f, be, fromBackend}, m.cfg)
		}
	})
}

// TestCTIgnoredRSTKeepsFlow: an established flow, then a RST with a
// far-off sequence number from one side, which its receiver ignores. A
// later packet of the RST's sender (it is alive: the RST was not its own)
// takes the mark back: the flow is open again, both entries expiring
// after the established timeout. A bare ACK of the receiver (the
// challenge ACK of RFC 5961) makes the mark a challenged one: open, both
// entries expiring after the SYN timeout, until the sender sends more
// (established again) or answers with the exact RST (closed again, the
// close timeout). Each side's RST. Without the fix (6143f51: any packet
// of the receiver unmarks, the sender's never) the sender's traffic
// leaves the flow closed and the challenge ACK reopens it at once.
func TestCTIgnoredRSTKeepsFlow(t *testing.T) {
	forRSTSides(t, 47000, func(t *testing.T, r rstFlow, cfg Config) {
		m := r.d.Maps()
		rstBit, chalBit := r.bits()
		expect := func(want, no uint32, life time.Duration, lo uint64, what string) {
			t.Helper()
			hi := clockNow(t)
			for _, k := range r.keys() {
				ctExpiresWithin(t, m, k, want, no, life, lo, hi, r.what()+": "+what)
			}
		}
		lo := clockNow(t)
		r.rst(tcpRST)
		expect(rstBit|ctFlagReplied, chalBit, cfg.CTTimeoutClose, lo, "the RST")

		// Out of the receiver's window: dropped silently, the
		// connection goes on; the sender's next segment reopens.
		lo = clockNow(t)
		r.send(true, tcpACK|packet.PSH, "more from the sender")
		expect(ctFlagReplied, ctFlagRST|ctFlagChal, cfg.CTTimeoutTCP, lo, "then the sender's data")

		// In the window, inexact: the receiver's challenge ACK.
		r.rst(tcpRST | tcpACK)
		lo = clockNow(t)
		r.send(false, tcpACK, "")
		expect(chalBit|ctFlagReplied, ctFlagRST, cfg.CTTimeoutSYN, lo, "the RST, then the receiver's challenge ACK")
		// More of the receiver's keeps it challenged.
		lo = clockNow(t)
		r.send(false, tcpACK|packet.PSH, "more from the receiver")
		expect(chalBit|ctFlagReplied, ctFlagRST, cfg.CTTimeoutSYN, lo, "then the receiver's data")
		// The sender goes on: established again.
		lo = clockNow(t)
		r.send(true, tcpACK, "")
		expect(ctFlagReplied, ctFlagRST|ctFlagChal, cfg.CTTimeoutTCP, lo, "then the sender's ACK")
		// The flow follows its backend still.
		if v, dst := sendTo(t, r.d.TCIngress(), r.f.pkt(tcpACK)); v != tcActOK || dst != r.be.addr.Addr.String() {
			t.Fatalf("%s ignored: client packet verdict %d to %s, want %s", r.what(), v, dst, r.be.addr.Addr)
		}

		// A genuine RST: the challenge ACK answered by the exact RST.
		r.rst(tcpRST | tcpACK)
		r.send(false, tcpACK, "")
		lo = clockNow(t)
		r.rst(tcpRST)
		expect(rstBit, 0, cfg.CTTimeoutClose, lo, "the challenge ACK answered with a RST")
	})
}

// TestCTRSTInFlight: a RST from one side, then what its receiver sent
// before the RST reached it. Its data (a server streaming a download to
// a client that aborts), with or without a FIN, leaves the flow closed:
// both entries keep the mark and expire after the close timeout. A bare
// ACK of it (the server acknowledging an upload the client aborts) makes
// the mark a challenged one, and more of its data or ACKs keep it so:
// both entries expire after the SYN timeout, never the established one,
// as the sender (gone) sends nothing more. Each side's RST. Without the
// fix (6143f51: any packet of the receiver took the mark back) the first
// data packet put both entries back at the established timeout.
func TestCTRSTInFlight(t *testing.T) {
	forRSTSides(t, 47100, func(t *testing.T, r rstFlow, cfg Config) {
		m := r.d.Maps()
		rstBit, chalBit := r.bits()
		lo := clockNow(t)
		r.rst(tcpRST | tcpACK)
		for i := 0; i < 3; i++ {
			r.send(false, tcpACK|packet.PSH, "in flight, sent before the RST arrived")
		}
		r.send(false, tcpFA|packet.PSH, "the last of it")
		hi := clockNow(t)
		for _, k := range r.keys() {
			ctExpiresWithin(t, m, k, rstBit, chalBit, cfg.CTTimeoutClose, lo, hi, r.what()+", then the receiver's data in flight")
		}

		lo = clockNow(t)
		r.send(false, tcpACK, "")
		r.send(false, tcpACK|packet.PSH, "more in flight")
		r.send(false, tcpACK, "")
		hi = clockNow(t)
		for _, k := range r.keys() {
			ctExpiresWithin(t, m, k, chalBit, ctFlagRST, cfg.CTTimeoutSYN, lo, hi, r.what()+", then the receiver's bare ACKs in flight")
		}
	})
}

// TestCTRSTFragments: fragments leave a RST's mark as it is. The RST's
// sender's datagram, its first fragment sent before the RST and its later
// fragments after it (no TCP header: flags 0), is not a packet of the
// sender that takes the mark back; the receiver's first fragment holding
// just the TCP header (more fragments follow) is not a bare ACK that
// makes the mark a challenged one. Both entries keep the mark and expire
// after the close timeout. Each side's RST. Without the fix the later
// fragments put both entries back at the established timeout, and the
// first fragment made the mark a challenged one (the SYN timeout).
func TestCTRSTFragments(t *testing.T) {
	forRSTSides(t, 47200, func(t *testing.T, r rstFlow, cfg Config) {
		m := r.d.Maps()
		rstBit, chalBit := r.bits()
		dgram := func(sender bool, id uint16) packet.Packet {
			fromBackend := sender == r.fromBackend
			p := r.f.pkt(tcpACK | packet.PSH)
			if fromBackend {
				p = r.f.from(r.be.addr, tcpACK|packet.PSH)
			}
			p.Payload = bytes.Repeat([]byte("fragmented "), 8)
			p.ID = id
			return p
		}
		frags := dgram(true, 0x5151).Fragments(24)
		r.run(r.fromBackend, frags[0])
		lo := clockNow(t)
		r.rst(tcpRST | tcpACK)
		for _, f := range frags[1:] {
			r.run(r.fromBackend, f)
		}
		hi := clockNow(t)
		for _, k := range r.keys() {
			ctExpiresWithin(t, m, k, rstBit, chalBit, cfg.CTTimeoutClose, lo, hi, r.what()+", then the sender's later fragments")
		}

		first := dgram(false, 0x5252).Fragments(24)[0]
		first.RawL4 = first.RawL4[:20] // the TCP header alone, MF set
		lo = clockNow(t)
		r.rst(tcpRST | tcpACK)
		r.run(!r.fromBackend, first)
		hi = clockNow(t)
		for _, k := range r.keys() {
			ctExpiresWithin(t, m, k, rstBit, chalBit, cfg.CTTimeoutClose, lo, hi, r.what()+", then the receiver's first fragment of just a TCP header")
		}
	})
}

// TestTCStrayTCPOpensNoFlow: a TCP packet to a frontend that no flow has
// and that cannot open one in netfilter (a RST, a FIN, a SYN-ACK, neither
// SYN nor ACK) is dropped, counted tc_tcp_stray, and leaves no conntrack
// entry in either table; to a frontend without endpoints too (not
// refused: netfilter's INVALID matches no reject rule). A SYN and a bare
// ACK (loose pickup) still open flows.
func TestTCStrayTCPOpensNoFlow(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		a, vip := twinOf(v6), twinL4(v6, vipTCP)
		empty := twinL4(v6, l4("10.96.0.11", 80, model.TCP))
		d := newTestDatapath(t)
		m := d.Maps()
		bes := []testBackend{{161, l4(a("10.1.16.1"), 8080, model.TCP)}, {162, l4(a("10.1.16.2"), 8080, model.TCP)}}
		addService(t, m, 1, vip, bes...)
		addService(t, m, 2, empty)
		noEntry := func(f flow, what string) {
			t.Helper()
			if e, ok := ctLookup(t, m, f.fwdKey()); ok {
				t.Errorf("%s: forward entry %+v", what, e)
			}
			for _, b := range bes {
				if e, ok := ctLookup(t, m, f.revKey(b.addr)); ok {
					t.Errorf("%s: reply entry %+v from %s", what, e, b.addr)
				}
			}
		}
		stray := []struct {
			name  string
			flags uint8
		}{
			{"RST", tcpRST}, {"RST-ACK", tcpRST | tcpACK}, {"FIN-ACK", tcpFA}, {"FIN", packet.FIN},
			{"SYN-ACK", tcpSA}, {"PSH, neither SYN nor ACK", packet.PSH}, {"SYN-RST", tcpSYN_ | tcpRST},
		}
		port := uint16(46000)
		for _, fe := range []model.L4Addr{vip, empty} {
			for _, s := range stray {
				port++
				f := flow{a("10.0.16.1"), port, fe}
				before := counters(t, d)["tc_tcp_stray"]
				v, out := runProg(t, d.TCIngress(), f.pkt(s.flags).Bytes())
				what := s.name + " to " + fe.String()
				if v != tcActShot {
					t.Errorf("%s: verdict %d (to %s), want TC_ACT_SHOT", what, v, outDst(out))
				}
				if got := counters(t, d)["tc_tcp_stray"]; got != before+1 {
					t.Errorf("%s: tc_tcp_stray %d, want %d", what, got, before+1)
				}
				noEntry(f, what)
			}
		}
		for _, s := range []struct {
			name  string
			flags uint8
		}{{"SYN", tcpSYN_}, {"ACK", tcpACK}, {"PSH-ACK", tcpACK | packet.PSH}} {
			port++
			f := flow{a("10.0.16.1"), port, vip}
			v, dst := sendTo(t, d.TCIngress(), f.pkt(s.flags))
			if v != tcActOK || (dst != bes[0].addr.Addr.String() && dst != bes[1].addr.Addr.String()) {
				t.Errorf("%s: verdict %d to %s, want a backend", s.name, v, dst)
			}
			if _, ok := ctLookup(t, m, f.fwdKey()); !ok {
				t.Errorf("%s: no forward entry", s.name)
			}
		}
		if got := counters(t, d)["tc_tcp_stray"]; got != uint64(2*len(stray)) {
			t.Errorf("tc_tcp_stray %d after the SYN and ACKs, want %d", got, 2*len(stray))
		}
	})
}

// TestTCStrayTCPToUnservedPort: a TCP packet that cannot open a flow
// (a RST, a FIN, a SYN-ACK, neither SYN nor ACK) to a port a ClusterIP
// does not serve is dropped, counted tc_tcp_stray, and gets no ICMP port
// unreachable: kube-proxy's nftables mode rejects there only `ct state
// new` (cluster-ips-check), which netfilter's INVALID is not, and its
// iptables mode's KUBE-FORWARD drops INVALID. A SYN and a bare ACK (loose
// pickup: new to netfilter) to it still get the port unreachable,
// counted tc_unknown_port. Per family. Before the fix every one got the
// ICMP error.
func TestTCStrayTCPToUnservedPort(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		a, vip := twinOf(v6), twinL4(v6, vipTCP)
		d := newTestDatapath(t)
		applyServices(t, d, clusterIP(vip, l4(a("10.1.16.1"), 8080, model.TCP)))
		unserved := vip
		unserved.Port = 81
		port := uint16(47000)
		for _, c := range []struct {
			name  string
			flags uint8
			stray bool
		}{
			{"RST", tcpRST, true}, {"RST-ACK", tcpRST | tcpACK, true}, {"FIN-ACK", tcpFA, true}, {"FIN", packet.FIN, true},
			{"SYN-ACK", tcpSA, true}, {"PSH, neither SYN nor ACK", packet.PSH, true},
			{"SYN", tcpSYN_, false}, {"ACK", tcpACK, false},
		} {
			port++
			// A client of its own each: the ICMP errors' rate limit
			// per destination (a burst of 6) stops none.
			in := flow{a(fmt.Sprintf("10.0.17.%d", port-47000)), port, unserved}.pkt(c.flags)
			before := counters(t, d)
			v, out := runProg(t, d.TCIngress(), in.Bytes())
			after := counters(t, d)
			stray, unknown := after["tc_tcp_stray"]-before["tc_tcp_stray"], after["tc_unknown_port"]-before["tc_unknown_port"]
			what := c.name + " to " + unserved.String()
			if c.stray {
				if v != tcActShot {
					t.Errorf("%s: verdict %d, want TC_ACT_SHOT (no ICMP error)", what, v)
				}
				if stray != 1 || unknown != 0 {
					t.Errorf("%s: tc_tcp_stray +%d, tc_unknown_port +%d; want +1, +0", what, stray, unknown)
				}
				continue
			}
			if v != tcActRedirect {
				t.Errorf("%s: verdict %d, want TC_ACT_REDIRECT (the port unreachable)", what, v)
				continue
			}
			if stray != 0 || unknown != 1 {
				t.Errorf("%s: tc_tcp_stray +%d, tc_unknown_port +%d; want +0, +1", what, stray, unknown)
			}
			p, err := packet.Parse(out)
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			proto, typ, code := packet.ICMP, packet.ICMPUnreachable, uint8(3)
			if v6 {
				proto, typ, code = packet.ICMPv6, packet.ICMPv6Unreachable, packet.ICMPv6PortUnreach
			}
			if p.Proto != proto || p.ICMPType != typ || p.ICMPCode != code || p.Dst != in.Src {
				t.Errorf("%s: answered with protocol %d type %d code %d to %s, want the port unreachable (%d %d %d) to %s",
					what, p.Proto, p.ICMPType, p.ICMPCode, p.Dst, proto, typ, code, in.Src)
			}
		}
	})
}

// TestXDPStrayTCPPasses: with XDP, a RST or FIN to an external frontend
// with a remote backend (the flows XDP opens itself) and no flow is left
// to tc untouched: no entry, no SNAT port taken. tc passes it up
// untranslated, counted tc_tcp_stray_up, when the frontend is on a node
// address (a NodePort: the node's stack answers it, as with kube-proxy,
// which leaves netfilter's INVALID there), and drops it, counted
// tc_tcp_stray, when it is not (an ExternalIP elsewhere: kube-proxy's
// KUBE-FORWARD drops it), or when it is a ClusterIP's port no frontend
// serves (no ICMP error: TestTCStrayTCPToUnservedPort). A SYN still
// opens a flow in XDP. Without the fix (6143f51) tc dropped the
// NodePort's stray too, and answered the ClusterIP's with a port
// unreachable.
func TestXDPStrayTCPPasses(t *testing.T) {
	_, ifindex, d := northSouthNode(t)
	m := d.Maps()
	elsewhere := l4("192.168.1.202", 80, model.TCP) // on eth0's subnet, not the node's
	addExternal(t, m, 7, elsewhere, reconciler.FlagExternal, beRemote)
	// A ClusterIP with no frontend on the port: tc drops the stray
	// (TestTCStrayTCPToUnservedPort), XDP leaves it to tc.
	unserved := l4("10.96.0.77", 81, model.TCP)
	if _, err := m.UpsertServiceIPs([]netip.Addr{unserved.Addr}); err != nil {
		t.Fatal(err)
	}
	for i, flags := range []uint8{tcpRST, tcpRST | tcpACK, tcpFA, tcpSA} {
		for _, c := range []struct {
			fe model.L4Addr
			up bool
		}{{npRemote, true}, {elsewhere, false}, {unserved, false}} {
			in := nsClient(uint16(42100+i), c.fe)
			in.TCPFlags = flags
			b := in.Bytes()
			if v, out := runXDP(t, d.XDP(), ifindex, b); v != xdpPass || !bytes.Equal(out[:len(b)], b) {
				t.Errorf("XDP: flags %#x to %s with no flow: verdict %d, want %d and the frame untouched", flags, c.fe, v, xdpPass)
			}
			before := counters(t, d)
			v, out := runOn(t, d.TCIngress(), ifindex, b)
			after := counters(t, d)
			switch {
			case c.up && (v != tcActOK || !bytes.Equal(out[:len(b)], b)):
				t.Errorf("tc: flags %#x to %s with no flow: verdict %d, want TC_ACT_OK and the packet untouched", flags, c.fe, v)
			case !c.up && v != tcActShot:
				t.Errorf("tc: flags %#x to %s with no flow: verdict %d, want TC_ACT_SHOT", flags, c.fe, v)
			}
			up, drop := after["tc_tcp_stray_up"]-before["tc_tcp_stray_up"], after["tc_tcp_stray"]-before["tc_tcp_stray"]
			if c.up && (up != 1 || drop != 0) || !c.up && (up != 0 || drop != 1) {
				t.Errorf("flags %#x to %s: tc_tcp_stray_up +%d, tc_tcp_stray +%d", flags, c.fe, up, drop)
			}
			k := ctKeyOf(nsClientIP, in.SrcPort, c.fe.Addr.String(), c.fe.Port, model.TCP, ctForward)
			if e, ok := ctLookup(t, m, k); ok {
				t.Errorf("flags %#x to %s: forward entry %+v", flags, c.fe, e)
			}
		}
	}
	syn := nsClient(42199, npRemote)
	if v, _ := runXDP(t, d.XDP(), ifindex, syn.Bytes()); v != xdpTx {
		t.Errorf("XDP: SYN: verdict %d, want XDP_TX", v)
	}
}

// TestTC6StrayTCPToNodeAddress: TestXDPStrayTCPPasses's tc half for IPv6:
// a FIN-ACK or RST with no flow to an IPv6 NodePort on the node's address
// goes up untranslated (tc_tcp_stray_up), one to an external frontend
// that is no node address is dropped (tc_tcp_stray).
func TestTC6StrayTCPToNodeAddress(t *testing.T) {
	ns, ifindex, d := nodeDatapath6(t, smallConfig)
	// The address's local route comes from a work queue (waitLocal):
	// before it, the node's address would look like no node's.
	waitLocal(t, ns, addr(nsNodeIP6))
	elsewhere := l4("2001:db8:100::202", 80, model.TCP)
	addExternal(t, d.Maps(), 17, elsewhere, reconciler.FlagExternal, be6Remote)
	for i, flags := range []uint8{tcpFA, tcpRST} {
		for _, c := range []struct {
			fe model.L4Addr
			up bool
		}{{np6Remote, true}, {elsewhere, false}} {
			in := nsClient(uint16(42300+i), c.fe)
			in.TCPFlags = flags
			b := in.Bytes()
			before := counters(t, d)
			v, out := runOn(t, d.TCIngress(), ifindex, b)
			after := counters(t, d)
			switch {
			case c.up && (v != tcActOK || !bytes.Equal(out[:len(b)], b)):
				t.Errorf("flags %#x to %s with no flow: verdict %d, want TC_ACT_OK and the packet untouched", flags, c.fe, v)
			case !c.up && v != tcActShot:
				t.Errorf("flags %#x to %s with no flow: verdict %d, want TC_ACT_SHOT", flags, c.fe, v)
			}
			up, drop := after["tc_tcp_stray_up"]-before["tc_tcp_stray_up"], after["tc_tcp_stray"]-before["tc_tcp_stray"]
			if c.up && (up != 1 || drop != 0) || !c.up && (up != 0 || drop != 1) {
				t.Errorf("flags %#x to %s: tc_tcp_stray_up +%d, tc_tcp_stray +%d", flags, c.fe, up, drop)
			}
		}
	}
}

// TestStrayTCPToUnservedPortEndToEnd: TestTCStrayTCPToUnservedPort with
// real traffic, per family. The client's namespace sends a RST (a raw
// socket) to a port its ClusterIP does not serve, then connects to that
// port: tc at the node's device counts the RST tc_tcp_stray (waited for:
// the programs count it once they have run on it), and the first ICMP
// error the client's device receives is the port unreachable about the
// connect's SYN (ECONNREFUSED), not one about the RST. Before the fix the
// RST was answered first.
func TestStrayTCPToUnservedPortEndToEnd(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		d, lb, plane := lbDatapathOf(t, v6)
		vip := addr(vipOf(v6, "10.96.0.93"))
		applyServices(t, d, clusterIP(model.L4Addr{Addr: vip, Port: 80, Proto: model.TCP},
			model.L4Addr{Addr: plane.backends[0], Port: 8080, Proto: model.TCP}))
		if err := lb.Node.Do(func() error { return d.AttachDevices([]string{lb.NodeDev}) }); err != nil {
			t.Fatal(err)
		}
		capture := captureOn(t, lb.Client, "eth0")
		const rstPort = 47999
		rst := packet.Packet{Src: plane.client, Dst: vip, SrcPort: rstPort, DstPort: 81, Proto: packet.TCP,
			TCPFlags: tcpRST | tcpACK, Seq: 1, Ack: 1}
		family, hdr := unix.AF_INET, 20
		if v6 {
			family, hdr = unix.AF_INET6, 40
		}
		l4 := rst.Bytes()[14+hdr:]
		sockaddr := func(a netip.Addr) unix.Sockaddr {
			if v6 {
				return &unix.SockaddrInet6{Addr: a.As16()}
			}
			return &unix.SockaddrInet4{Addr: a.As4()}
		}
		before := counters(t, d)
		if err := lb.Client.Do(func() error {
			fd, err := unix.Socket(family, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			// Bound to the client's address: the TCP checksum
			// covers it.
			if err := unix.Bind(fd, sockaddr(plane.client)); err != nil {
				return err
			}
			return unix.Sendto(fd, l4, 0, sockaddr(vip))
		}); err != nil {
			t.Fatalf("RST from the client: %v", err)
		}
		// The RST is counted under one reason or the other once tc has
		// run on it (20 s: a deadline for a lost packet).
		var stray, unknown uint64
		for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
			after := counters(t, d)
			stray, unknown = after["tc_tcp_stray"]-before["tc_tcp_stray"], after["tc_unknown_port"]-before["tc_unknown_port"]
			if stray+unknown > 0 {
				break
			}
		}
		if stray != 1 || unknown != 0 {
			t.Errorf("RST to %s:81: tc_tcp_stray +%d, tc_unknown_port +%d; want +1, +0", vip, stray, unknown)
		}
		if err := tcpRefused(lb.Client, netip.AddrPortFrom(vip, 81)); err != nil {
			t.Error(err)
		}
		p, err := packet.Parse(capture.icmpError(t, plane.client))
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Payload) < hdr+2 {
			t.Fatalf("ICMP error quotes %d bytes", len(p.Payload))
		}
		if sport := binary.BigEndian.Uint16(p.Payload[hdr:]); sport == rstPort {
			t.Errorf("the client got a port unreachable about its RST (from port %d), want the first about its SYN", sport)
		}
	})
}
