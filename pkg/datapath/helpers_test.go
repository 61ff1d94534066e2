package datapath

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/packet"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// Test helpers shared by the packet, socket and attach tests: a datapath
// in a pin directory of its own, namespaces and cgroups of the test's own,
// and service seeding through the production Maps API. Packets come from
// internal/testutil/packet, whose checksums are computed independently of
// the kernel's incremental updates.

// testPinDir returns a fresh directory on bpffs, removed with everything
// under it when the test ends.
func testPinDir(t testing.TB) string {
	t.Helper()
	return testutil.PinDir(t)
}

// newTestCgroup creates a cgroup of the test's own under the cgroup2
// mount, removed (whatever is left in it killed) when the test ends.
func newTestCgroup(t testing.TB) *topology.Cgroup {
	t.Helper()
	mount, err := CgroupV2Mount()
	if err != nil {
		t.Fatalf("CgroupV2Mount: %v", err)
	}
	cg, err := topology.NewT(t).AddCgroup(mount, "cg")
	if err != nil {
		t.Fatal(err)
	}
	return cg
}

// smallConfig keeps test maps small: LRU maps are preallocated.
func smallConfig(bpffs string) Config {
	return Config{
		BPFFS:             bpffs,
		MaxServices:       256,
		MaxBackends:       1024,
		MaxServiceEntries: 4096,
		MaxConntrack:      4096,
		MaxConntrackNew:   4096,
		MaxSockRev:        1024,
	}
}

// xdpConfig is smallConfig with the XDP program loaded (only an XDP mode
// loads it); AttachDevices then attaches it in generic mode.
func xdpConfig(bpffs string) Config {
	c := smallConfig(bpffs)
	c.XDP = XDPGeneric
	return c
}

func openTest(t testing.TB, cfg Config) *Datapath {
	t.Helper()
	d, err := Open(cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func newTestDatapath(t *testing.T) *Datapath {
	t.Helper()
	testutil.Privileged(t)
	return openTest(t, smallConfig(testPinDir(t)))
}

// newTestDatapathAt is newTestDatapath that also returns its pin
// directory, for a test that opens the pins again.
func newTestDatapathAt(t *testing.T) (*Datapath, string) {
	t.Helper()
	testutil.Privileged(t)
	bpffs := testPinDir(t)
	return openTest(t, smallConfig(bpffs)), bpffs
}

// openTestWith is newTestDatapath for a configuration of its own: base
// (smallConfig or xdpConfig) changed by set.
func openTestWith(t testing.TB, base func(bpffs string) Config, set func(*Config)) *Datapath {
	t.Helper()
	testutil.Privileged(t)
	return openTest(t, configWith(base, set)(testPinDir(t)))
}

// configWith is base changed by set, for openTestWith and nodeDatapath.
func configWith(base func(bpffs string) Config, set func(*Config)) func(bpffs string) Config {
	return func(bpffs string) Config {
		cfg := base(bpffs)
		set(&cfg)
		return cfg
	}
}

// nodeDatapath enters a node namespace of its own (nodeNetns) and opens a
// datapath of base's configuration attached to devs there; it returns the
// namespace, eth0's ifindex and the datapath.
func nodeDatapath(t testing.TB, base func(bpffs string) Config, devs ...string) (*topology.NS, int, *Datapath) {
	t.Helper()
	testutil.Privileged(t)
	ns, ifindex := nodeNetns(t)
	d := openTest(t, base(testPinDir(t)))
	if err := d.AttachDevices(devs); err != nil {
		t.Fatal(err)
	}
	return ns, ifindex, d
}

// joinSockCgroup attaches d's socket programs to a cgroup of the test's
// own and moves the test process into it.
func joinSockCgroup(t *testing.T, d *Datapath) *topology.Cgroup {
	t.Helper()
	cg := newTestCgroup(t)
	if err := d.AttachCgroup(cg.Path); err != nil {
		t.Fatalf("AttachCgroup: %v", err)
	}
	cg.Join(t)
	return cg
}

// sockNode is the socket tests' node: d's socket programs on a cgroup the
// test process joins, and a network namespace of the test's own named
// name, entered, with addrs on its loopback device and startBackends'
// servers listening there.
func sockNode(t *testing.T, d *Datapath, name string, addrs ...string) (*topology.NS, *topology.Cgroup) {
	t.Helper()
	ns := topology.NewNS(t, name)
	cg := joinSockCgroup(t, d)
	ns.Enter(t)
	addLoopbackAddrs(t, ns, addrs...)
	startBackends(t)
	return ns, cg
}

// clientAndNode builds the two namespaces of the end-to-end tc tests: a
// client, c0 <subnet>.2/24 with its default route via <subnet>.1, and a node,
// n0 <subnet>.1/24, with sockBackends on its loopback device, startBackends'
// servers listening there and d attached to n0. The calling goroutine is
// left in the node. subnet is the first three bytes of an IPv4 address, or
// an IPv6 /64 ("2001:db8:202::"): then c0 is <subnet>2/64 with its default
// route via <subnet>1/64 on n0, and the node has sockBackends6 too.
func clientAndNode(t *testing.T, d *Datapath, subnet string) (node, client *topology.NS) {
	t.Helper()
	tp := topology.NewT(t)
	node, client = tp.AddNST(t, "node"), tp.AddNST(t, "client")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	sub, bits, dflt, backends := subnet+".", 24, "0.0.0.0/0", sockBackends
	v6 := strings.Contains(subnet, ":")
	if v6 {
		sub, bits, dflt, backends = subnet, 64, "::/0", append(slices.Clone(sockBackends), sockBackends6...)
	}
	must(tp.Veth(node, "n0", client, "c0"))
	must(node.AddAddr("n0", netip.PrefixFrom(addr(sub+"1"), bits)))
	must(client.AddAddr("c0", netip.PrefixFrom(addr(sub+"2"), bits)))
	if v6 {
		must(node.WaitLocal(addr(sub + "1")))
		must(client.WaitLocal(addr(sub + "2")))
	}
	must(client.AddRoute(netip.MustParsePrefix(dflt), addr(sub+"1")))
	node.Enter(t)
	addLoopbackAddrs(t, node, backends...)
	startBackends(t, backends...)
	must(d.AttachDevices([]string{"n0"}))
	return node, client
}

// dialFrom connects from ns to target over network (tcp4, udp4) within
// timeout, and fails t if it cannot; the connection is closed when the
// test ends.
func dialFrom(t *testing.T, ns *topology.NS, network string, target model.L4Addr, timeout time.Duration) net.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c, err := ns.DialContext(ctx, network, apOf(target).String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// override sets *p to v until the test ends: a kernel probe's answer
// forced, to play an older kernel.
func override[T any](t testing.TB, p *T, v T) {
	t.Helper()
	orig := *p
	*p = v
	t.Cleanup(func() { *p = orig })
}

func l4(addr string, port uint16, proto model.Protocol) model.L4Addr {
	return model.L4Addr{Addr: netip.MustParseAddr(addr), Port: port, Proto: proto}
}

type testBackend struct {
	id   reconciler.BackendID
	addr model.L4Addr
}

// addLoopbackAddrs gives the loopback device of ns the addresses addrs
// (each a /32 or /128): local backends, reachable only inside ns.
func addLoopbackAddrs(t testing.TB, ns *topology.NS, addrs ...string) {
	t.Helper()
	for _, a := range addrs {
		if err := ns.AddAddr("lo", netip.PrefixFrom(addr(a), addr(a).BitLen())); err != nil {
			t.Fatal(err)
		}
	}
	for _, a := range addrs {
		if addr(a).Is6() {
			waitLocal(t, ns, addr(a))
		}
	}
}

// waitLocal waits until ns takes its own IPv6 address a for local. Even
// without DAD (nodad) the kernel inserts an address's local route from a
// work queue (addrconf_dad_work), a moment after the address, its prefix
// route and a listener bound to it exist: a connect to it in between goes
// out on lo, finds no local route coming back in, and fails with
// ENETUNREACH after a retransmission.
func waitLocal(t testing.TB, ns *topology.NS, a netip.Addr) {
	t.Helper()
	var rs []netlink.Route
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		err = ns.Do(func() error {
			rs, err = netlink.RouteGet(a.AsSlice())
			return err
		})
		if err == nil && len(rs) > 0 && rs[0].Type == unix.RTN_LOCAL {
			return
		}
	}
	t.Fatalf("%s in %s: no local route after 10s: %v %v", a, ns.Name, rs, err)
}

// applyServices programs svcs into d through the production writer,
// reconciler.Apply, as an agent would: ids, write order and master flags
// are the reconciler's. Tests that need ids of their own or a write order
// the reconciler would not make use addService.
func applyServices(t testing.TB, d *Datapath, svcs ...*model.Service) {
	t.Helper()
	applyWith(t, reconciler.New(d.Maps(), nil), svcs...)
}

// applyWith is applyServices through r, a reconciler the test keeps
// across Applies (what it retires, say: SetRetireTimeout).
func applyWith(t testing.TB, r *reconciler.Reconciler, svcs ...*model.Service) {
	t.Helper()
	st := model.NewState()
	for _, s := range svcs {
		s.Backends = model.SortBackends(s.Backends)
		st.Services.Set(s.Frontend, s)
	}
	if err := r.Apply(st); err != nil {
		t.Fatalf("reconciler.Apply: %v", err)
	}
}

// clusterIP is a ClusterIP service port of frontend fe over backends.
func clusterIP(fe model.L4Addr, backends ...model.L4Addr) *model.Service {
	s := &model.Service{Name: model.ServicePortName{Namespace: "test", Name: fe.String()}, Kind: model.ClusterIP, Frontend: fe}
	for _, b := range backends {
		s.Backends = append(s.Backends, model.Backend{L4Addr: b})
	}
	return s
}

// addService writes a service the way the reconciler does: backends, then
// slots, then the reverse-NAT entry and the master.
func addService(t testing.TB, m *Maps, id reconciler.ServiceID, fe model.L4Addr, bes ...testBackend) {
	t.Helper()
	for _, b := range bes {
		if err := m.UpsertBackend(b.id, b.addr); err != nil {
			t.Fatal(err)
		}
	}
	if isServicesV1(m.services) {
		addServiceV1(t, m, id, fe, bes...)
		return
	}
	for i, b := range bes {
		if err := m.UpsertSlot(reconciler.DefaultScope(fe), uint32(i+1), b.id); err != nil {
			t.Fatal(err)
		}
	}
	putRevNat(t, m, id, reconciler.DefaultScope(fe))
	if err := m.UpsertMaster(reconciler.DefaultScope(fe), reconciler.Master{ID: id, Count: uint32(len(bes))}); err != nil {
		t.Fatal(err)
	}
}

// The packet tables' MACs. nodeMAC is the address of the device
// BPF_PROG_TEST_RUN receives a frame on when the context names none (the
// loopback device's, zero): its eth_type_trans then marks a frame to it
// PACKET_HOST, as a NIC's frame to the node's own MAC is, and one to any
// other unicast MAC PACKET_OTHERHOST, which gets no ICMP error (icmp.h).
var (
	clientMAC = [6]byte{0x02, 0, 0, 0, 0, 0x01}
	nodeMAC   = [6]byte{}
	// otherHostMAC is another host's: a frame to it came in only
	// because the device is promiscuous.
	otherHostMAC = [6]byte{0x02, 0, 0, 0, 0, 0x02}
)

// addr parses an address of the tables.
func addr(s string) netip.Addr { return netip.MustParseAddr(s) }

// The edge-case tables (fragments, ICMP errors, L3 devices, TTL and MTU
// on redirect paths) describe their packets with the constructors below,
// over internal/testutil/packet: every header field can be set and every
// checksum is computed from scratch, so a byte-for-byte match of a
// program's output with a packet built here proves its checksum updates
// exact.

// tcpPacket is a TCP segment (flags 0 meaning SYN) carrying data.
func tcpPacket(src string, sport uint16, dst string, dport uint16, flags uint8, data []byte) packet.Packet {
	return packet.Packet{Src: addr(src), Dst: addr(dst), Proto: packet.TCP, SrcPort: sport, DstPort: dport,
		TCPFlags: flags, Seq: 0x01020304, Payload: data}
}

// udpPacket is a UDP datagram carrying data.
func udpPacket(src string, sport uint16, dst string, dport uint16, data []byte) packet.Packet {
	return packet.Packet{Src: addr(src), Dst: addr(dst), Proto: packet.UDP, SrcPort: sport, DstPort: dport, Payload: data}
}

// icmpErr is an ICMP message of type typ and code from src to dst, with
// the 32 bits after the checksum set to rest (the next-hop MTU of a
// FRAG_NEEDED is its low 16 bits) and q after them: for an error, the
// quote of the packet it is about.
func icmpErr(src, dst string, typ, code uint8, rest uint32, q []byte) packet.Packet {
	p := packet.Packet{Src: addr(src), Dst: addr(dst), Proto: packet.ICMP, ICMPType: typ, ICMPCode: code, Payload: q}
	binary.BigEndian.PutUint32(p.ICMPRest[:], rest)
	return p
}

// frame renders p in an Ethernet frame from src to dst.
func frame(dst, src [6]byte, p packet.Packet) []byte {
	p.DstMAC, p.SrcMAC = dst, src
	return p.Bytes()
}

// ether is frame with the client and node MACs of the tc tables.
func ether(p packet.Packet) []byte { return frame(nodeMAC, clientMAC, p) }

// fwdTTL is the TTL of a packet (sent with 64) that tc or XDP forwarded
// to its next hop itself: one less, as the stack's forwarding would.
const fwdTTL = 63

// edgeStep is one packet through tc ingress (or egress): the verdict and
// the packet expected (nil: unchanged).
type edgeStep struct {
	name    string
	egress  bool
	in      []byte
	verdict uint32
	want    []byte // nil: the output is the input
}

// runEdgeSteps runs the steps in order, in the caller's network namespace.
func runEdgeSteps(t *testing.T, d *Datapath, steps []edgeStep) {
	t.Helper()
	for _, s := range steps {
		prog := d.TCIngress()
		if s.egress {
			prog = d.TCEgress()
		}
		verdict, out := runProg(t, prog, s.in)
		want := s.want
		if want == nil {
			want = s.in
		}
		if verdict != s.verdict || !bytes.Equal(out, want) {
			t.Errorf("%s: verdict %d (want %d), output %s", s.name, verdict, s.verdict, packet.Diff(out, want))
		}
	}
}

// checkChecksums fails t unless every checksum of frame is what a
// from-scratch computation gives.
func checkChecksums(t *testing.T, frame []byte) {
	t.Helper()
	if err := packet.Verify(frame); err != nil {
		t.Error(err)
	}
}

// counters returns the datapath counters of d (a Datapath or Pinned) by
// reason.
func counters(t *testing.T, d interface {
	Counters() (map[string]uint64, error)
}) map[string]uint64 {
	t.Helper()
	cs, err := d.Counters()
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// expectCounted fails t unless every counter in reasons is non-zero, and
// returns all counters for further checks.
func expectCounted(t *testing.T, d *Datapath, reasons ...string) map[string]uint64 {
	t.Helper()
	cs := counters(t, d)
	for _, reason := range reasons {
		if cs[reason] == 0 {
			t.Errorf("counter %s is 0; counters: %v", reason, cs)
		}
	}
	return cs
}

// serviceEntries counts what a services map of m and its family's slots
// array hold together, as the kernel has them: each master and the slots
// 1..count of its range that name a backend (the entries the services
// hash held before slots moved to an array).
func serviceEntries(m *Maps, services *ebpf.Map) (int, error) {
	arr := m.slots4
	if services == m.services6 {
		arr = m.slots6
	}
	n := 0
	var bases [][2]uint32
	k := make([]byte, services.KeySize())
	var v sockLb4Service
	it := services.Iterate()
	for it.Next(k, &v) {
		n++
		bases = append(bases, [2]uint32{v.SlotsBase, v.Count})
	}
	if err := it.Err(); err != nil || arr == nil {
		return n, err
	}
	for _, bc := range bases {
		for i := range bc[1] {
			var id uint32
			if err := arr.arr.Lookup(bc[0]+i, &id); err != nil {
				return n, err
			}
			if id != 0 {
				n++
			}
		}
	}
	return n, nil
}

// slotOf returns the backend of slot (>= 1) of the frontend whose master
// is k, in the slots array arr.
func slotOf(t *testing.T, services *ebpf.Map, arr *ebpf.Map, k any, slot uint32) uint32 {
	t.Helper()
	var master sockLb4Service
	if err := services.Lookup(k, &master); err != nil {
		t.Fatalf("master %+v: %v", k, err)
	}
	if slot == 0 || slot > master.Count {
		t.Fatalf("slot %d of master %+v", slot, master)
	}
	var id uint32
	if err := arr.Lookup(master.SlotsBase+slot-1, &id); err != nil {
		t.Fatalf("slot %d of master %+v: %v", slot, master, err)
	}
	return id
}

// addServiceV1 is addService into a services map of the previous layout
// (v1: masters and slots in one hash, lb4ServiceV1), as an agent of the
// previous release wrote it; the backends are written.
func addServiceV1(t testing.TB, m *Maps, id reconciler.ServiceID, fe model.L4Addr, bes ...testBackend) {
	t.Helper()
	dfe := reconciler.DefaultScope(fe)
	put := func(slot uint32, v lb4ServiceV1) {
		k, err := serviceKey(dfe, slot)
		if err != nil {
			t.Fatal(err)
		}
		if is6(fe.Addr) {
			k6 := lb6Key(k, fe.Addr)
			err = m.services6.Put(&k6, &v)
		} else {
			err = m.services.Put(&k, &v)
		}
		if err != nil {
			t.Fatalf("v1 slot %d of %s: %v", slot, fe, err)
		}
	}
	for i, b := range bes {
		put(uint32(i+1), lb4ServiceV1{BackendId: uint32(b.id)})
	}
	putRevNat(t, m, id, dfe)
	put(0, lb4ServiceV1{Count: uint32(len(bes)), RevNatId: uint32(id)})
}

// putRevNat writes the reverse-NAT entry id -> fe into m: with
// UpsertRevNat, or as the previous layout had it where m's map of fe's
// family is a hash of it (pins of an older agent, isRevNatV1).
func putRevNat(t testing.TB, m *Maps, id reconciler.ServiceID, fe reconciler.Frontend) {
	t.Helper()
	k, v, err := revNatEntry(id, fe)
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case is6(fe.Addr) && isRevNatV1(m.revNat6):
		err = m.revNat6.Put(k, lb6RevNatV1{Vip: v6addr(fe.Addr), Port: v.Port, Proto: v.Proto, Scope: v.Scope})
	case !is6(fe.Addr) && isRevNatV1(m.revNat):
		err = m.revNat.Put(k, lb4RevNatV1{Vip: v.Vip, Port: v.Port, Proto: v.Proto, Scope: v.Scope})
	default:
		err = m.UpsertRevNat(id, fe)
	}
	if err != nil {
		t.Fatalf("rev_nat %d -> %s: %v", id, fe, err)
	}
}

// mustDump is what m's maps hold (Maps.Dump, Pinned.Dump), the test
// ended where they cannot be read.
func mustDump(t testing.TB, m interface {
	Dump() (*reconciler.KernelState, error)
}) *reconciler.KernelState {
	t.Helper()
	ks, err := m.Dump()
	if err != nil {
		t.Fatal(err)
	}
	return ks
}

// progInfo is what the kernel reports of a loaded program, the test
// ended where it cannot say.
func progInfo(t testing.TB, p *ebpf.Program) *ebpf.ProgramInfo {
	t.Helper()
	info, err := p.Info()
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// specOf is the collection spec a bpf2go loader (loadTc, loadSock,
// loadXdp) returns, the test ended where it cannot.
func specOf(t testing.TB, load func() (*ebpf.CollectionSpec, error)) *ebpf.CollectionSpec {
	t.Helper()
	spec, err := load()
	if err != nil {
		t.Fatal(err)
	}
	return spec
}
