package datapath

import (
	"net/netip"
	"testing"

	"github.com/sluice-lb/sluice/internal/testutil/packet"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// TestUDPStandbyKeepsFlows: per-packet UDP flows keep a backend that
// leaves the slots while its Service port still serves it (standby:
// serving and terminating while another is ready), as kube-proxy's
// conntrack cleanup keeps them, through the reconciler over the real
// maps: no flush, and the backend entry their conntrack entries name
// stays (ct_fwd_usable would re-balance them were it gone). Once the
// backend no longer serves, its flows are flushed and re-balanced.
func TestUDPStandbyKeepsFlows(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		a := twinOf(v6)
		d := newTestDatapath(t)
		rec := reconciler.New(d.Maps(), nil)
		fe := l4(a("10.96.0.70"), 53, model.UDP)
		b1, b2 := l4(a("10.1.9.7"), 5353, model.UDP), l4(a("10.1.9.8"), 5353, model.UDP)
		apply := func(backends []model.L4Addr, standby ...model.L4Addr) {
			t.Helper()
			s := clusterIP(fe, backends...)
			s.Standby = standby
			st := model.NewState()
			st.Services.Set(fe, s)
			if err := rec.Apply(st); err != nil {
				t.Fatal(err)
			}
		}
		// to sends one datagram of f and returns the backend it reached.
		to := func(f flow) netip.Addr {
			t.Helper()
			_, out := runProg(t, d.TCIngress(), f.pkt(0).Bytes())
			p, err := packet.Parse(out)
			if err != nil {
				t.Fatal(err)
			}
			return p.Dst
		}
		apply([]model.L4Addr{b1, b2})
		var flows []flow // to b1
		for i := 0; len(flows) < 8; i++ {
			if i == 512 {
				t.Fatalf("%d of 512 flows reached %s", len(flows), b1)
			}
			f := flow{a("10.0.9.9"), uint16(53000 + i), fe}
			if to(f) == b1.Addr {
				runProg(t, d.TCEgress(), f.from(b1, 0).Bytes())
				flows = append(flows, f)
			}
		}

		apply([]model.L4Addr{b2}, b1) // b1 terminates, b2 is ready
		for _, f := range flows {
			if got := to(f); got != b1.Addr {
				t.Errorf("flow from port %d reached %s with %s in standby, want it kept", f.cport, got, b1)
			}
		}
		// A new flow avoids it.
		if got := to(flow{a("10.0.9.9"), 60000, fe}); got != b2.Addr {
			t.Errorf("a new flow reached %s, want %s", got, b2)
		}

		apply([]model.L4Addr{b2}) // b1 is gone
		for _, f := range flows {
			if _, ok := ctLookup(t, d.Maps(), f.revKey(b1)); ok {
				t.Errorf("flow from port %d: reply entry of %s kept after it stopped serving", f.cport, b1)
			}
			if got := to(f); got != b2.Addr {
				t.Errorf("flow from port %d reached %s after %s stopped serving, want %s", f.cport, got, b1, b2)
			}
		}
	})
}
