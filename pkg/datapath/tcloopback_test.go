package datapath

import (
	"bytes"
	"fmt"
	"net/netip"
	"testing"

	"github.com/sluice-lb/sluice/internal/testutil/packet"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// NodePorts on 127.0.0.1 (--localhost-nodeports) are in the services map,
// which tc and XDP read too; they serve the node's own sockets only
// (TestSockLoopbackNodePortNodeOnly). A packet from the wire to
// 127.0.0.1:<nodePort> is a martian: the kernel drops it while
// route_localnet is 0, and kube-proxy, which sets route_localnet to 1 for
// its localhost NodePorts (and leaves it so after --cleanup), drops it
// itself (KUBE-FIREWALL: `-d 127.0.0.0/8 ! -s 127.0.0.0/8 ... -j DROP`,
// CVE-2020-8558). Sluice drops it at tc ingress, whatever route_localnet
// says. Were it translated, any L2 neighbour would reach the backends
// through 127.0.0.1, with --nodeport-addresses localhost meant to keep
// NodePorts local; passed up, its loopback listeners.

// TestTCLoopbackFrontendFromWire: a SYN and a bare ACK from a client on
// eth0 to a localhost NodePort, whether the frontend's backend is on
// another node (XDP's own flows) or on this one (tc's DNAT), XDP passes
// untouched to tc (XDP_PASS, the frame as it came), and tc drops
// (TC_ACT_SHOT, counted tc_loopback_drop, nothing else), with no
// conntrack entry; so too such a packet to a port with no frontend, or of
// another protocol (an ICMP echo, GRE), were 127.0.0.1 ever taken for a
// ClusterIP or the service CIDR (the agent writes neither), and a packet
// from a spoofed 127.0.0.0/8 source to the node's NodePorts (which the
// kernel's martian source check would drop, had tc not translated it). On
// lo (ifindex 1: the node's own traffic) the packets to 127.0.0.0/8 pass
// tc untouched and uncounted. The same frontends on the node's address
// are still translated. Before the fix of the drop (bpf/tc.c,
// tc_loopback_martian) tc passed the packets to 127.0.0.0/8 untouched
// (TC_ACT_OK, nothing counted: the kernel's drop, route_localnet 0) and
// redirected the spoofed-source SYN to the remote backend source-NATed
// (XDP transmitted it: XDP_TX), DNATed the local backend's; before the
// fix of the pass (bpf/lib/xdp_fam.h xdp_fwd, bpf/tc.c tc_ingress) tc
// redirected or DNATed those to 127.0.0.1 too, XDP transmitted the remote
// backend's SNATed, the unserved port and the ICMP echo and GRE were
// answered with a port unreachable and 127.0.0.2 was dropped
// (tc_service_cidr_drop).
func TestTCLoopbackFrontendFromWire(t *testing.T) {
	_, ifindex, d := northSouthNode(t)
	m, ext := d.Maps(), reconciler.FlagExternal
	lhRemote := l4("127.0.0.1", npRemote.Port, model.TCP)
	lhLocal := l4("127.0.0.1", npLocal.Port, model.TCP)
	lhUDP := l4("127.0.0.1", npUDP.Port, model.UDP)
	addExternal(t, m, 11, lhRemote, ext, beRemote)
	addExternal(t, m, 12, lhLocal, ext, beLocal)
	addExternal(t, m, 13, lhUDP, ext, beRemU)
	if _, err := m.UpsertServiceIPs([]netip.Addr{addr("127.0.0.1")}); err != nil {
		t.Fatal(err)
	}
	if err := m.SetServiceCIDRs([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}); err != nil {
		t.Fatal(err)
	}
	unserved := l4("127.0.0.1", 30099, model.TCP) // a "ClusterIP"'s other port
	unallocated := l4("127.0.0.2", 30080, model.TCP)

	type send struct {
		name    string
		p       packet.Packet
		spoofed bool   // from 127.0.0.0/8, to the node's address
		frame   []byte // sent instead of p's frame (a fragment of p)
	}
	var sends []send
	for i, fe := range []model.L4Addr{lhRemote, lhLocal, lhUDP, unserved, unallocated} {
		if fe.Proto == model.UDP {
			sends = append(sends, send{"UDP to " + fe.String(), nsClient(uint16(43000+i), fe), false, nil})
			continue
		}
		for j, c := range []struct {
			what  string
			flags uint8
		}{{"SYN", tcpSYN_}, {"bare ACK", tcpACK}} {
			p := nsClient(uint16(43000+10*i+j), fe)
			p.TCPFlags = c.flags
			sends = append(sends, send{c.what + " to " + fe.String(), p, false, nil})
		}
	}
	// Another protocol (PKT_OTHER): an ICMP echo and a GRE packet.
	for _, c := range []struct {
		what       string
		proto, typ uint8
	}{{"ICMP echo", packet.ICMP, packet.ICMPEcho}, {"GRE", 47, 0}} {
		p := packet.Packet{SrcMAC: clientMAC, DstMAC: macOf(nodeEthMAC), Src: addr(nsClientIP), Dst: addr("127.0.0.1"),
			Proto: c.proto, ICMPType: c.typ, Payload: []byte("from the wire")}
		sends = append(sends, send{c.what + " to 127.0.0.1", p, false, nil})
	}
	// A spoofed loopback source to the node's NodePorts.
	for i, c := range []struct {
		src string
		fe  model.L4Addr
	}{{"127.0.0.1", npRemote}, {"127.0.0.1", npLocal}, {"127.1.2.3", npUDP}} {
		p := nsClient(uint16(43200+i), c.fe)
		p.Src = addr(c.src)
		sends = append(sends, send{"spoofed-source packet to " + c.fe.String(), p, true, nil})
	}
	// A SYN to 127.0.0.1 in fragments of 8 bytes: the first too short for
	// the TCP header (passed as malformed), the later ones without their
	// first's record; the kernel would reassemble them. The parser counts
	// them first (tc_malformed, tc_fragment), as every such fragment.
	frag := nsClient(43300, lhLocal)
	frag.Payload = []byte("a SYN in fragments")
	for i, f := range fragFrames(frag, 8) {
		sends = append(sends, send{fmt.Sprintf("fragment %d of a SYN to %s", i, lhLocal), frag, false, f})
	}
	for _, s := range sends {
		b := s.p.Bytes()
		if s.frame != nil {
			b = s.frame
		}
		if v, out := runXDP(t, d.XDP(), ifindex, b); v != xdpPass || !bytes.Equal(out[:len(b)], b) {
			t.Errorf("XDP: %s from %s: verdict %d (want XDP_PASS %d), frame changed: %v", s.name, s.p.Src, v, xdpPass, !bytes.Equal(out[:len(b)], b))
		}
		before := counters(t, d)
		if v, _ := runOn(t, d.TCIngress(), ifindex, b); v != tcActShot {
			t.Errorf("tc: %s from %s: verdict %d, want TC_ACT_SHOT %d", s.name, s.p.Src, v, tcActShot)
		}
		after := counters(t, d)
		if after["tc_loopback_drop"] != before["tc_loopback_drop"]+1 {
			t.Errorf("tc: %s from %s: tc_loopback_drop %d, was %d", s.name, s.p.Src, after["tc_loopback_drop"], before["tc_loopback_drop"])
		}
		// parsed reports whether counter name may move for s: the
		// parser's own counts of a fragment.
		parsed := func(name string) bool {
			return s.frame != nil && (name == "tc_fragment" || name == "tc_malformed")
		}
		for name, n := range after {
			if name != "tc_loopback_drop" && !parsed(name) && n != before[name] {
				t.Errorf("tc: %s from %s: counter %s moved: %d, was %d", s.name, s.p.Src, name, n, before[name])
			}
		}
		if !s.spoofed {
			// On lo: the node's own traffic to 127.0.0.0/8, untouched.
			if v, out := runOn(t, d.TCIngress(), 1, b); v != tcActOK || !bytes.Equal(out[:len(b)], b) {
				t.Errorf("tc on lo: %s from %s: verdict %d (want TC_ACT_OK %d), packet changed: %v", s.name, s.p.Src, v, tcActOK, !bytes.Equal(out[:len(b)], b))
			}
			for name, n := range counters(t, d) {
				if !parsed(name) && n != after[name] {
					t.Errorf("tc on lo: %s from %s: counter %s moved: %d, was %d", s.name, s.p.Src, name, n, after[name])
				}
			}
		}
		if s.frame != nil || s.p.Proto != uint8(model.TCP) && s.p.Proto != uint8(model.UDP) {
			continue
		}
		k := ctKeyOf(s.p.Src.String(), s.p.SrcPort, s.p.Dst.String(), s.p.DstPort, model.Protocol(s.p.Proto), ctForward)
		if e, ok := ctLookup(t, m, k); ok {
			t.Errorf("%s from %s: forward conntrack entry %+v", s.name, s.p.Src, e)
		}
	}

	// The node's address still serves the same NodePorts: XDP transmits
	// the remote backend's flow, tc DNATs the local one's.
	if v, _ := runXDP(t, d.XDP(), ifindex, nsClient(43100, npRemote).Bytes()); v != xdpTx {
		t.Errorf("XDP: SYN to %s: verdict %d, want XDP_TX %d", npRemote, v, xdpTx)
	}
	if v, out := runOn(t, d.TCIngress(), ifindex, nsClient(43101, npLocal).Bytes()); v != tcActOK || outDst(out) != beLocal.addr.Addr.String() {
		t.Errorf("tc: SYN to %s: verdict %d to %s, want TC_ACT_OK to %s", npLocal, v, outDst(out), beLocal.addr.Addr)
	}
}
