package datapath

import (
	"bytes"
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/packet"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/model"
)

// Packet tables for the service semantics of issue 9, through
// BPF_PROG_TEST_RUN in the node namespace of the north-south tables
// (northsouth_test.go), with pod0 attached as well: which scope serves a
// client, which flows are masqueraded (towards a backend on this node
// too), and what a packet to no frontend gets. The maps are written by
// reconciler.Apply from the model, as the agent writes them.

var (
	pod0MAC  = net.HardwareAddr{0x02, 0, 0, 0, 0x10, 0x01} // the node's side of pod0
	podMAC   = net.HardwareAddr{0x02, 0, 0, 0, 0x10, 0x07} // the pods behind it
	cipLocal = l4("10.96.0.10", 80, model.TCP)             // ClusterIP, backend here
	cipRem   = l4("10.96.0.11", 80, model.TCP)             // ClusterIP, backend on node 2
	cipDrop  = l4("10.96.0.12", 80, model.TCP)             // ClusterIP, none here (iTP Local)
	npTwo    = l4(nsNodeIP, 30090, model.TCP)              // eTP Local: here / all
	npTwoNo  = l4(nsNodeIP, 30091, model.TCP)              // eTP Local, none here
	npClus   = l4(nsNodeIP, 30081, model.TCP)              // eTP Cluster, backend here
)

const (
	podClient  = "10.1.0.9" // a pod of this node
	remotePod  = "10.2.0.50"
	podBackend = "10.1.0.7" // beLocal
)

// semWorld is the addresses of the semantics tables in one family: the
// IPv4 ones above, or their IPv6 twins (twinAddr; the node and its
// NodePorts at nsNodeIP6, the client at nsClientIP6).
type semWorld struct {
	v6                                                bool
	cipLocal, cipRem, cipDrop, npTwo, npTwoNo, npClus model.L4Addr
	beLocal, beRemote                                 testBackend
	podClient, remotePod, podBackend                  string
}

func semanticsOf(v6 bool) semWorld {
	np := func(fe model.L4Addr) model.L4Addr {
		if v6 {
			fe.Addr = addr(nsNodeIP6)
		}
		return fe
	}
	be := func(b testBackend) testBackend { b.addr = twinL4(v6, b.addr); return b }
	return semWorld{
		v6:       v6,
		cipLocal: twinL4(v6, cipLocal), cipRem: twinL4(v6, cipRem), cipDrop: twinL4(v6, cipDrop),
		npTwo: np(npTwo), npTwoNo: np(npTwoNo), npClus: np(npClus),
		beLocal: be(beLocal), beRemote: be(beRemote),
		podClient: twinAddr(v6, podClient), remotePod: twinAddr(v6, remotePod), podBackend: twinAddr(v6, podBackend),
	}
}

// addr is the twin of IPv4 address a in w's family.
func (w semWorld) addr(a string) string { return twinAddr(w.v6, a) }

// client is the external client's address (nsClient's).
func (w semWorld) client() string { return ofFamily(w.cipLocal.Addr, nsClientIP, nsClientIP6).String() }

// prefixes is the twins of IPv4 prefixes ps (twinPrefix).
func (w semWorld) prefixes(ps ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		out = append(out, twinPrefix(w.v6, p))
	}
	return out
}

// semanticsNode builds the node namespace with pod0 (MAC pod0MAC, its pods
// at podMAC), opens a datapath with cfg's settings on eth0 and pod0, and
// programs the services above, of w's family. Over IPv6, eth0 has its
// IPv6 address too (addNodeIPv6), pod0 holds the twin of the local pod
// range and node 2 routes the twin of the remote one.
func semanticsNode(t *testing.T, cfg Config, w semWorld) (*topology.NS, *Datapath, int, int) {
	t.Helper()
	testutil.Privileged(t)
	ns, eth0 := nodeNetns(t)
	pod0, err := netlink.LinkByName("pod0")
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetHardwareAddr(pod0, pod0MAC); err != nil {
		t.Fatal(err)
	}
	family := netlink.FAMILY_V4
	nodeIPs := []netip.Addr{addr(nsNodeIP)}
	if w.v6 {
		family = netlink.FAMILY_V6
		nodeIPs = append(nodeIPs, addr(nsNodeIP6))
		addNodeIPv6(t)
		for _, r := range []netlink.Route{
			{LinkIndex: pod0.Attrs().Index, Dst: prefixNet(twinPrefix(true, "10.1.0.0/24"))},
			{LinkIndex: eth0, Dst: prefixNet(twinPrefix(true, "10.2.0.0/16")), Gw: net.ParseIP(nsNode2IP6)},
		} {
			if err := netlink.RouteAdd(&r); err != nil {
				t.Fatalf("route %s: %v", r.Dst, err)
			}
		}
	}
	for _, ip := range []string{w.podBackend, w.podClient} {
		if err := netlink.NeighAdd(&netlink.Neigh{LinkIndex: pod0.Attrs().Index, Family: family,
			State: netlink.NUD_PERMANENT, IP: net.ParseIP(ip), HardwareAddr: podMAC}); err != nil {
			t.Fatalf("neighbour %s: %v", ip, err)
		}
	}
	c := smallConfig(testPinDir(t))
	c.NodeIPs, c.ClusterCIDRs, c.ServiceCIDRs, c.MasqueradeAll = nodeIPs, cfg.ClusterCIDRs, cfg.ServiceCIDRs, cfg.MasqueradeAll
	d := openTest(t, c)
	if err := d.AttachDevices([]string{"eth0", "pod0"}); err != nil {
		t.Fatal(err)
	}
	be := func(b testBackend) model.Backend { return model.Backend{L4Addr: b.addr} }
	drop := clusterIP(w.cipDrop)
	drop.DropWhenEmpty = true
	two := &model.Service{Name: model.ServicePortName{Namespace: "test", Name: "two"}, Kind: model.NodePort, Frontend: w.npTwo,
		Backends: []model.Backend{be(w.beLocal)}, ExternalLocal: true, TwoScopes: true, InternalBackends: []model.Backend{be(w.beRemote)}}
	twoNo := &model.Service{Name: model.ServicePortName{Namespace: "test", Name: "two-none"}, Kind: model.NodePort, Frontend: w.npTwoNo,
		DropWhenEmpty: true, ExternalLocal: true, TwoScopes: true, InternalBackends: []model.Backend{be(w.beRemote)}}
	clus := &model.Service{Name: model.ServicePortName{Namespace: "test", Name: "cluster"}, Kind: model.NodePort, Frontend: w.npClus,
		Backends: []model.Backend{be(w.beLocal)}}
	applyServices(t, d, clusterIP(w.cipLocal, w.beLocal.addr), clusterIP(w.cipRem, w.beRemote.addr), drop, two, twoNo, clus)
	return ns, d, eth0, pod0.Attrs().Index
}

// prefixNet is p as netlink takes it.
func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// fromPod is a request from pod client src (on pod0) to fe.
func fromPod(src string, sport uint16, fe model.L4Addr) packet.Packet {
	return packet.Packet{SrcMAC: macOf(podMAC), DstMAC: macOf(pod0MAC), Src: addr(src), Dst: fe.Addr,
		SrcPort: sport, DstPort: fe.Port, Proto: uint8(fe.Proto)}
}

// dnat is in with its destination rewritten to b (TTL and MACs kept: the
// stack forwards it).
func dnat(in packet.Packet, b testBackend) packet.Packet {
	in.Dst, in.DstPort = b.addr.Addr, b.addr.Port
	return in
}

// expectDNAT runs in through prog on ifindex and expects it passed on to
// the stack with its destination translated to be, and nothing else: not
// masqueraded.
func expectDNAT(t *testing.T, name string, prog *ebpf.Program, ifindex int, in packet.Packet, be testBackend) {
	t.Helper()
	expectRun(t, name, prog, ifindex, in, tcActOK, dnat(in, be))
}

// expectMasqueraded runs in through d's tc ingress on ifindex and expects
// it redirected to be as masq builds it from in, the source port the
// datapath reserved for in's flow and be; it returns that port.
func expectMasqueraded(t *testing.T, d *Datapath, name string, ifindex int, in packet.Packet,
	masq func(packet.Packet, uint16, testBackend) packet.Packet, be testBackend) uint16 {
	t.Helper()
	verdict, out := runOn(t, d.TCIngress(), ifindex, in.Bytes())
	fe := model.L4Addr{Addr: in.Dst, Port: in.DstPort, Proto: model.Protocol(in.Proto)}
	sp := snatPortIn(t, d, in.Src.String(), in.SrcPort, fe)
	expectPacket(t, name, verdict, tcActRedirect, out, masq(in, sp, be))
	return sp
}

// masqToPod is in as the node sends it to the local pod backend b:
// source-NATed to the node's address and port sp, out of pod0.
func masqToPod(in packet.Packet, sp uint16, b testBackend) packet.Packet {
	in.TTL = fwdTTL
	in.SrcMAC, in.DstMAC = macOf(pod0MAC), macOf(podMAC)
	in.Src, in.SrcPort = ofFamily(b.addr.Addr, nsNodeIP, nsNodeIP6), sp
	in.Dst, in.DstPort = b.addr.Addr, b.addr.Port
	return in
}

// podReply is pod backend b's reply to the node's port sp, arriving on
// pod0.
func podReply(b testBackend, sp uint16) packet.Packet {
	return packet.Packet{SrcMAC: macOf(podMAC), DstMAC: macOf(pod0MAC), Src: b.addr.Addr, SrcPort: b.addr.Port,
		Dst: ofFamily(b.addr.Addr, nsNodeIP, nsNodeIP6), DstPort: sp, Proto: uint8(b.addr.Proto), TCPFlags: 0x12}
}

// portUnreachable is the ICMP (ICMPv6) port unreachable tc answers in
// with: from where the kernel's reject would come (kernelRejectSrc, asked
// of the calling thread's namespace: the test process's, where the run
// has no device but lo, or a node namespace the test entered, where every
// device forwards), quoting its IP header and TCP header, back out of the
// device it came in on.
func portUnreachable(in packet.Packet) []byte {
	if in.Dst.Is6() {
		return frame(in.SrcMAC, in.DstMAC, packet.Packet{Src: kernelRejectSrc("lo", in.Dst, in.Src), Dst: in.Src, Proto: packet.ICMPv6,
			ICMPType: packet.ICMPv6Unreachable, ICMPCode: packet.ICMPv6PortUnreach, Payload: in.L3()[:40+20]})
	}
	b := in.Bytes()
	quote := b[14 : 14+20+20]
	return frame(in.SrcMAC, in.DstMAC, icmpErr(kernelRejectSrc("lo", in.Dst, in.Src).String(), in.Src.String(), 3, 3, 0, quote))
}

func expectVerdict(t *testing.T, name string, verdict, want uint32) {
	t.Helper()
	if verdict != want {
		t.Fatalf("%s: verdict %d, want %d", name, verdict, want)
	}
}

// TestTCTrafficPolicies: with a cluster CIDR (10.0.0.0/8), a service CIDR
// (10.96.0.0/16) and the node's address, as kube-proxy decides:
// externalTrafficPolicy Local frontends serve external clients from their
// default scope and internal ones (a pod here, a pod of another node) from
// their internal scope, unmasqueraded; traffic from outside the cluster
// CIDR to a ClusterIP is masqueraded, to a backend here too (out of pod0,
// and back); a pod's to an externalTrafficPolicy Cluster NodePort too
// (masqueraded even to a backend here), while an external client's keeps
// its address (Sluice's deviation); a hairpin is masqueraded; empty sets
// drop or reject as flagged; a ClusterIP's other ports reject, the
// service CIDR's other addresses drop.
func TestTCTrafficPolicies(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		w := semanticsOf(v6)
		ns, d, eth0, pod0 := semanticsNode(t, Config{
			ClusterCIDRs: w.prefixes("10.0.0.0/8"),
			ServiceCIDRs: w.prefixes("10.96.0.0/16"),
		}, w)
		ing := d.TCIngress()

		t.Run("external to ClusterIP, backend here: masqueraded there and back", func(t *testing.T) {
			ns.Enter(t)
			sp := expectMasqueraded(t, d, "forward", eth0, nsClient(41000, w.cipLocal), masqToPod, w.beLocal)
			reply := podReply(w.beLocal, sp)
			expectRun(t, "reply", ing, pod0, reply, tcActRedirect, toClient(reply, w.cipLocal, 41000))
		})

		t.Run("external to ClusterIP, backend elsewhere: masqueraded", func(t *testing.T) {
			ns.Enter(t)
			expectMasqueraded(t, d, "forward", eth0, nsClient(41001, w.cipRem), toRemote, w.beRemote)
		})

		t.Run("pod to ClusterIP: not masqueraded", func(t *testing.T) {
			ns.Enter(t)
			expectDNAT(t, "forward", ing, pod0, fromPod(w.podClient, 41002, w.cipRem), w.beRemote)
		})

		t.Run("pod to its own ClusterIP: a hairpin, masqueraded", func(t *testing.T) {
			ns.Enter(t)
			sp := expectMasqueraded(t, d, "forward", pod0, fromPod(w.podBackend, 41003, w.cipLocal), masqToPod, w.beLocal)
			reply := podReply(w.beLocal, sp)
			verdict, out := runOn(t, ing, pod0, reply.Bytes())
			back := reply
			back.TTL = fwdTTL
			back.SrcMAC, back.DstMAC = macOf(pod0MAC), macOf(podMAC)
			back.Src, back.SrcPort = w.cipLocal.Addr, w.cipLocal.Port
			back.Dst, back.DstPort = addr(w.podBackend), 41003
			expectPacket(t, "reply", verdict, tcActRedirect, out, back)
		})

		t.Run("eTP Local: external clients get the default scope, unmasqueraded", func(t *testing.T) {
			ns.Enter(t)
			expectDNAT(t, "forward", ing, eth0, nsClient(41004, w.npTwo), w.beLocal)
		})

		t.Run("eTP Local: a pod of another node gets the internal scope, unmasqueraded", func(t *testing.T) {
			ns.Enter(t)
			in := nsClient(41005, w.npTwo)
			in.Src = addr(w.remotePod)
			expectDNAT(t, "forward", ing, eth0, in, w.beRemote)
			// Its flow's next packet, which its forward entry sends, is
			// served by the internal scope too (a two-scope frontend's
			// followed packet still finds its scope: lb4_frontend).
			before := counters(t, d)["tc_short_circuit"]
			in.TCPFlags = packet.ACK
			expectDNAT(t, "its ACK", ing, eth0, in, w.beRemote)
			if after := counters(t, d)["tc_short_circuit"]; after != before+1 {
				t.Errorf("tc_short_circuit %d after the flow's ACK, want %d: not served by the internal scope", after, before+1)
			}
		})

		t.Run("eTP Local without a local endpoint: external dropped, pods served", func(t *testing.T) {
			ns.Enter(t)
			verdict, _ := runOn(t, ing, eth0, nsClient(41006, w.npTwoNo).Bytes())
			expectVerdict(t, "external", verdict, tcActShot)
			expectDNAT(t, "pod", ing, pod0, fromPod(w.podClient, 41007, w.npTwoNo), w.beRemote)
		})

		t.Run("eTP Cluster: an external client to a backend here keeps its address", func(t *testing.T) {
			ns.Enter(t)
			expectDNAT(t, "forward", ing, eth0, nsClient(41008, w.npClus), w.beLocal)
		})

		t.Run("eTP Cluster: a pod is masqueraded, to a backend here too", func(t *testing.T) {
			ns.Enter(t)
			expectMasqueraded(t, d, "forward", pod0, fromPod(w.podClient, 41009, w.npClus), masqToPod, w.beLocal)
		})

		t.Run("iTP Local without a local endpoint: dropped", func(t *testing.T) {
			ns.Enter(t)
			verdict, _ := runOn(t, ing, pod0, fromPod(w.podClient, 41010, w.cipDrop).Bytes())
			expectVerdict(t, "pod", verdict, tcActShot)
		})

		t.Run("a ClusterIP's other port or protocol: rejected", func(t *testing.T) {
			ns.Enter(t)
			for _, in := range []packet.Packet{
				fromPod(w.podClient, 41011, l4(w.addr("10.96.0.10"), 81, model.TCP)),
				nsClient(41012, l4(w.addr("10.96.0.11"), 443, model.TCP)),
			} {
				ifindex := pod0
				if in.SrcMAC == clientMAC {
					ifindex = eth0
				}
				verdict, out := runOn(t, ing, ifindex, in.Bytes())
				want := portUnreachable(in)
				if verdict != tcActRedirect || !bytes.Equal(out, want) {
					t.Fatalf("%s:%d: verdict %d, output\n got %x\nwant %x", in.Dst, in.DstPort, verdict, out, want)
				}
				checkChecksums(t, out)
			}
		})

		t.Run("the service CIDR's other addresses: dropped; beyond it: untouched", func(t *testing.T) {
			ns.Enter(t)
			verdict, _ := runOn(t, ing, eth0, nsClient(41013, l4(w.addr("10.96.5.5"), 80, model.TCP)).Bytes())
			expectVerdict(t, "unallocated", verdict, tcActShot)
			in := nsClient(41014, l4(w.addr("10.97.0.1"), 80, model.TCP)).Bytes()
			verdict, out := runOn(t, ing, eth0, in)
			if verdict != tcActOK || !bytes.Equal(out, in) {
				t.Fatalf("outside the service CIDR: verdict %d, packet changed", verdict)
			}
		})

		expectCounted(t, d, "tc_short_circuit", "tc_masq_local", "tc_snat_new", "tc_unknown_port",
			"tc_service_cidr_drop", "tc_local_no_backend")
	})
}

// TestTCNoClusterCIDR: without --cluster-cidr no client is internal
// (kube-proxy without a local traffic detector): ClusterIP traffic is not
// masqueraded, whatever its source; a pod of another node to an
// externalTrafficPolicy Local frontend gets its default scope; a pod of
// this node to an externalTrafficPolicy Cluster one is still masqueraded
// (it did not come from outside); nothing drops as a service CIDR.
func TestTCNoClusterCIDR(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		w := semanticsOf(v6)
		ns, d, eth0, pod0 := semanticsNode(t, Config{}, w)
		ing := d.TCIngress()
		ns.Enter(t)

		expectDNAT(t, "external to ClusterIP", ing, eth0, nsClient(42000, w.cipLocal), w.beLocal)

		in := nsClient(42001, w.npTwo)
		in.Src = addr(w.remotePod)
		expectDNAT(t, "remote pod to eTP Local", ing, eth0, in, w.beLocal)

		expectMasqueraded(t, d, "pod to eTP Cluster", pod0, fromPod(w.podClient, 42002, w.npClus), masqToPod, w.beLocal)

		// A ClusterIP's other port is still a service IP's; the service CIDR
		// is unknown.
		in = nsClient(42003, l4(w.addr("10.96.5.5"), 80, model.TCP))
		verdict, _ := runOn(t, ing, eth0, in.Bytes())
		expectVerdict(t, "unallocated address", verdict, tcActOK)
		if cs, _ := d.Counters(); cs["tc_short_circuit"] != 0 {
			t.Errorf("tc_short_circuit = %d without a cluster CIDR", cs["tc_short_circuit"])
		}
	})
}

// TestTCMasqueradeAll: --masquerade-all masquerades ClusterIP traffic from
// pods, and gives kube-proxy's answer for external clients of an
// externalTrafficPolicy Cluster frontend with a backend here (no
// deviation); externalTrafficPolicy Local traffic keeps its address.
func TestTCMasqueradeAll(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		w := semanticsOf(v6)
		ns, d, eth0, pod0 := semanticsNode(t, Config{
			ClusterCIDRs:  w.prefixes("10.0.0.0/8"),
			MasqueradeAll: true,
		}, w)
		ing := d.TCIngress()
		ns.Enter(t)

		expectMasqueraded(t, d, "pod to ClusterIP", pod0, fromPod(w.podClient, 43000, w.cipRem), toRemote, w.beRemote)
		expectMasqueraded(t, d, "external to eTP Cluster, backend here", eth0, nsClient(43001, w.npClus), masqToPod, w.beLocal)

		expectDNAT(t, "external to eTP Local", ing, eth0, nsClient(43002, w.npTwo), w.beLocal)
	})
}
