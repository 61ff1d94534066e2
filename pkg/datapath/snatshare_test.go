package datapath

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil/packet"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// Source-NATed flows in the half-open share (bpf/lib/conntrack.h): a new
// source-NATed flow's port reservation, which only sluice_conntrack may
// hold, counts in the family's half-open share from its insert
// (CT_F_ADMITTED) until whoever first sets CT_F_COUNTED on it takes it
// off (its first reply, or the deleter that claims it unanswered); beyond
// the share the flow is refused, counted tc_snat_half_open_full. So a SYN
// flood to a source-NATed frontend (SYN-ACKs never answered) takes at
// most the share of the table nothing evicts, where it filled it before.
// A reservation is one entry where a flow's are two: reservations are
// admitted while the count is below twice the share (snatAdmitted).

// snatShare is the half-open share of the tests' datapaths, snatFlood the
// SYNs of their floods.
const snatShare, snatFlood = 5, 24

// snatAdmitted is how many reservations a share of snatShare admits.
const snatAdmitted = 2 * snatShare

// snatShareNode is a node datapath of base (snatNode: eth0, the family's
// NodePort to a remote backend, source-NATed) with a half-open share of
// snatShare, and local, a frontend on the node's address with the Local
// policy to the same backend: its flows are destination-NATed only.
func snatShareNode(t *testing.T, v6 bool, base func(bpffs string) Config) (d *Datapath, ifindex int, np, local model.L4Addr, be testBackend) {
	t.Helper()
	d, ifindex, np, be = snatNode(t, v6, configWith(base, func(c *Config) { c.CTHalfOpenMax = snatShare }))
	local = l4(np.Addr.String(), 30090, model.TCP)
	addExternal(t, d.Maps(), 30, local, reconciler.FlagExternal|reconciler.FlagLocal, be)
	return d, ifindex, np, local, be
}

// spoofedSYN is a SYN to fe from port 44000 of the i-th spoofed source.
func spoofedSYN(v6 bool, i int, fe model.L4Addr) packet.Packet {
	p := nsClient(44000, fe)
	p.Src = addr(twinAddr(v6, fmt.Sprintf("172.16.3.%d", i+1)))
	p.TCPFlags = tcpSYN_
	return p
}

// clientSYN is nsClient's SYN from port sport to fe.
func clientSYN(sport uint16, fe model.L4Addr) packet.Packet {
	p := nsClient(sport, fe)
	p.TCPFlags = tcpSYN_
	return p
}

// TestSNATShareBounded: a flood of SYNs from distinct spoofed sources to a
// source-NATed NodePort takes snatAdmitted port reservations of
// sluice_conntrack (the share's entries), counted in the half-open share (the GC finds as many);
// the rest are refused, counted tc_snat_half_open_full. Meanwhile an
// established source-NATed flow still goes both ways from its port, and a
// new flow that is not source-NATed is still translated. Once the GC has
// reaped the flood's reservations the count is 0 again, and a new
// source-NATed flow is admitted.
func TestSNATShareBounded(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		oneCPU(t)
		d, ifindex, np, local, be := snatShareNode(t, v6, smallConfig)
		m, ing := d.Maps(), d.TCIngress()
		node := ofFamily(np.Addr, nsNodeIP, nsNodeIP6).String()

		// An established source-NATed flow: counted from its SYN, taken
		// off by its client's ACK after the SYN-ACK (conntrack.h,
		// ct_assure).
		syn := clientSYN(43000, np)
		client := syn.Src.String()
		if v, _ := runOn(t, ing, ifindex, syn.Bytes()); v != tcActRedirect {
			t.Fatalf("SYN: verdict %d, want %d", v, tcActRedirect)
		}
		sp := snatPortIn(t, d, client, 43000, np)
		wantCounted(t, m, v6, 1, "after a source-NATed flow's SYN")
		if v, out := runOn(t, ing, ifindex, replyFrom(be, sp, tcpSA).Bytes()); v != tcActRedirect || outDst(out) != client {
			t.Fatalf("SYN-ACK: verdict %d to %s, want %d to %s", v, outDst(out), tcActRedirect, client)
		}
		wantCounted(t, m, v6, 1, "after its SYN-ACK")
		synACK := syn
		synACK.TCPFlags = tcpACK
		if v, _ := runOn(t, ing, ifindex, synACK.Bytes()); v != tcActRedirect {
			t.Fatalf("ACK: verdict %d, want %d", v, tcActRedirect)
		}
		wantCounted(t, m, v6, 0, "after its ACK")

		// The flood.
		var admitted []int
		for i := range snatFlood {
			switch v, _ := runOn(t, ing, ifindex, spoofedSYN(v6, i, np).Bytes()); v {
			case tcActRedirect:
				admitted = append(admitted, i)
			case tcActShot:
			default:
				t.Fatalf("flood SYN %d: verdict %d", i, v)
			}
		}
		if len(admitted) != snatAdmitted {
			t.Errorf("flood of %d SYNs: %d admitted, want %d (the share's entries)", snatFlood, len(admitted), snatAdmitted)
		}
		wantCounted(t, m, v6, snatAdmitted, "after the flood")
		// The established flow's two entries and the flood's reservations.
		if n := ctCountOf(t, m, v6, false); n != 2+snatAdmitted {
			t.Errorf("sluice_conntrack holds %d entries after the flood, want %d", n, 2+snatAdmitted)
		}
		if cs := counters(t, d); cs["tc_snat_half_open_full"] != snatFlood-snatAdmitted {
			t.Errorf("tc_snat_half_open_full %d, want %d", cs["tc_snat_half_open_full"], snatFlood-snatAdmitted)
		}
		// The refusals count as the table's: the agent collects at once.
		if r, err := m.ConntrackRefused(); err != nil || r != uint64(snatFlood-snatAdmitted) {
			t.Errorf("ConntrackRefused %d (%v), want %d: the refusals beyond the share", r, err, snatFlood-snatAdmitted)
		}
		st, err := m.GCConntrack()
		if err != nil {
			t.Fatal(err)
		}
		if st.HalfOpen != snatAdmitted || st.HalfOpenCounted != snatAdmitted {
			t.Errorf("GC found %d half-open, counted %d; want %d each", st.HalfOpen, st.HalfOpenCounted, snatAdmitted)
		}

		// During the flood, the established flow goes on from its port.
		ack := syn
		ack.TCPFlags = tcpACK
		if v, out := runOn(t, ing, ifindex, ack.Bytes()); v != tcActRedirect || outSport(out) != sp {
			t.Errorf("established flow's ACK: verdict %d from port %d, want %d from %d", v, outSport(out), tcActRedirect, sp)
		}
		if v, out := runOn(t, ing, ifindex, replyFrom(be, sp, tcpACK).Bytes()); v != tcActRedirect || outDst(out) != client {
			t.Errorf("established flow's reply: verdict %d to %s, want %d to %s", v, outDst(out), tcActRedirect, client)
		}
		// A new flow that is not source-NATed is translated (into the
		// LRU, the share being full).
		if v, out := runOn(t, ing, ifindex, clientSYN(43001, local).Bytes()); v != tcActOK || outDst(out) != be.addr.Addr.String() {
			t.Errorf("new destination-NATed flow: verdict %d to %s, want %d to %s", v, outDst(out), tcActOK, be.addr.Addr)
		}
		wantCounted(t, m, v6, snatAdmitted, "after the destination-NATed flow")

		// The flood's entries live out their lifetime: the GC reaps
		// them, and takes their reservations off the count.
		for _, i := range admitted {
			src := spoofedSYN(v6, i, np).Src.String()
			p := snatPortIn(t, d, src, 44000, np)
			ctSetSeen(t, m, ctKeyOf(src, 44000, np.Addr.String(), np.Port, model.TCP, ctForward), -2*time.Hour)
			ctSetSeen(t, m, ctKeyOf(be.addr.Addr.String(), be.addr.Port, node, p, model.TCP, ctReverse), -2*time.Hour)
		}
		if _, err := m.GCConntrack(); err != nil {
			t.Fatal(err)
		}
		wantCounted(t, m, v6, 0, "after the GC reaped the flood")
		if n := ctCountOf(t, m, v6, false); n != 2 {
			t.Errorf("sluice_conntrack holds %d entries after the GC, want the established flow's 2", n)
		}
		if v, _ := runOn(t, ing, ifindex, spoofedSYN(v6, snatFlood, np).Bytes()); v != tcActRedirect {
			t.Errorf("a new source-NATed flow after the GC: verdict %d, want %d", v, tcActRedirect)
		}
		wantCounted(t, m, v6, 1, "after a new source-NATed flow")
	})
}

// TestSNATShareCountedOnce: a source-NATed flow's reservation is taken off
// the count exactly once: by its first reply (not again by a second
// SYN-ACK, nor by a flush of the flow once answered), or, unanswered, by
// a flush of its backend, a new flow superseding it on its tuple (the
// client's SYN after its RST), or the GC after DeleteConntrack lapsed it.
func TestSNATShareCountedOnce(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		oneCPU(t)
		d, ifindex, np, _, be := snatShareNode(t, v6, smallConfig)
		m, ing := d.Maps(), d.TCIngress()
		node := ofFamily(np.Addr, nsNodeIP, nsNodeIP6).String()
		open := func(sport uint16) (uint16, ctK) {
			t.Helper()
			syn := clientSYN(sport, np)
			if v, _ := runOn(t, ing, ifindex, syn.Bytes()); v != tcActRedirect {
				t.Fatalf("SYN from port %d: verdict %d, want %d", sport, v, tcActRedirect)
			}
			sp := snatPortIn(t, d, syn.Src.String(), sport, np)
			return sp, ctKeyOf(be.addr.Addr.String(), be.addr.Port, node, sp, model.TCP, ctReverse)
		}
		flush := func() {
			t.Helper()
			if err := m.FlushConntrack([]model.L4Addr{be.addr}); err != nil {
				t.Fatal(err)
			}
		}

		// Answered and assured: taken off by the client's first ACK
		// after the SYN-ACK only (conntrack.h, ct_assure).
		sp, rev := open(43000)
		wantCounted(t, m, v6, 1, "opened")
		for range 2 {
			if v, _ := runOn(t, ing, ifindex, replyFrom(be, sp, tcpSA).Bytes()); v != tcActRedirect {
				t.Fatalf("SYN-ACK: verdict %d, want %d", v, tcActRedirect)
			}
			wantCounted(t, m, v6, 1, "after a SYN-ACK")
		}
		ack := clientSYN(43000, np)
		ack.TCPFlags = tcpACK
		for range 2 {
			if v, _ := runOn(t, ing, ifindex, ack.Bytes()); v != tcActRedirect {
				t.Fatalf("ACK: verdict %d, want %d", v, tcActRedirect)
			}
			wantCounted(t, m, v6, 0, "after an ACK")
		}
		if e, ok := ctLookup(t, m, rev); !ok || e.flags&(ctFlagReplied|ctFlagCounted|ctFlagAdmitted) != ctFlagReplied|ctFlagCounted|ctFlagAdmitted {
			t.Errorf("answered reservation %+v (found %v), want it replied, admitted and counted", e, ok)
		}
		flush()
		wantCounted(t, m, v6, 0, "after the answered flow's flush")

		// Unanswered, flushed.
		_, rev = open(43001)
		wantCounted(t, m, v6, 1, "opened")
		flush()
		if _, ok := ctLookup(t, m, rev); ok {
			t.Error("reservation left by the flush")
		}
		wantCounted(t, m, v6, 0, "after the flush")

		// Unanswered, superseded: the client resets and opens again from
		// the same port; the new flow's reservation is counted instead.
		_, rev = open(43002)
		rst := clientSYN(43002, np)
		rst.TCPFlags = tcpRST
		runOn(t, ing, ifindex, rst.Bytes())
		_, rev2 := open(43002)
		if rev2 != rev {
			if _, ok := ctLookup(t, m, rev); ok {
				t.Error("the superseded flow's reservation is left")
			}
		}
		wantCounted(t, m, v6, 1, "after the new flow superseded the old")
		flush()
		wantCounted(t, m, v6, 0, "after the flush")
	})
}

// TestSNATShareBoundedXDP: the XDP path reserves ports as tc does
// (ct_create_snat) and is bounded alike: of a flood, snatAdmitted SYNs are
// sent on by XDP, the rest passed to tc, which refuses them (counted).
func TestSNATShareBoundedXDP(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		oneCPU(t)
		d, ifindex, np, _, _ := snatShareNode(t, v6, xdpConfig)
		m := d.Maps()
		sent, refused := 0, 0
		for i := range snatFlood {
			b := spoofedSYN(v6, i, np).Bytes()
			v, _ := runXDP(t, d.XDP(), ifindex, b)
			switch v {
			case xdpTx:
				sent++
				continue
			case xdpPass:
			default:
				t.Fatalf("flood SYN %d: XDP verdict %d", i, v)
			}
			if v, _ := runOn(t, d.TCIngress(), ifindex, b); v == tcActShot {
				refused++
			}
		}
		if sent != snatAdmitted || refused != snatFlood-snatAdmitted {
			t.Errorf("flood of %d SYNs: %d sent by XDP, %d refused by tc; want %d, %d", snatFlood, sent, refused, snatAdmitted, snatFlood-snatAdmitted)
		}
		wantCounted(t, m, v6, snatAdmitted, "after the flood")
		if cs := counters(t, d); cs["tc_snat_half_open_full"] != snatFlood-snatAdmitted {
			t.Errorf("tc_snat_half_open_full %d, want %d", cs["tc_snat_half_open_full"], snatFlood-snatAdmitted)
		}
	})
}
