package datapath

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/sluice-lb/sluice/pkg/model"
)

// Assured TCP flows (bpf/lib/conntrack.h, ct_assure): a TCP flow's first
// reply (the SYN-ACK) marks it answered (CT_F_REPLIED with CT_F_AWAIT),
// its replies translated as before, but it keeps the SYN timeout and its
// place in the half-open share (a source-NATed flow: its port
// reservation's) until its client's ACK assures it (CT_F_ASSURED): then
// it leaves the count, exactly once, and lives the established timeout.
// So a SYN flood from spoofed sources whose endpoints answer (the
// SYN-ACKs go to addresses that never acknowledge them) stays within the
// share and lives the SYN timeout, as netfilter keeps such a flow in
// SYN_RECV and never assures it; before, the SYN-ACK established it for
// the TCP timeout (6 h), outside the share.

// assuredFlow opens a datapath of smallConfig changed by set, with a TCP
// ClusterIP and its backend, and returns them and a client flow to it.
func assuredFlow(t *testing.T, v6 bool, set func(*Config)) (*Datapath, *Maps, testBackend, flow) {
	t.Helper()
	a, vip := twinOf(v6), twinL4(v6, vipTCP)
	if set == nil {
		set = func(*Config) {}
	}
	d := openTestWith(t, smallConfig, set)
	m := d.Maps()
	be := testBackend{47, l4(a("10.1.4.7"), 8080, model.TCP)}
	addService(t, m, 1, vip, be)
	return d, m, be, flow{a("10.0.71.1"), 23000, vip}
}

// clock reads the programs' clock (now_ns: CLOCK_MONOTONIC, coarse).
func clock(t *testing.T) uint64 {
	t.Helper()
	now, err := monotonicNow()
	if err != nil {
		t.Fatal(err)
	}
	return now
}

// wantExpiry fails the test unless the entry under k (in either table)
// is there and expires within [lo+life, hi+life]: refreshed for life by
// a packet the programs saw between the clock readings lo and hi (a
// refresh moves an expiry by a second or more only: lo may be read
// before an earlier packet).
func wantExpiry(t *testing.T, m *Maps, k ctK, lo, hi uint64, life time.Duration, what string) {
	t.Helper()
	e, ok := ctLookup(t, m, k)
	if !ok {
		t.Errorf("%s: no entry %s", what, k)
		return
	}
	l := uint64(life.Nanoseconds())
	if e.expires < lo+l || e.expires > hi+l {
		t.Errorf("%s: %s expires in %v, want %v (flags %#x)", what, k, time.Duration(int64(e.expires-hi)), life, e.flags)
	}
}

// wantFlags fails the test unless the entry under k is there with the
// bits of mask as want.
func wantFlags(t *testing.T, m *Maps, k ctK, mask, want uint32, what string) {
	t.Helper()
	if e, ok := ctLookup(t, m, k); !ok || e.flags&mask != want {
		t.Errorf("%s: %s flags %#x (found %v), want %#x of %#x", what, k, e.flags, ok, want, mask)
	}
}

// ctSetFlags writes flags into the entry under k (either table), as a
// program's atomic or would have left them.
func ctSetFlags(t *testing.T, m *Maps, k ctK, edit func(uint32) uint32) {
	t.Helper()
	for _, cm := range ctTablesOf(t, m, k) {
		var found bool
		var err error
		if k.v6() {
			found, err = ctEdit(cm, k.k6(), func(v *tcCt6Entry) { v.Flags = edit(v.Flags) })
		} else {
			found, err = ctEdit(cm, k.k4(), func(v *sockCt4Entry) { v.Flags = edit(v.Flags) })
		}
		if err != nil {
			t.Fatal(err)
		}
		if found {
			return
		}
	}
	t.Fatalf("no conntrack entry %s", k)
}

const awaitBits = ctFlagReplied | ctFlagAwait | ctFlagAssured

// TestCTAssuredTCP: a SYN and its SYN-ACK (translated) leave the flow
// answered but unassured: both entries with CT_F_AWAIT, living the SYN
// timeout, the flow still counted (the GC finds it half-open too); a
// retransmitted SYN-ACK and a retransmitted SYN change nothing. The
// client's ACK assures it: both entries the established timeout, the
// count 0, and later ACKs take nothing off again. On the objects before
// the assured stage the SYN-ACK took the flow off the count and gave it
// the established timeout.
func TestCTAssuredTCP(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		oneCPU(t)
		d, m, be, f := assuredFlow(t, v6, nil)
		cfg := m.cfg.withDefaults()
		ing, eg := d.TCIngress(), d.TCEgress()
		keys := []ctK{f.fwdKey(), f.revKey(be.addr)}

		t0 := clock(t)
		if v, dst := sendTo(t, ing, f.pkt(tcpSYN_)); v != tcActOK || dst != be.addr.Addr.String() {
			t.Fatalf("SYN: verdict %d to %s", v, dst)
		}
		wantCounted(t, m, v6, 1, "after the SYN")
		for range 2 {
			if v, out := runProg(t, eg, f.from(be.addr, tcpSA).Bytes()); v != tcActOK || outSrc(out) != f.fe.Addr.String() {
				t.Fatalf("SYN-ACK: verdict %d from %s, want %d from %s", v, outSrc(out), tcActOK, f.fe.Addr)
			}
			t1 := clock(t)
			for _, k := range keys {
				wantFlags(t, m, k, awaitBits, ctFlagReplied|ctFlagAwait, "after the SYN-ACK")
				wantExpiry(t, m, k, t0, t1, cfg.CTTimeoutSYN, "after the SYN-ACK")
			}
			wantCounted(t, m, v6, 1, "after the SYN-ACK")
		}
		// A retransmitted SYN assures nothing.
		if v, _ := sendTo(t, ing, f.pkt(tcpSYN_)); v != tcActOK {
			t.Fatalf("retransmitted SYN: verdict %d", v)
		}
		wantCounted(t, m, v6, 1, "after a retransmitted SYN")
		if st, err := m.GCConntrack(); err != nil || st.HalfOpen != 1 || st.HalfOpenCounted != 1 {
			t.Errorf("GC of the unassured flow: %+v (%v), want 1 half-open found and counted", st, err)
		}

		t2 := clock(t)
		if v, dst := sendTo(t, ing, f.pkt(tcpACK)); v != tcActOK || dst != be.addr.Addr.String() {
			t.Fatalf("ACK: verdict %d to %s", v, dst)
		}
		t3 := clock(t)
		for _, k := range keys {
			wantFlags(t, m, k, awaitBits, awaitBits, "after the ACK")
			wantExpiry(t, m, k, t2, t3, cfg.CTTimeoutTCP, "after the ACK")
		}
		wantCounted(t, m, v6, 0, "after the ACK")
		sendTo(t, ing, f.pkt(tcpACK))
		runProg(t, eg, f.from(be.addr, tcpACK).Bytes())
		wantCounted(t, m, v6, 0, "after more of the flow")
		if st, err := m.GCConntrack(); err != nil || st.HalfOpen != 0 || st.HalfOpenCounted != 0 {
			t.Errorf("GC of the assured flow: %+v (%v), want no half-open flow found or counted", st, err)
		}
	})
}

// TestCTAssuredCountedOnce: the flow leaves the count once, whoever sets
// CT_F_COUNTED first. Sequenced through the flags a race leaves: two
// ACKs racing (the first has set CT_F_COUNTED and taken the flow off, not
// yet CT_F_ASSURED, when the second runs: the second takes nothing off);
// the GC reaping an unassured flow whose ACK has set CT_F_COUNTED (it
// takes nothing off); and the GC reaping it before any ACK (it takes the
// flow off, the ACK that comes after its claim nothing).
func TestCTAssuredCountedOnce(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		oneCPU(t)
		d, m, be, f := assuredFlow(t, v6, nil)
		ing, eg := d.TCIngress(), d.TCEgress()
		answered := func(fl flow) {
			t.Helper()
			if v, _ := sendTo(t, ing, fl.pkt(tcpSYN_)); v != tcActOK {
				t.Fatalf("SYN: verdict %d", v)
			}
			if v, _ := runProg(t, eg, fl.from(be.addr, tcpSA).Bytes()); v != tcActOK {
				t.Fatalf("SYN-ACK: verdict %d", v)
			}
		}
		notAssured := func(fs uint32) uint32 { return fs &^ ctFlagAssured }

		// Two ACKs racing.
		answered(f)
		wantCounted(t, m, v6, 1, "answered")
		sendTo(t, ing, f.pkt(tcpACK))
		wantCounted(t, m, v6, 0, "after the first ACK")
		ctSetFlags(t, m, f.fwdKey(), notAssured)
		ctSetFlags(t, m, f.revKey(be.addr), notAssured)
		if v, _ := sendTo(t, ing, f.pkt(tcpACK)); v != tcActOK {
			t.Fatalf("second ACK: verdict %d", v)
		}
		wantCounted(t, m, v6, 0, "after the racing second ACK")
		wantFlags(t, m, f.fwdKey(), awaitBits, awaitBits, "after the racing second ACK")

		// The GC after an ACK's CT_F_COUNTED, before that ACK took the
		// flow off the count (its ct_admit_add to come): the GC takes
		// nothing off.
		g := f
		g.cport++
		answered(g)
		wantCounted(t, m, v6, 1, "answered")
		ctSetFlags(t, m, g.fwdKey(), func(fs uint32) uint32 { return fs | ctFlagCounted })
		for _, k := range []ctK{g.fwdKey(), g.revKey(be.addr)} {
			ctSetSeen(t, m, k, -2*time.Hour)
		}
		if st, err := m.GCConntrack(); err != nil || st.Deleted != 2 {
			t.Fatalf("GC: %+v (%v), want the flow's 2 entries deleted", st, err)
		}
		wantCounted(t, m, v6, 1, "after the GC reaped the flow an ACK claimed (its ACK to take it off)")
	})
}

// TestCTAssuredFloodBounded: a SYN flood from spoofed sources whose
// endpoint answers every SYN stays within the half-open share: share
// flows in sluice_conntrack, counted, the rest answered in sluice_ct_new
// (the LRU, which a flood evicts from), none of them established; the
// GC finds share of them half-open. Before, every SYN-ACK promoted its
// flow into sluice_conntrack for the TCP timeout, outside the share.
// A flow of the LRU that its client acknowledges moves to
// sluice_conntrack, established; one of the share leaves the count. Once
// the SYN timeout is over, the GC reaps the unassured flows.
func TestCTAssuredFloodBounded(t *testing.T) {
	const share, flood = 5, 20
	forFamilies(t, func(t *testing.T, v6 bool) {
		oneCPU(t)
		d, m, be, f := assuredFlow(t, v6, func(c *Config) { c.CTHalfOpenMax = share })
		cfg := m.cfg.withDefaults()
		ing, eg := d.TCIngress(), d.TCEgress()
		flows := make([]flow, flood)
		for i := range flows {
			flows[i] = f
			flows[i].client = twinAddr(v6, fmt.Sprintf("172.16.4.%d", i+1))
			if v, _ := sendTo(t, ing, flows[i].pkt(tcpSYN_)); v != tcActOK {
				t.Fatalf("flood SYN %d: verdict %d", i, v)
			}
			if v, out := runProg(t, eg, flows[i].from(be.addr, tcpSA).Bytes()); v != tcActOK || outSrc(out) != f.fe.Addr.String() {
				t.Fatalf("flood SYN-ACK %d: verdict %d from %s", i, v, outSrc(out))
			}
		}
		inEst, inNew := 0, 0
		for _, fl := range flows {
			_, est := ctInTable(t, m, fl.fwdKey(), false)
			e, lru := ctInTable(t, m, fl.fwdKey(), true)
			inEst += b2n(est)
			inNew += b2n(lru)
			if lru && e.flags&awaitBits != ctFlagReplied|ctFlagAwait {
				t.Errorf("flow of %s in sluice_ct_new: flags %#x, want answered, unassured", fl.client, e.flags)
			}
		}
		if inEst != share || inNew != flood-share {
			t.Errorf("answered flood of %d: %d flows in sluice_conntrack, %d in sluice_ct_new; want %d, %d", flood, inEst, inNew, share, flood-share)
		}
		if n := ctCountOf(t, m, v6, false); n != 2*share {
			t.Errorf("sluice_conntrack holds %d entries after the answered flood, want %d", n, 2*share)
		}
		wantCounted(t, m, v6, share, "after the answered flood")
		if st, err := m.GCConntrack(); err != nil || st.HalfOpen != share || st.HalfOpenCounted != share {
			t.Errorf("GC: %+v (%v), want %d half-open found and counted", st, err, share)
		}

		// Acknowledged: a flow of the share leaves the count, one of the
		// LRU moves to sluice_conntrack, established and uncounted.
		first, last := flows[0], flows[flood-1]
		if _, est := ctInTable(t, m, first.fwdKey(), false); !est {
			t.Fatalf("first flow not in sluice_conntrack")
		}
		for _, fl := range []flow{first, last} {
			if v, dst := sendTo(t, ing, fl.pkt(tcpACK)); v != tcActOK || dst != be.addr.Addr.String() {
				t.Fatalf("ACK of %s: verdict %d to %s", fl.client, v, dst)
			}
			for _, k := range []ctK{fl.fwdKey(), fl.revKey(be.addr)} {
				if e, ok := ctInTable(t, m, k, false); !ok || e.flags&awaitBits != awaitBits {
					t.Errorf("after the ACK of %s: %s in sluice_conntrack %+v (found %v), want it assured", fl.client, k, e, ok)
				}
				if _, ok := ctInTable(t, m, k, true); ok {
					t.Errorf("after the ACK of %s: %s still in sluice_ct_new", fl.client, k)
				}
			}
			if v, out := runProg(t, eg, fl.from(be.addr, tcpACK).Bytes()); v != tcActOK || outSrc(out) != f.fe.Addr.String() {
				t.Errorf("reply to %s: verdict %d from %s", fl.client, v, outSrc(out))
			}
		}
		wantCounted(t, m, v6, share-1, "after two ACKs")

		// The SYN timeout over, the GC reaps the unassured flows of the
		// share (the LRU's lapse: an LRU's entries are left to eviction).
		for _, fl := range flows {
			for _, k := range []ctK{fl.fwdKey(), fl.revKey(be.addr)} {
				ctSetSeen(t, m, k, -cfg.CTTimeoutSYN-time.Second)
			}
		}
		if _, err := m.GCConntrack(); err != nil {
			t.Fatal(err)
		}
		wantCounted(t, m, v6, 0, "after the GC")
		if n := ctCountOf(t, m, v6, false); n != 4 {
			t.Errorf("sluice_conntrack holds %d entries after the GC, want the 2 assured flows' 4", n)
		}
	})
}

// TestCTAssuredLostReply: a flow answered beyond the share (its entries
// in sluice_ct_new) whose reply entry the LRU evicted before its
// client's ACK: the ACK re-creates the reply entry beside the forward
// entry (ct_check_reverse takes an unassured flow for a half-open one)
// and both move to sluice_conntrack, assured, the replies translated.
// Before, within a second of the SYN-ACK the ACK skipped the check (the
// forward entry answered, its refresh not due) and assured the forward
// entry alone, in sluice_ct_new: the replies went out untranslated.
func TestCTAssuredLostReply(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		oneCPU(t)
		d, m, be, f := assuredFlow(t, v6, func(c *Config) { c.CTHalfOpenMax = 1 })
		ing, eg := d.TCIngress(), d.TCEgress()
		flows := []flow{f, f}
		flows[1].client = twinAddr(v6, "172.16.4.1")
		for i, fl := range flows {
			if v, _ := sendTo(t, ing, fl.pkt(tcpSYN_)); v != tcActOK {
				t.Fatalf("SYN %d: verdict %d", i, v)
			}
			if v, out := runProg(t, eg, fl.from(be.addr, tcpSA).Bytes()); v != tcActOK || outSrc(out) != f.fe.Addr.String() {
				t.Fatalf("SYN-ACK %d: verdict %d from %s", i, v, outSrc(out))
			}
		}
		fl := flows[1]
		if _, lru := ctInTable(t, m, fl.fwdKey(), true); !lru {
			t.Fatalf("the flow beyond the share is not in sluice_ct_new")
		}
		ctRemove(t, m, fl.revKey(be.addr))

		if v, dst := sendTo(t, ing, fl.pkt(tcpACK)); v != tcActOK || dst != be.addr.Addr.String() {
			t.Fatalf("ACK: verdict %d to %s", v, dst)
		}
		for _, k := range []ctK{fl.fwdKey(), fl.revKey(be.addr)} {
			if e, ok := ctInTable(t, m, k, false); !ok || e.flags&awaitBits != awaitBits {
				t.Errorf("after the ACK: %s in sluice_conntrack %+v (found %v), want it assured", k, e, ok)
			}
			if _, ok := ctInTable(t, m, k, true); ok {
				t.Errorf("after the ACK: %s still in sluice_ct_new", k)
			}
		}
		if v, out := runProg(t, eg, fl.from(be.addr, tcpACK).Bytes()); v != tcActOK || outSrc(out) != f.fe.Addr.String() {
			t.Errorf("reply after the ACK: verdict %d from %s, want %d from %s", v, outSrc(out), tcActOK, f.fe.Addr)
		}
		wantCounted(t, m, v6, 1, "after the ACK (the share's flow unassured)")
	})
}

// TestCTAssuredSNAT: a source-NATed flow's port reservation stays counted
// after the SYN-ACK (translated back to the client), both entries living
// the SYN timeout, until the client's ACK assures the flow (the count 0,
// the established timeout; a second ACK takes nothing off). A flood of
// spoofed SYNs whose endpoint answers each is admitted up to the share's
// reservations only, the rest refused as unanswered ones are (counted
// tc_snat_half_open_full): before, each SYN-ACK took its reservation off
// the count, and every SYN of the flood took a port for the TCP timeout.
// Once the SYN timeout is over the GC reaps the answered flood, its ports
// free again. Through tc and through XDP (which passes the flood's
// refused SYNs to tc, which refuses them).
func TestCTAssuredSNAT(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		for _, xdp := range []bool{false, true} {
			t.Run(map[bool]string{false: "tc", true: "xdp"}[xdp], func(t *testing.T) { assuredSNAT(t, v6, xdp) })
		}
	})
}

func assuredSNAT(t *testing.T, v6, xdp bool) {
	oneCPU(t)
	base := smallConfig
	if xdp {
		base = xdpConfig
	}
	d, ifindex, np, _, be := snatShareNode(t, v6, base)
	if v6 {
		// The flood's spoofed sources (spoofedSYN) beyond the client,
		// as IPv4's 172.16.0.0/12 is (northSouthNode): their SYN-ACKs
		// are sent back there.
		_, far, _ := net.ParseCIDR(twinAddr(true, "172.16.3.0") + "/64")
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: mustLink(t, "eth0").Attrs().Index, Dst: far, Gw: net.ParseIP(nsClientIP6)}); err != nil {
			t.Fatalf("route to far clients: %v", err)
		}
	}
	m, ing := d.Maps(), d.TCIngress()
	cfg := m.cfg.withDefaults()
	node := ofFamily(np.Addr, nsNodeIP, nsNodeIP6).String()
	// send runs p as the node receives it: through XDP, which must send
	// it on itself, or through tc; it reports whether it was sent, and
	// where to.
	send := func(b []byte, what string) (bool, string) {
		t.Helper()
		if xdp {
			v, out := runXDP(t, d.XDP(), ifindex, b)
			switch v {
			case xdpTx:
				return true, outDst(out)
			case xdpPass:
			default:
				t.Fatalf("%s: XDP verdict %d", what, v)
			}
			if v, _ := runOn(t, ing, ifindex, b); v != tcActShot {
				t.Fatalf("%s: passed to tc, verdict %d, want it refused (%d)", what, v, tcActShot)
			}
			return false, ""
		}
		switch v, out := runOn(t, ing, ifindex, b); v {
		case tcActRedirect:
			return true, outDst(out)
		case tcActShot:
			return false, ""
		default:
			t.Fatalf("%s: verdict %d", what, v)
		}
		return false, ""
	}

	syn := clientSYN(43000, np)
	client := syn.Src.String()
	t0 := clock(t)
	if ok, _ := send(syn.Bytes(), "SYN"); !ok {
		t.Fatal("SYN refused")
	}
	sp := snatPortIn(t, d, client, 43000, np)
	keys := []ctK{ctKeyOf(client, 43000, np.Addr.String(), np.Port, model.TCP, ctForward),
		ctKeyOf(be.addr.Addr.String(), be.addr.Port, node, sp, model.TCP, ctReverse)}
	wantCounted(t, m, v6, 1, "after the SYN")
	for range 2 {
		if ok, dst := send(replyFrom(be, sp, tcpSA).Bytes(), "SYN-ACK"); !ok || dst != client {
			t.Fatalf("SYN-ACK: sent %v to %s, want to %s", ok, dst, client)
		}
		t1 := clock(t)
		for _, k := range keys {
			wantFlags(t, m, k, awaitBits, ctFlagReplied|ctFlagAwait, "after the SYN-ACK")
			wantExpiry(t, m, k, t0, t1, cfg.CTTimeoutSYN, "after the SYN-ACK")
		}
		wantCounted(t, m, v6, 1, "after the SYN-ACK")
	}
	ack := syn
	ack.TCPFlags = tcpACK
	// Read once: the second ACK, within CT_REFRESH_NS of the first, may
	// leave the expiry the first set.
	t2 := clock(t)
	for range 2 {
		if ok, _ := send(ack.Bytes(), "ACK"); !ok {
			t.Fatal("ACK refused")
		}
		t3 := clock(t)
		for _, k := range keys {
			wantFlags(t, m, k, awaitBits, awaitBits, "after the ACK")
			wantExpiry(t, m, k, t2, t3, cfg.CTTimeoutTCP, "after the ACK")
		}
		wantCounted(t, m, v6, 0, "after the ACK")
	}

	// The answered flood.
	var admitted []int
	for i := range snatFlood {
		s := spoofedSYN(v6, i, np)
		if ok, _ := send(s.Bytes(), fmt.Sprintf("flood SYN %d", i)); !ok {
			continue
		}
		admitted = append(admitted, i)
		p := snatPortIn(t, d, s.Src.String(), 44000, np)
		if ok, dst := send(replyFrom(be, p, tcpSA).Bytes(), "flood SYN-ACK"); !ok || dst != s.Src.String() {
			t.Fatalf("flood SYN-ACK %d: sent %v to %s, want to %s", i, ok, dst, s.Src)
		}
	}
	if len(admitted) != snatAdmitted {
		t.Errorf("answered flood of %d SYNs: %d admitted, want %d (the share's entries)", snatFlood, len(admitted), snatAdmitted)
	}
	wantCounted(t, m, v6, snatAdmitted, "after the answered flood")
	if cs := counters(t, d); cs["tc_snat_half_open_full"] != snatFlood-snatAdmitted {
		t.Errorf("tc_snat_half_open_full %d, want %d", cs["tc_snat_half_open_full"], snatFlood-snatAdmitted)
	}
	if st, err := m.GCConntrack(); err != nil || st.HalfOpen != snatAdmitted || st.HalfOpenCounted != snatAdmitted {
		t.Errorf("GC: %+v (%v), want %d half-open found and counted", st, err, snatAdmitted)
	}

	// Its SYN timeout over, the GC reaps it and frees its ports.
	var revs []ctK
	for _, i := range admitted {
		src := spoofedSYN(v6, i, np).Src.String()
		p := snatPortIn(t, d, src, 44000, np)
		rev := ctKeyOf(be.addr.Addr.String(), be.addr.Port, node, p, model.TCP, ctReverse)
		revs = append(revs, rev)
		ctSetSeen(t, m, ctKeyOf(src, 44000, np.Addr.String(), np.Port, model.TCP, ctForward), -cfg.CTTimeoutSYN-time.Second)
		ctSetSeen(t, m, rev, -cfg.CTTimeoutSYN-time.Second)
	}
	if _, err := m.GCConntrack(); err != nil {
		t.Fatal(err)
	}
	for _, rev := range revs {
		if _, ok := ctInTable(t, m, rev, false); ok {
			t.Errorf("reservation %s left after the GC", rev)
		}
	}
	wantCounted(t, m, v6, 0, "after the GC reaped the answered flood")
	if n := ctCountOf(t, m, v6, false); n != 2 {
		t.Errorf("sluice_conntrack holds %d entries after the GC, want the assured flow's 2", n)
	}
	if ok, _ := send(spoofedSYN(v6, snatFlood, np).Bytes(), "SYN after the GC"); !ok {
		t.Error("a new source-NATed flow after the GC: refused")
	}
}

// TestCTAssuredGoMirror: the Go side reads the assured stage as the
// programs do: ctTimeouts (which the migrations judge by) gives an
// answered, unassured TCP flow the SYN timeout and an assured one, or
// one an earlier release answered (no CT_F_AWAIT), the TCP timeout;
// counted (DeleteConntrack's rule) holds an unassured forward entry or
// reservation counted until CT_F_COUNTED; Conntrack's entries say
// Unassured, not Established, for it.
func TestCTAssuredGoMirror(t *testing.T) {
	tm := (Config{}).ctTimeouts()
	tcp := uint8(model.TCP)
	for _, c := range []struct {
		flags uint32
		want  time.Duration
	}{
		{ctFlagReplied | ctFlagAwait, DefaultCTTimeoutSYN},
		{ctFlagReplied | ctFlagAwait | ctFlagAssured, DefaultCTTimeoutTCP},
		{ctFlagReplied, DefaultCTTimeoutTCP},
		{ctFlagReplied | ctFlagAwait | ctFlagSNAT | ctFlagAdmitted, DefaultCTTimeoutSYN},
		{ctFlagReplied | ctFlagAwait | ctFlagFinFwd | ctFlagFinRev, DefaultCTTimeoutClose},
	} {
		if got := time.Duration(tm.lifetime(tcp, c.flags)); got != c.want {
			t.Errorf("lifetime of flags %#x: %v, want %v", c.flags, got, c.want)
		}
	}
	for _, c := range []struct {
		dir   uint8
		flags uint32
		want  bool
	}{
		{ctForward, 0, true},
		{ctForward, ctFlagReplied | ctFlagAwait, true},
		{ctForward, ctFlagReplied | ctFlagAwait | ctFlagCounted, false},
		{ctForward, ctFlagReplied | ctFlagAwait | ctFlagCounted | ctFlagAssured, false},
		{ctForward, ctFlagReplied, false},
		{ctForward, ctFlagReplied | ctFlagAwait | ctFlagSNAT, false},
		{ctReverse, ctFlagReplied | ctFlagAwait, false},
		{ctReverse, ctFlagReplied | ctFlagAwait | ctFlagSNAT | ctFlagAdmitted, true},
		{ctReverse, ctFlagReplied | ctFlagAwait | ctFlagSNAT | ctFlagAdmitted | ctFlagCounted, false},
	} {
		if got := counted(c.dir, c.flags); got != c.want {
			t.Errorf("counted(dir %d, flags %#x) = %v, want %v", c.dir, c.flags, got, c.want)
		}
	}
	k := ctKeyOf("10.0.0.1", 1000, "10.96.0.1", 80, model.TCP, ctForward).k4()
	e := conntrackEntry(true, k, sockCt4Entry{Flags: ctFlagReplied | ctFlagAwait, Expires: 2}, 1)
	if !e.Unassured || e.Established {
		t.Errorf("answered, unassured entry: Unassured %v, Established %v; want true, false", e.Unassured, e.Established)
	}
	e = conntrackEntry(true, k, sockCt4Entry{Flags: ctFlagReplied | ctFlagAwait | ctFlagAssured, Expires: 2}, 1)
	if e.Unassured || !e.Established {
		t.Errorf("assured entry: Unassured %v, Established %v; want false, true", e.Unassured, e.Established)
	}
}
