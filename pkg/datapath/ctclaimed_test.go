package datapath

import (
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/pkg/model"
)

// claimTestFlow is the claimed-entry tests' setup: a test datapath
// holding a UDP Service (service id 1, the VIP vipUDP of v6's family)
// with one backend, and the flow to it from client:cport.
func claimTestFlow(t *testing.T, v6 bool, client string, cport uint16) (*Datapath, *Maps, testBackend, flow) {
	t.Helper()
	a, vip := twinOf(v6), twinL4(v6, vipUDP)
	// No half-open share: the flow goes through sluice_ct_new and its
	// promotion out of it, whose claim races these tests sequence.
	d := openTestWith(t, smallConfig, func(c *Config) { c.CTHalfOpenMax = -1 })
	m := d.Maps()
	be := testBackend{46, l4(a("10.1.4.6"), 5353, model.UDP)}
	addService(t, m, 1, vip, be)
	return d, m, be, flow{a(client), cport, vip}
}

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
		d, m, be, f := claimTestFlow(t, v6, "10.0.60.1", 21000)
		vip := f.fe
		if v, _, err := runProgErr(d.TCIngress(), f.pkt(0).Bytes()); err != nil || v != tcActOK {
			t.Fatalf("datagram: verdict %d, %v", v, err)
		}

		// The reply tuple's previous flow, claimed by another deleter.
		rk := f.revKey(be.addr)
		plantClaimed(t, m, rk)

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

// plantClaimed writes under k, into sluice_conntrack of k's family, an
// entry that another deleter has claimed (expiry CT_DEAD) and holds for
// good: the moment between a claim and its delete, without timing.
func plantClaimed(t *testing.T, m *Maps, k ctK) {
	t.Helper()
	est := ctTablesOf(t, m, k)[0]
	var err error
	if k.v6() {
		key := k.k6()
		err = est.Update(&key, &tcCt6Entry{Expires: 0}, ebpf.UpdateNoExist)
	} else {
		key := k.k4()
		err = est.Update(&key, &sockCt4Entry{Expires: 0}, ebpf.UpdateNoExist)
	}
	if err != nil {
		t.Fatalf("plant a claimed entry %s: %v", k, err)
	}
}

// TestPromoteSNATWaitsForClaimedEntry: the first answer of a source-NATed
// flow, whose forward key <client -> frontend> is held in sluice_conntrack
// by a dead entry another deleter has claimed and not deleted yet (the
// tuple's previous flow, reaped by the GC as the client reuses its port),
// goes through, translated back to the client, and leaves the flow
// half-open, its port reservation unanswered (CT_DEFERRED); once the entry
// is deleted, the next answer promotes the flow. Before, ct_promote_snat's
// insert failed with -EEXIST and the SYN-ACK was dropped as a clash.
func TestPromoteSNATWaitsForClaimedEntry(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		h := holdSNATPort(t, v6)
		be, np, fk := h.be, h.np, h.fwd
		plantClaimed(t, h.m, fk)

		answer := func(what string) {
			t.Helper()
			v, out := runOn(t, h.d.TCIngress(), h.ifindex, replyFrom(be, h.port, tcpSA).Bytes())
			if v != tcActRedirect || outSrc(out) != np.Addr.String() || outDst(out) != h.client {
				t.Fatalf("%s: verdict %d from %s to %s, want %d from %s to %s", what, v, outSrc(out), outDst(out), tcActRedirect, np.Addr, h.client)
			}
		}
		answer("SYN-ACK while the forward key holds a claimed entry")
		if cs := counters(t, h.d); cs["tc_ct_clash"] != 0 {
			t.Errorf("tc_ct_clash %d, want 0: the claimed entry is no other flow's", cs["tc_ct_clash"])
		}
		if r, ok := ctLookup(t, h.m, h.rev); !ok || r.flags&ctFlagReplied != 0 {
			t.Errorf("port reservation %+v (found %v), want it there, unanswered", r, ok)
		}

		// The claimer deletes it; the flow is still half-open, and the
		// next answer promotes it.
		ctRemove(t, h.m, fk)
		if r, ok := ctLookup(t, h.m, fk); !ok || r.flags&ctFlagReplied != 0 {
			t.Errorf("forward entry %+v (found %v), want it there, still half-open", r, ok)
		}
		answer("SYN-ACK once the claimed entry is gone")
		for _, k := range []ctK{fk, h.rev} {
			if r, ok := ctLookup(t, h.m, k); !ok || r.flags&ctFlagReplied == 0 {
				t.Errorf("%s: entry %+v (found %v), want it established", k, r, ok)
			}
		}
	})
}
