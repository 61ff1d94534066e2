package datapath

// Closing marks and port reservations of the assured stage
// (bpf/lib/conntrack_fam.h: ct_mark, ct_assure): through
// BPF_PROG_TEST_RUN, per family, in a node namespace of the test's own
// (twNode: a SNAT range of 2 ports, a TIME_WAIT timeout of twTimeWait).

import (
	"testing"

	"github.com/sluice-lb/sluice/internal/testutil/packet"
)

// TestCTMarkClosedLifetimeBothEntries: a source-NATed flow, assured, that
// the backend closes with a FIN and then resets, whose RST the client
// challenges with a bare ACK (open again, challenged: the SYN timeout),
// and that the client's FIN then closes, holds its port for the
// TIME_WAIT timeout from that FIN on both its entries: ct_mark moves a
// closing flow's expiry to its closed lifetime further as well as closer
// (the TIME_WAIT is longer than the SYN timeout), which the reservation's
// refresh by the same packet (ct_check_reverse) gives it anyway. With
// main's rule (closer only, tried on this branch) the forward entry kept
// the SYN timeout while its reservation had the TIME_WAIT.
func TestCTMarkClosedLifetimeBothEntries(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		d, ifindex, np, be, cfg := twNode(t, v6, false)
		m := d.Maps()
		if cfg.CTTimeoutSYN >= twTimeWait {
			t.Fatalf("SYN timeout %v not below TIME_WAIT %v: the test tells nothing", cfg.CTTimeoutSYN, twTimeWait)
		}
		send := func(what string, p packet.Packet) {
			t.Helper()
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
	})
}
