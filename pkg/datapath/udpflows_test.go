package datapath

import (
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// TestUDPFlowBackends: the backends of the UDP flows conntrack holds,
// per frontend, read from the forward entries of both families' tables:
// two clients' flows to a ClusterIP through its two backends, each with
// the backend id its entries name (a backend once however many flows use
// it), none from the reverse entries (their
// destination is a client) nor from a flow whose entry expired.
//
// Run twice: as configured by default (the flows, half-open, in
// sluice_conntrack) and with CTHalfOpenMax negative (every new flow in
// sluice_ct_new, the LRU, until its first reply), so that both tables
// are read.
func TestUDPFlowBackends(t *testing.T) {
	for _, allNew := range []bool{false, true} {
		t.Run(map[bool]string{false: "Conntrack", true: "CTNew"}[allNew], func(t *testing.T) {
			testUDPFlowBackends(t, allNew)
		})
	}
}

func testUDPFlowBackends(t *testing.T, allNew bool) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		a, vip := twinOf(v6), twinL4(v6, vipUDP)
		testutil.Privileged(t)
		d := openTestWith(t, smallConfig, func(c *Config) {
			if allNew {
				c.CTHalfOpenMax = -1
			}
		})
		m := d.Maps()
		b1, b2 := l4(a("10.1.3.1"), 5353, model.UDP), l4(a("10.1.3.2"), 5353, model.UDP)
		addService(t, m, 1, vip, testBackend{31, b1})
		// Each client's first datagrams go to b1; then b2 alone serves
		// and a new flow of each goes there.
		for _, port := range []uint16{42001, 42002} {
			for _, client := range []string{"10.0.0.4", "10.0.0.5"} {
				runProg(t, d.TCIngress(), udpDgram(a(client), port, a("10.96.0.11"), 53).Bytes())
			}
		}
		addService(t, m, 1, vip, testBackend{32, b2})
		runProg(t, d.TCIngress(), udpDgram(a("10.0.0.4"), 42003, a("10.96.0.11"), 53).Bytes())
		// An expired flow of another frontend's.
		other := twinL4(v6, l4("10.96.0.12", 53, model.UDP))
		addService(t, m, 2, other, testBackend{33, l4(a("10.1.3.3"), 5353, model.UDP)})
		runProg(t, d.TCIngress(), udpDgram(a("10.0.0.4"), 42004, a("10.96.0.12"), 53).Bytes())
		expire := ctKeyOf(a("10.0.0.4"), 42004, a("10.96.0.12"), 53, model.UDP, ctForward)
		if _, ok := ctLookup(t, m, expire); !ok {
			t.Fatalf("no conntrack entry %+v: the test proves nothing", expire)
		}
		ctSetSeen(t, m, expire, -time.Hour)
		// The table the flows are in: the run reads the one it means to.
		flow := ctKeyOf(a("10.0.0.4"), 42003, a("10.96.0.11"), 53, model.UDP, ctForward)
		newTable := m.ctNew
		if v6 {
			newTable = m.ctNew6
		}
		var inNew bool
		if v6 {
			k, v := flow.k6(), tcCt6Entry{}
			inNew = newTable.Lookup(&k, &v) == nil
		} else {
			k, v := flow.k4(), sockCt4Entry{}
			inNew = newTable.Lookup(&k, &v) == nil
		}
		if _, ok := ctLookup(t, m, flow); !ok || inNew != allNew {
			t.Fatalf("flow %+v: present %v, in the new flows' table %v, want %v: the test proves nothing", flow, ok, inNew, allNew)
		}
		got, err := m.UDPFlowBackends()
		if err != nil {
			t.Fatal(err)
		}
		for fe := range got {
			slices.SortFunc(got[fe], func(x, y reconciler.UDPFlowBackend) int { return x.Addr.Compare(y.Addr) })
		}
		want := map[model.L4Addr][]reconciler.UDPFlowBackend{vip: {{Addr: b1, ID: 31}, {Addr: b2, ID: 32}}}
		if !maps.EqualFunc(got, want, slices.Equal) {
			t.Errorf("UDPFlowBackends() = %v, want %v", got, want)
		}
	})
}
