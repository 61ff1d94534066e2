package datapath

import (
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/pkg/model"
)

// TestPromoteWaitsForClaimedEntry: the first answer of a half-open flow
// whose reply tuple is held in sluice_conntrack by a dead entry that
// another deleter has claimed (expiry CT_DEAD) and not deleted yet, as
// when the agent's GC reaps a tuple's previous flow while the tuple is
// re-created, goes through, translated, and leaves the flow half-open
// (CT_DEFERRED); once the claimer has deleted the entry, the next answer
// promotes the flow. Before, that answer was dropped as a clash: a lost
// datagram now and then while the GC ran (TestCTGCKeepsRecreatedFlows
// failed with "answer to ...: verdict 2" under load). A claimed entry is
// held here for good, written with the expiry CT_DEAD, so the race is
// shown without timing.
func TestPromoteWaitsForClaimedEntry(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		a, vip := twinOf(v6), twinL4(v6, vipUDP)
		d := newTestDatapath(t)
		m := d.Maps()
		be := testBackend{46, l4(a("10.1.4.6"), 5353, model.UDP)}
		addService(t, m, 1, vip, be)
		f := flow{a("10.0.60.1"), 21000, vip}
		if v, _, err := runProgErr(d.TCIngress(), f.pkt(0).Bytes()); err != nil || v != tcActOK {
			t.Fatalf("datagram: verdict %d, %v", v, err)
		}

		// The reply tuple's previous flow, claimed by another deleter.
		rk := f.revKey(be.addr)
		est := ctTablesOf(t, m, rk)[0]
		var err error
		if v6 {
			k := rk.k6()
			err = est.Update(&k, &tcCt6Entry{Expires: 0}, ebpf.UpdateNoExist)
		} else {
			k := rk.k4()
			err = est.Update(&k, &sockCt4Entry{Expires: 0}, ebpf.UpdateNoExist)
		}
		if err != nil {
			t.Fatal(err)
		}

		answer := func(what string) {
			t.Helper()
			v, out, err := runProgErr(d.TCEgress(), f.from(be.addr, 0).Bytes())
			if err != nil || v != tcActOK || outSrc(out) != vip.Addr.String() {
				t.Fatalf("%s: verdict %d from %s (%v), want %d from %s", what, v, outSrc(out), err, tcActOK, vip.Addr)
			}
		}
		answer("answer while the reply tuple's old entry is claimed")
		if cs := counters(t, d); cs["tc_ct_clash"] != 0 {
			t.Errorf("tc_ct_clash %d, want 0: the claimed entry is no other flow's", cs["tc_ct_clash"])
		}
		if r, ok := ctLookup(t, m, f.fwdKey()); !ok || r.flags&ctFlagReplied != 0 {
			t.Errorf("forward entry %+v (found %v), want it there, still half-open", r, ok)
		}

		// The claimer deletes it; the next answer promotes the flow.
		ctRemove(t, m, rk)
		answer("answer once the old entry is gone")
		for _, k := range []ctK{f.fwdKey(), rk} {
			if r, ok := ctLookup(t, m, k); !ok || r.flags&ctFlagReplied == 0 {
				t.Errorf("%s: entry %+v (found %v), want it established", k, r, ok)
			}
		}
	})
}
