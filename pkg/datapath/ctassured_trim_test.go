package datapath

// Closing marks and port reservations of the assured stage
// (bpf/lib/conntrack_fam.h: ct_mark, ct_assure): through
// BPF_PROG_TEST_RUN, per family, in a node namespace of the test's own
// (twNode: a SNAT range of 2 ports, a TIME_WAIT timeout of twTimeWait).

import (
	"testing"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil/packet"
)

// TestCTMarkClosedLifetimeBothEntries: a source-NATed flow, assured, that
// the backend closes with a FIN and then resets, whose RST the client
// challenges with a bare ACK (open again, challenged: the SYN timeout),
// and that the client's FIN then closes, holds its port for the
// TIME_WAIT timeout from that FIN on both its entries: ct_mark moves a
// closing flow's expiry to its closed lifetime further as well as closer
// (the TIME_WAIT is longer than the SYN timeout), which the reservation's
// refresh by the same packet (ct_check_reverse) gives it anyway at tc;
// at XDP, whose ct_check_reverse runs before the mark, the mark alone
// does. With main's rule (closer only, tried on this branch) the forward
// entry kept the SYN timeout while its reservation had the TIME_WAIT
// (tc), both entries the SYN timeout (XDP). Through tc, and through XDP
// first (what it passes, tc takes), as the node's device runs them.
func TestCTMarkClosedLifetimeBothEntries(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		for _, xdp := range []bool{false, true} {
			t.Run(map[bool]string{false: "tc", true: "xdp"}[xdp], func(t *testing.T) {
				markClosedLifetime(t, v6, xdp)
			})
		}
	})
}

// markClosedLifetime is TestCTMarkClosedLifetimeBothEntries for one
// family, through XDP first or tc alone.
func markClosedLifetime(t *testing.T, v6, xdp bool) {
	d, ifindex, np, be, cfg := twNode(t, v6, xdp)
	m := d.Maps()
	if cfg.CTTimeoutSYN >= twTimeWait {
		t.Fatalf("SYN timeout %v not below TIME_WAIT %v: the test tells nothing", cfg.CTTimeoutSYN, twTimeWait)
	}
	send := func(what string, p packet.Packet) {
		t.Helper()
		if xdp {
			switch v, _ := runXDP(t, d.XDP(), ifindex, p.Bytes()); v {
			case xdpTx:
				return
			case xdpPass:
			default:
				t.Fatalf("%s: XDP verdict %d", what, v)
			}
		}
		if v, _ := runOn(t, d.TCIngress(), ifindex, p.Bytes()); v != tcActRedirect {
			t.Fatalf("%s: verdict %d", what, v)
		}
	}
	client := twClient(np)
	f := twOpen(t, d, ifindex, np, be, client, 44200)
	clientPkt := func(flags uint8) packet.Packet {
		p := nsClient(f.cport, np)
		p.Src, p.TCPFlags = addr(client), flags
		return p
	}
	send("client's ACK", clientPkt(tcpACK))
	for _, k := range []ctK{f.fwd, f.rev} {
		wantFlags(t, m, k, awaitBits, awaitBits, "after the client's ACK")
	}
	send("backend's FIN", replyFrom(be, f.port, tcpFA))
	send("backend's RST", replyFrom(be, f.port, tcpRST))
	lo := clockNow(t)
	send("client's bare ACK", clientPkt(tcpACK))
	hi := clockNow(t)
	for _, k := range []ctK{f.fwd, f.rev} {
		ctExpiresWithin(t, m, k, ctFlagSNAT|ctFlagFinRev|ctFlagChalRev, ctFlagRST|ctFlagFinFwd, cfg.CTTimeoutSYN, lo, hi, "challenged after the backend's FIN")
	}
	lo = clockNow(t)
	send("client's FIN", clientPkt(tcpFA))
	hi = clockNow(t)
	for _, k := range []ctK{f.fwd, f.rev} {
		ctExpiresWithin(t, m, k, ctFlagSNAT|ctFlagFinRev|ctFlagFinFwd|ctFlagChalRev, ctFlagRST, twTimeWait, lo, hi, "challenged, then closed by the client's FIN")
	}
}

// TestCTAssuredKeptReservation: a source-NATed flow answered and not
// assured whose port reservation has lapsed and is kept (its forward
// entry alive: the GC keeps it, as the flow still sends from that port)
// is assured by its client's ACK all the same, through tc and through
// XDP: the reservation, revived, gets CT_F_ASSURED and the established
// timeout, and leaves the half-open count (as ct_uncount, which goes by
// the flags, not the expiry, would take it off when claimed): ct_assure
// finds it live (ct_peer) because the packet's ct_check_reverse revived
// it first. With XDP's ct_assure moved before that check (tried), the
// reservation stayed counted and unassured (counted 1).
func TestCTAssuredKeptReservation(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		for _, xdp := range []bool{false, true} {
			t.Run(map[bool]string{false: "tc", true: "xdp"}[xdp], func(t *testing.T) {
				d, ifindex, np, be, cfg := twNode(t, v6, xdp)
				m := d.Maps()
				client := twClient(np)
				f := twOpen(t, d, ifindex, np, be, client, 44300)
				wantCounted(t, m, v6, 1, "after the SYN-ACK")
				for _, k := range []ctK{f.fwd, f.rev} {
					wantFlags(t, m, k, awaitBits, ctFlagReplied|ctFlagAwait, "after the SYN-ACK")
				}
				ctSetSeen(t, m, f.rev, -cfg.CTTimeoutSYN-time.Second)
				if _, alive := twAlive(t, m, f.rev); alive {
					t.Fatalf("reservation %s alive after its expiry was put in the past", f.rev)
				}
				if _, err := m.GCConntrack(); err != nil {
					t.Fatal(err)
				}
				if _, ok := ctLookup(t, m, f.rev); !ok {
					t.Fatalf("reservation %s not kept by the GC beside its live forward entry", f.rev)
				}
				ack := nsClient(f.cport, np)
				ack.Src, ack.TCPFlags = addr(client), tcpACK
				lo := clockNow(t)
				if xdp {
					if v, _ := runXDP(t, d.XDP(), ifindex, ack.Bytes()); v != xdpTx {
						t.Fatalf("client's ACK: XDP verdict %d, want XDP_TX (%d)", v, xdpTx)
					}
				} else if v, _ := runOn(t, d.TCIngress(), ifindex, ack.Bytes()); v != tcActRedirect {
					t.Fatalf("client's ACK: verdict %d", v)
				}
				hi := clockNow(t)
				for _, k := range []ctK{f.fwd, f.rev} {
					wantFlags(t, m, k, awaitBits|ctFlagCounted, awaitBits|ctFlagCounted, "after the client's ACK")
					wantExpiry(t, m, k, lo, hi, cfg.CTTimeoutTCP, "after the client's ACK")
				}
				wantCounted(t, m, v6, 0, "after the client's ACK")
			})
		}
	})
}
