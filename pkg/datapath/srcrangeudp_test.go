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
		ranges := srcRangeLB(t, d, lb, be)
		ranges(pick("192.168.1.0/24", "2001:db8:100::/64"))

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
		ranges(pick("192.168.1.0/28", "2001:db8:100::/124"))
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

// srcRangeLB writes the LoadBalancer IP lb of d, served by be, through a
// reconciler of its own, and returns what applies it again with the one
// source range p.
func srcRangeLB(t *testing.T, d *Datapath, lb model.L4Addr, be testBackend) func(p string) {
	rec := reconciler.New(d.Maps(), nil)
	return func(p string) {
		t.Helper()
		applyWith(t, rec, &model.Service{Name: model.ServicePortName{Namespace: "test", Name: "lb-ranges"}, Kind: model.LoadBalancer,
			Frontend: lb, Backends: []model.Backend{{L4Addr: be.addr}}, SourceRanges: []netip.Prefix{netip.MustParsePrefix(p)}})
	}
}

// TestSourceRangesKeepEstablishedLocalBackend: TestSourceRangesKeepEstablished
// for a LoadBalancer IP whose backend is on this node (pod0): the flow is
// DNATed only, its entry half-open until the backend's reply, which
// leaves by eth0, where tc's egress translates it back. An answered flow
// goes on after a narrowing (through tc, and through XDP, which passes a
// flow to a local backend to tc); an unanswered one's retransmitted SYN
// is dropped, counted (by XDP where it runs). IPv4 (nodeNetns has no
// IPv6 route to pod0).
func TestSourceRangesKeepEstablishedLocalBackend(t *testing.T) {
	for _, xdp := range []bool{false, true} {
		t.Run(map[bool]string{false: "tc", true: "xdp"}[xdp], func(t *testing.T) {
			ifindex, d := nodeDatapathFam(t, false, xdpConfig)
			lb := l4("192.168.1.212", 80, model.TCP)
			ranges := srcRangeLB(t, d, lb, beLocal)
			ranges("192.168.1.0/24")
			dnat := func(p packet.Packet) packet.Packet { p.Dst, p.DstPort = beLocal.addr.Addr, beLocal.addr.Port; return p }
			syn, unanswered := nsClient(43000, lb), nsClient(43001, lb)
			for _, in := range []packet.Packet{syn, unanswered} {
				expectRun(t, "SYN", d.TCIngress(), ifindex, in, tcActOK, dnat(in))
			}
			synAck := packet.Packet{SrcMAC: macOf(nodeEthMAC), DstMAC: clientMAC, Src: beLocal.addr.Addr, SrcPort: beLocal.addr.Port,
				Dst: syn.Src, DstPort: syn.SrcPort, Proto: packet.TCP, TCPFlags: tcpSA}
			back := synAck
			back.Src, back.SrcPort = lb.Addr, lb.Port
			expectRun(t, "the backend's SYN-ACK at eth0's egress", d.TCEgress(), ifindex, synAck, tcActOK, back)

			ranges("192.168.1.0/28")
			before := counters(t, d)
			data := syn
			data.TCPFlags, data.Payload = tcpACK|packet.PSH, []byte("GET / HTTP/1.0\r\n\r\n")
			if xdp {
				if v, out := runXDP(t, d.XDP(), ifindex, data.Bytes()); v != xdpPass || !bytes.Equal(out, data.Bytes()) {
					t.Errorf("the established flow's data at XDP after the narrowing: verdict %d, want XDP_PASS (%d) untouched", v, xdpPass)
				}
			}
			expectRun(t, "the established flow's data after the narrowing", d.TCIngress(), ifindex, data, tcActOK, dnat(data))
			run, dropped, counted := runOn, uint32(tcActShot), map[string]uint64{"tc_src_range_deny": 1, "xdp_src_range_deny": 0}
			prog := d.TCIngress()
			if xdp {
				run, dropped, prog = runXDP, xdpDrop, d.XDP()
				counted = map[string]uint64{"tc_src_range_deny": 0, "xdp_src_range_deny": 1}
			}
			if v, _ := run(t, prog, ifindex, unanswered.Bytes()); v != dropped {
				t.Errorf("the unanswered flow's retransmitted SYN: verdict %d, want a drop (%d)", v, dropped)
			}
			after := counters(t, d)
			for reason, want := range counted {
				if got := after[reason] - before[reason]; got != want {
					t.Errorf("%s +%d, want +%d", reason, got, want)
				}
			}
		})
	}
}
