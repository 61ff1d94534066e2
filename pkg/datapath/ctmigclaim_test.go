package datapath

import (
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
)

// TestMigrationJudgesNewEntriesAsTheDatapath: while conntrack is carried
// over to resized maps (bpf/migrate.c), the shim judges what the new maps
// hold under a flow's key as the live path does (bpf/lib/migrate_fam.h,
// mig_put):
//
//   - an entry another deleter has claimed (expiry CT_DEAD; the GC reaping
//     a finished flow on a reused tuple) is left to it, and the old map's
//     flow is carried over by its next packet once the claimer has deleted
//     it. Before, the claimed entry was overwritten (a claimed entry is
//     seen earliest of all, so the old map's superseded it), and the
//     claimer's delete then took the carried entry;
//   - a lapsed entry of the same flow, established or half-open, counts as
//     absent, and the old map's live entry replaces it. Before, it kept the
//     flow out (an entry of the same flow is never superseded, and a
//     half-open entry in the new maps never), and the flow's next packet
//     met by a new program found nothing alive: a new flow, a reset.
func TestMigrationJudgesNewEntriesAsTheDatapath(t *testing.T) {
	testutil.Privileged(t)
	forCTFamilies(t, testMigrationJudges, testMigrationJudges)
}

// migJudge is the setup both tests below share: a datapath whose links
// run the programs of old maps (d1, its conntrack map old), and a second
// one open on the same pins with a larger conntrack table, so migrating
// (d2: its maps cur and half, the shims not yet replaced); with ways to
// plant entries in them.
type migJudge[K ctMigKey[K], V ctTestValue] struct {
	d2             *Datapath
	old, cur, half *ebpf.Map
	now            uint64
	put            func(m *ebpf.Map, k *K, v *V)
	oldFlow        func(cport uint16) (fk K, fv V, rk K, rv V)
	entry          func(cport uint16, backend string, expires uint64, flags uint32) V
}

func newMigJudge[K ctMigKey[K], V ctTestValue](t *testing.T, fam ctFamily[K, V], name string) *migJudge[K, V] {
	t.Helper()
	bpffs := testPinDir(t)
	ns := topology.NewNS(t, name)
	ns.Enter(t)
	addVeths(t, [2]string{"sl-r", "sl-s"})
	d1 := openTest(t, smallConfig(bpffs))
	if err := d1.AttachDevices([]string{"sl-r"}); err != nil {
		t.Fatal(err)
	}
	f := &migJudge[K, V]{}
	f.old, _ = fam.maps(d1)
	cfg := smallConfig(bpffs)
	cfg.MaxConntrack = 8192
	f.d2 = openTest(t, cfg)
	if shim, _ := f.d2.migrating(); !shim {
		t.Fatal("no migration shims")
	}
	f.cur, f.half = fam.maps(f.d2)
	var err error
	if f.now, err = monotonicNow(); err != nil {
		t.Fatal(err)
	}
	f.put = func(m *ebpf.Map, k *K, v *V) {
		t.Helper()
		if err := m.Update(k, v, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
	}
	// oldFlow is an established flow the old programs made after the
	// copy at the start, in the old map, seen now (its lifetime to live:
	// the tests' copies are not a moment later).
	f.oldFlow = func(cport uint16) (fk K, fv V, rk K, rv V) {
		fk4, fv4, rk4, rv4 := ctFlow(t, "10.0.0.9", cport, "10.96.5.1", "10.2.5.1")
		fv4.Expires = f.now + cfg.ctTimeouts().lifetime(fk4.Proto, fv4.Flags)
		rv4.Expires = fv4.Expires
		fk, fv = fam.of(fk4, fv4)
		rk, rv = fam.of(rk4, rv4)
		f.put(f.old, &fk, &fv)
		f.put(f.old, &rk, &rv)
		return fk, fv, rk, rv
	}
	// entry is the forward entry of the flow from cport, to backend, in
	// the new maps: with expires and flags.
	f.entry = func(cport uint16, backend string, expires uint64, flags uint32) V {
		k4, v4, _, _ := ctFlow(t, "10.0.0.9", cport, "10.96.5.1", backend)
		v4.Expires, v4.Flags = expires, flags
		_, v := fam.of(k4, v4)
		return v
	}
	return f
}

func testMigrationJudges[K ctMigKey[K], V ctTestValue](t *testing.T, fam ctFamily[K, V]) {
	f := newMigJudge(t, fam, "migclaim")
	d2, cur, half, now, put, oldFlow, entry := f.d2, f.cur, f.half, f.now, f.put, f.oldFlow, f.entry
	shim := func(cport uint16) {
		t.Helper()
		if v, _ := runProg(t, d2.shim.SluiceMigTc, fam.ack("10.0.0.9", cport, "10.96.5.1").Bytes()); v != uint32(0xffffffff) {
			t.Fatalf("shim verdict %d, want TC_ACT_UNSPEC", int32(v))
		}
	}
	want := func(when string, k *K, w V) {
		t.Helper()
		var got V
		if err := cur.Lookup(k, &got); err != nil || got != w {
			t.Errorf("%s: new map has %+v (%v) under %+v, want %+v", when, got, err, *k, w)
		}
	}

	// A claimed entry of the tuple's finished flow (backend .2).
	fk, fv, rk, rv := oldFlow(40011)
	claimed := entry(40011, "10.2.5.2", 0, ctFlagReplied|ctFlagFinFwd|ctFlagFinRev)
	put(cur, &fk, &claimed)
	shim(40011)
	want("claimed entry, after the shim", &fk, claimed)
	var got V
	if err := cur.Lookup(&rk, &got); err == nil {
		t.Errorf("reply entry carried over beside a claimed forward key: %+v", got)
	}
	if err := cur.Delete(&fk); err != nil { // the claimer's delete
		t.Fatal(err)
	}
	shim(40011)
	want("once the claimed entry is deleted", &fk, fv)
	want("once the claimed entry is deleted", &rk, rv)

	// A lapsed established entry of the same flow.
	fk, fv, rk, rv = oldFlow(40012)
	lapsed := entry(40012, "10.2.5.1", now-1e9, ctFlagReplied)
	put(cur, &fk, &lapsed)
	shim(40012)
	want("lapsed entry of the same flow", &fk, fv)
	want("lapsed entry of the same flow", &rk, rv)

	// A lapsed half-open entry of the same flow, copied at the start.
	fk, fv, rk, rv = oldFlow(40013)
	lapsed = entry(40013, "10.2.5.1", now-1e9, 0)
	put(half, &fk, &lapsed)
	shim(40013)
	want("lapsed half-open entry of the same flow", &fk, fv)
	want("lapsed half-open entry of the same flow", &rk, rv)
}

// TestSettleJudgesNewEntriesAsTheDatapath: the copy at the end of a
// migration, once the links run the new programs (settle's ctPlace),
// judges the new maps' entries as the shim does
// (TestMigrationJudgesNewEntriesAsTheDatapath), from user space:
//
//   - an entry another deleter has claimed is left to it, and neither the
//     flow's entry under that key nor its other entry is copied (the flow
//     cannot be whole; its next packet is a new flow). Before, the claimed
//     entry was overwritten (BPF_ANY: seen earliest of all, it was
//     superseded), and the claimer's delete by key took the copied entry;
//   - a lapsed entry of the same flow, established or half-open, counts as
//     absent: the old map's live entry is copied (over the established
//     one, deleted first; beside the half-open one, which the datapath
//     looks up after sluice_conntrack). Before, it kept the flow out, and
//     the flow's next packet was balanced afresh.
func TestSettleJudgesNewEntriesAsTheDatapath(t *testing.T) {
	testutil.Privileged(t)
	forCTFamilies(t, testSettleJudges, testSettleJudges)
}

func testSettleJudges[K ctMigKey[K], V ctTestValue](t *testing.T, fam ctFamily[K, V]) {
	f := newMigJudge(t, fam, "setclaim")
	d2, cur, half, now, put, oldFlow, entry := f.d2, f.cur, f.half, f.now, f.put, f.oldFlow, f.entry
	// A claimed entry of the tuple's finished flow (backend .2).
	cfk, _, crk, _ := oldFlow(40021)
	claimed := entry(40021, "10.2.5.2", 0, ctFlagReplied|ctFlagFinFwd|ctFlagFinRev)
	put(cur, &cfk, &claimed)
	// A lapsed established entry of the same flow.
	lfk, lfv, lrk, lrv := oldFlow(40022)
	lapsed := entry(40022, "10.2.5.1", now-1e9, ctFlagReplied)
	put(cur, &lfk, &lapsed)
	// A lapsed half-open entry of the same flow, copied at the start.
	hfk, hfv, hrk, hrv := oldFlow(40023)
	lapsedHalf := entry(40023, "10.2.5.1", now-1e9, 0)
	put(half, &hfk, &lapsedHalf)

	if err := d2.AttachDevices([]string{"sl-r"}); err != nil {
		t.Fatal(err)
	}
	if len(d2.migrations) != 0 {
		t.Fatalf("migrations left after the switch: %d", len(d2.migrations))
	}
	want := func(when string, k *K, w V) {
		t.Helper()
		var got V
		if err := cur.Lookup(k, &got); err != nil || got != w {
			t.Errorf("%s: new map has %+v (%v) under %+v, want %+v", when, got, err, *k, w)
		}
	}
	want("claimed entry", &cfk, claimed)
	var got V
	if err := cur.Lookup(&crk, &got); err == nil {
		t.Errorf("reply entry copied beside a claimed forward key: %+v", got)
	}
	want("lapsed entry of the same flow", &lfk, lfv)
	want("lapsed entry of the same flow", &lrk, lrv)
	want("lapsed half-open entry of the same flow", &hfk, hfv)
	want("lapsed half-open entry of the same flow", &hrk, hrv)
}
