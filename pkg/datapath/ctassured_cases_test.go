package datapath

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil/packet"
	"github.com/sluice-lb/sluice/pkg/model"
)

// More cases of the assured stage (ctassured_test.go; bpf/lib/conntrack.h,
// ct_assure): the GC reaping an unassured flow before its client's ACK; a
// client whose ACK is lost, assured by its data; clients whose only packet
// after the SYN-ACK is a FIN or a RST; a flush, a deletion, a superseding
// flow and a TIME_WAIT take-over of an unassured flow; and the previous
// release's answered entries, which were never counted. Each says how
// many flows the half-open count holds after every step: an unassured
// flow is taken off exactly once, an old one never.

// answer runs the SYN of f and its backend's SYN-ACK through tc, the
// SYN-ACK translated back to the frontend.
func answer(t *testing.T, d *Datapath, be testBackend, f flow) {
	t.Helper()
	if v, dst := sendTo(t, d.TCIngress(), f.pkt(tcpSYN_)); v != tcActOK || dst != be.addr.Addr.String() {
		t.Fatalf("SYN: verdict %d to %s", v, dst)
	}
	if v, out := runProg(t, d.TCEgress(), f.from(be.addr, tcpSA).Bytes()); v != tcActOK || outSrc(out) != f.fe.Addr.String() {
		t.Fatalf("SYN-ACK: verdict %d from %s, want %d from %s", v, outSrc(out), tcActOK, f.fe.Addr)
	}
}

// wantGCFinds runs a collection and fails the test unless it found half
// flows half-open (TCP: unassured) and the count said as many, with no
// correction made.
func wantGCFinds(t *testing.T, m *Maps, half int, when string) ConntrackStats {
	t.Helper()
	st, err := m.GCConntrack()
	if err != nil {
		t.Fatal(err)
	}
	if st.HalfOpen != half || st.HalfOpenCounted != half || st.HalfOpenResynced != [2]int64{} {
		t.Errorf("%s: GC %+v, want %d half-open found and counted, no resync", when, st, half)
	}
	return st
}

// claimFwd writes the forward entry of f as a deleter's claim leaves it
// (its expiry CT_DEAD, the compare-and-swap of ct_reap), with more flags
// (CT_F_COUNTED: the claimer's ct_uncount has run).
func claimFwd(t *testing.T, m *Maps, f flow, more uint32) {
	t.Helper()
	est := ctTablesOf(t, m, f.fwdKey())[0]
	var found bool
	var err error
	if f.fwdKey().v6() {
		found, err = ctEdit(est, f.fwdKey().k6(), func(v *tcCt6Entry) { v.Expires, v.Flags = ctDead, v.Flags|more })
	} else {
		found, err = ctEdit(est, f.fwdKey().k4(), func(v *sockCt4Entry) { v.Expires, v.Flags = ctDead, v.Flags|more })
	}
	if err != nil || !found {
		t.Fatalf("claim %s: found %v (%v)", f.fwdKey(), found, err)
	}
}

// TestCTAssuredReapedBeforeACK: TestCTAssuredCountedOnce's third case. An
// answered flow whose forward entry a deleter (the GC, its SYN timeout
// over) has claimed before any ACK: the ACK that comes after the claim
// takes nothing off and assures nothing (the entry is dead to it), the
// claimer takes the flow off (CT_F_COUNTED, written here as its
// ct_uncount would, the count with it); and the GC itself, reaping the
// flow once its SYN timeout is over, takes it off once: an ACK after the
// reap finds no flow to take off.
func TestCTAssuredReapedBeforeACK(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		oneCPU(t)
		d, m, be, f := assuredFlow(t, v6, nil)
		cfg := m.cfg.withDefaults()
		ing := d.TCIngress()

		// Claimed, before the claimer's ct_uncount: the ACK leaves the
		// count to it.
		answer(t, d, be, f)
		wantCounted(t, m, v6, 1, "answered")
		claimFwd(t, m, f, 0)
		sendTo(t, ing, f.pkt(tcpACK))
		wantCounted(t, m, v6, 1, "after an ACK to the claimed flow (the claimer's to take off)")
		if e, ok := ctLookup(t, m, f.fwdKey()); ok && e.flags&(ctFlagCounted|ctFlagAssured) != 0 {
			t.Errorf("claimed forward entry %+v taken off or assured by the ACK", e)
		}
		// The claimer's ct_uncount.
		claimFwd(t, m, f, ctFlagCounted)
		addCounted(t, m, v6, -1)
		sendTo(t, ing, f.pkt(tcpACK))
		wantCounted(t, m, v6, 0, "after an ACK to the flow its claimer took off")

		// The GC's own claim, its SYN timeout over.
		g := f
		g.cport++
		answer(t, d, be, g)
		wantCounted(t, m, v6, 1, "answered")
		for _, k := range []ctK{g.fwdKey(), g.revKey(be.addr)} {
			ctSetSeen(t, m, k, -cfg.CTTimeoutSYN-time.Second)
		}
		if st, err := m.GCConntrack(); err != nil || st.Deleted < 2 {
			t.Fatalf("GC: %+v (%v), want the flow's 2 entries deleted", st, err)
		}
		for _, k := range []ctK{g.fwdKey(), g.revKey(be.addr)} {
			if _, ok := ctLookup(t, m, k); ok {
				t.Errorf("%s left by the GC", k)
			}
		}
		wantCounted(t, m, v6, 0, "after the GC reaped the unassured flow")
		sendTo(t, ing, g.pkt(tcpACK))
		if e, ok := ctLookup(t, m, g.fwdKey()); ok && e.flags&(ctFlagReplied|ctFlagAssured) != 0 {
			t.Errorf("after the ACK of the reaped flow: forward entry %+v, want none or a new half-open one", e)
		}
		// The ACK opens a new flow (netfilter's loose pickup) or none:
		// counted as the GC finds it, never below.
		_, half := ctInTable(t, m, g.fwdKey(), false)
		wantCounted(t, m, v6, int64(b2n(half)), "after the ACK of the reaped flow")
	})
}

// TestCTAssuredLostACK: a legitimate client whose ACK is lost: SYN,
// SYN-ACK, (the ACK lost), the SYN-ACK sent again (translated, the flow
// still unassured and counted), then the client's data with ACK, which
// assures the flow: both entries the established timeout, the count 0,
// the data and the replies translated. Destination-NATed through tc;
// source-NATed through tc and XDP (the port reservation counted until
// the data).
func TestCTAssuredLostACK(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		t.Run("dnat", func(t *testing.T) {
			oneCPU(t)
			d, m, be, f := assuredFlow(t, v6, nil)
			cfg := m.cfg.withDefaults()
			ing, eg := d.TCIngress(), d.TCEgress()
			keys := []ctK{f.fwdKey(), f.revKey(be.addr)}
			t0 := clock(t)
			answer(t, d, be, f)
			if v, out := runProg(t, eg, f.from(be.addr, tcpSA).Bytes()); v != tcActOK || outSrc(out) != f.fe.Addr.String() {
				t.Fatalf("SYN-ACK again: verdict %d from %s, want %d from %s", v, outSrc(out), tcActOK, f.fe.Addr)
			}
			t1 := clock(t)
			for _, k := range keys {
				wantFlags(t, m, k, awaitBits, ctFlagReplied|ctFlagAwait, "after the SYN-ACK again")
				wantExpiry(t, m, k, t0, t1, cfg.CTTimeoutSYN, "after the SYN-ACK again")
			}
			wantCounted(t, m, v6, 1, "after the SYN-ACK again")

			data := f.pkt(tcpACK | packet.PSH)
			data.Payload = []byte("GET / HTTP/1.1\r\n\r\n")
			t2 := clock(t)
			if v, dst := sendTo(t, ing, data); v != tcActOK || dst != be.addr.Addr.String() {
				t.Fatalf("data: verdict %d to %s", v, dst)
			}
			t3 := clock(t)
			for _, k := range keys {
				wantFlags(t, m, k, awaitBits, awaitBits, "after the data")
				wantExpiry(t, m, k, t2, t3, cfg.CTTimeoutTCP, "after the data")
			}
			wantCounted(t, m, v6, 0, "after the data")
			if v, out := runProg(t, eg, f.from(be.addr, tcpACK).Bytes()); v != tcActOK || outSrc(out) != f.fe.Addr.String() {
				t.Errorf("reply after the data: verdict %d from %s, want %d from %s", v, outSrc(out), tcActOK, f.fe.Addr)
			}
			wantGCFinds(t, m, 0, "after the data")
		})
		for _, xdp := range []bool{false, true} {
			t.Run(map[bool]string{false: "snat-tc", true: "snat-xdp"}[xdp], func(t *testing.T) { lostACKSNAT(t, v6, xdp) })
		}
	})
}

// snatSender returns send, which runs a frame as the node receives it on
// ifindex: through XDP (which must send it on itself) with xdp, else
// through tc (which must redirect it); it returns where the frame went.
func snatSender(t *testing.T, d *Datapath, ifindex int, xdp bool) func(b []byte, what string) string {
	return func(b []byte, what string) string {
		t.Helper()
		if xdp {
			v, out := runXDP(t, d.XDP(), ifindex, b)
			if v != xdpTx {
				t.Fatalf("%s: XDP verdict %d, want %d", what, v, xdpTx)
			}
			return outDst(out)
		}
		v, out := runOn(t, d.TCIngress(), ifindex, b)
		if v != tcActRedirect {
			t.Fatalf("%s: verdict %d, want %d", what, v, tcActRedirect)
		}
		return outDst(out)
	}
}

// snatAssuredNode is snatShareNode of xdpConfig (xdp) or smallConfig, its
// send (snatSender) and the keys of a flow from nsClient's port 43000 to
// its NodePort, whose SYN it has sent: the forward entry and the port
// reservation.
func snatAssuredNode(t *testing.T, v6, xdp bool) (d *Datapath, send func([]byte, string) string, np model.L4Addr, be testBackend, sp uint16, keys []ctK) {
	t.Helper()
	base := smallConfig
	if xdp {
		base = xdpConfig
	}
	d, ifindex, np, _, be := snatShareNode(t, v6, base)
	send = snatSender(t, d, ifindex, xdp)
	syn := clientSYN(43000, np)
	send(syn.Bytes(), "SYN")
	client := syn.Src.String()
	sp = snatPortIn(t, d, client, 43000, np)
	node := ofFamily(np.Addr, nsNodeIP, nsNodeIP6).String()
	keys = []ctK{ctKeyOf(client, 43000, np.Addr.String(), np.Port, model.TCP, ctForward),
		ctKeyOf(be.addr.Addr.String(), be.addr.Port, node, sp, model.TCP, ctReverse)}
	return d, send, np, be, sp, keys
}

func lostACKSNAT(t *testing.T, v6, xdp bool) {
	oneCPU(t)
	t0 := clock(t)
	d, send, np, be, sp, keys := snatAssuredNode(t, v6, xdp)
	m := d.Maps()
	cfg := m.cfg.withDefaults()
	client := clientSYN(43000, np).Src.String()
	for i := range 2 {
		if dst := send(replyFrom(be, sp, tcpSA).Bytes(), "SYN-ACK"); dst != client {
			t.Fatalf("SYN-ACK %d: sent to %s, want %s", i, dst, client)
		}
	}
	t1 := clock(t)
	for _, k := range keys {
		wantFlags(t, m, k, awaitBits, ctFlagReplied|ctFlagAwait, "after the SYN-ACK again")
		wantExpiry(t, m, k, t0, t1, cfg.CTTimeoutSYN, "after the SYN-ACK again")
	}
	wantCounted(t, m, v6, 1, "after the SYN-ACK again")

	data := clientSYN(43000, np)
	data.TCPFlags, data.Payload = tcpACK|packet.PSH, []byte("GET / HTTP/1.1\r\n\r\n")
	t2 := clock(t)
	if dst := send(data.Bytes(), "data"); dst != be.addr.Addr.String() {
		t.Fatalf("data: sent to %s, want %s", dst, be.addr.Addr)
	}
	t3 := clock(t)
	for _, k := range keys {
		wantFlags(t, m, k, awaitBits, awaitBits, "after the data")
		wantExpiry(t, m, k, t2, t3, cfg.CTTimeoutTCP, "after the data")
	}
	wantCounted(t, m, v6, 0, "after the data")
	if dst := send(replyFrom(be, sp, tcpACK).Bytes(), "reply"); dst != client {
		t.Errorf("reply after the data: sent to %s, want %s", dst, client)
	}
	wantGCFinds(t, m, 0, "after the data")
}

// TestCTAssuredFINOrRSTOnly: a client whose only packet after the
// SYN-ACK is a FIN, or a RST (with ACK or without): the flow is not
// assured (netfilter: SYN_RECV to FIN_WAIT or CLOSE, never ESTABLISHED),
// still counted, and the GC finds it so. A FIN leaves it the SYN timeout;
// a RST ends it, both entries the close timeout. Reaped once that is
// over, it is taken off the count exactly once: a second collection
// takes nothing more. Destination-NATed through tc; source-NATed (its
// port reservation counted) through tc and XDP.
func TestCTAssuredFINOrRSTOnly(t *testing.T) {
	closers := []struct {
		name  string
		flags uint8
		mark  uint32 // the mark it leaves on both entries
		life  func(Config) time.Duration
	}{
		{"fin", tcpFA, ctFlagFinFwd, func(c Config) time.Duration { return c.CTTimeoutSYN }},
		{"rst", tcpRST, ctFlagRSTFwd, func(c Config) time.Duration { return c.CTTimeoutClose }},
		{"rst-ack", tcpRST | tcpACK, ctFlagRSTFwd, func(c Config) time.Duration { return c.CTTimeoutClose }},
	}
	forFamilies(t, func(t *testing.T, v6 bool) {
		for _, c := range closers {
			for _, path := range []string{"dnat", "snat-tc", "snat-xdp"} {
				t.Run(c.name+"/"+path, func(t *testing.T) {
					oneCPU(t)
					var m *Maps
					var keys []ctK
					var sendClose func() // the client's packet
					t0 := clock(t)
					if path == "dnat" {
						var d *Datapath
						var be testBackend
						var f flow
						d, m, be, f = assuredFlow(t, v6, nil)
						answer(t, d, be, f)
						keys = []ctK{f.fwdKey(), f.revKey(be.addr)}
						sendClose = func() {
							if v, dst := sendTo(t, d.TCIngress(), f.pkt(c.flags)); v != tcActOK || dst != be.addr.Addr.String() {
								t.Fatalf("%s: verdict %d to %s", c.name, v, dst)
							}
						}
					} else {
						d, send, np, be, sp, ks := snatAssuredNode(t, v6, path == "snat-xdp")
						m, keys = d.Maps(), ks
						send(replyFrom(be, sp, tcpSA).Bytes(), "SYN-ACK")
						sendClose = func() {
							p := clientSYN(43000, np)
							p.TCPFlags = c.flags
							if dst := send(p.Bytes(), c.name); dst != be.addr.Addr.String() {
								t.Fatalf("%s: sent to %s, want %s", c.name, dst, be.addr.Addr)
							}
						}
					}
					cfg := m.cfg.withDefaults()
					wantCounted(t, m, v6, 1, "answered")
					sendClose()
					t1 := clock(t)
					for _, k := range keys {
						wantFlags(t, m, k, awaitBits|c.mark, ctFlagReplied|ctFlagAwait|c.mark, "after the "+c.name)
						wantExpiry(t, m, k, t0, t1, c.life(cfg), "after the "+c.name)
					}
					wantCounted(t, m, v6, 1, "after the "+c.name)
					wantGCFinds(t, m, 1, "after the "+c.name)

					for _, k := range keys {
						ctSetSeen(t, m, k, -c.life(cfg)-time.Second)
					}
					if st := wantGCFinds(t, m, 0, "reaping the flow"); st.Deleted != 2 {
						t.Errorf("GC deleted %d entries, want the flow's 2", st.Deleted)
					}
					wantCounted(t, m, v6, 0, "after the GC reaped the flow")
					for _, k := range keys {
						if _, ok := ctLookup(t, m, k); ok {
							t.Errorf("%s left by the GC", k)
						}
					}
					wantGCFinds(t, m, 0, "again")
					wantCounted(t, m, v6, 0, "after a second GC")
				})
			}
		}
	})
}

// TestCTAssuredEndsCountedOnce: an answered, unassured flow that ends is
// taken off the count once, by whoever ends it: a flush of its backend
// (the agent's, by backend), a deletion (sluicectl's DeleteConntrack,
// which lapses the forward entry for the GC's claim), a new flow on its
// tuple superseding it (the client's SYN after its RST, and a SYN after
// its backend left). Destination-NATed, through tc; and source-NATed
// (its port reservation: flushed, deleted, superseded after a RST),
// through tc and XDP. A later flush or collection takes nothing more
// off. (The TIME_WAIT take-over:
// TestCTAssuredTakeOverCountedOnce.)
func TestCTAssuredEndsCountedOnce(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		t.Run("dnat", func(t *testing.T) {
			oneCPU(t)
			var bpffs string
			d, m, be, f := assuredFlow(t, v6, func(c *Config) { bpffs = c.BPFFS })
			ing := d.TCIngress()
			gone := func(fl flow, b testBackend, what string) {
				t.Helper()
				for _, k := range []ctK{fl.fwdKey(), fl.revKey(b.addr)} {
					if e, ok := ctLookup(t, m, k); ok && int64(e.expires-clock(t)) > 0 {
						t.Errorf("%s: %s left alive (%+v)", what, k, e)
					}
				}
			}
			flush := func(what string) {
				t.Helper()
				if err := m.FlushConntrack([]model.L4Addr{be.addr}); err != nil {
					t.Fatal(err)
				}
				wantCounted(t, m, v6, 0, what)
			}

			// Flushed.
			answer(t, d, be, f)
			wantCounted(t, m, v6, 1, "answered")
			flush("after the flush")
			gone(f, be, "after the flush")
			flush("after a second flush")
			wantGCFinds(t, m, 0, "after the flush")

			// Deleted by sluicectl: lapsed, reaped by the GC.
			answer(t, d, be, f)
			wantCounted(t, m, v6, 1, "answered")
			p, es := pinnedEntries(t, bpffs)
			var sel []ConntrackEntry
			for _, e := range es {
				if !e.Reverse && e.Src.Port() == f.cport {
					sel = append(sel, e)
				}
			}
			if len(sel) != 1 || !sel[0].Unassured {
				t.Fatalf("entries listed for the flow: %+v, want its unassured forward entry", sel)
			}
			if n, err := p.DeleteConntrack(sel); err != nil || n != 2 {
				t.Fatalf("DeleteConntrack: %d (%v), want 2", n, err)
			}
			wantCounted(t, m, v6, 1, "deleted (the GC's to take off)")
			wantGCFinds(t, m, 0, "after the deletion")
			wantCounted(t, m, v6, 0, "after the GC reaped the deleted flow")
			gone(f, be, "after the deletion and the GC")
			wantGCFinds(t, m, 0, "again")

			// Superseded: the client's RST, then its SYN from the same
			// port; the new flow counted instead.
			answer(t, d, be, f)
			sendTo(t, ing, f.pkt(tcpRST))
			wantCounted(t, m, v6, 1, "after the RST")
			answer(t, d, be, f)
			wantFlags(t, m, f.fwdKey(), awaitBits|ctFlagRST, ctFlagReplied|ctFlagAwait, "the new flow")
			wantCounted(t, m, v6, 1, "after the new flow superseded the reset one")
			wantGCFinds(t, m, 1, "after the new flow superseded the reset one")
			flush("after the new flow's flush")

			// Superseded: its backend left, another took the frontend
			// (under its id); the client's next SYN is a new flow.
			answer(t, d, be, f)
			be2 := testBackend{47, l4(twinAddr(v6, "10.1.4.8"), 8080, model.TCP)}
			addService(t, m, 1, f.fe, be2)
			if v, dst := sendTo(t, ing, f.pkt(tcpSYN_)); v != tcActOK || dst != be2.addr.Addr.String() {
				t.Fatalf("SYN after the backend left: verdict %d to %s, want %s", v, dst, be2.addr.Addr)
			}
			if e, ok := ctInTable(t, m, f.fwdKey(), false); !ok || e.nat.Addr() != be2.addr.Addr || e.flags&ctFlagReplied != 0 {
				t.Errorf("forward entry %+v (found %v), want the new flow's, half-open, to %s", e, ok, be2.addr)
			}
			if _, ok := ctLookup(t, m, f.revKey(be.addr)); ok {
				t.Errorf("the superseded flow's reply entry is left")
			}
			wantCounted(t, m, v6, 1, "after the new flow superseded the old")
			wantGCFinds(t, m, 1, "after the new flow superseded the old")
		})
		for _, xdp := range []bool{false, true} {
			t.Run(map[bool]string{false: "snat-tc", true: "snat-xdp"}[xdp], func(t *testing.T) { endsSNAT(t, v6, xdp) })
		}
	})
}

// endsSNAT is TestCTAssuredEndsCountedOnce's source-NATed case: the
// unassured flow's port reservation taken off once by a flush, a
// deletion (lapsed, then the GC's), and a new flow superseding it (the
// client's RST, then its SYN from the same port), through XDP (with xdp;
// what XDP leaves to tc, tc's) or tc.
func endsSNAT(t *testing.T, v6, xdp bool) {
	oneCPU(t)
	var bpffs string
	base := smallConfig
	if xdp {
		base = xdpConfig
	}
	d, ifindex, np, _, be := snatShareNode(t, v6, func(p string) Config { bpffs = p; return base(p) })
	m := d.Maps()
	node := ofFamily(np.Addr, nsNodeIP, nsNodeIP6).String()
	send := func(p packet.Packet, what string) string {
		t.Helper()
		if xdp {
			v, out := runXDP(t, d.XDP(), ifindex, p.Bytes())
			if v == xdpTx {
				return outDst(out)
			}
			if v != xdpPass {
				t.Fatalf("%s: XDP verdict %d", what, v)
			}
		}
		v, out := runOn(t, d.TCIngress(), ifindex, p.Bytes())
		if v != tcActRedirect {
			t.Fatalf("%s: verdict %d, want %d", what, v, tcActRedirect)
		}
		return outDst(out)
	}
	// open answers a flow from port 43000: its keys (the forward
	// entry's, the port reservation's).
	open := func() []ctK {
		t.Helper()
		syn := clientSYN(43000, np)
		send(syn, "SYN")
		sp := snatPortIn(t, d, syn.Src.String(), 43000, np)
		if dst := send(replyFrom(be, sp, tcpSA), "SYN-ACK"); dst != syn.Src.String() {
			t.Fatalf("SYN-ACK: sent to %s, want %s", dst, syn.Src)
		}
		return []ctK{ctKeyOf(syn.Src.String(), 43000, np.Addr.String(), np.Port, model.TCP, ctForward),
			ctKeyOf(be.addr.Addr.String(), be.addr.Port, node, sp, model.TCP, ctReverse)}
	}
	gone := func(keys []ctK, what string) {
		t.Helper()
		for _, k := range keys {
			if _, ok := ctLookup(t, m, k); ok {
				t.Errorf("%s: %s left", what, k)
			}
		}
	}
	flush := func(what string) {
		t.Helper()
		if err := m.FlushConntrack([]model.L4Addr{be.addr}); err != nil {
			t.Fatal(err)
		}
		wantCounted(t, m, v6, 0, what)
	}

	// Flushed.
	keys := open()
	wantCounted(t, m, v6, 1, "answered")
	flush("after the flush")
	gone(keys, "after the flush")
	flush("after a second flush")
	wantGCFinds(t, m, 0, "after the flush")

	// Deleted by sluicectl, by its reservation: lapsed, reaped by the GC.
	keys = open()
	wantCounted(t, m, v6, 1, "answered")
	p, es := pinnedEntries(t, bpffs)
	var sel []ConntrackEntry
	for _, e := range es {
		if e.Reverse && e.Dst.Port() == keys[1].dst.Port() {
			sel = append(sel, e)
		}
	}
	if len(sel) != 1 || !sel[0].Unassured {
		t.Fatalf("entries listed for the reservation: %+v, want its unassured reply entry", sel)
	}
	if n, err := p.DeleteConntrack(sel); err != nil || n != 2 {
		t.Fatalf("DeleteConntrack: %d (%v), want 2", n, err)
	}
	wantCounted(t, m, v6, 1, "deleted (the GC's to take off)")
	wantGCFinds(t, m, 0, "after the deletion")
	wantCounted(t, m, v6, 0, "after the GC reaped the deleted flow")
	gone(keys, "after the deletion and the GC")
	wantGCFinds(t, m, 0, "again")

	// Superseded: the client's RST, then its SYN from the same port;
	// the new flow's reservation counted instead.
	keys = open()
	rst := clientSYN(43000, np)
	rst.TCPFlags = tcpRST
	send(rst, "RST")
	wantCounted(t, m, v6, 1, "after the RST")
	keys2 := open()
	if keys2[1] != keys[1] {
		gone(keys[1:], "after the new flow superseded the reset one")
	}
	wantFlags(t, m, keys2[1], awaitBits|ctFlagRST|ctFlagCounted, ctFlagReplied|ctFlagAwait, "the new flow's reservation")
	wantCounted(t, m, v6, 1, "after the new flow superseded the reset one")
	wantGCFinds(t, m, 1, "after the new flow superseded the reset one")
	flush("after the new flow's flush")
}

// TestCTAssuredTakeOverCountedOnce: a source-NATed flow answered and never
// assured (its client's FIN came before any ACK), closed by FINs, holds
// its port for the backend's TIME_WAIT, its reservation counted. A new
// flow that finds every port of the range held takes that port over: the
// old flow's reservation is taken off the count (once) as the new one's
// goes on. Through tc, and with XDP loaded (which leaves the new flow to
// tc).
func TestCTAssuredTakeOverCountedOnce(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		for _, xdp := range []bool{false, true} {
			t.Run(map[bool]string{false: "tc", true: "xdp"}[xdp], func(t *testing.T) {
				oneCPU(t)
				d, ifindex, np, be, _ := twNode(t, v6, xdp)
				m := d.Maps()
				a := twOpen(t, d, ifindex, np, be, twClient(np), 44000)
				twClose(t, d, ifindex, np, be, a)
				for _, k := range []ctK{a.fwd, a.rev} {
					wantFlags(t, m, k, awaitBits, ctFlagReplied|ctFlagAwait, "A, closed")
					twShift(t, m, k, -30*time.Second)
				}
				twOpen(t, d, ifindex, np, be, twClient(np), 44001)
				wantCounted(t, m, v6, 2, "A closed unassured, B answered")
				wantGCFinds(t, m, 2, "A closed unassured, B answered")

				client, cport := twClient(np), uint16(44002)
				syn := twSYN(np, client, cport)
				if xdp {
					if v, _ := runXDP(t, d.XDP(), ifindex, syn.Bytes()); v != xdpPass {
						t.Fatalf("flow C through XDP: verdict %d, want it left to tc (%d)", v, xdpPass)
					}
				}
				if v, _ := runOn(t, d.TCIngress(), ifindex, syn.Bytes()); v != tcActRedirect {
					t.Fatalf("flow C: verdict %d, want it sent on from A's port", v)
				}
				if sp := snatPortIn(t, d, client, cport, np); sp != a.port {
					t.Fatalf("flow C got port %d, want %d, A's: no take-over, the test proves nothing", sp, a.port)
				}
				if _, ok := ctLookup(t, m, a.fwd); ok {
					t.Errorf("A's forward entry left after the take-over")
				}
				wantCounted(t, m, v6, 2, "after C took A's port over (B and C)")
				wantGCFinds(t, m, 2, "after the take-over")
			})
		}
	})
}

// TestCTAssuredPreviousRelease: an answered entry of the previous release
// (CT_F_REPLIED without CT_F_AWAIT, established, as an upgrade leaves it;
// with CT_F_COUNTED, taken off by the old programs' answer, or without,
// from before the share) was never counted, or taken off already: its
// client's ACK takes nothing off the count and leaves it the established
// timeout (as a SYN-ACK sent again does before it), the GC finds no
// half-open flow and corrects nothing.
// Destination-NATed (its forward entry) through tc; source-NATed (its
// reservation, CT_F_ADMITTED and CT_F_COUNTED as the old answer left it)
// through tc and XDP.
func TestCTAssuredPreviousRelease(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		for _, counted := range []uint32{0, ctFlagCounted} {
			t.Run(fmt.Sprintf("dnat/counted=%v", counted != 0), func(t *testing.T) {
				oneCPU(t)
				d, m, be, f := assuredFlow(t, v6, nil)
				cfg := m.cfg.withDefaults()
				keys := []ctK{f.fwdKey(), f.revKey(be.addr)}
				answer(t, d, be, f)
				old := func(fs uint32) uint32 { return fs&^(ctFlagAwait|ctFlagCounted) | counted }
				for _, k := range keys {
					ctSetFlags(t, m, k, old)
				}
				addCounted(t, m, v6, -1) // never counted, or taken off
				wantCounted(t, m, v6, 0, "the previous release's answered flow")
				wantGCFinds(t, m, 0, "the previous release's answered flow")
				// Established: a SYN-ACK sent again (translated) moves
				// both entries to the established timeout.
				t0 := clock(t)
				if v, out := runProg(t, d.TCEgress(), f.from(be.addr, tcpSA).Bytes()); v != tcActOK || outSrc(out) != f.fe.Addr.String() {
					t.Fatalf("SYN-ACK again: verdict %d from %s", v, outSrc(out))
				}
				t1 := clock(t)
				for _, k := range keys {
					wantExpiry(t, m, k, t0, t1, cfg.CTTimeoutTCP, "the old flow after a SYN-ACK again")
				}
				wantCounted(t, m, v6, 0, "after the old flow's SYN-ACK again")

				for i := range 2 {
					if v, dst := sendTo(t, d.TCIngress(), f.pkt(tcpACK)); v != tcActOK || dst != be.addr.Addr.String() {
						t.Fatalf("ACK %d: verdict %d to %s", i, v, dst)
					}
					t2 := clock(t)
					wantCounted(t, m, v6, 0, "after the old flow's ACK")
					wantFlags(t, m, f.fwdKey(), ctFlagAwait|ctFlagReplied, ctFlagReplied, "after the old flow's ACK")
					for _, k := range keys {
						wantExpiry(t, m, k, t0, t2, cfg.CTTimeoutTCP, "after the old flow's ACK")
					}
				}
				if v, out := runProg(t, d.TCEgress(), f.from(be.addr, tcpACK).Bytes()); v != tcActOK || outSrc(out) != f.fe.Addr.String() {
					t.Errorf("reply: verdict %d from %s", v, outSrc(out))
				}
				wantGCFinds(t, m, 0, "after the old flow's ACK")
				wantCounted(t, m, v6, 0, "after the GC")
			})
		}
		for _, xdp := range []bool{false, true} {
			t.Run(map[bool]string{false: "snat-tc", true: "snat-xdp"}[xdp], func(t *testing.T) {
				oneCPU(t)
				d, send, np, be, sp, keys := snatAssuredNode(t, v6, xdp)
				m := d.Maps()
				send(replyFrom(be, sp, tcpSA).Bytes(), "SYN-ACK")
				for _, k := range keys {
					ctSetFlags(t, m, k, func(fs uint32) uint32 { return fs &^ ctFlagAwait })
				}
				// The old answer took the reservation off (CT_F_COUNTED).
				ctSetFlags(t, m, keys[1], func(fs uint32) uint32 { return fs | ctFlagCounted })
				addCounted(t, m, v6, -1)
				wantGCFinds(t, m, 0, "the previous release's answered flow")
				cfg := m.cfg.withDefaults()
				t0 := clock(t)
				if dst := send(replyFrom(be, sp, tcpSA).Bytes(), "SYN-ACK again"); dst != clientSYN(43000, np).Src.String() {
					t.Fatalf("SYN-ACK again: sent to %s", dst)
				}
				t1 := clock(t)
				for _, k := range keys {
					wantExpiry(t, m, k, t0, t1, cfg.CTTimeoutTCP, "the old flow after a SYN-ACK again")
				}
				ack := clientSYN(43000, np)
				ack.TCPFlags = tcpACK
				for range 2 {
					if dst := send(ack.Bytes(), "ACK"); dst != be.addr.Addr.String() {
						t.Fatalf("ACK: sent to %s, want %s", dst, be.addr.Addr)
					}
					wantCounted(t, m, v6, 0, "after the old flow's ACK")
				}
				wantGCFinds(t, m, 0, "after the old flow's ACK")
				wantCounted(t, m, v6, 0, "after the GC")
			})
		}
	})
}
