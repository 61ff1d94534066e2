package datapath

import (
	"bytes"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil/packet"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// The paths TestTCRetiredFrontendKeepsEstablished leaves out, through a
// removed NodePort (a retired master, pkg/reconciler/retired.go) whose
// flow to a backend on node 2 is source-NATed: its packets arriving at
// XDP (which passes a master of count 0 to tc), its close by FINs or a
// RST, and ICMP errors about it. kube-proxy's conntrack keeps translating
// such a flow until it ends, its close and the errors RELATED to it
// included; a new connection meets no Service.

// retiredFlowTimeout is how long the tests' reconciler keeps a removed
// TCP frontend's master retired: long enough that none is deleted within
// a test.
const retiredFlowTimeout = time.Hour

// nodeDatapathFam is nodeDatapath on eth0 over the family of v6: with
// v6, eth0 has its IPv6 address too (addNodeIPv6, attached again for
// sluice6_devices_v1). It returns eth0's ifindex.
func nodeDatapathFam(t testing.TB, v6 bool, base func(bpffs string) Config) (int, *Datapath) {
	t.Helper()
	_, ifindex, d := nodeDatapath(t, base, "eth0")
	if v6 {
		addNodeIPv6(t)
		if err := d.AttachDevices([]string{"eth0"}); err != nil {
			t.Fatal(err)
		}
	}
	return ifindex, d
}

// retiredNP is a node datapath (XDP loaded, per family) whose NodePort np
// to be, a backend on node 2, was removed by r after its flows were
// opened: sp holds each flow's SNAT port by its client port.
type retiredNP struct {
	d       *Datapath
	ifindex int
	r       *reconciler.Reconciler
	np      model.L4Addr
	be      testBackend
	sp      map[uint16]uint16
}

// retiredNodePort builds a retiredNP: the NodePort written by a
// reconciler that retires removed frontends (retiredFlowTimeout), a flow
// from each of cports opened through XDP (its SYN and the backend's
// SYN-ACK, xdpRoundTrip), then an Apply without the NodePort.
func retiredNodePort(t *testing.T, v6 bool, cports ...uint16) *retiredNP {
	t.Helper()
	ifindex, d := nodeDatapathFam(t, v6, xdpConfig)
	n := &retiredNP{d: d, ifindex: ifindex, r: reconciler.New(d.Maps(), nil), np: nsTwinL4(v6, npRemote),
		be: testBackend{addr: nsTwinL4(v6, beRemote.addr)}, sp: map[uint16]uint16{}}
	n.r.SetRetireTimeout(retiredFlowTimeout)
	s := clusterIP(n.np, n.be.addr)
	s.Kind = model.NodePort
	applyWith(t, n.r, s)
	for _, cport := range cports {
		n.sp[cport] = xdpRoundTrip(t, d, ifindex, nsClient(cport, n.np), n.np, n.be, tcpSA)
	}
	applyWith(t, n.r)
	if _, ok := n.r.Retired()[reconciler.DefaultScope(n.np)]; !ok {
		t.Fatalf("%s not retired: %v", n.np, n.r.Retired())
	}
	return n
}

// client is the client's packet from cport to the NodePort, with flags.
func (n *retiredNP) client(cport uint16, flags uint8) packet.Packet {
	p := nsClient(cport, n.np)
	p.TCPFlags = flags
	return p
}

// tc runs p through tc ingress as arriving on eth0 and fails t unless it
// is sent on (redirected) as want.
func (n *retiredNP) tc(t *testing.T, name string, p, want packet.Packet) {
	t.Helper()
	expectRun(t, name, n.d.TCIngress(), n.ifindex, p, tcActRedirect, want)
}

// passes fails t unless prog's verdict on p, arriving on eth0, is pass
// (XDP_PASS or TC_ACT_OK) with p untouched.
func (n *retiredNP) passes(t *testing.T, name string, xdp bool, p packet.Packet) {
	t.Helper()
	run, pass, hook := runOn, uint32(tcActOK), "tc"
	prog := n.d.TCIngress()
	if xdp {
		run, pass, hook, prog = runXDP, xdpPass, "XDP", n.d.XDP()
	}
	in := p.Bytes()
	if v, out := run(t, prog, n.ifindex, in); v != pass || !bytes.Equal(out, in) {
		t.Errorf("%s at %s: verdict %d, want %d with the packet untouched; %s", name, hook, v, pass, packet.Diff(out, in))
	}
}

// noFlow fails t if a forward conntrack entry of the client's port cport
// to the NodePort exists: a flow started.
func (n *retiredNP) noFlow(t *testing.T, name string, cport uint16) {
	t.Helper()
	client := ofFamily(n.np.Addr, nsClientIP, nsClientIP6).String()
	if e, ok := ctLookup(t, n.d.Maps(), ctKeyOf(client, cport, n.np.Addr.String(), n.np.Port, model.TCP, ctForward)); ok {
		t.Errorf("%s: a conntrack entry made for the removed NodePort: %+v", name, e)
	}
}

// TestXDPRetiredFrontendPassesToTC: XDP passes a packet to a retired
// master (count 0) to tc untouched, and tc translates it if it is an
// established flow's: the client's data reaches the backend on node 2
// from the flow's SNAT port, and the backend's answer, which XDP
// translates by the flow's entries alone, reaches the client from the
// NodePort. A new connection's SYN passes XDP and tc untranslated (up to
// the node's stack, as to a port no Service has) and starts no flow.
// Before the retirement (the master deleted at once) tc passed the
// established flow's data up untranslated too: the node's stack answered
// it with a RST.
func TestXDPRetiredFrontendPassesToTC(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		const cport = 41500
		n := retiredNodePort(t, v6, cport)
		data := n.client(cport, tcpACK|packet.PSH)
		data.Payload = []byte("GET / HTTP/1.0\r\n\r\n")
		n.passes(t, "the established flow's data", true, data)
		n.tc(t, "the established flow's data, passed to tc", data, toRemote(data, n.sp[cport], n.be))

		answer := replyFrom(n.be, n.sp[cport], tcpACK|packet.PSH)
		answer.Payload = []byte("HTTP/1.0 200 OK\r\n\r\n")
		v, out := runXDP(t, n.d.XDP(), n.ifindex, answer.Bytes())
		expectPacket(t, "the backend's answer at XDP", v, xdpTx, out, toClient(answer, n.np, cport))

		fresh := n.client(cport+1, tcpSYN_)
		n.passes(t, "a new connection's SYN", true, fresh)
		n.passes(t, "a new connection's SYN", false, fresh)
		n.noFlow(t, "a new connection's SYN", cport+1)
	})
}

// TestTCRetiredFrontendFlowCloses: a flow under a retired master closes
// as any: FINs each way (the client's first) and a RST from the backend
// are translated both ways, and mark the flow's entries closed, so that
// they live what a closed flow's live (a source-NATed flow closed by
// FINs: the SNAT TIME_WAIT hold; by a RST: the close timeout), as
// netfilter's conntrack moves an established connection to TIME_WAIT or
// CLOSE whether or not its Service is still there. A SYN on the closed
// tuple then starts nothing: the retired master follows only a usable
// entry, and a closed flow's is not one for a new connection.
func TestTCRetiredFrontendFlowCloses(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		const finPort, rstPort = 41600, 41601
		n := retiredNodePort(t, v6, finPort, rstPort)
		m, cfg := n.d.Maps(), xdpConfig("").withDefaults()
		client, node := ofFamily(n.np.Addr, nsClientIP, nsClientIP6).String(), ofFamily(n.np.Addr, nsNodeIP, nsNodeIP6).String()
		keys := func(cport uint16) []ctK {
			return []ctK{ctKeyOf(client, cport, n.np.Addr.String(), n.np.Port, model.TCP, ctForward),
				ctKeyOf(n.be.addr.Addr.String(), n.be.addr.Port, node, n.sp[cport], model.TCP, ctReverse)}
		}

		lo := clockNow(t)
		fin := n.client(finPort, tcpFA)
		n.tc(t, "the client's FIN", fin, toRemote(fin, n.sp[finPort], n.be))
		beFin := replyFrom(n.be, n.sp[finPort], tcpFA)
		n.tc(t, "the backend's FIN", beFin, toClient(beFin, n.np, finPort))
		ack := n.client(finPort, tcpACK)
		n.tc(t, "the client's last ACK", ack, toRemote(ack, n.sp[finPort], n.be))
		hi := clockNow(t)
		for _, k := range keys(finPort) {
			ctExpiresWithin(t, m, k, ctFlagSNAT|ctFlagFinFwd|ctFlagFinRev, ctFlagRST, cfg.CTTimeoutSNATTimeWait, lo, hi,
				"a flow of the retired master closed by FINs")
		}
		again := n.client(finPort, tcpSYN_)
		n.passes(t, "a SYN on the closed flow's tuple", true, again)
		n.passes(t, "a SYN on the closed flow's tuple", false, again)

		lo = clockNow(t)
		rst := replyFrom(n.be, n.sp[rstPort], tcpRST|tcpACK)
		n.tc(t, "the backend's RST", rst, toClient(rst, n.np, rstPort))
		hi = clockNow(t)
		for _, k := range keys(rstPort) {
			ctExpiresWithin(t, m, k, ctFlagSNAT|ctFlagRSTRev, 0, cfg.CTTimeoutClose, lo, hi, "a flow of the retired master reset by its backend")
		}
	})
}

// TestTCRetiredFrontendICMPErrors: ICMP errors about a flow under a
// retired master are translated as about any flow (icmp_err_xlate, by
// the flow's entries), as netfilter translates an error RELATED to a
// connection it keeps: a router's fragmentation needed (IPv6: packet too
// big) and the backend's port unreachable about <node:port -> backend>
// reach the client as about <client -> NodePort>, and the client's port
// unreachable about a reply goes on to the backend as about <backend ->
// node:port>.
func TestTCRetiredFrontendICMPErrors(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		const cport = 41700
		n := retiredNodePort(t, v6, cport)
		sp, np := n.sp[cport], n.np
		eth, n2 := macOf(nodeEthMAC), macOf(node2MAC)
		client, node, router := nsTwin(v6, nsClientIP), nsTwin(v6, nsNodeIP), nsTwin(v6, nsNode2IP)
		be := n.be.addr.Addr.String()
		seg := func(src string, sport uint16, dst string, dport uint16) []byte {
			p := tcpPacket(src, sport, dst, dport, tcpACK|packet.PSH, bytes.Repeat([]byte("r"), 1400))
			p.FragOff, p.TTL = packet.DF, 63
			return quoteOf(p, 128)
		}
		sent := func(p packet.Packet) packet.Packet { p.TTL = fwdTTL; return p }
		for _, c := range []struct {
			name    string
			in, out []byte
		}{
			{"frag needed from a router about a request",
				frame(eth, n2, icmpMsg(router, node, icmpTooBig, 1400, seg(node, sp, be, n.be.addr.Port))),
				frame(clientMAC, eth, sent(icmpMsg(router, client, icmpTooBig, 1400, seg(client, cport, node, np.Port))))},
			{"port unreachable from the backend",
				frame(eth, n2, icmpMsg(be, node, icmpPortUnreach, 0, seg(node, sp, be, n.be.addr.Port))),
				frame(clientMAC, eth, sent(icmpMsg(node, client, icmpPortUnreach, 0, seg(client, cport, node, np.Port))))},
			{"port unreachable from the client about a reply",
				frame(eth, clientMAC, icmpMsg(client, node, icmpPortUnreach, 0, seg(node, np.Port, client, cport))),
				frame(n2, eth, sent(icmpMsg(node, be, icmpPortUnreach, 0, seg(be, n.be.addr.Port, node, sp))))},
		} {
			v, out := runOn(t, n.d.TCIngress(), n.ifindex, c.in)
			if v != tcActRedirect || !bytes.Equal(out, c.out) {
				t.Errorf("%s: verdict %d (want redirect), output %s", c.name, v, packet.Diff(out, c.out))
			}
		}
	})
}
