package datapath

import (
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/model"
)

// TestResizeKeepsHalfOpenCount (review6 MED-1): a resize of
// sluice_conntrack while the previous agent's programs count half-open
// flows in the count both builds share (sluice_ct_admit_v1 and
// sluice_ct_pcpu_v1 are not migrated) leaves the count equal to what the
// collections find in the new map, with nothing to resync. The previous
// agent's flows are planted in its map, counted as its programs count
// them (an add to the count), and taken off as they take them off (an
// or of CT_F_COUNTED, an add of -1 only if it was clear: oldTakesOff):
//
//   - A, half-open at the copy, assured by an old program afterwards;
//   - B, answered and unassured (CT_F_AWAIT), and C, a port reservation
//     counted (CT_F_ADMITTED), both untouched during the switch;
//   - D, half-open, made by an old program after the copy and carried
//     over by the shim at its next packet, then assured by an old
//     program;
//   - E, the same, carried over by settle (it sent nothing meanwhile);
//   - F, the same, expired before settle (left behind).
//
// The count then holds D and E (carried over with their places), and the
// collections find those two. Before, the copies went in counted with
// their old entries: A and D came off in the old map and stayed counted
// in the new one, B and C were counted in both maps for one place, and
// F's place was never taken off (found 5, counted 4).
func TestResizeKeepsHalfOpenCount(t *testing.T) {
	forCTFamilies(t, testResizeKeepsHalfOpenCount[sockCt4Key, sockCt4Entry], testResizeKeepsHalfOpenCount[tcCt6Key, tcCt6Entry])
}

// migCountNode is the start of a test of the half-open count across a
// migrating start: in a network namespace of its own (name) and a bpffs
// directory of the test's, the previous agent d1 on sl-r (sl-s beside
// it, unattached), with a share of 16 (no resync band: halfOpenBand);
// its conntrack map of fam's family (old), that family's number, and
// the next start's config, which resizes sluice_conntrack (the shims).
func migCountNode[K ctMigKey[K], V ctTestValue](t *testing.T, fam ctFamily[K, V], name string) (bpffs string, d1 *Datapath, old *ebpf.Map, family uint32, next Config) {
	t.Helper()
	bpffs = testPinDir(t)
	ns := topology.NewNS(t, name)
	ns.Enter(t)
	addVeths(t, [2]string{"sl-r", "sl-s"})
	small := func(dir string) Config {
		c := smallConfig(dir)
		c.CTHalfOpenMax = 16 // no resync band (halfOpenBand)
		return c
	}
	d1 = openTest(t, small(bpffs))
	if err := d1.AttachDevices([]string{"sl-r"}); err != nil {
		t.Fatal(err)
	}
	family = 4
	if fam.v6 {
		family = 6
	}
	old, _ = fam.maps(d1)
	next = small(bpffs)
	next.MaxConntrack = 8192
	return bpffs, d1, old, family, next
}

func testResizeKeepsHalfOpenCount[K ctMigKey[K], V ctTestValue](t *testing.T, fam ctFamily[K, V]) {
	_, d1, old, family, cfg := migCountNode(t, fam, "migcount")
	count := func(d int64) {
		t.Helper()
		if err := d1.Maps().adjustHalfOpen(family, d); err != nil {
			t.Fatal(err)
		}
	}
	flags := func(m *ebpf.Map, k *K) uint32 {
		t.Helper()
		var v V
		if err := m.Lookup(k, &v); err != nil {
			t.Fatalf("look up %+v: %v", *k, err)
		}
		return v.view().flags
	}
	// plant puts a flow of the old programs into their map, counted as
	// they count it (its forward entry, or its reservation).
	plant := func(cport uint16, fflags, rflags uint32, snat bool, expired bool) (fk K) {
		t.Helper()
		fk4, fv4, rk4, rv4 := ctFlow(t, "10.0.0.9", cport, "10.96.5.1", "10.2.5.1")
		fv4.Flags, rv4.Flags = fflags, rflags
		if snat {
			// <B -> node:sp> reserves the node's port sp (61000 + cport's
			// last digits) for <C:cport -> V>.
			sp := 61000 + cport%100
			fv4.SnatAddr, fv4.SnatPort = be32(addr("10.0.0.1")), be16(sp)
			rk4.Daddr, rk4.Dport = be32(addr("10.0.0.1")), be16(sp)
			rv4.SnatAddr, rv4.SnatPort = be32(addr("10.0.0.9")), be16(cport)
		}
		if expired {
			fv4.Expires, rv4.Expires = 2, 2
		}
		fk, fv := fam.of(fk4, fv4)
		rk, rv := fam.of(rk4, rv4)
		for _, e := range []struct {
			k *K
			v *V
		}{{&fk, &fv}, {&rk, &rv}} {
			if err := old.Put(e.k, e.v); err != nil {
				t.Fatal(err)
			}
		}
		count(1)
		return fk
	}
	// oldTakesOff is an old program's assurance of the flow of fk: it
	// takes the flow off unless CT_F_COUNTED was set (ct_assure).
	oldTakesOff := func(fk *K) {
		t.Helper()
		var v V
		if err := old.Lookup(fk, &v); err != nil {
			t.Fatal(err)
		}
		f := v.view().flags
		orCTFlags(&v, ctFlagCounted)
		orCTFlags(&v, ctFlagReplied|ctFlagAwait|ctFlagAssured)
		if err := old.Update(fk, &v, ebpf.UpdateExist); err != nil {
			t.Fatal(err)
		}
		if counted(ctForward, f) {
			count(-1)
		}
	}

	a := plant(40011, 0, 0, false, false)
	plant(40012, ctFlagReplied|ctFlagAwait, ctFlagReplied|ctFlagAwait, false, false)
	plant(40013, ctFlagSNAT, ctFlagSNAT|ctFlagAdmitted, true, false)
	wantCounted(t, d1.Maps(), fam.v6, 3, "before the resize")

	d2 := openTest(t, cfg)
	if shim, _ := d2.migrating(); !shim {
		t.Fatal("migrating() = false: want the shims")
	}
	cur, _ := fam.maps(d2)
	oldTakesOff(&a)

	dk := plant(40014, 0, 0, false, false)
	runProg(t, d2.shim.SluiceMigTc, fam.ack("10.0.0.9", 40014, "10.96.5.1").Bytes())
	if f := flags(cur, &dk); counted(ctForward, f) == false {
		t.Errorf("D carried over by the shim with flags %#x: want it counted in the new map", f)
	}
	if f := flags(old, &dk); counted(ctForward, f) {
		t.Errorf("D left counted in the old map by the shim (flags %#x): its place is the copy's", f)
	}
	oldTakesOff(&dk)
	plant(40015, 0, 0, false, false)
	plant(40016, 0, 0, false, true)
	wantCounted(t, d1.Maps(), fam.v6, 5, "before the switch")

	if err := d2.AttachDevices([]string{"sl-r"}); err != nil {
		t.Fatal(err)
	}
	if err := d2.Commit(); err != nil {
		t.Fatal(err)
	}
	wantCounted(t, d2.Maps(), fam.v6, 2, "after the switch")
	for i := range 2 {
		st := collect(t, d2.Maps())
		if st.HalfOpen != 2 || st.HalfOpenCounted != 2 || st.HalfOpenResynced != [2]int64{} {
			t.Errorf("collection %d: found %d, counted %d, resynced %v; want 2, 2, none", i, st.HalfOpen, st.HalfOpenCounted, st.HalfOpenResynced)
		}
	}
	wantCounted(t, d2.Maps(), fam.v6, 2, "after the collections")
}

// TestResizeCopiedBackReservationCountedOnce: during a resize, a new
// program's port reservation (in the new sluice_conntrack, counted) that
// the shim copies back into the old map for the flow's SYN-ACK, met by the
// previous agent's ingress (mig_copy_back), goes there taken off
// (CT_F_COUNTED): the old program's assurance of the flow (the client's
// ACK, met by it too) takes nothing off, and the flow keeps its one
// place, the new map's reservation's, which the collections find after
// the switch (to be taken off by its own assurance there). Before, the
// copy went in counted: the old program's assurance took the flow off
// (counted 0, found 1: the new map's reservation), and the new
// reservation's assurance would take it off a second time.
func TestResizeCopiedBackReservationCountedOnce(t *testing.T) {
	testutil.Privileged(t)
	forFamilies(t, func(t *testing.T, v6 bool) {
		d1, d2, ifindex, np, be := snatResizeNode(t, v6, func(c *Config) { c.MaxConntrack = 8192 })
		newIngress, _ := tcProgs(d2, v6)
		oldIngress, _ := tcProgs(d1, v6)
		const cport, port = 43000, 62000
		node := ofFamily(np.Addr, nsNodeIP, nsNodeIP6).String()
		rev := ctKeyOf(be.addr.Addr.String(), be.addr.Port, node, port, model.TCP, ctReverse)

		syn := nsClient(cport, np)
		syn.TCPFlags = tcpSYN_
		runShim(t, d2, ifindex, syn.Bytes())
		if v, out := runOn(t, newIngress, ifindex, syn.Bytes()); v != tcActRedirect || outSport(out) != port {
			t.Fatalf("SYN at the new ingress: verdict %d from port %d, want %d from %d", v, outSport(out), tcActRedirect, port)
		}
		wantCounted(t, d2.Maps(), v6, 1, "after the SYN")
		sa := replyFrom(be, port, tcpSA)
		runShim(t, d2, ifindex, sa.Bytes())
		if v, out := runOn(t, oldIngress, ifindex, sa.Bytes()); v != tcActRedirect || outDport(out) != cport {
			t.Fatalf("SYN-ACK at the previous agent's ingress: verdict %d to port %d, want %d to %d", v, outDport(out), tcActRedirect, cport)
		}
		// The client's ACK, met by the previous agent's ingress too:
		// it assures the flow there (ct_assure sets CT_F_COUNTED on the
		// reservation, and takes the flow off if it was clear).
		ack := nsClient(cport, np)
		ack.TCPFlags = tcpACK
		runShim(t, d2, ifindex, ack.Bytes())
		if v, out := runOn(t, oldIngress, ifindex, ack.Bytes()); v != tcActRedirect || outSport(out) != port {
			t.Fatalf("the client's ACK at the previous agent's ingress: verdict %d from port %d, want %d from %d", v, outSport(out), tcActRedirect, port)
		}
		est := func(d *Datapath) *ebpf.Map {
			if v6 {
				return d.tc.Sluice6ConntrackV1
			}
			return d.tc.SluiceConntrackV2
		}
		for _, m := range []struct {
			what      string
			d         *Datapath
			mask, bit uint32
		}{
			{"the reservation copied back, assured by the old program", d1, ctFlagCounted | ctFlagAssured, ctFlagCounted | ctFlagAssured},
			{"the new map's reservation", d2, ctFlagCounted | ctFlagAdmitted | ctFlagReplied, ctFlagAdmitted},
		} {
			if f, ok := flagsIn(t, est(m.d), rev); !ok || f&m.mask != m.bit {
				t.Errorf("%s: flags %#x (found %v), want %#x of %#x", m.what, f, ok, m.bit, m.mask)
			}
		}
		wantCounted(t, d2.Maps(), v6, 1, "after the SYN-ACK and ACK at the previous agent's ingress")

		if err := d2.AttachDevices([]string{"eth0"}); err != nil {
			t.Fatal(err)
		}
		if err := d2.Commit(); err != nil {
			t.Fatal(err)
		}
		for i := range 2 {
			st := collect(t, d2.Maps())
			if st.HalfOpen != 1 || st.HalfOpenCounted != 1 || st.HalfOpenResynced != [2]int64{} {
				t.Errorf("collection %d: found %d, counted %d, resynced %v; want 1, 1, none", i, st.HalfOpen, st.HalfOpenCounted, st.HalfOpenResynced)
			}
		}
	})
}

// flagsIn returns the flags of the entry under k in the conntrack map m
// (of k's family), if any.
func flagsIn(t *testing.T, m *ebpf.Map, k ctK) (uint32, bool) {
	t.Helper()
	if k.v6() {
		key, v := k.k6(), tcCt6Entry{}
		err := m.Lookup(&key, &v)
		return v.Flags, err == nil
	}
	key, v := k.k4(), sockCt4Entry{}
	err := m.Lookup(&key, &v)
	return v.Flags, err == nil
}
