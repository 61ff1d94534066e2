package datapath

import (
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/pkg/model"
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
		d, m, be, f := claimTestFlow(t, v6, "10.0.60.2", 21001)
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

// TestPromoteStopsOnClaimedHalfOpenEntry: the first answer of a
// half-open flow whose forward entry in sluice_ct_new another deleter has
// claimed (and not deleted yet: a flush ending the flow, or a new flow
// superseding it) does not promote the flow: nothing of it is left in
// sluice_conntrack, the answer goes on untranslated as a stale one, the
// claimed entry is left to its claimer and the reply entry goes. Before,
// the promotion went ahead: its established entries escaped a flush
// that had gone over sluice_conntrack already, or shadowed the half-open
// forward entry of the new flow that superseded it, and every forward
// packet of that new flow went to the old backend.
func TestPromoteStopsOnClaimedHalfOpenEntry(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		d, m, be, f := claimTestFlow(t, v6, "10.0.60.3", 21002)
		if v, _, err := runProgErr(d.TCIngress(), f.pkt(0).Bytes()); err != nil || v != tcActOK {
			t.Fatalf("datagram: verdict %d, %v", v, err)
		}
		claimHalfOpen(t, m, f.fwdKey())

		v, out, err := runProgErr(d.TCEgress(), f.from(be.addr, 0).Bytes())
		if err != nil || v != tcActOK || outSrc(out) != be.addr.Addr.String() {
			t.Fatalf("answer: verdict %d from %s (%v), want %d from %s (untranslated: the flow is gone)", v, outSrc(out), err, tcActOK, be.addr.Addr)
		}
		for _, k := range []ctK{f.fwdKey(), f.revKey(be.addr)} {
			if r, ok := ctInTable(t, m, k, false); ok {
				t.Errorf("%s: established entry %+v of a flow whose half-open entry was claimed, want none", k, r)
			}
		}
		wantClaimed(t, m, f.fwdKey(), true, "after the answer")
		if r, ok := ctInTable(t, m, f.revKey(be.addr), true); ok {
			t.Errorf("half-open reply entry %+v left after the answer", r)
		}
	})
}

// TestPromoteSNATStopsOnClaimedHalfOpenEntry: the same for a source-NATed
// flow (ct_promote_snat): its first answer while its half-open forward
// entry is claimed inserts no established forward entry and leaves its
// port reservation unanswered, to the claimer, who ends it too (a flush
// of the backend, a new flow superseding it). Before, the forward entry
// went into sluice_conntrack and the reservation was marked answered.
func TestPromoteSNATStopsOnClaimedHalfOpenEntry(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		h := holdSNATPort(t, v6)
		fk := h.fwd
		claimHalfOpen(t, h.m, fk)

		runOn(t, h.d.TCIngress(), h.ifindex, replyFrom(h.be, h.port, tcpSA).Bytes())
		if r, ok := ctInTable(t, h.m, fk, false); ok {
			t.Errorf("established forward entry %+v of a flow whose half-open entry was claimed, want none", r)
		}
		wantClaimed(t, h.m, fk, true, "after the answer")
		if r, ok := ctLookup(t, h.m, h.rev); !ok || r.flags&ctFlagReplied != 0 {
			t.Errorf("port reservation %+v (found %v), want it there, unanswered, left to the claimer", r, ok)
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
		d, ifindex, np, _ := snatNode(t, v6, base)
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
		if n := mapLen(t, ctTablesOf(t, m, fk)[0]); n != 0 {
			t.Errorf("%d entries in sluice_conntrack, want none: the port reserved for a flow that was not recorded goes back", n)
		}

		ctRemove(t, m, fk)
		if v, _ := runOn(t, d.TCIngress(), ifindex, syn.Bytes()); v != tcActRedirect {
			t.Fatalf("SYN once the entry is gone: verdict %d, want %d", v, tcActRedirect)
		}
		if r, ok := ctInTable(t, m, fk, true); !ok || r.expires == 0 {
			t.Errorf("forward entry %+v (found %v), want it alive", r, ok)
		}
		if n := mapLen(t, ctTablesOf(t, m, fk)[0]); n != 1 {
			t.Errorf("%d entries in sluice_conntrack, want the flow's port reservation", n)
		}
	})
}
