package datapath

import (
	"net/netip"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/pkg/model"
)

// Half-open flows in the established table (bpf/lib/conntrack.h): a new
// flow's entries go into sluice_conntrack without CT_F_REPLIED while the
// half-open share has room (ct_admit_room), and its first reply promotes
// them in place; the count of such flows is taken off exactly once, by
// whoever sets CT_F_COUNTED first; beyond the share new flows go to
// sluice_ct_new, which the programs look in only while its new_live word
// is set. These tests run the programs by BPF_PROG_TEST_RUN and write the
// maps directly to sequence what a race would interleave.

// admitState returns the programs' count of half-open flows in the
// family's sluice_conntrack and its sluice_ct_new's new_live word.
func admitState(t *testing.T, m *Maps, v6 bool) (counted int64, newLive uint32) {
	t.Helper()
	family := map[bool]uint32{false: 4, true: 6}[v6]
	n, err := m.HalfOpenCounted(family)
	if err != nil {
		t.Fatal(err)
	}
	var g sockCtAdmit
	if err := m.ctAdmit.Lookup(ctAdmitIndex(family), &g); err != nil {
		t.Fatal(err)
	}
	return n, g.NewLive
}

// wantCounted fails the test unless the family's count is want.
func wantCounted(t *testing.T, m *Maps, v6 bool, want int64, when string) {
	t.Helper()
	if n, _ := admitState(t, m, v6); n != want {
		t.Errorf("%s: half-open flows counted %d, want %d", when, n, want)
	}
}

// oneCPU keeps the test's goroutine on one CPU, so that every program run
// adds to the same CPU's part of the count, which admission reads (the
// other CPUs' parts are seen only once folded, every 64).
func oneCPU(t *testing.T) {
	t.Helper()
	runtime.LockOSThread()
	var old, one unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		t.Fatal(err)
	}
	one.Set(0)
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = unix.SchedSetaffinity(0, &old)
		runtime.UnlockOSThread()
	})
}

// inPlaceFlow opens a datapath of smallConfig changed by set, with one UDP
// frontend and its backend, and returns them and a client flow to it.
func inPlaceFlow(t *testing.T, v6 bool, set func(*Config)) (*Datapath, *Maps, testBackend, flow) {
	t.Helper()
	a, vip := twinOf(v6), twinL4(v6, vipUDP)
	if set == nil {
		set = func(*Config) {}
	}
	d := openTestWith(t, smallConfig, set)
	m := d.Maps()
	be := testBackend{46, l4(a("10.1.4.6"), 5353, model.UDP)}
	addService(t, m, 1, vip, be)
	return d, m, be, flow{a("10.0.70.1"), 22000, vip}
}

// sendOK runs p through prog and fails unless it passes; it returns the
// packet's source and destination addresses as sent.
func sendOK(t *testing.T, run func() (uint32, []byte, error), what string) (src, dst string) {
	t.Helper()
	v, out, err := run()
	if err != nil || v != tcActOK {
		t.Fatalf("%s: verdict %d (%v), want %d", what, v, err, tcActOK)
	}
	return outSrc(out), outDst(out)
}

// TestHalfOpenPromotedInPlace: a new flow's two entries go into
// sluice_conntrack, half-open (no CT_F_REPLIED), and nothing into
// sluice_ct_new, whose new_live word stays clear; the flow is counted
// once. Its first reply is translated and promotes both entries in place
// (CT_F_REPLIED, the forward one CT_F_COUNTED), taking the flow off the
// count; later replies do not take it off again.
func TestHalfOpenPromotedInPlace(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		d, m, be, f := inPlaceFlow(t, v6, nil)
		ingress := func() (uint32, []byte, error) { return runProgErr(d.TCIngress(), f.pkt(0).Bytes()) }
		egress := func() (uint32, []byte, error) { return runProgErr(d.TCEgress(), f.from(be.addr, 0).Bytes()) }
		if _, dst := sendOK(t, ingress, "datagram"); dst != be.addr.Addr.String() {
			t.Fatalf("datagram to %s, want %s", dst, be.addr.Addr)
		}
		for _, k := range []ctK{f.fwdKey(), f.revKey(be.addr)} {
			e, ok := ctInTable(t, m, k, false)
			if !ok || e.flags&(ctFlagReplied|ctFlagCounted) != 0 || e.expires == 0 {
				t.Errorf("%s: entry in sluice_conntrack %+v (found %v), want it alive, half-open", k, e, ok)
			}
			if e, ok := ctInTable(t, m, k, true); ok {
				t.Errorf("%s: entry in sluice_ct_new %+v, want none", k, e)
			}
		}
		if n, live := admitState(t, m, v6); n != 1 || live != 0 {
			t.Errorf("after the datagram: counted %d, new_live %d; want 1, 0", n, live)
		}
		// Another datagram of the flow follows it: no second count.
		sendOK(t, ingress, "second datagram")
		wantCounted(t, m, v6, 1, "after a second datagram")

		if src, _ := sendOK(t, egress, "answer"); src != f.fe.Addr.String() {
			t.Fatalf("answer from %s, want %s", src, f.fe.Addr)
		}
		for _, k := range []ctK{f.fwdKey(), f.revKey(be.addr)} {
			if e, ok := ctInTable(t, m, k, false); !ok || e.flags&ctFlagReplied == 0 {
				t.Errorf("%s: entry %+v (found %v), want it promoted in place", k, e, ok)
			}
		}
		if e, _ := ctInTable(t, m, f.fwdKey(), false); e.flags&ctFlagCounted == 0 {
			t.Errorf("forward entry flags %#x, want CT_F_COUNTED", e.flags)
		}
		wantCounted(t, m, v6, 0, "after the answer")
		sendOK(t, egress, "second answer")
		sendOK(t, ingress, "datagram of the established flow")
		wantCounted(t, m, v6, 0, "after a second answer")
		if st, err := m.GCConntrack(); err != nil || st.HalfOpen != 0 || st.HalfOpenCounted != 0 {
			t.Errorf("GC: %+v (%v), want no half-open flow found or counted", st, err)
		}
	})
}

// TestHalfOpenShareBounded: a flood of new flows beyond the half-open
// share (CTHalfOpenMax) puts only that many into sluice_conntrack; the
// rest go to sluice_ct_new, whose new_live word the first of them sets,
// so the rest of the established table stays free for established flows
// (one answered from the LRU is promoted there) and port reservations.
// Without the bound the flood takes the whole table.
func TestHalfOpenShareBounded(t *testing.T) {
	const share, flood = 5, 40
	forFamilies(t, func(t *testing.T, v6 bool) {
		oneCPU(t)
		d, m, be, f := inPlaceFlow(t, v6, func(c *Config) { c.CTHalfOpenMax = share })
		flows := make([]flow, flood)
		for i := range flows {
			flows[i] = f
			flows[i].cport = f.cport + uint16(i)
			p := flows[i].pkt(0)
			sendOK(t, func() (uint32, []byte, error) { return runProgErr(d.TCIngress(), p.Bytes()) }, "datagram")
		}
		inEst, inNew := 0, 0
		for _, fl := range flows {
			_, est := ctInTable(t, m, fl.fwdKey(), false)
			_, lru := ctInTable(t, m, fl.fwdKey(), true)
			if est == lru {
				t.Errorf("flow %d: in sluice_conntrack %v, in sluice_ct_new %v; want one", fl.cport, est, lru)
			}
			inEst += b2n(est)
			inNew += b2n(lru)
		}
		if inEst != share || inNew != flood-share {
			t.Errorf("flood of %d: %d flows in sluice_conntrack, %d in sluice_ct_new; want %d, %d", flood, inEst, inNew, share, flood-share)
		}
		if n, live := admitState(t, m, v6); n != share || live != 1 {
			t.Errorf("after the flood: counted %d, new_live %d; want %d, 1", n, live, share)
		}
		if n := ctCountOf(t, m, v6, false); n != 2*share {
			t.Errorf("sluice_conntrack holds %d entries after the flood, want %d", n, 2*share)
		}

		// A flow of the LRU answered: promoted into the established
		// table (uncounted there), translated.
		last := flows[flood-1]
		p := last.from(be.addr, 0)
		if src, _ := sendOK(t, func() (uint32, []byte, error) { return runProgErr(d.TCEgress(), p.Bytes()) }, "answer of a flow in the LRU"); src != f.fe.Addr.String() {
			t.Errorf("answer from %s, want %s", src, f.fe.Addr)
		}
		if e, ok := ctInTable(t, m, last.fwdKey(), false); !ok || e.flags&(ctFlagReplied|ctFlagCounted) != ctFlagReplied|ctFlagCounted {
			t.Errorf("forward entry of the LRU's flow %+v (found %v), want it in sluice_conntrack, replied and counted", e, ok)
		}
		wantCounted(t, m, v6, share, "after the LRU's flow is answered")

		// One of the share answered: a new flow takes its place.
		p = flows[0].from(be.addr, 0)
		sendOK(t, func() (uint32, []byte, error) { return runProgErr(d.TCEgress(), p.Bytes()) }, "answer of a flow in the share")
		wantCounted(t, m, v6, share-1, "after a flow of the share is answered")
		nf := f
		nf.cport = f.cport + flood
		p = nf.pkt(0)
		sendOK(t, func() (uint32, []byte, error) { return runProgErr(d.TCIngress(), p.Bytes()) }, "new flow")
		if _, ok := ctInTable(t, m, nf.fwdKey(), false); !ok {
			t.Errorf("new flow not in sluice_conntrack once the share had room")
		}
		wantCounted(t, m, v6, share, "after a new flow")
	})
}

// ctCountOf counts the entries of the family's sluice_conntrack (half:
// sluice_ct_new).
func ctCountOf(t *testing.T, m *Maps, v6, half bool) int {
	t.Helper()
	tables := ctMaps(m)
	if v6 {
		tables = ctTables6(t, m)
	}
	return mapLen(t, tables[b2n(half)])
}

// TestHalfOpenEndsCountedOnce: a flow that ends half-open is taken off the
// count once, by the deleter that claims its forward entry: the GC
// reaping it once its lifetime is over, a flush of its backend, a new
// flow superseding it (its backend gone); and a flow promoted before the
// flush is not taken off again.
func TestHalfOpenEndsCountedOnce(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		oneCPU(t)
		d, m, be, f := inPlaceFlow(t, v6, nil)
		open := func(fl flow) {
			t.Helper()
			p := fl.pkt(0)
			sendOK(t, func() (uint32, []byte, error) { return runProgErr(d.TCIngress(), p.Bytes()) }, "datagram")
		}
		open(f)
		wantCounted(t, m, v6, 1, "opened")

		// The GC reaps it once unanswered for its lifetime.
		ctSetSeen(t, m, f.fwdKey(), -2*time.Hour)
		ctSetSeen(t, m, f.revKey(be.addr), -2*time.Hour)
		if st, err := m.GCConntrack(); err != nil || st.Deleted != 2 {
			t.Fatalf("GC: %+v (%v), want 2 entries deleted", st, err)
		}
		wantCounted(t, m, v6, 0, "after the GC reaped it")

		// A flush of its backend.
		open(f)
		if err := m.FlushConntrack([]model.L4Addr{be.addr}); err != nil {
			t.Fatal(err)
		}
		if _, ok := ctLookup(t, m, f.fwdKey()); ok {
			t.Fatal("forward entry left by the flush")
		}
		wantCounted(t, m, v6, 0, "after the flush")

		// Promoted, then flushed: taken off by the promotion only.
		open(f)
		p := f.from(be.addr, 0)
		sendOK(t, func() (uint32, []byte, error) { return runProgErr(d.TCEgress(), p.Bytes()) }, "answer")
		if err := m.FlushConntrack([]model.L4Addr{be.addr}); err != nil {
			t.Fatal(err)
		}
		wantCounted(t, m, v6, 0, "after the promotion and the flush")

		// Superseded: its backend leaves, another takes the frontend;
		// the next datagram is a new flow on the tuple.
		open(f)
		a := twinOf(v6)
		be2 := testBackend{46, l4(a("10.1.4.7"), 5353, model.UDP)}
		addService(t, m, 1, f.fe, be2)
		open(f)
		if e, ok := ctInTable(t, m, f.fwdKey(), false); !ok || e.nat != netip.AddrPortFrom(be2.addr.Addr, be2.addr.Port) {
			t.Errorf("forward entry %+v (found %v), want the new flow's, to %s", e, ok, be2.addr)
		}
		if _, ok := ctLookup(t, m, f.revKey(be.addr)); ok {
			t.Errorf("the superseded flow's reply entry is left")
		}
		wantCounted(t, m, v6, 1, "after the new flow superseded the old")
	})
}

// TestHalfOpenPromotionFindsClaim: the first reply of a half-open flow
// whose forward entry a deleter has claimed (its expiry CT_DEAD, written
// here as the claim's compare-and-swap would) is stale: not translated,
// and the promotion takes nothing off the count, which is the claimer's
// to take (the flow is counted until then). With the claimer's
// CT_F_COUNTED already set (and the count taken off by it), the reply
// takes nothing off either: the count is taken off once.
func TestHalfOpenPromotionFindsClaim(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		oneCPU(t)
		d, m, be, f := inPlaceFlow(t, v6, nil)
		p := f.pkt(0)
		sendOK(t, func() (uint32, []byte, error) { return runProgErr(d.TCIngress(), p.Bytes()) }, "datagram")
		claim := func(flags uint32) {
			t.Helper()
			est := ctTablesOf(t, m, f.fwdKey())[0]
			var err error
			if v6 {
				_, err = ctEdit(est, f.fwdKey().k6(), func(v *tcCt6Entry) { v.Expires, v.Flags = ctDead, v.Flags|flags })
			} else {
				_, err = ctEdit(est, f.fwdKey().k4(), func(v *sockCt4Entry) { v.Expires, v.Flags = ctDead, v.Flags|flags })
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		answer := func(what string) {
			t.Helper()
			q := f.from(be.addr, 0)
			v, out, err := runProgErr(d.TCEgress(), q.Bytes())
			if err != nil || v != tcActOK || outSrc(out) != be.addr.Addr.String() {
				t.Fatalf("%s: verdict %d from %s (%v), want %d from %s (untranslated: the flow is gone)", what, v, outSrc(out), err, tcActOK, be.addr.Addr)
			}
		}
		claim(0)
		answer("answer while the forward entry is claimed")
		wantCounted(t, m, v6, 1, "after the stale answer (the claimer's to take off)")
		if e, ok := ctInTable(t, m, f.revKey(be.addr), false); ok && e.flags&ctFlagReplied != 0 {
			t.Errorf("reply entry %+v promoted by a stale answer", e)
		}

		// The claimer's CT_F_COUNTED and its count taken off, as
		// ct_uncount does after the claim.
		claim(ctFlagCounted)
		addCounted(t, m, v6, -1)
		answer("answer after the claimer took the flow off")
		wantCounted(t, m, v6, 0, "after the second stale answer")
	})
}

// addCounted adds d to the family's shared count word, as a program's
// fold does.
func addCounted(t *testing.T, m *Maps, v6 bool, d int64) {
	t.Helper()
	editAdmit(t, m, v6, func(g *sockCtAdmit) { g.Pending += d })
}

// editAdmit rewrites the family's sluice_ct_admit word by edit (the
// programs' atomic adds are not raced: tests only).
func editAdmit(t *testing.T, m *Maps, v6 bool, edit func(*sockCtAdmit)) {
	t.Helper()
	idx := ctAdmitIndex(map[bool]uint32{false: 4, true: 6}[v6])
	var g sockCtAdmit
	if err := m.ctAdmit.Lookup(idx, &g); err != nil {
		t.Fatal(err)
	}
	edit(&g)
	if err := m.ctAdmit.Put(idx, &g); err != nil {
		t.Fatal(err)
	}
}

// TestCTNewGate: while sluice_ct_new's new_live word is clear the programs
// do not look there: a reply whose only entries are in the LRU (as the
// previous release's programs left them) is not translated. A collection
// sets the word when the LRU holds an entry, and the reply is translated.
// A program's insert there sets it too; the GC clears it once the LRU is
// empty. (An agent's start holds it set: TestCTNewHeldUntilCommit.)
func TestCTNewGate(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		// No half-open share: every new flow goes to the LRU.
		d, m, be, f := inPlaceFlow(t, v6, func(c *Config) { c.CTHalfOpenMax = -1 })
		p := f.pkt(0)
		sendOK(t, func() (uint32, []byte, error) { return runProgErr(d.TCIngress(), p.Bytes()) }, "datagram")
		if _, ok := ctInTable(t, m, f.fwdKey(), true); !ok {
			t.Fatal("no entry in sluice_ct_new with the share off")
		}
		if _, live := admitState(t, m, v6); live != 1 {
			t.Errorf("new_live %d after an insert into the LRU, want 1", live)
		}
		if _, err := m.GCConntrack(); err != nil {
			t.Fatal(err)
		}
		if _, live := admitState(t, m, v6); live != 1 {
			t.Errorf("new_live %d after a GC with the LRU holding entries, want 1", live)
		}

		// As an agent of the previous release left it: the LRU holds
		// the flow, the word is clear.
		setNewLive(t, m, v6, 0)
		q := f.from(be.addr, 0)
		v, out, err := runProgErr(d.TCEgress(), q.Bytes())
		if err != nil || v != tcActOK || outSrc(out) != be.addr.Addr.String() {
			t.Fatalf("answer with the word clear: verdict %d from %s (%v), want %d from %s: the LRU not looked in", v, outSrc(out), err, tcActOK, be.addr.Addr)
		}
		if live := liveAfterGC(t, m, v6); live != 1 {
			t.Fatalf("new_live %d after a GC over an LRU holding entries, want 1", live)
		}
		if src, _ := sendOK(t, func() (uint32, []byte, error) { return runProgErr(d.TCEgress(), q.Bytes()) }, "answer after the GC"); src != f.fe.Addr.String() {
			t.Errorf("answer after the GC from %s, want %s", src, f.fe.Addr)
		}

		// The flow is promoted out of the LRU: empty, the GC clears
		// the word.
		if n := ctCountOf(t, m, v6, true); n != 0 {
			t.Fatalf("sluice_ct_new holds %d entries after the promotion, want 0", n)
		}
		if _, err := m.GCConntrack(); err != nil {
			t.Fatal(err)
		}
		if _, live := admitState(t, m, v6); live != 0 {
			t.Errorf("new_live %d after a GC over an empty LRU, want 0", live)
		}
	})
}

// TestCTNewHeldUntilCommit: an agent's start sets sluice_ct_new's
// new_live word before it attaches a program (HoldConntrackNew, in
// AttachDevices) and its collections leave the word set until the start
// is committed, LRU empty or not: meanwhile the previous release's
// programs may still run on a device and insert there without setting
// it. After Commit a collection over the empty LRU clears it again.
func TestCTNewHeldUntilCommit(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		d, m, _, _ := inPlaceFlow(t, v6, nil)
		if live := liveAfterGC(t, m, v6); live != 0 {
			t.Fatalf("new_live %d after a GC over an empty LRU, want 0", live)
		}
		if err := m.HoldConntrackNew(); err != nil {
			t.Fatal(err)
		}
		if _, live := admitState(t, m, v6); live != 1 {
			t.Errorf("new_live %d after the hold over an empty LRU, want 1", live)
		}
		if live := liveAfterGC(t, m, v6); live != 1 {
			t.Errorf("new_live %d after a GC while held, want 1 (a clear would hide the previous release's inserts)", live)
		}
		if err := d.Commit(); err != nil {
			t.Fatal(err)
		}
		if live := liveAfterGC(t, m, v6); live != 0 {
			t.Errorf("new_live %d after a GC over an empty LRU once committed, want 0", live)
		}
	})
}

// liveAfterGC runs a collection and returns the family's new_live word
// after it.
func liveAfterGC(t *testing.T, m *Maps, v6 bool) uint32 {
	t.Helper()
	if _, err := m.GCConntrack(); err != nil {
		t.Fatal(err)
	}
	_, live := admitState(t, m, v6)
	return live
}

// setNewLive writes the family's new_live word.
func setNewLive(t *testing.T, m *Maps, v6 bool, v uint32) {
	t.Helper()
	editAdmit(t, m, v6, func(g *sockCtAdmit) { g.NewLive = v })
}

// TestHalfOpenFloodLeavesRoomForReservations: a flood of new flows on a
// node whose established table holds 64 entries (a half-open share of 8
// flows, 16 entries) leaves the rest of the table free: a source-NATed
// flow's port reservation, which needs the table, is made after it.
// Without the bound the flood fills the table and the reservation is
// refused (tc_ct_est_full), the SYN dropped.
func TestHalfOpenFloodLeavesRoomForReservations(t *testing.T) {
	const table, flood = 64, 100
	forFamilies(t, func(t *testing.T, v6 bool) {
		base := configWith(smallConfig, func(c *Config) { c.MaxConntrack = table })
		d, ifindex, np, _ := snatNode(t, v6, base)
		oneCPU(t)
		m := d.Maps()
		a, vip := twinOf(v6), twinL4(v6, vipUDP)
		addService(t, m, 40, vip, testBackend{46, l4(a("10.1.4.6"), 5353, model.UDP)})
		for i := range flood {
			f := flow{a("10.0.70.1"), uint16(23000 + i), vip}
			if v, _ := runOn(t, d.TCIngress(), ifindex, f.pkt(0).Bytes()); v != tcActOK {
				t.Fatalf("flood datagram %d: verdict %d", i, v)
			}
		}
		if n := ctCountOf(t, m, v6, false); n != 2*(table/8) {
			t.Errorf("the flood left %d entries in sluice_conntrack, want %d (its half-open share)", n, 2*(table/8))
		}
		syn := nsClient(43000, np)
		if v, _ := runOn(t, d.TCIngress(), ifindex, syn.Bytes()); v != tcActRedirect {
			t.Fatalf("SYN of a source-NATed flow after the flood: verdict %d, want %d (its port reserved)", v, tcActRedirect)
		}
		if cs := counters(t, d); cs["tc_ct_est_full"] != 0 {
			t.Errorf("tc_ct_est_full %d, want 0", cs["tc_ct_est_full"])
		}
	})
}
