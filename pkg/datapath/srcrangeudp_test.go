package datapath

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/sluice-lb/sluice/internal/testutil/packet"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// TestSourceRangesKeepEstablishedUDP: TestSourceRangesKeepEstablished
// for UDP. A UDP flow the backend has answered is one netfilter no longer
// sees as `ct state new` (its conntrack has seen a reply), so a narrowing
// of loadBalancerSourceRanges leaves it going, through tc and through
// XDP; a flow not answered yet is still new to netfilter, so its next
// datagram is checked and refused, as a new flow's first one is.
func TestSourceRangesKeepEstablishedUDP(t *testing.T) {
	srcRangesNarrowedHooks(t, model.UDP)
}

// TestSourceRangesClosedTupleReused: a flow answered and then closed
// leaves an entry that is answered but not usable for a new connection
// on its tuple (a client reusing its port). After a narrowing of
// loadBalancerSourceRanges that leaves the client out, its SYN on that
// tuple is a new connection to netfilter (a SYN on a closed conntrack
// starts a new one: `ct state new`), so kube-proxy checks it and refuses
// it. XDP, which skips the check for an answered entry, passes the SYN to
// tc untouched (it does not follow an entry tc would not: ct_fwd_usable),
// and tc, which finds no usable entry, checks it and drops it, counted
// tc_src_range_deny. Per family; the flow opened and closed through XDP.
func TestSourceRangesClosedTupleReused(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		ifindex, d := nodeDatapathFam(t, v6, xdpConfig)
		pick := func(s4, s6 string) string {
			if v6 {
				return s6
			}
			return s4
		}
		lb := l4(pick("192.168.1.211", "2001:db8:100::d3"), 80, model.TCP)
		be := testBackend{addr: nsTwinL4(v6, beRemote.addr)} // on node 2
		rec := reconciler.New(d.Maps(), nil)
		ranges := func(p string) *model.Service {
			return &model.Service{Name: model.ServicePortName{Namespace: "test", Name: "lb-reuse"}, Kind: model.LoadBalancer,
				Frontend: lb, Backends: []model.Backend{{L4Addr: be.addr}}, SourceRanges: []netip.Prefix{netip.MustParsePrefix(p)}}
		}
		applyWith(t, rec, ranges(pick("192.168.1.0/24", "2001:db8:100::/64")))

		const cport = 42000
		sp := xdpRoundTrip(t, d, ifindex, nsClient(cport, lb), lb, be, tcpSA)
		fin := nsClient(cport, lb)
		fin.TCPFlags = tcpFA
		ack := fin
		ack.TCPFlags = tcpACK
		beFin := replyFrom(be, sp, tcpFA)
		for _, c := range []struct {
			name    string
			in, out packet.Packet
		}{
			{"the client's FIN", fin, toRemote(fin, sp, be)},
			{"the backend's FIN", beFin, toClient(beFin, lb, cport)},
			{"the client's last ACK", ack, toRemote(ack, sp, be)},
		} {
			v, out := runXDP(t, d.XDP(), ifindex, c.in.Bytes())
			expectPacket(t, c.name, v, xdpTx, out, c.out)
		}

		// Narrowed to leave the client (nsClientIP, nsClientIP6) out.
		applyWith(t, rec, ranges(pick("192.168.1.0/28", "2001:db8:100::/124")))
		before := counters(t, d)
		syn := nsClient(cport, lb).Bytes()
		if v, out := runXDP(t, d.XDP(), ifindex, syn); v != xdpPass || !bytes.Equal(out, syn) {
			t.Errorf("a SYN on the closed flow's tuple at XDP: verdict %d, want XDP_PASS (%d) untouched", v, xdpPass)
		}
		if v, _ := runOn(t, d.TCIngress(), ifindex, syn); v != tcActShot {
			t.Errorf("a SYN on the closed flow's tuple at tc: verdict %d, want a drop (%d)", v, tcActShot)
		}
		after := counters(t, d)
		for reason, want := range map[string]uint64{"tc_src_range_deny": 1, "xdp_src_range_deny": 0} {
			if got := after[reason] - before[reason]; got != want {
				t.Errorf("%s +%d, want +%d", reason, got, want)
			}
		}
	})
}
