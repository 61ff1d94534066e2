package datapath

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/sluice-lb/sluice/internal/testutil/packet"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// TestSourceRangesKeepEstablished: loadBalancerSourceRanges are checked
// for a flow that has seen no reply only, as kube-proxy checks netfilter's
// `ct state new`. A LoadBalancer IP whose ranges admit the client, with a
// backend on node 2: the client's SYN is DNATed and SNATed, the backend's
// SYN-ACK translated back; a second flow of the client is admitted but
// never answered. Then an Apply narrows the ranges to leave the client
// out. The first flow goes on (the client's data still DNATed, the
// backend's answer back), not counted as a denied source; a new SYN of
// the client and the unanswered flow's retransmitted SYN are dropped and
// counted; a client the narrowed ranges admit still opens flows. Per
// family, through tc and through XDP (which counts its own drops);
// through tc, the dry run (sluicectl explain) says the same.
func TestSourceRangesKeepEstablished(t *testing.T) {
	srcRangesNarrowedHooks(t, model.TCP)
}

// srcRangesNarrowedHooks runs srcRangesNarrowed with flows of proto per
// family, through tc and through XDP.
func srcRangesNarrowedHooks(t *testing.T, proto model.Protocol) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		t.Run("tc", func(t *testing.T) { srcRangesNarrowed(t, v6, false, proto) })
		t.Run("xdp", func(t *testing.T) { srcRangesNarrowed(t, v6, true, proto) })
	})
}

// srcRangesNarrowed is TestSourceRangesKeepEstablished over v6's family,
// through XDP (xdp) or tc, with flows of proto (for UDP, a "SYN" is a
// flow's first datagram, a "SYN-ACK" the backend's first answer).
func srcRangesNarrowed(t *testing.T, v6, xdp bool, proto model.Protocol) {
	ifindex, d := nodeDatapathFam(t, v6, xdpConfig)
	pick := func(s4, s6 string) string {
		if v6 {
			return s6
		}
		return s4
	}
	lb := l4(pick("192.168.1.210", "2001:db8:100::d2"), 80, proto)
	be := testBackend{addr: l4(pick("10.2.0.7", "2001:db8:2::7"), 8080, proto)} // on node 2
	client := pick(nsClientIP, nsClientIP6)
	// wide admits the client; narrow leaves it out, admits admitted.
	wide := netip.MustParsePrefix(pick("192.168.1.0/24", "2001:db8:100::/64"))
	narrow := netip.MustParsePrefix(pick("192.168.1.0/28", "2001:db8:100::/124"))
	admitted := pick("192.168.1.5", "2001:db8:100::5")
	rec := reconciler.New(d.Maps(), nil)
	apply := func(r netip.Prefix) {
		t.Helper()
		st := model.NewState()
		st.Services.Set(lb, &model.Service{Name: model.ServicePortName{Namespace: "test", Name: "lb"}, Kind: model.LoadBalancer,
			Frontend: lb, Backends: []model.Backend{{L4Addr: be.addr}}, SourceRanges: []netip.Prefix{r}})
		if err := rec.Apply(st); err != nil {
			t.Fatalf("Apply with source range %s: %v", r, err)
		}
	}
	// send runs p through the hook under test, as arriving on eth0.
	send := func(p packet.Packet) (uint32, []byte) {
		t.Helper()
		if xdp {
			return runXDP(t, d.XDP(), ifindex, p.Bytes())
		}
		return runOn(t, d.TCIngress(), ifindex, p.Bytes())
	}
	sent, dropped, deny := uint32(tcActRedirect), uint32(tcActShot), "tc_src_range_deny"
	if xdp {
		sent, dropped, deny = xdpTx, xdpDrop, "xdp_src_range_deny"
	}
	denied := func() uint64 { t.Helper(); return counters(t, d)[deny] }
	// opens sends in, a SYN of a new flow, and expects it DNATed and
	// SNATed to node 2; it returns the flow's SNAT port.
	opens := func(name string, in packet.Packet) uint16 {
		t.Helper()
		v, out := send(in)
		if v != sent {
			t.Fatalf("%s: verdict %d, want %d", name, v, sent)
		}
		sp := snatPortIn(t, d, in.Src.String(), in.SrcPort, lb)
		expectPacket(t, name, v, sent, out, toRemote(in, sp, be))
		return sp
	}

	apply(wide)
	syn := nsClient(41000, lb)
	sp := opens("SYN", syn)
	synAck := replyFrom(be, sp, packet.SYN|packet.ACK)
	v, out := send(synAck)
	expectPacket(t, "SYN-ACK", v, sent, out, toClient(synAck, lb, syn.SrcPort))
	unanswered := nsClient(41001, lb)
	opens("SYN of the unanswered flow", unanswered)

	apply(narrow)
	before := denied()
	data := syn
	data.TCPFlags, data.Payload = packet.ACK|packet.PSH, []byte("GET / HTTP/1.0\r\n\r\n")
	v, out = send(data)
	expectPacket(t, "the established flow's data after the narrowing", v, sent, out, toRemote(data, sp, be))
	answer := replyFrom(be, sp, packet.ACK|packet.PSH)
	answer.Payload = []byte("HTTP/1.0 200 OK\r\n\r\n")
	v, out = send(answer)
	expectPacket(t, "the backend's answer after the narrowing", v, sent, out, toClient(answer, lb, syn.SrcPort))
	if got := denied(); got != before {
		t.Errorf("the established flow's packets counted %s: %d, want %d", deny, got, before)
	}

	for _, c := range []struct {
		name string
		in   packet.Packet
	}{
		{"a new flow's SYN", nsClient(41002, lb)},
		{"the unanswered flow's retransmitted SYN", unanswered},
	} {
		before := denied()
		if v, _ := send(c.in); v != dropped {
			t.Errorf("%s from the excluded client: verdict %d, want a drop (%d)", c.name, v, dropped)
		}
		if got := denied(); got != before+1 {
			t.Errorf("%s from the excluded client: %s %d, want %d", c.name, deny, got, before+1)
		}
	}
	in := nsClient(41003, lb)
	in.Src = addr(admitted)
	opens("a new flow of a client the narrowed ranges admit", in)

	if xdp {
		return
	}
	// The dry run decides in the same order (the same code, dry): the
	// established flow's tuple follows its entry; a new one, and the
	// unanswered flow's, are refused by the ranges.
	e := mustDryRun(t, d, uint8(proto), at(client, syn.SrcPort), fe(lb))
	if !e.ConntrackHit || !e.DNAT || e.Backend != netip.AddrPortFrom(be.addr.Addr, be.addr.Port) || e.Verdict == "drop" ||
		slices.Contains(e.Reasons, deny) {
		t.Errorf("explain the established flow: %+v", e)
	}
	for _, port := range []uint16{41004, unanswered.SrcPort} {
		e := mustDryRun(t, d, uint8(proto), at(client, port), fe(lb))
		if e.DNAT || e.Verdict != "drop" || !slices.Equal(e.Reasons, []string{deny}) {
			t.Errorf("explain a SYN from port %d of the excluded client: %+v", port, e)
		}
	}
}
