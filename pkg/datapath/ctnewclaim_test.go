package datapath

import (
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// The tests of this file hold an entry of sluice_ct_new claimed by
// another deleter (expiry CT_DEAD) for good, as ctclaimed_test.go's do
// with sluice_conntrack: the moment between a flush's (or a new flow's)
// claim of an entry and its delete by key, without timing. Whatever is
// under that key when the delete comes goes with it.

// ctInTable returns the entry under k in the table of k's family that
// half names (sluice_ct_new if set, else sluice_conntrack), alive or not.
func ctInTable(t *testing.T, m *Maps, k ctK, half bool) (ctView, bool) {
	t.Helper()
	cm := ctTablesOf(t, m, k)[b2n(half)]
	if k.v6() {
		key, v := k.k6(), tcCt6Entry{}
		if cm.Lookup(&key, &v) != nil {
			return ctView{}, false
		}
		return v.view(), true
	}
	key, v := k.k4(), sockCt4Entry{}
	if cm.Lookup(&key, &v) != nil {
		return ctView{}, false
	}
	return v.view(), true
}

// claimHalfOpen claims the entry under k in sluice_ct_new of k's family,
// as a flush does (its expiry to CT_DEAD), or plants a claimed entry
// there if there is none; its delete is left to the test.
func claimHalfOpen(t *testing.T, m *Maps, k ctK) {
	t.Helper()
	cm := ctTablesOf(t, m, k)[1]
	var err error
	if k.v6() {
		key, v := k.k6(), tcCt6Entry{}
		_ = cm.Lookup(&key, &v)
		v.Expires = 0
		err = cm.Update(&key, &v, ebpf.UpdateAny)
	} else {
		key, v := k.k4(), sockCt4Entry{}
		_ = cm.Lookup(&key, &v)
		v.Expires = 0
		err = cm.Update(&key, &v, ebpf.UpdateAny)
	}
	if err != nil {
		t.Fatalf("claim half-open entry %s: %v", k, err)
	}
}

// wantClaimed fails the test unless the entry under k in the table half
// names is there and still claimed: not overwritten, not deleted but by
// its claimer.
func wantClaimed(t *testing.T, m *Maps, k ctK, half bool, when string) {
	t.Helper()
	if v, ok := ctInTable(t, m, k, half); !ok || v.expires != 0 {
		t.Errorf("%s: entry under %s %+v (found %v), want the claimed one (expiry 0), left to its claimer", when, k, v, ok)
	}
}

// TestNewFlowLeavesClaimedHalfOpenEntry: a new flow whose forward key in
// sluice_ct_new holds the tuple's previous flow's entry, claimed by a
// flush of that flow's backend that has not deleted it yet, does not
// overwrite it: its datagram is dropped (tc_ct_clash), its reply entry
// goes again, and once the claimer has deleted the entry the next
// datagram makes the flow. Before, the insert (BPF_ANY) overwrote the
// claimed entry and the datagram went, but the claimer's delete took the
// new forward entry, and the flow's next datagram was balanced afresh.
// Likewise a half-open flow whose reply entry is claimed (a flush ending
// it) does not re-create it over the claim: its packet is dropped, as an
// established flow's is (ct_check_reverse).
func TestNewFlowLeavesClaimedHalfOpenEntry(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		a, vip := twinOf(v6), twinL4(v6, vipUDP)
		d := newTestDatapath(t)
		m := d.Maps()
		be := testBackend{46, l4(a("10.1.4.6"), 5353, model.UDP)}
		addService(t, m, 1, vip, be)
		f := flow{a("10.0.60.2"), 21001, vip}
		claimHalfOpen(t, m, f.fwdKey())

		v, _, err := runProgErr(d.TCIngress(), f.pkt(0).Bytes())
		if err != nil || v != tcActShot {
			t.Fatalf("datagram while its forward key's old entry is claimed: verdict %d (%v), want %d", v, err, tcActShot)
		}
		if cs := counters(t, d); cs["tc_ct_clash"] != 1 {
			t.Errorf("tc_ct_clash %d, want 1", cs["tc_ct_clash"])
		}
		wantClaimed(t, m, f.fwdKey(), true, "after the datagram")
		if r, ok := ctLookup(t, m, f.revKey(be.addr)); ok {
			t.Errorf("reply entry %+v left behind by a flow that was not recorded", r)
		}

		// The claimer deletes it; the next datagram makes the flow.
		ctRemove(t, m, f.fwdKey())
		if v, out, err := runProgErr(d.TCIngress(), f.pkt(0).Bytes()); err != nil || v != tcActOK || outDst(out) != be.addr.Addr.String() {
			t.Fatalf("datagram once the entry is gone: verdict %d to %s (%v), want %d to %s", v, outDst(out), err, tcActOK, be.addr.Addr)
		}
		for _, k := range []ctK{f.fwdKey(), f.revKey(be.addr)} {
			if r, ok := ctInTable(t, m, k, true); !ok || r.expires == 0 {
				t.Errorf("%s: half-open entry %+v (found %v), want it alive", k, r, ok)
			}
		}

		// A flush claims the half-open flow's reply entry: its next
		// datagram does not re-create it over the claim.
		claimHalfOpen(t, m, f.revKey(be.addr))
		if v, _, err := runProgErr(d.TCIngress(), f.pkt(0).Bytes()); err != nil || v != tcActShot {
			t.Fatalf("datagram while its reply entry is claimed: verdict %d (%v), want %d", v, err, tcActShot)
		}
		wantClaimed(t, m, f.revKey(be.addr), true, "after a datagram of the flow")
		ctRemove(t, m, f.revKey(be.addr))
		if v, _, err := runProgErr(d.TCIngress(), f.pkt(0).Bytes()); err != nil || v != tcActOK {
			t.Fatalf("datagram once the reply entry is gone: verdict %d (%v), want %d", v, err, tcActOK)
		}
		if r, ok := ctInTable(t, m, f.revKey(be.addr), true); !ok || r.expires == 0 {
			t.Errorf("reply entry %+v (found %v), want it re-created", r, ok)
		}
	})
}

// TestPromoteLeavesClaimedHalfOpenEntry: the first answer of a half-open
// flow whose forward entry in sluice_ct_new another deleter has claimed
// (and not deleted yet) promotes the flow, and leaves that entry to its
// claimer. Before, the promotion deleted it by key: the claimer's own
// delete, by key too, then took whatever was inserted there after (a new
// flow on the tuple). The reply entry, which the promotion found alive,
// is claimed and deleted as before.
func TestPromoteLeavesClaimedHalfOpenEntry(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		a, vip := twinOf(v6), twinL4(v6, vipUDP)
		d := newTestDatapath(t)
		m := d.Maps()
		be := testBackend{46, l4(a("10.1.4.6"), 5353, model.UDP)}
		addService(t, m, 1, vip, be)
		f := flow{a("10.0.60.3"), 21002, vip}
		if v, _, err := runProgErr(d.TCIngress(), f.pkt(0).Bytes()); err != nil || v != tcActOK {
			t.Fatalf("datagram: verdict %d, %v", v, err)
		}
		claimHalfOpen(t, m, f.fwdKey())

		v, out, err := runProgErr(d.TCEgress(), f.from(be.addr, 0).Bytes())
		if err != nil || v != tcActOK || outSrc(out) != vip.Addr.String() {
			t.Fatalf("answer: verdict %d from %s (%v), want %d from %s", v, outSrc(out), err, tcActOK, vip.Addr)
		}
		for _, k := range []ctK{f.fwdKey(), f.revKey(be.addr)} {
			if r, ok := ctInTable(t, m, k, false); !ok || r.flags&ctFlagReplied == 0 || r.expires == 0 {
				t.Errorf("%s: established entry %+v (found %v), want the flow promoted", k, r, ok)
			}
		}
		wantClaimed(t, m, f.fwdKey(), true, "after the promotion")
		if r, ok := ctInTable(t, m, f.revKey(be.addr), true); ok {
			t.Errorf("half-open reply entry %+v left after the promotion", r)
		}
	})
}

// TestSNATFlowLeavesClaimedHalfOpenEntry: a source-NATed flow's SYN whose
// forward key in sluice_ct_new holds an entry another deleter has claimed
// (a flush of the backend, ending the tuple's earlier flow) does not
// overwrite it: the SYN is dropped (tc_ct_clash) and the port it reserved
// is given back, for nothing would release it before its timeout; once
// the claimer has deleted the entry, the retransmitted SYN makes the
// flow. Before, the SYN went, and the claimer's delete took the new
// flow's forward entry.
func TestSNATFlowLeavesClaimedHalfOpenEntry(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		base := configWith(smallConfig, func(c *Config) { c.SNATPortMin, c.SNATPortMax = 62000, 62001 })
		var d *Datapath
		var ifindex int
		np := npRemote
		if v6 {
			_, ifindex, d = nodeDatapath6(t, base)
			np = np6Remote
		} else {
			_, ifindex, d = nodeDatapath(t, base, "eth0")
			addExternal(t, d.Maps(), 1, npRemote, reconciler.FlagExternal, beRemote)
		}
		m := d.Maps()
		syn := nsClient(43000, np)
		fk := ctKeyOf(syn.Src.String(), 43000, np.Addr.String(), np.Port, model.TCP, ctForward)
		claimHalfOpen(t, m, fk)

		if v, _ := runOn(t, d.TCIngress(), ifindex, syn.Bytes()); v != tcActShot {
			t.Fatalf("SYN while its forward key's old entry is claimed: verdict %d, want %d", v, tcActShot)
		}
		if cs := counters(t, d); cs["tc_ct_clash"] != 1 {
			t.Errorf("tc_ct_clash %d, want 1", cs["tc_ct_clash"])
		}
		wantClaimed(t, m, fk, true, "after the SYN")
		if n := ctCount(t, ctTablesOf(t, m, fk)[0]); n != 0 {
			t.Errorf("%d entries in sluice_conntrack, want none: the port reserved for a flow that was not recorded goes back", n)
		}

		ctRemove(t, m, fk)
		if v, _ := runOn(t, d.TCIngress(), ifindex, syn.Bytes()); v != tcActRedirect {
			t.Fatalf("SYN once the entry is gone: verdict %d, want %d", v, tcActRedirect)
		}
		if r, ok := ctInTable(t, m, fk, true); !ok || r.expires == 0 {
			t.Errorf("forward entry %+v (found %v), want it alive", r, ok)
		}
		if n := ctCount(t, ctTablesOf(t, m, fk)[0]); n != 1 {
			t.Errorf("%d entries in sluice_conntrack, want the flow's port reservation", n)
		}
	})
}

// ctCount is the number of entries in the conntrack table cm.
func ctCount(t *testing.T, cm *ebpf.Map) int {
	t.Helper()
	var k, v []byte
	n := 0
	it := cm.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}
