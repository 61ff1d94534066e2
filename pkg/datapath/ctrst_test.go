package datapath

import (
	"bytes"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil/packet"
	"github.com/sluice-lb/sluice/pkg/model"
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

// TestCTIgnoredRSTKeepsFlow: an established flow, then a RST with a
// far-off sequence number from one side (its receiver ignores it, out of
// its window), then a packet from the receiver (an ACK, as a challenge
// ACK or the flow's next data): the flow is open again, both entries
// without the RST mark and expiring after the established timeout. Each
// side's RST, each receiver. The RST's sender answering with an exact RST
// closes the flow again, and a RST its receiver does not answer (a
// genuine close; the sender's own packets do not count) closes it at the
// close timeout.
func TestCTIgnoredRSTKeepsFlow(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		a, vip := twinOf(v6), twinL4(v6, vipTCP)
		d := newTestDatapath(t)
		m := d.Maps()
		cfg := m.cfg
		bes := []testBackend{{151, l4(a("10.1.15.1"), 8080, model.TCP)}, {152, l4(a("10.1.15.2"), 8080, model.TCP)}}
		addService(t, m, 1, vip, bes...)
		for i, fromBackend := range []bool{true, false} {
			f := flow{a("10.0.15.1"), uint16(47000 + i), vip}
			be := establish(t, d, f, bes...)
			fk, rk := f.fwdKey(), f.revKey(be.addr)
			// rst from the side under test, ack from the other (its receiver).
			rst := func(flags uint8) {
				t.Helper()
				var v uint32
				if fromBackend {
					p := f.from(be.addr, flags)
					p.Seq = 0x80000000 // far off whatever the flow uses
					v, _ = runProg(t, d.TCEgress(), p.Bytes())
				} else {
					p := f.pkt(flags)
					p.Seq = 0x80000000
					v, _ = runProg(t, d.TCIngress(), p.Bytes())
				}
				if v != tcActOK {
					t.Fatalf("RST (from backend %v): verdict %d", fromBackend, v)
				}
			}
			ack := func(receiver bool) {
				t.Helper()
				var v uint32
				if receiver == fromBackend { // the client receives the backend's RST
					v, _ = runProg(t, d.TCIngress(), f.pkt(tcpACK).Bytes())
				} else {
					v, _ = runProg(t, d.TCEgress(), f.from(be.addr, tcpACK).Bytes())
				}
				if v != tcActOK {
					t.Fatalf("ACK (receiver %v): verdict %d", receiver, v)
				}
			}
			rstBit := ctFlagRSTFwd
			if fromBackend {
				rstBit = ctFlagRSTRev
			}
			what := map[bool]string{true: "backend's RST", false: "client's RST"}[fromBackend]

			lo := clockNow(t)
			rst(tcpRST)
			hi := clockNow(t)
			for _, k := range []ctK{fk, rk} {
				ctExpiresWithin(t, m, k, rstBit|ctFlagReplied, 0, cfg.CTTimeoutClose, lo, hi, what)
			}
			lo = clockNow(t)
			ack(true)
			hi = clockNow(t)
			for _, k := range []ctK{fk, rk} {
				ctExpiresWithin(t, m, k, ctFlagReplied, ctFlagRST, cfg.CTTimeoutTCP, lo, hi, what+", then its receiver's ACK")
			}
			// The flow follows its backend still.
			if v, dst := sendTo(t, d.TCIngress(), f.pkt(tcpACK)); v != tcActOK || dst != be.addr.Addr.String() {
				t.Fatalf("%s ignored: client packet verdict %d to %s, want %s", what, v, dst, be.addr.Addr)
			}

			// The exact RST after the challenge ACK closes it again.
			lo = clockNow(t)
			rst(tcpRST | tcpACK)
			hi = clockNow(t)
			for _, k := range []ctK{fk, rk} {
				ctExpiresWithin(t, m, k, rstBit, 0, cfg.CTTimeoutClose, lo, hi, what+" again")
			}
			// Its sender's own packets do not take it back: the
			// receiver accepted it and sends nothing more.
			ack(false)
			for _, k := range []ctK{fk, rk} {
				ctExpiresWithin(t, m, k, rstBit, 0, cfg.CTTimeoutClose, lo, clockNow(t), what+", then its sender's ACK")
			}
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

// TestXDPStrayTCPPasses: with XDP, a RST or FIN to an external frontend
// with a remote backend (the flows XDP opens itself) and no flow is left
// to tc untouched, which drops it, counted: no entry, no SNAT port taken.
// A SYN still opens a flow in XDP.
func TestXDPStrayTCPPasses(t *testing.T) {
	_, ifindex, d := northSouthNode(t)
	m := d.Maps()
	for i, flags := range []uint8{tcpRST, tcpRST | tcpACK, tcpFA} {
		in := nsClient(uint16(42100+i), npRemote)
		in.TCPFlags = flags
		b := in.Bytes()
		if v, out := runXDP(t, d.XDP(), ifindex, b); v != xdpPass || !bytes.Equal(out[:len(b)], b) {
			t.Errorf("XDP: flags %#x with no flow: verdict %d, want %d and the frame untouched", flags, v, xdpPass)
		}
		before := counters(t, d)["tc_tcp_stray"]
		if v, _ := runOn(t, d.TCIngress(), ifindex, b); v != tcActShot {
			t.Errorf("tc: flags %#x with no flow: verdict %d, want TC_ACT_SHOT", flags, v)
		}
		if got := counters(t, d)["tc_tcp_stray"]; got != before+1 {
			t.Errorf("flags %#x: tc_tcp_stray %d, want %d", flags, got, before+1)
		}
		k := ctKeyOf(nsClientIP, in.SrcPort, npRemote.Addr.String(), npRemote.Port, model.TCP, ctForward)
		if e, ok := ctLookup(t, m, k); ok {
			t.Errorf("flags %#x: forward entry %+v", flags, e)
		}
	}
	syn := nsClient(42199, npRemote)
	if v, _ := runXDP(t, d.XDP(), ifindex, syn.Bytes()); v != xdpTx {
		t.Errorf("XDP: SYN: verdict %d, want XDP_TX", v)
	}
}
