package datapath

import (
	"testing"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/model"
)

// pinnedEntries lists the conntrack entries through the pins, as sluicectl
// does.
func pinnedEntries(t *testing.T, bpffs string) (*Pinned, []ConntrackEntry) {
	t.Helper()
	p, err := OpenPinned(bpffs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() }) // read handles: nothing to lose
	es, err := p.Conntrack()
	if err != nil {
		t.Fatal(err)
	}
	return p, es
}

// TestDeleteConntrackFlow: deleting a flow by either of its entries takes
// both, and leaves the other flows alone.
func TestDeleteConntrackFlow(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		a, vip := twinOf(v6), twinL4(v6, vipUDP)
		testutil.Privileged(t)
		bpffs := testPinDir(t)
		d := openTest(t, smallConfig(bpffs))
		m := d.Maps()
		addService(t, m, 1, vip, testBackend{31, l4(a("10.1.3.1"), 5353, model.UDP)})
		for _, port := range []uint16{42001, 42002} {
			runProg(t, d.TCIngress(), udpDgram(a("10.0.0.4"), port, a("10.96.0.11"), 53).Bytes())
		}
		fwd1 := ctKeyOf(a("10.0.0.4"), 42001, a("10.96.0.11"), 53, model.UDP, ctForward)
		rev1 := ctKeyOf(a("10.1.3.1"), 5353, a("10.0.0.4"), 42001, model.UDP, ctReverse)
		fwd2 := ctKeyOf(a("10.0.0.4"), 42002, a("10.96.0.11"), 53, model.UDP, ctForward)
		rev2 := ctKeyOf(a("10.1.3.1"), 5353, a("10.0.0.4"), 42002, model.UDP, ctReverse)
		for _, k := range []ctK{fwd1, rev1, fwd2, rev2} {
			if _, ok := ctLookup(t, m, k); !ok {
				t.Fatalf("no conntrack entry %+v after the datagrams: the test proves nothing", k)
			}
		}
		for _, c := range []struct {
			name    string
			reverse bool
			port    uint16
			gone    []ctK
		}{
			{"by its forward entry", false, 42001, []ctK{fwd1, rev1}},
			{"by its reverse entry", true, 42002, []ctK{fwd2, rev2}},
		} {
			p, es := pinnedEntries(t, bpffs)
			var sel []ConntrackEntry
			for _, e := range es {
				client := e.Src
				if e.Reverse {
					client = e.Dst
				}
				if e.Reverse == c.reverse && client.Port() == c.port {
					sel = append(sel, e)
				}
			}
			if len(sel) != 1 {
				t.Fatalf("%s: %d entries selected of %v", c.name, len(sel), es)
			}
			n, err := p.DeleteConntrack(sel)
			if err != nil || n != 2 {
				t.Errorf("%s: deleted %d entries (%v), want 2", c.name, n, err)
			}
			// The flows are half-open in sluice_conntrack: the forward
			// entry is lapsed, for the GC's claim to delete it and take
			// the flow off the half-open count.
			if _, err := m.GCConntrack(); err != nil {
				t.Fatal(err)
			}
			wantCounted(t, m, v6, int64(map[uint16]int{42001: 1, 42002: 0}[c.port]), c.name)
			for _, k := range c.gone {
				if _, ok := ctLookup(t, m, k); ok {
					t.Errorf("%s: entry %+v still there", c.name, k)
				}
			}
			if c.port == 42001 {
				for _, k := range []ctK{fwd2, rev2} {
					if _, ok := ctLookup(t, m, k); !ok {
						t.Errorf("deleting flow 42001 took entry %+v of flow 42002", k)
					}
				}
			}
			// Deleting again finds nothing.
			if n, err := p.DeleteConntrack(sel); err != nil || n != 0 {
				t.Errorf("%s again: deleted %d (%v), want 0", c.name, n, err)
			}
		}
	})
}

// TestDeleteConntrackSNATReservation: deleting a source-NATed flow frees
// its SNAT port reservation, so the port goes to the next flow.
func TestDeleteConntrackSNATReservation(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		h := holdSNATPort(t, v6)
		d, m, ifindex, bpffs, syn, sp, rev := h.d, h.m, h.ifindex, h.bpffs, h.syn, h.port, h.rev
		if _, ok := ctLookup(t, m, rev); !ok {
			t.Fatal("no port reservation after the SYN: the test proves nothing")
		}
		other := syn
		other.Src = addr(twinAddr(v6, "172.16.0.30"))
		if v, out := runOn(t, d.TCIngress(), ifindex, other.Bytes()); v == tcActRedirect && outSport(out) == sp {
			t.Fatalf("a second flow took the only port %d while the first holds it", sp)
		}

		p, es := pinnedEntries(t, bpffs)
		var sel []ConntrackEntry
		for _, e := range es {
			if !e.Reverse && e.Src.Addr() == addr(h.client) && e.Src.Port() == 43000 {
				sel = append(sel, e)
			}
		}
		if len(sel) != 1 || !sel[0].SNAT.IsValid() {
			t.Fatalf("selected %v of %v, want the source-NATed forward entry", sel, es)
		}
		if n, err := p.DeleteConntrack(sel); err != nil || n != 2 {
			t.Errorf("deleted %d entries (%v), want 2: the flow and its port reservation", n, err)
		}
		// The reservation, unanswered, counts in the half-open share:
		// lapsed, for the GC's claim to delete it and take it off the
		// count, as a half-open flow's forward entry.
		if _, err := m.GCConntrack(); err != nil {
			t.Fatal(err)
		}
		wantCounted(t, m, v6, 0, "after the delete and the GC")
		if _, ok := ctLookup(t, m, rev); ok {
			t.Error("port reservation still there")
		}
		if v, out := runOn(t, d.TCIngress(), ifindex, other.Bytes()); v != tcActRedirect || outSport(out) != sp {
			t.Errorf("after the delete, a new flow got verdict %d port %d, want the freed port %d", v, outSport(out), sp)
		}
	})
}
