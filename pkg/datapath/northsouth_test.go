package datapath

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/packet"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// Packet tables for north-south traffic (NodePort, ExternalIP and
// LoadBalancer frontends) through BPF_PROG_TEST_RUN. They run in a network
// namespace of their own that looks like a node: eth0 (192.168.1.1/24) is
// the node device, the other node (192.168.1.2) routes the remote pod range
// 10.2.0.0/16, and pod0 holds the local pod range 10.1.0.0/24. Neighbours
// are static, so bpf_fib_lookup resolves next-hop MACs and the expected
// packets are exact.

var (
	nodeEthMAC  = net.HardwareAddr{0x02, 0, 0, 0, 0x01, 0x01}
	node2MAC    = net.HardwareAddr{0x02, 0, 0, 0, 0x02, 0x01}
	nodeEth1MAC = net.HardwareAddr{0x02, 0, 0, 0, 0x01, 0x02}
	node3MAC    = net.HardwareAddr{0x02, 0, 0, 0, 0x03, 0x01}
	nsClientMAC = net.HardwareAddr(clientMAC[:])
)

const (
	nsNodeIP   = "192.168.1.1"
	nsNode2IP  = "192.168.1.2"
	nsClientIP = "192.168.1.50"
)

// nodeNetns builds the node namespace described above, enters it for the
// rest of the test, and returns it and eth0's ifindex. (Subtests run on
// goroutines of their own: they must Enter it again.)
func nodeNetns(t testing.TB) (*topology.NS, int) {
	t.Helper()
	ns := topology.NewNS(t, "node")
	ns.Enter(t)
	if err := os.WriteFile("/proc/sys/net/ipv4/conf/all/forwarding", []byte("1"), 0); err != nil {
		t.Fatalf("enable forwarding: %v", err)
	}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0", HardwareAddr: nodeEthMAC}, PeerName: "wire0"}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("add veth: %v", err)
	}
	// eth1 (192.168.3.1/24): a second node device, towards node 3
	// (192.168.3.2), which routes 10.3.0.0/16.
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth1", HardwareAddr: nodeEth1MAC}, PeerName: "wire1"}); err != nil {
		t.Fatalf("add veth: %v", err)
	}
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "pod0"}, PeerName: "pod0peer"}); err != nil {
		t.Fatalf("add veth: %v", err)
	}
	must := func(err error, what string) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	eth0, err := netlink.LinkByName("eth0")
	must(err, "eth0")
	for _, name := range []string{"eth0", "wire0", "eth1", "wire1", "pod0", "pod0peer"} {
		l, err := netlink.LinkByName(name)
		must(err, name)
		must(netlink.LinkSetUp(l), "up "+name)
	}
	pod0, err := netlink.LinkByName("pod0")
	must(err, "pod0")
	addr, _ := netlink.ParseAddr(nsNodeIP + "/24")
	must(netlink.AddrAdd(eth0, addr), "address eth0")
	_, podNet, _ := net.ParseCIDR("10.1.0.0/24")
	must(netlink.RouteAdd(&netlink.Route{LinkIndex: pod0.Attrs().Index, Dst: podNet}), "route to local pods")
	_, remote, _ := net.ParseCIDR("10.2.0.0/16")
	must(netlink.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: remote, Gw: net.ParseIP(nsNode2IP)}), "route to remote pods")
	eth1, err := netlink.LinkByName("eth1")
	must(err, "eth1")
	addr1, _ := netlink.ParseAddr("192.168.3.1/24")
	must(netlink.AddrAdd(eth1, addr1), "address eth1")
	_, remote3, _ := net.ParseCIDR("10.3.0.0/16")
	must(netlink.RouteAdd(&netlink.Route{LinkIndex: eth1.Attrs().Index, Dst: remote3, Gw: net.ParseIP("192.168.3.2")}), "route to node 3's pods")
	must(netlink.NeighAdd(&netlink.Neigh{LinkIndex: eth1.Attrs().Index, Family: netlink.FAMILY_V4,
		State: netlink.NUD_PERMANENT, IP: net.ParseIP("192.168.3.2"), HardwareAddr: node3MAC}), "neighbour 192.168.3.2")
	_, far, _ := net.ParseCIDR("172.16.0.0/12") // clients beyond a router
	must(netlink.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: far, Gw: net.ParseIP(nsClientIP)}), "route to far clients")
	for ip, mac := range map[string]net.HardwareAddr{nsNode2IP: node2MAC, nsClientIP: nsClientMAC} {
		must(netlink.NeighAdd(&netlink.Neigh{LinkIndex: eth0.Attrs().Index, Family: netlink.FAMILY_V4,
			State: netlink.NUD_PERMANENT, IP: net.ParseIP(ip), HardwareAddr: mac}), "neighbour "+ip)
	}
	return ns, eth0.Attrs().Index
}

// skbCtx is the head of struct __sk_buff, up to ifindex: BPF_PROG_TEST_RUN
// runs the program as if the packet had arrived on that device.
type skbCtx struct {
	Len, PktType, Mark, QueueMapping, Protocol, VlanPresent, VlanTci, VlanProto, Priority, IngressIfindex, Ifindex uint32
}

func runOn(t *testing.T, prog *ebpf.Program, ifindex int, in []byte) (uint32, []byte) {
	t.Helper()
	opts := ebpf.RunOptions{
		Data:    append([]byte(nil), in...),
		DataOut: make([]byte, len(in)+256),
		Context: skbCtx{Ifindex: uint32(ifindex)},
	}
	ret, err := prog.Run(&opts)
	if err != nil {
		t.Fatalf("BPF_PROG_TEST_RUN: %v", err)
	}
	return ret, opts.DataOut
}

// addExternal writes a frontend like addService, with master flags.
func addExternal(t testing.TB, m *Maps, id reconciler.ServiceID, fe model.L4Addr, flags uint8, bes ...testBackend) {
	t.Helper()
	addService(t, m, id, fe, bes...)
	if err := m.UpsertMaster(reconciler.DefaultScope(fe), reconciler.Master{ID: id, Count: uint32(len(bes)), Flags: flags}); err != nil {
		t.Fatal(err)
	}
}

// snatPortOf returns the SNAT port of the forward conntrack entry of the
// flow <client:cport -> fe>, failing if the flow is not source-NATed.
func snatPortOf(t testing.TB, m *Maps, client string, cport uint16, fe model.L4Addr) uint16 {
	t.Helper()
	k := sockCt4Key{
		Saddr: be32(netip.MustParseAddr(client)), Daddr: be32(fe.Addr),
		Sport: be16(cport), Dport: be16(fe.Port), Proto: uint8(fe.Proto), Dir: ctForward,
	}
	v, ok := ctGet(m, k)
	if !ok {
		t.Fatalf("no forward conntrack entry of %s:%d -> %s", client, cport, fe)
	}
	if v.Flags&ctFlagSNAT == 0 || addrFromBE32(v.SnatAddr).String() != nsNodeIP {
		t.Fatalf("flow %s:%d -> %s not source-NATed to %s: %+v", client, cport, fe, nsNodeIP, v)
	}
	return portFromBE16(v.SnatPort)
}

func expectPacket(t *testing.T, name string, verdict, wantVerdict uint32, out []byte, want packet.Packet) {
	t.Helper()
	if verdict != wantVerdict {
		t.Fatalf("%s: verdict %d, want %d", name, verdict, wantVerdict)
	}
	w := want.Bytes()
	if !bytes.Equal(out, w) {
		t.Fatalf("%s: output packet\n got %x\nwant %x", name, out, w)
	}
	checkChecksums(t, out)
}

// expectRun runs in through prog as arriving on ifindex and fails t
// unless the verdict is verdict and the output want (expectPacket).
func expectRun(t *testing.T, name string, prog *ebpf.Program, ifindex int, in packet.Packet, verdict uint32, want packet.Packet) {
	t.Helper()
	v, out := runOn(t, prog, ifindex, in.Bytes())
	expectPacket(t, name, v, verdict, out, want)
}

func macOf(h net.HardwareAddr) (m [6]byte) { copy(m[:], h); return }

var (
	npRemote = l4(nsNodeIP, 30080, model.TCP)
	npLocal  = l4(nsNodeIP, 30081, model.TCP)
	npUDP    = l4(nsNodeIP, 30053, model.UDP)
	npEmpty  = l4(nsNodeIP, 30082, model.TCP)
	lbRanges = l4("192.168.1.200", 80, model.TCP)
	extIP    = l4("192.168.1.201", 80, model.TCP)
	beRemote = testBackend{1, l4("10.2.0.7", 8080, model.TCP)}
	beLocal  = testBackend{2, l4("10.1.0.7", 8080, model.TCP)}
	beRemU   = testBackend{3, l4("10.2.0.8", 5353, model.UDP)}
)

// northSouthNode is the set-up the tc and XDP tables share: the node
// namespace, entered, a datapath on eth0, and the NodePort and ExternalIP
// frontends both tables send to (ids 1, 2, 3 and 5).
func northSouthNode(t testing.TB) (*topology.NS, int, *Datapath) {
	t.Helper()
	ns, ifindex, d := nodeDatapath(t, xdpConfig, "eth0")
	m, ext := d.Maps(), reconciler.FlagExternal
	addExternal(t, m, 1, npRemote, ext, beRemote)
	addExternal(t, m, 2, npLocal, ext, beLocal)
	addExternal(t, m, 3, npUDP, ext, beRemU)
	addExternal(t, m, 5, extIP, ext|reconciler.FlagLocal, beRemote) // Local: never SNAT
	return ns, ifindex, d
}

// ofFamily is v4 or v6 (addresses of the tables), whichever is of a's
// family: the node's or the client's address as a packet to or from a
// (IPv4, or IPv6 with addNodeIPv6) sees it.
func ofFamily(a netip.Addr, v4, v6 string) netip.Addr {
	if a.Is6() {
		return addr(v6)
	}
	return addr(v4)
}

// nsClient is a request from the client (nsClientIP, or nsClientIP6) to
// fe, from port sport.
func nsClient(sport uint16, fe model.L4Addr) packet.Packet {
	p := packet.Packet{SrcMAC: clientMAC, DstMAC: macOf(nodeEthMAC), Src: ofFamily(fe.Addr, nsClientIP, nsClientIP6), Dst: fe.Addr,
		SrcPort: sport, DstPort: fe.Port, Proto: uint8(fe.Proto)}
	if fe.Proto == model.UDP {
		p.Payload = []byte("nodeport datagram")
	}
	return p
}

// toRemote is request in as the node sends it on to be on the other node:
// source-NATed to the node's address (of be's family) and port sp,
// destination-NATed to be, from eth0 to node 2.
func toRemote(in packet.Packet, sp uint16, be testBackend) packet.Packet {
	in.TTL = fwdTTL // forwarded by tc or XDP
	in.SrcMAC, in.DstMAC = macOf(nodeEthMAC), macOf(node2MAC)
	in.Src, in.SrcPort = ofFamily(be.addr.Addr, nsNodeIP, nsNodeIP6), sp
	in.Dst, in.DstPort = be.addr.Addr, be.addr.Port
	return in
}

// replyFrom is be's reply, arriving from node 2, to the node's SNAT port
// sp.
func replyFrom(be testBackend, sp uint16, flags uint8) packet.Packet {
	p := packet.Packet{SrcMAC: macOf(node2MAC), DstMAC: macOf(nodeEthMAC), Src: be.addr.Addr, SrcPort: be.addr.Port,
		Dst: ofFamily(be.addr.Addr, nsNodeIP, nsNodeIP6), DstPort: sp, Proto: uint8(be.addr.Proto), TCPFlags: flags}
	if be.addr.Proto == model.UDP {
		p.Payload = []byte("answer")
	}
	return p
}

// toClient is reply r as the node sends it back to the client: from
// frontend fe to the client's port cport.
func toClient(r packet.Packet, fe model.L4Addr, cport uint16) packet.Packet {
	r.TTL = fwdTTL // forwarded by tc or XDP
	r.SrcMAC, r.DstMAC = macOf(nodeEthMAC), clientMAC
	r.Src, r.SrcPort = fe.Addr, fe.Port
	r.Dst, r.DstPort = ofFamily(fe.Addr, nsClientIP, nsClientIP6), cport
	return r
}

func TestNorthSouthPacketTable(t *testing.T) {
	ns, ifindex, d := northSouthNode(t)
	m, ext := d.Maps(), reconciler.FlagExternal
	addExternal(t, m, 4, npEmpty, ext|reconciler.FlagLocal|reconciler.FlagDropEmpty)
	for _, p := range []string{"192.168.1.0/28", "172.16.0.0/12"} {
		if err := m.UpsertSourceRange(lbRanges, netip.MustParsePrefix(p)); err != nil {
			t.Fatal(err)
		}
	}
	addExternal(t, m, 6, lbRanges, ext|reconciler.FlagSourceRanges, beLocal)
	ing, eg := d.TCIngress(), d.TCEgress()
	client := nsClient
	// expectDNATOnly: ingress passes in on with only its destination
	// rewritten, to the backend at dst:8080.
	expectDNATOnly := func(t *testing.T, name string, in packet.Packet, dst string) {
		t.Helper()
		want := in
		want.Dst, want.DstPort = addr(dst), 8080
		expectRun(t, name, ing, ifindex, in, tcActOK, want)
	}

	// A remote backend: the request leaves source-NATed to a port of the
	// node's range and destination-NATed, redirected to node 2; the same
	// flow again keeps its port and rewrite; the reply from node 2 goes
	// back to the client.
	for _, c := range []struct {
		name       string
		sport      uint16
		fe         model.L4Addr
		be         testBackend // 10.2.0.7:8080 and 10.2.0.8:5353, via node 2
		replyFlags uint8
	}{
		{"tcp_remote_dnat_snat_redirect", 40000, npRemote, beRemote, 0x12},
		{"udp_remote_dnat_snat_redirect", 5300, npUDP, beRemU, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			ns.Enter(t)
			in := client(c.sport, c.fe)
			verdict, out := runOn(t, ing, ifindex, in.Bytes())
			sp := snatPortOf(t, m, nsClientIP, c.sport, c.fe)
			if sp < DefaultSNATPortMin {
				t.Fatalf("SNAT port %d outside %d-%d", sp, DefaultSNATPortMin, DefaultSNATPortMax)
			}
			want := toRemote(in, sp, c.be)
			expectPacket(t, "forward", verdict, tcActRedirect, out, want)
			expectRun(t, "forward again", ing, ifindex, in, tcActRedirect, want)
			reply := replyFrom(c.be, sp, c.replyFlags)
			expectRun(t, "reply", ing, ifindex, reply, tcActRedirect, toClient(reply, c.fe, c.sport))
		})
	}

	t.Run("tcp_local_dnat_only", func(t *testing.T) {
		ns.Enter(t)
		expectDNATOnly(t, "forward", client(40001, npLocal), "10.1.0.7")
		// The pod's reply leaves through eth0: egress restores the frontend.
		reply := packet.Packet{SrcMAC: macOf(nodeEthMAC), DstMAC: clientMAC, Src: addr("10.1.0.7"), SrcPort: 8080,
			Dst: addr(nsClientIP), DstPort: 40001, Proto: 6, TCPFlags: 0x12}
		back := reply
		back.Src, back.SrcPort = addr(nsNodeIP), 30081
		expectRun(t, "reply", eg, ifindex, reply, tcActOK, back)
	})

	t.Run("local_policy_remote_backend_no_snat", func(t *testing.T) {
		ns.Enter(t)
		expectDNATOnly(t, "forward", client(40002, extIP), "10.2.0.7")
	})

	t.Run("local_policy_no_backend_drops", func(t *testing.T) {
		ns.Enter(t)
		verdict, _ := runOn(t, ing, ifindex, client(40003, npEmpty).Bytes())
		if verdict != tcActShot {
			t.Fatalf("verdict %d, want drop (%d)", verdict, tcActShot)
		}
	})

	t.Run("source_ranges", func(t *testing.T) {
		ns.Enter(t)
		allowed := client(40004, lbRanges)
		allowed.Src = addr("192.168.1.5")
		expectDNATOnly(t, "allowed", allowed, "10.1.0.7")
		other := allowed
		other.Src = addr("172.20.1.1")
		expectDNATOnly(t, "allowed by second range", other, "10.1.0.7")
		denied := client(40005, lbRanges) // 192.168.1.50 is outside 192.168.1.0/28
		if verdict, _ := runOn(t, ing, ifindex, denied.Bytes()); verdict != tcActShot {
			t.Fatalf("denied source: verdict %d, want drop", verdict)
		}
		// Deleting the ranges removes them.
		for _, p := range []string{"192.168.1.0/28", "172.16.0.0/12"} {
			if err := m.DeleteSourceRange(lbRanges, netip.MustParsePrefix(p)); err != nil {
				t.Fatal(err)
			}
		}
		if verdict, _ := runOn(t, ing, ifindex, allowed.Bytes()); verdict != tcActShot {
			t.Fatalf("after prune: verdict %d, want drop (flag still set, no ranges)", verdict)
		}
	})

	expectCounted(t, d, "tc_snat_new", "tc_local_no_backend", "tc_src_range_deny", "tc_rev_nat")
}

func TestDevicesAndAddresses(t *testing.T) {
	testutil.Privileged(t)
	nodeNetns(t)
	devs, err := DevicesOf([]netip.Addr{netip.MustParseAddr(nsNodeIP)})
	if err != nil || fmt.Sprint(devs) != "[eth0]" {
		t.Fatalf("DevicesOf(%s) = %v, %v; want [eth0]", nsNodeIP, devs, err)
	}
	addrs, err := AddressesOf([]string{"eth0", "pod0"})
	if err != nil || fmt.Sprint(addrs) != "["+nsNodeIP+"]" {
		t.Fatalf("AddressesOf(eth0, pod0) = %v, %v; want [%s]", addrs, err, nsNodeIP)
	}
}

// TestNorthSouthSNATPorts: many clients through one node to one remote
// backend each get a port of their own; once the range is used up, new
// flows are refused rather than given a port in use; and ports of flows
// that closed come back after the close timeout, through GCConntrack. Per
// family.
func TestNorthSouthSNATPorts(t *testing.T) {
	forFamilies(t, northSouthSNATPorts)
}

// northSouthSNATPorts is TestNorthSouthSNATPorts over IPv4, or with v6
// over IPv6: the NodePort of nodeDatapath6, its clients 172.16.x.y's
// twins on eth0's IPv6 subnet (2001:db8:100::10:x:y).
func northSouthSNATPorts(t *testing.T, v6 bool) {
	cfg := configWith(smallConfig, func(cfg *Config) {
		// As many ports as a new flow tries (SNAT_TRIES): every free
		// port is found, so the test is exact.
		cfg.SNATPortMin, cfg.SNATPortMax = 62000, 62031
		cfg.CTTimeoutClose = 50 * time.Millisecond
		// No TIME_WAIT extension: the closed flow's port is free at the
		// close timeout (snattw_test.go tests the extension).
		cfg.CTTimeoutSNATTimeWait = cfg.CTTimeoutClose
	})
	n := nsNodeOf(t, v6, cfg)
	ifindex, d, np, be := n.ifindex, n.d, n.np, n.be
	m := d.Maps()
	ing := d.TCIngress()
	tw := func(a string) string {
		if !v6 {
			return a
		}
		b := addr(a).As4()
		return fmt.Sprintf("2001:db8:100::%x:%x:%x", b[1], b[2], b[3])
	}

	syn := func(client string, sport uint16) packet.Packet {
		return packet.Packet{SrcMAC: clientMAC, DstMAC: macOf(nodeEthMAC), Src: addr(tw(client)), Dst: np.Addr, SrcPort: sport, DstPort: 30080, Proto: 6}
	}
	used := map[uint16]string{}
	// 32 clients, two of them sharing a source port: every flow a port.
	for i := range 32 {
		client := fmt.Sprintf("172.16.%d.%d", i/200, 1+i%200)
		sport := uint16(40000 + i)
		if i == 31 {
			client, sport = "172.16.0.2", 40000 // same port as client 0, another address
		}
		verdict, out := runOn(t, ing, ifindex, syn(client, sport).Bytes())
		if verdict != tcActRedirect {
			t.Fatalf("flow %d: verdict %d", i, verdict)
		}
		sp := outSport(out)
		if sp < 62000 || sp > 62031 {
			t.Fatalf("flow %d: SNAT port %d outside the range", i, sp)
		}
		if prev, dup := used[sp]; dup {
			t.Fatalf("flow %d (%s:%d) got port %d, already used by %s", i, client, sport, sp, prev)
		}
		used[sp] = fmt.Sprintf("%s:%d", client, sport)
	}
	// The range is full: a 33rd flow is dropped (bounded tries), not
	// given a port in use.
	if verdict, _ := runOn(t, ing, ifindex, syn("172.31.0.1", 50000).Bytes()); verdict != tcActShot {
		t.Fatalf("flow beyond the range: verdict %d, want drop", verdict)
	}
	cs, _ := d.Counters()
	if cs["tc_snat_exhausted"] == 0 {
		t.Errorf("tc_snat_exhausted is 0: %v", cs)
	}

	// Close client 0's flow: FIN from the client, FIN from the backend.
	sp0 := snatPortFam(t, d, tw("172.16.0.1"), 40000, np)
	fin := syn("172.16.0.1", 40000)
	fin.TCPFlags = 0x11
	if v, _ := runOn(t, ing, ifindex, fin.Bytes()); v != tcActRedirect {
		t.Fatalf("client FIN: verdict %d", v)
	}
	rfin := packet.Packet{SrcMAC: macOf(node2MAC), DstMAC: macOf(nodeEthMAC), Src: be.addr.Addr, SrcPort: 8080,
		Dst: np.Addr, DstPort: sp0, Proto: 6, TCPFlags: 0x11}
	if v, _ := runOn(t, ing, ifindex, rfin.Bytes()); v != tcActRedirect {
		t.Fatalf("backend FIN: verdict %d", v)
	}
	time.Sleep(100 * time.Millisecond)
	st, err := m.GCConntrack()
	if err != nil {
		t.Fatal(err)
	}
	if st.Deleted != 2 {
		t.Fatalf("GCConntrack deleted %d entries, want the 2 of the closed flow", st.Deleted)
	}
	// Its port is free again: a new flow gets exactly it.
	verdict, out := runOn(t, ing, ifindex, syn("172.31.0.1", 50000).Bytes())
	if verdict != tcActRedirect {
		t.Fatalf("new flow after close: verdict %d", verdict)
	}
	if sp := outSport(out); sp != sp0 {
		t.Fatalf("new flow got port %d, want the freed %d", sp, sp0)
	}
}

const (
	xdpDrop = 1
	xdpPass = 2
	xdpTx   = 3
)

// xdpCtx is struct xdp_md for BPF_PROG_TEST_RUN: the packet arrives on
// IngressIfindex.
type xdpCtx struct {
	Data, DataEnd, DataMeta, IngressIfindex, RxQueueIndex, EgressIfindex uint32
}

func runXDP(t *testing.T, prog *ebpf.Program, ifindex int, in []byte) (uint32, []byte) {
	t.Helper()
	opts := ebpf.RunOptions{
		Data:    append([]byte(nil), in...),
		DataOut: make([]byte, len(in)+256),
		Context: xdpCtx{DataEnd: uint32(len(in)), IngressIfindex: uint32(ifindex)},
	}
	ret, err := prog.Run(&opts)
	if err != nil {
		t.Fatalf("BPF_PROG_TEST_RUN (XDP): %v", err)
	}
	return ret, opts.DataOut
}

// xdpRoundTrip runs in, a request to fe that starts a flow, and then its
// backend be's reply (TCP flags replyFlags) through d's XDP program,
// arriving on ifindex: XDP must send both on itself (XDP_TX), rewritten
// as toRemote and toClient say. It returns the flow's SNAT port.
func xdpRoundTrip(t *testing.T, d *Datapath, ifindex int, in packet.Packet, fe model.L4Addr, be testBackend, replyFlags uint8) uint16 {
	t.Helper()
	verdict, out := runXDP(t, d.XDP(), ifindex, in.Bytes())
	var sp uint16
	if fe.Addr.Is6() {
		sp = snatPort6Of(t, d, in.Src.String(), in.SrcPort, fe)
	} else {
		sp = snatPortOf(t, d.Maps(), in.Src.String(), in.SrcPort, fe)
	}
	expectPacket(t, fmt.Sprintf("%s request", fe), verdict, xdpTx, out, toRemote(in, sp, be))
	r := replyFrom(be, sp, replyFlags)
	verdict, out = runXDP(t, d.XDP(), ifindex, r.Bytes())
	expectPacket(t, fmt.Sprintf("%s reply", fe), verdict, xdpTx, out, toClient(r, fe, in.SrcPort))
	return sp
}

// TestXDPPacketTable: the XDP fast path rewrites external flows to remote
// backends and their replies exactly like tc and transmits them itself;
// everything else passes untouched to tc.
func TestXDPPacketTable(t *testing.T) {
	_, ifindex, d := northSouthNode(t)
	m, ext := d.Maps(), reconciler.FlagExternal
	lbRemote := l4("192.168.1.202", 80, model.TCP)
	if err := m.UpsertSourceRange(lbRemote, netip.MustParsePrefix("192.168.1.0/28")); err != nil {
		t.Fatal(err)
	}
	addExternal(t, m, 6, lbRemote, ext|reconciler.FlagSourceRanges, beRemote)
	if err := d.AttachDevices([]string{"eth0", "eth1"}); err != nil {
		t.Fatal(err)
	}
	npNode3 := l4(nsNodeIP, 30083, model.TCP)
	beNode3 := testBackend{7, l4("10.3.0.7", 8080, model.TCP)}
	addExternal(t, m, 7, npNode3, ext, beNode3)
	xdp, ing := d.XDP(), d.TCIngress()
	client := nsClient

	// TCP: SYN, reply, and the rest of the flow, all in XDP.
	in := client(41000, npRemote)
	sp := xdpRoundTrip(t, d, ifindex, in, npRemote, beRemote, 0x12)
	ack := in
	ack.TCPFlags = 0x10
	ack.Payload = []byte("GET / HTTP/1.0\r\n\r\n")
	verdict, out := runXDP(t, xdp, ifindex, ack.Bytes())
	expectPacket(t, "tcp data", verdict, xdpTx, out, toRemote(ack, sp, beRemote))

	// UDP, with a checksum and without one.
	u := client(5400, npUDP)
	usp := xdpRoundTrip(t, d, ifindex, u, npUDP, beRemU, 0)
	u0 := u
	u0.NoUDPChecksum = true
	verdict, out = runXDP(t, xdp, ifindex, u0.Bytes())
	expectPacket(t, "udp forward, no checksum", verdict, xdpTx, out, toRemote(u0, usp, beRemU))

	// A flow tc started (say the neighbour was unresolved) continues in
	// XDP on the same reservation.
	in2 := client(41001, npRemote)
	if v, _ := runOn(t, ing, ifindex, in2.Bytes()); v != tcActRedirect {
		t.Fatalf("tc start: verdict %d", v)
	}
	sp2 := snatPortOf(t, m, nsClientIP, 41001, npRemote)
	in2.TCPFlags = 0x10
	verdict, out = runXDP(t, xdp, ifindex, in2.Bytes())
	expectPacket(t, "tc-started flow in XDP", verdict, xdpTx, out, toRemote(in2, sp2, beRemote))

	// A backend behind the other device: redirected there, source-NATed
	// to that device's address; tc does the same.
	for i, prog := range []*ebpf.Program{xdp, ing} {
		in3 := client(uint16(41010+i), npNode3)
		var verdict uint32
		var out []byte
		want := uint32(4) // XDP_REDIRECT
		if prog == ing {
			verdict, out = runOn(t, prog, ifindex, in3.Bytes())
			want = tcActRedirect
		} else {
			verdict, out = runXDP(t, prog, ifindex, in3.Bytes())
		}
		k := sockCt4Key{Saddr: be32(netip.MustParseAddr(nsClientIP)), Daddr: be32(npNode3.Addr),
			Sport: be16(in3.SrcPort), Dport: be16(npNode3.Port), Proto: 6, Dir: ctForward}
		v, ok := ctGet(m, k)
		if !ok {
			t.Fatal("no forward entry via eth1")
		}
		w := in3
		w.TTL = fwdTTL
		w.SrcMAC, w.DstMAC = macOf(nodeEth1MAC), macOf(node3MAC)
		w.Src, w.SrcPort = addr("192.168.3.1"), portFromBE16(v.SnatPort)
		w.Dst, w.DstPort = addr("10.3.0.7"), 8080
		expectPacket(t, fmt.Sprintf("redirect to eth1 (prog %d)", i), verdict, want, out, w)
	}

	// Source ranges: allowed goes through XDP, denied is dropped there.
	allowed := client(41002, lbRemote)
	allowed.Src = addr("192.168.1.5")
	verdict, out = runXDP(t, xdp, ifindex, allowed.Bytes())
	asp := snatPortOf(t, m, "192.168.1.5", 41002, lbRemote)
	expectPacket(t, "allowed source", verdict, xdpTx, out, toRemote(allowed, asp, beRemote))
	if v, _ := runXDP(t, xdp, ifindex, client(41003, lbRemote).Bytes()); v != xdpDrop {
		t.Fatalf("denied source: verdict %d, want XDP_DROP", v)
	}

	// Left to tc, untouched.
	withOpts := client(41004, npRemote)
	withOpts.IPOptions = []byte{1, 1, 1, 0}
	for name, p := range map[string]packet.Packet{
		"local backend":       client(41005, npLocal),
		"Local policy":        client(41006, extIP),
		"not a service":       client(41007, l4(nsNodeIP, 22, model.TCP)),
		"IP options":          withOpts,
		"reply of no flow":    replyFrom(beRemote, 61999, 0x12),
		"ClusterIP-like port": client(41008, l4(nsNodeIP, 30099, model.TCP)),
	} {
		b := p.Bytes()
		verdict, out := runXDP(t, xdp, ifindex, b)
		if verdict != xdpPass || !bytes.Equal(out[:len(b)], b) {
			t.Errorf("%s: verdict %d (want XDP_PASS), output changed: %v", name, verdict, !bytes.Equal(out[:len(b)], b))
		}
	}
	cs := counters(t, d)
	if cs["xdp_fwd"] == 0 || cs["xdp_rev"] == 0 || cs["xdp_snat_new"] == 0 || cs["xdp_src_range_deny"] == 0 {
		t.Errorf("XDP counters zero: %v", cs)
	}
	// tc saw no denied source here: XDP counts its own drops.
	if cs["tc_src_range_deny"] != 0 {
		t.Errorf("XDP drop counted as tc_src_range_deny: %v", cs)
	}
}

// TestXDP6PacketTable is TestXDPPacketTable over IPv6 (bpf/xdp.c's
// sluice6_xdp, which the attached program tail-calls for an IPv6 frame),
// on the node of TestTC6NorthSouthPacketTable: a NodePort flow to a
// backend on node 2 is DNATed and SNATed to eth0's IPv6 address with a
// reserved port and transmitted one hop less, its reply rewritten back to
// the client, by XDP; a flow tc started goes on in XDP; source ranges and
// session affinity as tc has them; and what XDP cannot finish passes to
// tc untouched. The packets are built from scratch (checksums over the
// IPv6 pseudo-header included), so a byte-for-byte match proves the
// incremental checksum updates exact.
func TestXDP6PacketTable(t *testing.T) {
	_, ifindex, d := nodeDatapath6(t, xdpConfig)
	must := func(err error, what string) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	// A local pod range behind pod0 (its neighbour resolved), and a range
	// behind a router (2001:db8:100::4) whose neighbour is not.
	pod0 := mustLink(t, "pod0")
	for _, r := range []netlink.Route{
		{LinkIndex: pod0.Attrs().Index, Dst: &net.IPNet{IP: net.ParseIP("2001:db8:1::"), Mask: net.CIDRMask(64, 128)}},
		{LinkIndex: mustLink(t, "eth0").Attrs().Index, Dst: &net.IPNet{IP: net.ParseIP("2001:db8:4::"), Mask: net.CIDRMask(64, 128)},
			Gw: net.ParseIP("2001:db8:100::4")},
	} {
		must(netlink.RouteAdd(&r), "route "+r.Dst.String())
	}
	must(netlink.NeighAdd(&netlink.Neigh{LinkIndex: pod0.Attrs().Index, Family: netlink.FAMILY_V6,
		State: netlink.NUD_PERMANENT, IP: net.ParseIP("2001:db8:1::7"), HardwareAddr: node3MAC}), "neighbour of the local pod")

	np, npU, be, beU := np6Remote, np6UDP, be6Remote, be6RemU
	npLocal := l4(nsNodeIP6, 30081, model.TCP)
	npNoNeigh := l4(nsNodeIP6, 30084, model.TCP)
	extLocal := l4("2001:db8:100::c9", 80, model.TCP)
	lbRanges := l4("2001:db8:100::c8", 80, model.TCP)
	npAff := l4(nsNodeIP6, 30090, model.TCP)
	m, ext := d.Maps(), reconciler.FlagExternal
	addExternal(t, m, 13, npLocal, ext, testBackend{13, l4("2001:db8:1::7", 8080, model.TCP)})
	addExternal(t, m, 14, npNoNeigh, ext, testBackend{14, l4("2001:db8:4::7", 8080, model.TCP)})
	addExternal(t, m, 15, extLocal, ext|reconciler.FlagLocal, be)
	must(m.UpsertSourceRange(lbRanges, netip.MustParsePrefix("2001:db8:100::/124")), "source range")
	addExternal(t, m, 16, lbRanges, ext|reconciler.FlagSourceRanges, be)
	var affBackends []testBackend
	for i := range 4 {
		affBackends = append(affBackends, testBackend{reconciler.BackendID(21 + i), l4(fmt.Sprintf("2001:db8:2::%x", 0x21+i), 8080, model.TCP)})
	}
	addService(t, m, 17, npAff, affBackends...)
	must(m.UpsertMaster(reconciler.DefaultScope(npAff), reconciler.Master{ID: 17, Count: 4,
		Flags: ext | reconciler.FlagAffinity, AffinityTimeout: 3600}), "affinity master")
	xdp := d.XDP()

	// TCP: SYN, SYN-ACK, and the rest of the flow, all in XDP; UDP both
	// ways.
	syn := nsClient(41000, np)
	sp := xdpRoundTrip(t, d, ifindex, syn, np, be, packet.SYN|packet.ACK)
	data := syn.With(func(p *packet.Packet) { p.TCPFlags, p.Payload = packet.ACK, []byte("GET / HTTP/1.0\r\n\r\n") })
	verdict, out := runXDP(t, xdp, ifindex, data.Bytes())
	expectPacket(t, "established", verdict, xdpTx, out, toRemote(data, sp, be))
	xdpRoundTrip(t, d, ifindex, nsClient(5400, npU), npU, beU, 0)

	// A flow tc started goes on in XDP, on the same reservation.
	tcSyn := nsClient(41001, np)
	if v, _ := runOn(t, d.TCIngress(), ifindex, tcSyn.Bytes()); v != tcActRedirect {
		t.Fatalf("tc start: verdict %d", v)
	}
	sp2 := snatPort6Of(t, d, nsClientIP6, 41001, np)
	tcAck := tcSyn.With(func(p *packet.Packet) { p.TCPFlags = packet.ACK })
	verdict, out = runXDP(t, xdp, ifindex, tcAck.Bytes())
	expectPacket(t, "tc-started flow in XDP", verdict, xdpTx, out, toRemote(tcAck, sp2, be))

	// Source ranges: allowed goes through XDP, denied is dropped there.
	allowed := nsClient(41002, lbRanges).With(func(p *packet.Packet) { p.Src = addr("2001:db8:100::5") })
	verdict, out = runXDP(t, xdp, ifindex, allowed.Bytes())
	asp := snatPort6Of(t, d, "2001:db8:100::5", 41002, lbRanges)
	expectPacket(t, "allowed source", verdict, xdpTx, out, toRemote(allowed, asp, be))
	if v, _ := runXDP(t, xdp, ifindex, nsClient(41003, lbRanges).Bytes()); v != xdpDrop {
		t.Errorf("denied source: verdict %d, want XDP_DROP", v)
	}

	// Session affinity: every new flow of the client goes where its
	// first went, and so does one tc starts (the entries are shared).
	var first testBackend
	for i := range 8 {
		in := nsClient(uint16(42000+i), npAff)
		verdict, out := runXDP(t, xdp, ifindex, in.Bytes())
		p, err := packet.Parse(out)
		must(err, "parse")
		if i == 0 {
			first = testBackend{addr: l4(p.Dst.String(), 8080, model.TCP)}
		}
		sp := snatPort6Of(t, d, nsClientIP6, in.SrcPort, npAff)
		expectPacket(t, fmt.Sprintf("affinity flow %d", i), verdict, xdpTx, out, toRemote(in, sp, first))
	}
	in := nsClient(42100, npAff)
	verdict, out = runOn(t, d.TCIngress(), ifindex, in.Bytes())
	expectPacket(t, "affinity flow started by tc", verdict, tcActRedirect, out,
		toRemote(in, snatPort6Of(t, d, nsClientIP6, 42100, npAff), first))

	// Left to tc, untouched: what XDP does not translate, and what it
	// cannot finish (extension headers, fragments, a hop limit that
	// would expire, an unresolved neighbour, a local backend), and
	// malformed frames.
	last := nsClient(41004, np).With(func(p *packet.Packet) { p.TTL = 1 })
	short := nsClient(41005, np).Bytes()
	badLen := nsClient(41006, np).Bytes()
	badLen[14+4], badLen[14+5] = 0, 8 // payload length 8: no whole TCP header
	v4in6 := nsClient(41007, np).Bytes()
	v4in6[14] = 0x40 // version 4 under the IPv6 ethertype
	for name, b := range map[string][]byte{
		"local backend":        nsClient(41010, npLocal).Bytes(),
		"unresolved neighbour": nsClient(41011, npNoNeigh).Bytes(),
		"Local policy":         nsClient(41012, extLocal).Bytes(),
		"not a service":        nsClient(41013, l4(nsNodeIP6, 22, model.TCP)).Bytes(),
		"reply of no flow":     replyFrom(be, 61999, packet.SYN|packet.ACK).Bytes(),
		"hop-by-hop header": nsClient(41014, np).With(func(p *packet.Packet) {
			p.IPv6.Ext = []packet.ExtHeader{packet.HopByHopHeader([]byte{5, 2, 0, 0})}
		}).Bytes(),
		"first fragment": nsClient(41015, np).With(func(p *packet.Packet) {
			p.IPv6.Ext = []packet.ExtHeader{packet.FragmentHeader(0, true, 7)}
		}).Bytes(),
		"UDP without checksum": nsClient(5401, npU).With(func(p *packet.Packet) { p.NoUDPChecksum = true }).Bytes(),
		"hop limit 1":          last.Bytes(),
		"truncated TCP header": short[:14+40+10],
		"IPv6 header only":     short[:14+40],
		"Ethernet header only": short[:14],
		"payload length 8":     badLen,
		"version 4":            v4in6,
	} {
		verdict, out := runXDP(t, xdp, ifindex, b)
		if verdict != xdpPass || !bytes.Equal(out[:len(b)], b) {
			t.Errorf("%s: verdict %d (want XDP_PASS), output changed: %v", name, verdict, !bytes.Equal(out[:len(b)], b))
		}
	}
	// Over the egress MTU: to tc, which answers packet too big.
	must(netlink.LinkSetMTU(mustLink(t, "eth0"), 1280), "MTU")
	big := data.With(func(p *packet.Packet) { p.Payload = bytes.Repeat([]byte("m"), 1300) }).Bytes()
	if verdict, out := runXDP(t, xdp, ifindex, big); verdict != xdpPass || !bytes.Equal(out[:len(big)], big) {
		t.Errorf("over the MTU: verdict %d (want XDP_PASS), output changed: %v", verdict, !bytes.Equal(out[:len(big)], big))
	}

	cs := expectCounted(t, d, "xdp_fwd", "xdp_rev", "xdp_snat_new", "xdp_src_range_deny", "xdp_ttl_exceeded", "xdp_mtu_exceeded")
	if cs["tc_src_range_deny"] != 0 {
		t.Errorf("XDP drop counted as tc_src_range_deny: %v", cs)
	}

	// Without the IPv6 program in sluice6_xdp_v1 (the agent that put it
	// there is gone), IPv6 passes to tc untouched.
	must(d.xdp.Sluice6XdpV1.Delete(uint32(0)), "empty sluice6_xdp_v1")
	fresh := nsClient(41020, np).Bytes()
	if v, out := runXDP(t, xdp, ifindex, fresh); v != xdpPass || !bytes.Equal(out[:len(fresh)], fresh) {
		t.Errorf("without the IPv6 program: verdict %d (want XDP_PASS), output changed: %v", v, !bytes.Equal(out[:len(fresh)], fresh))
	}
}

// TestAttachXDPModes: the XDP program follows Config.XDP across agent
// restarts: generic, then native (the generic attachment goes), then off
// (nothing left); Cleanup removes whatever is attached.
func TestAttachXDPModes(t *testing.T) {
	testutil.Privileged(t)
	nodeNetns(t)
	bpffs := testPinDir(t)
	pins := func() []string {
		es, _ := os.ReadDir(filepath.Join(bpffs, "sluice", "links"))
		var out []string
		for _, e := range es {
			if strings.HasPrefix(e.Name(), "xdp_") {
				out = append(out, e.Name())
			}
		}
		return out
	}
	attached := func() uint32 {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			t.Fatal(err)
		}
		if x := l.Attrs().Xdp; x != nil && x.Attached {
			return x.AttachMode
		}
		return 0
	}
	for _, c := range []struct {
		mode XDPMode
		pins string
		att  uint32
	}{
		{XDPGeneric, "[xdp_generic_eth0]", nl.XDP_ATTACHED_SKB},
		{XDPNative, "[xdp_native_eth0]", nl.XDP_ATTACHED_DRV},
		{XDPNative, "[xdp_native_eth0]", nl.XDP_ATTACHED_DRV}, // again: updated in place
		{XDPOff, "[]", 0},
	} {
		cfg := smallConfig(bpffs)
		cfg.XDP = c.mode
		d, err := Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		err = d.AttachDevices([]string{"eth0"})
		d.Close()
		if err != nil {
			t.Fatalf("%s: %v", c.mode, err)
		}
		if got := fmt.Sprint(pins()); got != c.pins {
			t.Errorf("%s: pinned XDP links %s, want %s", c.mode, got, c.pins)
		}
		if got := attached(); got != c.att {
			t.Errorf("%s: eth0 XDP attach mode %d, want %d", c.mode, got, c.att)
		}
	}
	cfg := smallConfig(bpffs)
	cfg.XDP = XDPGeneric
	d := openTest(t, cfg)
	if err := d.AttachDevices([]string{"eth0"}); err != nil {
		t.Fatal(err)
	}
	if err := Cleanup(bpffs); err != nil {
		t.Fatal(err)
	}
	if got := attached(); got != 0 {
		t.Errorf("after Cleanup: eth0 XDP attach mode %d", got)
	}
	if _, err := ParseXDPMode("fast"); err == nil {
		t.Error(`ParseXDPMode("fast") succeeded`)
	}
}

// TestXDPPassesClashRemap: XDP takes a remapped flow's entries (source-NATed
// to the client's own address, lb4_remap) for no source-NATed flow of its
// own: the reply of a pod's remapped flow to a backend on another node,
// arriving on eth0, passes to tc untouched (XDP would send it to the pod's
// veth itself, where nothing receives an XDP frame), which translates it;
// so does the next packet of an external client's remapped flow to a
// NodePort whose endpoint is the pod.
func TestXDPPassesClashRemap(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		base := configWith(xdpConfig, oneSNATPort)
		var ifindex int
		var d *Datapath
		be, client := beRemote, "10.1.0.7"
		if v6 {
			_, ifindex, d = nodeDatapath6(t, base)
			be, client = be6Remote, "2001:db8:1::7"
			pod0 := mustLink(t, "pod0")
			route := netlink.Route{LinkIndex: pod0.Attrs().Index, Dst: &net.IPNet{IP: net.ParseIP("2001:db8:1::"), Mask: net.CIDRMask(64, 128)}}
			if err := netlink.RouteAdd(&route); err != nil {
				t.Fatal(err)
			}
		} else {
			_, ifindex, d = nodeDatapath(t, base, "eth0")
		}
		// The client's neighbour is resolved: XDP could send to it.
		if err := netlink.NeighAdd(&netlink.Neigh{LinkIndex: mustLink(t, "pod0").Attrs().Index, Family: map[bool]int{false: netlink.FAMILY_V4, true: netlink.FAMILY_V6}[v6],
			State: netlink.NUD_PERMANENT, IP: net.ParseIP(client), HardwareAddr: node3MAC}); err != nil {
			t.Fatal(err)
		}
		m := d.Maps()
		vip1, vip2 := l4(twinAddr(v6, "10.96.0.80"), 80, model.TCP), l4(twinAddr(v6, "10.96.0.81"), 80, model.TCP)
		addService(t, m, 31, vip1, be)
		addService(t, m, 32, vip2, be)
		f1 := flow{client, 47500, vip1}
		f2 := f1
		f2.fe = vip2
		pod := mustLink(t, "pod0").Attrs().Index
		for _, f := range []flow{f1, f2} {
			if v, _ := runOn(t, d.TCIngress(), pod, f.pkt(tcpSYN_).Bytes()); v != tcActOK {
				t.Fatalf("SYN to %s: verdict %d", f.fe, v)
			}
		}
		reply := f2.from(be.addr, tcpSA)
		reply.DstPort = 62000
		in := reply.Bytes()
		if v, out := runXDP(t, d.XDP(), ifindex, in); v != xdpPass || !bytes.Equal(out[:len(in)], in) {
			t.Fatalf("XDP: reply of the remapped flow: verdict %d, want %d and the frame untouched", v, xdpPass)
		}
		want := reply.With(func(p *packet.Packet) { p.Src, p.SrcPort, p.DstPort = vip2.Addr, vip2.Port, f2.cport })
		if v, out := runOn(t, d.TCIngress(), ifindex, in); v != tcActOK || !bytes.Equal(out[:len(in)], want.Bytes()) {
			t.Fatalf("tc: reply of the remapped flow: verdict %d\n got %x\nwant %x", v, out[:len(in)], want.Bytes())
		}

		// An external client's flows to two NodePorts whose endpoint is
		// the pod (DNAT only: Sluice's deviation keeps the client's
		// address): the second's next packet passes XDP to tc too.
		node := ofFamily(vip1.Addr, nsNodeIP, nsNodeIP6).String()
		local := testBackend{33, l4(client, 8080, model.TCP)}
		np1, np2 := l4(node, 30101, model.TCP), l4(node, 30102, model.TCP)
		addExternal(t, m, 33, np1, reconciler.FlagExternal, local)
		addExternal(t, m, 34, np2, reconciler.FlagExternal, local)
		for _, np := range []model.L4Addr{np1, np2} {
			if v, _ := runOn(t, d.TCIngress(), ifindex, nsClient(47600, np).Bytes()); v != tcActOK {
				t.Fatalf("SYN to %s: verdict %d", np, v)
			}
		}
		ack := nsClient(47600, np2)
		ack.TCPFlags = tcpACK
		in = ack.Bytes()
		if v, out := runXDP(t, d.XDP(), ifindex, in); v != xdpPass || !bytes.Equal(out[:len(in)], in) {
			t.Fatalf("XDP: next packet of the remapped flow: verdict %d, want %d and the frame untouched", v, xdpPass)
		}
		want = ack.With(func(p *packet.Packet) { p.Dst, p.DstPort, p.SrcPort = local.addr.Addr, local.addr.Port, 62000 })
		if v, out := runOn(t, d.TCIngress(), ifindex, in); v != tcActOK || !bytes.Equal(out[:len(in)], want.Bytes()) {
			t.Fatalf("tc: next packet of the remapped flow: verdict %d\n got %x\nwant %x", v, out[:len(in)], want.Bytes())
		}
	})
}
