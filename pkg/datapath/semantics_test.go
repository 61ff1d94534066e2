package datapath

import (
	"bytes"
	"net"
	"net/netip"
	"testing"

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

// semanticsNode builds the node namespace with pod0 (MAC pod0MAC, its pods
// at podMAC), opens a datapath with cfg's settings on eth0 and pod0, and
// programs the services above.
func semanticsNode(t *testing.T, cfg Config) (*topology.NS, *Datapath, int, int) {
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
	for _, ip := range []string{podBackend, podClient} {
		if err := netlink.NeighAdd(&netlink.Neigh{LinkIndex: pod0.Attrs().Index, Family: netlink.FAMILY_V4,
			State: netlink.NUD_PERMANENT, IP: net.ParseIP(ip), HardwareAddr: podMAC}); err != nil {
			t.Fatalf("neighbour %s: %v", ip, err)
		}
	}
	c := smallConfig(testPinDir(t))
	c.NodeIPs, c.ClusterCIDRs, c.ServiceCIDRs, c.MasqueradeAll = []netip.Addr{addr(nsNodeIP)}, cfg.ClusterCIDRs, cfg.ServiceCIDRs, cfg.MasqueradeAll
	d := openTest(t, c)
	if err := d.AttachDevices([]string{"eth0", "pod0"}); err != nil {
		t.Fatal(err)
	}
	be := func(b testBackend) model.Backend { return model.Backend{L4Addr: b.addr} }
	drop := clusterIP(cipDrop)
	drop.DropWhenEmpty = true
	two := &model.Service{Name: model.ServicePortName{Namespace: "test", Name: "two"}, Kind: model.NodePort, Frontend: npTwo,
		Backends: []model.Backend{be(beLocal)}, ExternalLocal: true, TwoScopes: true, InternalBackends: []model.Backend{be(beRemote)}}
	twoNo := &model.Service{Name: model.ServicePortName{Namespace: "test", Name: "two-none"}, Kind: model.NodePort, Frontend: npTwoNo,
		DropWhenEmpty: true, ExternalLocal: true, TwoScopes: true, InternalBackends: []model.Backend{be(beRemote)}}
	clus := &model.Service{Name: model.ServicePortName{Namespace: "test", Name: "cluster"}, Kind: model.NodePort, Frontend: npClus,
		Backends: []model.Backend{be(beLocal)}}
	applyServices(t, d, clusterIP(cipLocal, beLocal.addr), clusterIP(cipRem, beRemote.addr), drop, two, twoNo, clus)
	return ns, d, eth0, pod0.Attrs().Index
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

// masqToPod is in as the node sends it to the local pod backend b:
// source-NATed to the node's address and port sp, out of pod0.
func masqToPod(in packet.Packet, sp uint16, b testBackend) packet.Packet {
	in.TTL = fwdTTL
	in.SrcMAC, in.DstMAC = macOf(pod0MAC), macOf(podMAC)
	in.Src, in.SrcPort = addr(nsNodeIP), sp
	in.Dst, in.DstPort = b.addr.Addr, b.addr.Port
	return in
}

// podReply is pod backend b's reply to the node's port sp, arriving on
// pod0.
func podReply(b testBackend, sp uint16) packet.Packet {
	return packet.Packet{SrcMAC: macOf(podMAC), DstMAC: macOf(pod0MAC), Src: b.addr.Addr, SrcPort: b.addr.Port,
		Dst: addr(nsNodeIP), DstPort: sp, Proto: uint8(b.addr.Proto), TCPFlags: 0x12}
}

// portUnreachable is the ICMP port unreachable tc answers in with: from
// its destination, quoting its IPv4 header and TCP header, back out of the
// device it came in on.
func portUnreachable(in packet.Packet) []byte {
	b := in.Bytes()
	quote := b[14 : 14+20+20]
	return frame(in.SrcMAC, in.DstMAC, icmpErr(in.Dst.String(), in.Src.String(), 3, 3, 0, quote))
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
	ns, d, eth0, pod0 := semanticsNode(t, Config{
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")},
	})
	m, ing := d.Maps(), d.TCIngress()

	t.Run("external to ClusterIP, backend here: masqueraded there and back", func(t *testing.T) {
		ns.Enter(t)
		in := nsClient(41000, cipLocal)
		verdict, out := runOn(t, ing, eth0, in.Bytes())
		sp := snatPortOf(t, m, nsClientIP, 41000, cipLocal)
		expectPacket(t, "forward", verdict, tcActRedirect, out, masqToPod(in, sp, beLocal))
		reply := podReply(beLocal, sp)
		expectRun(t, "reply", ing, pod0, reply, tcActRedirect, toClient(reply, cipLocal, 41000))
	})

	t.Run("external to ClusterIP, backend elsewhere: masqueraded", func(t *testing.T) {
		ns.Enter(t)
		in := nsClient(41001, cipRem)
		verdict, out := runOn(t, ing, eth0, in.Bytes())
		sp := snatPortOf(t, m, nsClientIP, 41001, cipRem)
		expectPacket(t, "forward", verdict, tcActRedirect, out, toRemote(in, sp, beRemote))
	})

	t.Run("pod to ClusterIP: not masqueraded", func(t *testing.T) {
		ns.Enter(t)
		in := fromPod(podClient, 41002, cipRem)
		expectRun(t, "forward", ing, pod0, in, tcActOK, dnat(in, beRemote))
	})

	t.Run("pod to its own ClusterIP: a hairpin, masqueraded", func(t *testing.T) {
		ns.Enter(t)
		in := fromPod(podBackend, 41003, cipLocal)
		verdict, out := runOn(t, ing, pod0, in.Bytes())
		sp := snatPortOf(t, m, podBackend, 41003, cipLocal)
		expectPacket(t, "forward", verdict, tcActRedirect, out, masqToPod(in, sp, beLocal))
		reply := podReply(beLocal, sp)
		verdict, out = runOn(t, ing, pod0, reply.Bytes())
		back := reply
		back.TTL = fwdTTL
		back.SrcMAC, back.DstMAC = macOf(pod0MAC), macOf(podMAC)
		back.Src, back.SrcPort = cipLocal.Addr, cipLocal.Port
		back.Dst, back.DstPort = addr(podBackend), 41003
		expectPacket(t, "reply", verdict, tcActRedirect, out, back)
	})

	t.Run("eTP Local: external clients get the default scope, unmasqueraded", func(t *testing.T) {
		ns.Enter(t)
		in := nsClient(41004, npTwo)
		expectRun(t, "forward", ing, eth0, in, tcActOK, dnat(in, beLocal))
	})

	t.Run("eTP Local: a pod of another node gets the internal scope, unmasqueraded", func(t *testing.T) {
		ns.Enter(t)
		in := nsClient(41005, npTwo)
		in.Src = addr(remotePod)
		expectRun(t, "forward", ing, eth0, in, tcActOK, dnat(in, beRemote))
	})

	t.Run("eTP Local without a local endpoint: external dropped, pods served", func(t *testing.T) {
		ns.Enter(t)
		verdict, _ := runOn(t, ing, eth0, nsClient(41006, npTwoNo).Bytes())
		expectVerdict(t, "external", verdict, tcActShot)
		in := fromPod(podClient, 41007, npTwoNo)
		expectRun(t, "pod", ing, pod0, in, tcActOK, dnat(in, beRemote))
	})

	t.Run("eTP Cluster: an external client to a backend here keeps its address", func(t *testing.T) {
		ns.Enter(t)
		in := nsClient(41008, npClus)
		expectRun(t, "forward", ing, eth0, in, tcActOK, dnat(in, beLocal))
	})

	t.Run("eTP Cluster: a pod is masqueraded, to a backend here too", func(t *testing.T) {
		ns.Enter(t)
		in := fromPod(podClient, 41009, npClus)
		verdict, out := runOn(t, ing, pod0, in.Bytes())
		sp := snatPortOf(t, m, podClient, 41009, npClus)
		expectPacket(t, "forward", verdict, tcActRedirect, out, masqToPod(in, sp, beLocal))
	})

	t.Run("iTP Local without a local endpoint: dropped", func(t *testing.T) {
		ns.Enter(t)
		verdict, _ := runOn(t, ing, pod0, fromPod(podClient, 41010, cipDrop).Bytes())
		expectVerdict(t, "pod", verdict, tcActShot)
	})

	t.Run("a ClusterIP's other port or protocol: rejected", func(t *testing.T) {
		ns.Enter(t)
		for _, in := range []packet.Packet{
			fromPod(podClient, 41011, l4("10.96.0.10", 81, model.TCP)),
			nsClient(41012, l4("10.96.0.11", 443, model.TCP)),
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
		verdict, _ := runOn(t, ing, eth0, nsClient(41013, l4("10.96.5.5", 80, model.TCP)).Bytes())
		expectVerdict(t, "unallocated", verdict, tcActShot)
		in := nsClient(41014, l4("10.97.0.1", 80, model.TCP)).Bytes()
		verdict, out := runOn(t, ing, eth0, in)
		if verdict != tcActOK || !bytes.Equal(out, in) {
			t.Fatalf("outside the service CIDR: verdict %d, packet changed", verdict)
		}
	})

	expectCounted(t, d, "tc_short_circuit", "tc_masq_local", "tc_snat_new", "tc_unknown_port",
		"tc_service_cidr_drop", "tc_local_no_backend")
}

// TestTCNoClusterCIDR: without --cluster-cidr no client is internal
// (kube-proxy without a local traffic detector): ClusterIP traffic is not
// masqueraded, whatever its source; a pod of another node to an
// externalTrafficPolicy Local frontend gets its default scope; a pod of
// this node to an externalTrafficPolicy Cluster one is still masqueraded
// (it did not come from outside); nothing drops as a service CIDR.
func TestTCNoClusterCIDR(t *testing.T) {
	ns, d, eth0, pod0 := semanticsNode(t, Config{})
	m, ing := d.Maps(), d.TCIngress()
	ns.Enter(t)

	in := nsClient(42000, cipLocal)
	expectRun(t, "external to ClusterIP", ing, eth0, in, tcActOK, dnat(in, beLocal))

	in = nsClient(42001, npTwo)
	in.Src = addr(remotePod)
	expectRun(t, "remote pod to eTP Local", ing, eth0, in, tcActOK, dnat(in, beLocal))

	in = fromPod(podClient, 42002, npClus)
	verdict, out := runOn(t, ing, pod0, in.Bytes())
	sp := snatPortOf(t, m, podClient, 42002, npClus)
	expectPacket(t, "pod to eTP Cluster", verdict, tcActRedirect, out, masqToPod(in, sp, beLocal))

	// A ClusterIP's other port is still a service IP's; the service CIDR
	// is unknown.
	in = nsClient(42003, l4("10.96.5.5", 80, model.TCP))
	verdict, _ = runOn(t, ing, eth0, in.Bytes())
	expectVerdict(t, "unallocated address", verdict, tcActOK)
	if cs, _ := d.Counters(); cs["tc_short_circuit"] != 0 {
		t.Errorf("tc_short_circuit = %d without a cluster CIDR", cs["tc_short_circuit"])
	}
}

// TestTCMasqueradeAll: --masquerade-all masquerades ClusterIP traffic from
// pods, and gives kube-proxy's answer for external clients of an
// externalTrafficPolicy Cluster frontend with a backend here (no
// deviation); externalTrafficPolicy Local traffic keeps its address.
func TestTCMasqueradeAll(t *testing.T) {
	ns, d, eth0, pod0 := semanticsNode(t, Config{
		ClusterCIDRs:  []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		MasqueradeAll: true,
	})
	m, ing := d.Maps(), d.TCIngress()
	ns.Enter(t)

	in := fromPod(podClient, 43000, cipRem)
	verdict, out := runOn(t, ing, pod0, in.Bytes())
	sp := snatPortOf(t, m, podClient, 43000, cipRem)
	expectPacket(t, "pod to ClusterIP", verdict, tcActRedirect, out, toRemote(in, sp, beRemote))

	in = nsClient(43001, npClus)
	verdict, out = runOn(t, ing, eth0, in.Bytes())
	sp = snatPortOf(t, m, nsClientIP, 43001, npClus)
	expectPacket(t, "external to eTP Cluster, backend here", verdict, tcActRedirect, out, masqToPod(in, sp, beLocal))

	in = nsClient(43002, npTwo)
	expectRun(t, "external to eTP Local", ing, eth0, in, tcActOK, dnat(in, beLocal))
}
