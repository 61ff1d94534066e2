package datapath

import (
	"encoding/binary"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/model"
)

// Config.SocketLBHostNetnsOnly (--socket-lb-host-netns-only) with real
// sockets in two network namespaces of the test's own: "host", where the
// datapath is opened (the agent's namespace) and the backends listen on
// its loopback device, and "pod", behind a veth pair (p0 on the host,
// eth0 in the pod) with tc attached to p0, as to a pod's host-side device
// in --devices. The test process is in the cgroup the socket programs
// are attached to, so the sockets of both namespaces pass through them,
// as every pod's do under the cgroup2 root.

// hostNetnsCase is a family's addresses for TestSockHostNetnsOnly.
type hostNetnsCase struct {
	domain    int
	host, pod netip.Addr
	bits      int
	dflt      netip.Prefix
	vip, vipU model.L4Addr
	backends  []string
}

func hostNetnsFamily(v6 bool) hostNetnsCase {
	if v6 {
		return hostNetnsCase{unix.AF_INET6, addr("2001:db8:203::1"), addr("2001:db8:203::2"), 64,
			netip.MustParsePrefix("::/0"), l4("2001:db8:96::50", 80, model.TCP), l4("2001:db8:96::50", 53, model.UDP),
			sockBackends6}
	}
	return hostNetnsCase{unix.AF_INET, addr("10.203.0.1"), addr("10.203.0.2"), 24,
		netip.MustParsePrefix("0.0.0.0/0"), l4("10.96.0.50", 80, model.TCP), l4("10.96.0.50", 53, model.UDP),
		sockBackends}
}

// forHostNetnsOnly runs test with SocketLBHostNetnsOnly off (subtest
// "default") and on ("host_netns_only").
func forHostNetnsOnly(t *testing.T, test func(t *testing.T, on bool)) {
	for _, on := range []bool{false, true} {
		t.Run(map[bool]string{false: "default", true: "host_netns_only"}[on], func(t *testing.T) { test(t, on) })
	}
}

// forHostNetnsOnlyFamilies is forHostNetnsOnly over each family
// (hostNetnsFamily).
func forHostNetnsOnlyFamilies(t *testing.T, test func(t *testing.T, on bool, f hostNetnsCase)) {
	forHostNetnsOnly(t, func(t *testing.T, on bool) {
		forFamilies(t, func(t *testing.T, v6 bool) { test(t, on, hostNetnsFamily(v6)) })
	})
}

// TestSockHostNetnsOnly: by default a pod's connect to a ClusterIP is
// translated at the socket (its SYN leaves the pod for a backend, its
// peer name is the VIP) like the host's. With the option only the host's
// is: the pod's SYN carries the ClusterIP, and tc on the pod's host-side
// device translates it per packet, so the connection still reaches a
// backend and the pod still sees the VIP; the pod's UDP, connected and
// not, is translated per packet too and answered from the VIP; the
// socket path counts none of the pod's traffic. Over each family.
func TestSockHostNetnsOnly(t *testing.T) {
	forHostNetnsOnlyFamilies(t, testSockHostNetnsOnly)
}

func testSockHostNetnsOnly(t *testing.T, on bool, f hostNetnsCase) {
	testutil.Privileged(t)
	host, pod := hostAndPod(t, f)
	// Opened inside "host": its namespace is the one served.
	host.Enter(t)
	d := openTest(t, configWith(smallConfig, func(c *Config) { c.SocketLBHostNetnsOnly = on })(testPinDir(t)))
	_, podSYNs, hostSYNs := hostServes(t, d, host, f)

	isBackend := func(a netip.AddrPort) bool { return f.isBackend(a) }

	// The pod's traffic, alone in the counters.
	before := counters(t, d)
	fd := socketIn(t, pod, f.domain, unix.SOCK_STREAM)
	connectSeesPeer(t, fd, f.domain, f.vip)
	readGreeting(t, fd)
	syn := synOf(t, podSYNs, fd)
	if on && syn.Dst != apOf(f.vip) {
		t.Errorf("the pod's SYN went to %s, want the ClusterIP %s (not translated at the pod's socket)", syn.Dst, apOf(f.vip))
	}
	if !on && !isBackend(syn.Dst) {
		t.Errorf("the pod's SYN went to %s, want a backend (translated at the socket)", syn.Dst)
	}

	ufd := socketIn(t, pod, f.domain, unix.SOCK_DGRAM)
	for range 2 {
		if err := unix.Sendto(ufd, []byte("q"), 0, sockaddrIn(f.domain, f.vipU)); err != nil {
			t.Fatalf("sendto %s: %v", f.vipU, err)
		}
		msg, from := recvFrom(t, ufd)
		if !isBackendReply(msg) || from != apOf(f.vipU) {
			t.Errorf("the pod's UDP reply %q from %s, want a backend's echo from the VIP %s", msg, from, apOf(f.vipU))
		}
	}
	cfd := socketIn(t, pod, f.domain, unix.SOCK_DGRAM)
	connectSeesPeer(t, cfd, f.domain, f.vipU)
	if _, err := unix.Write(cfd, []byte("c")); err != nil {
		t.Fatal(err)
	}
	if msg, from := recvFrom(t, cfd); !isBackendReply(msg) || from != apOf(f.vipU) {
		t.Errorf("the pod's connected UDP reply %q from %s, want a backend's echo from the VIP %s", msg, from, apOf(f.vipU))
	}
	after := counters(t, d)
	sockXlate, tcDNAT := after["sock_xlate"]-before["sock_xlate"], after["tc_dnat_new"]-before["tc_dnat_new"]
	if on && (sockXlate != 0 || tcDNAT == 0) {
		t.Errorf("the pod's traffic: sock_xlate +%d, tc_dnat_new +%d; want none at the socket, all per packet", sockXlate, tcDNAT)
	}
	if !on && (sockXlate != 4 || tcDNAT != 0) {
		t.Errorf("the pod's traffic: sock_xlate +%d, tc_dnat_new +%d; want 4 at the socket (a TCP and a UDP connect, two datagrams), none per packet", sockXlate, tcDNAT)
	}

	// The host's connect is translated at the socket either way: its SYN
	// on the loopback device goes to a backend (no tc runs there).
	before = after
	hfd := socketIn(t, host, f.domain, unix.SOCK_STREAM)
	connectSeesPeer(t, hfd, f.domain, f.vip)
	readGreeting(t, hfd)
	if syn := synOf(t, hostSYNs, hfd); !isBackend(syn.Dst) {
		t.Errorf("the host's SYN went to %s, want a backend (translated at the socket)", syn.Dst)
	}
	if n := counters(t, d)["sock_xlate"] - before["sock_xlate"]; n != 1 {
		t.Errorf("the host's connect: sock_xlate +%d, want 1", n)
	}
}

// hostAndPod builds TestSockHostNetnsOnly's namespaces: "host" with p0
// (f.host), "pod" with eth0 (f.pod) and its default route via the host.
func hostAndPod(t *testing.T, f hostNetnsCase) (host, pod *topology.NS) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	tp := topology.NewT(t)
	host, pod = tp.AddNST(t, "host"), tp.AddNST(t, "pod")
	must(tp.Veth(host, "p0", pod, "eth0"))
	must(host.AddAddr("p0", netip.PrefixFrom(f.host, f.bits)))
	must(pod.AddAddr("eth0", netip.PrefixFrom(f.pod, f.bits)))
	if f.domain == unix.AF_INET6 {
		must(host.WaitLocal(f.host))
		must(pod.WaitLocal(f.pod))
	}
	must(pod.AddRoute(f.dflt, f.host))
	return host, pod
}

// hostServes makes d, opened in host (which the calling goroutine is
// in), serve f's ClusterIPs from backends on host's loopback device: its
// socket programs on a cgroup the test process joins, its tc programs on
// p0. It returns captures of the SYNs arriving at p0 (the pod's) and at
// the loopback device (the host's own), and the cgroup.
func hostServes(t *testing.T, d *Datapath, host *topology.NS, f hostNetnsCase) (cg *topology.Cgroup, podSYNs, hostSYNs *topology.SYNCapture) {
	t.Helper()
	var tcpBEs, udpBEs []model.L4Addr
	for _, b := range f.backends {
		tcpBEs = append(tcpBEs, l4(b, 8080, model.TCP))
		udpBEs = append(udpBEs, l4(b, 5353, model.UDP))
	}
	applyServices(t, d, clusterIP(f.vip, tcpBEs...), clusterIP(f.vipU, udpBEs...))
	cg = joinSockCgroup(t, d)
	addLoopbackAddrs(t, host, f.backends...)
	startBackends(t, f.backends...)
	if err := d.AttachDevices([]string{"p0"}); err != nil {
		t.Fatal(err)
	}
	var err error
	if podSYNs, err = host.CaptureSYNs("p0"); err != nil {
		t.Fatal(err)
	}
	if hostSYNs, err = host.CaptureSYNs("lo"); err != nil {
		t.Fatal(err)
	}
	return cg, podSYNs, hostSYNs
}

// isBackend says whether a is one of f's TCP backends.
func (f hostNetnsCase) isBackend(a netip.AddrPort) bool {
	return slices.ContainsFunc(f.backends, func(b string) bool { return netip.AddrPortFrom(addr(b), 8080) == a })
}

// TestSockHostNetnsOnlyRestart: an agent restarted with the option finds
// a pod's socket its predecessor (without it) translated. The socket
// still shows the VIP as its peer (the reverse hooks ask no namespace:
// only a translated socket has an entry), its entry goes when it closes
// (sock_release neither), and the pod's new connects reach the VIP.
func TestSockHostNetnsOnlyRestart(t *testing.T) {
	testutil.Privileged(t)
	f := hostNetnsFamily(false)
	host, pod := hostAndPod(t, f)
	host.Enter(t)
	bpffs := testPinDir(t)
	d := openTest(t, smallConfig(bpffs))
	cg, podSYNs, _ := hostServes(t, d, host, f)

	// Closed by the test itself (its release is checked), not at the end.
	old := -1
	if err := pod.Do(func() (err error) {
		old, err = unix.Socket(f.domain, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			unix.Close(old)
		}
	})
	connectSeesPeer(t, old, f.domain, f.vip)
	if syn := synOf(t, podSYNs, old); !f.isBackend(syn.Dst) {
		t.Fatalf("before the restart the pod's SYN went to %s, want a backend", syn.Dst)
	}
	cookie, err := unix.GetsockoptUint64(old, unix.SOL_SOCKET, unix.SO_COOKIE)
	if err != nil {
		t.Fatal(err)
	}
	rev, err := ebpf.LoadPinnedMap(filepath.Join(d.dir, mapSockRev), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rev.Close()
	if n := sockRevEntries(t, rev, false, cookie); n != 1 {
		t.Fatalf("sock_rev entries of the pod's socket: %d, want 1", n)
	}

	// The restart: the pinned links keep the old programs running until
	// the new agent attaches its own in their place.
	d.Close()
	d = openTest(t, configWith(smallConfig, func(c *Config) { c.SocketLBHostNetnsOnly = true })(bpffs))
	if err := d.AttachCgroup(cg.Path); err != nil {
		t.Fatal(err)
	}
	if err := d.AttachDevices([]string{"p0"}); err != nil {
		t.Fatal(err)
	}

	peer, err := unix.Getpeername(old)
	if err != nil {
		t.Fatal(err)
	}
	if got := addrPort(peer); got != apOf(f.vip) {
		t.Errorf("after the restart getpeername of the pod's old socket = %s, want the VIP %s", got, apOf(f.vip))
	}
	readGreeting(t, old)
	fd := socketIn(t, pod, f.domain, unix.SOCK_STREAM)
	connectSeesPeer(t, fd, f.domain, f.vip)
	readGreeting(t, fd)
	if syn := synOf(t, podSYNs, fd); syn.Dst != apOf(f.vip) {
		t.Errorf("after the restart the pod's SYN went to %s, want the ClusterIP %s", syn.Dst, apOf(f.vip))
	}
	closed = true
	if err := unix.Close(old); err != nil {
		t.Fatal(err)
	}
	if n := sockRevEntries(t, rev, false, cookie); n != 0 {
		t.Errorf("sock_rev entries of the pod's old socket once closed: %d, want 0", n)
	}
}

// socketIn returns a socket of domain and typ created in ns (where it
// stays), with 3s send (connect) and receive timeouts, closed when the
// test ends.
func socketIn(t *testing.T, ns *topology.NS, domain, typ int) int {
	t.Helper()
	fd := -1
	err := ns.Do(func() (err error) {
		fd, err = unix.Socket(domain, typ|unix.SOCK_CLOEXEC, 0)
		return err
	})
	if err != nil {
		t.Fatalf("socket in %s: %v", ns.Name, err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	tv := unix.NsecToTimeval(int64(3 * time.Second))
	for _, opt := range []int{unix.SO_SNDTIMEO, unix.SO_RCVTIMEO} {
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, opt, &tv); err != nil {
			t.Fatal(err)
		}
	}
	return fd
}

// readGreeting reads a backend's greeting from the TCP socket fd.
func readGreeting(t *testing.T, fd int) {
	t.Helper()
	buf := make([]byte, 100)
	n, err := unix.Read(fd, buf)
	if err != nil || !isBackendReply(string(buf[:n])) {
		t.Fatalf("read %q, %v: want a backend's greeting", buf[:n], err)
	}
}

// synOf returns the SYN of the connected socket fd that c saw arrive
// (from its local address). The capture reads on a goroutine of its own:
// the SYN may be recorded a little after the connect returned, so it is
// waited for, at most 10s.
func synOf(t *testing.T, c *topology.SYNCapture, fd int) topology.SYN {
	t.Helper()
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	local := addrPort(sa)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if s := c.Match(func(s topology.SYN) bool { return s.Src == local }); len(s) > 0 {
			return s[0]
		}
		if time.Now().After(deadline) {
			var seen []string
			for _, s := range c.Match(func(topology.SYN) bool { return true }) {
				seen = append(seen, s.Src.String()+"->"+s.Dst.String())
			}
			t.Fatalf("no SYN from %s captured; saw [%s]", local, strings.Join(seen, " "))
		}
	}
}

// TestSockHostNetnsOnlyBridge: with the option, pods on a bridge (br0,
// their host-side veths its ports, tc on the bridge only) reach Services
// per packet at the bridge device: a backend on the host (its loopback),
// and with MasqueradeAll one on the same bridge, whose replies would
// otherwise go port to port past the bridge (README, "Service meshes
// (Istio) and nested clusters"). The client's SYNs, seen on its port,
// carry the ClusterIPs.
func TestSockHostNetnsOnlyBridge(t *testing.T) {
	testutil.Privileged(t)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	tp := topology.NewT(t)
	host, client, server := tp.AddNST(t, "host"), tp.AddNST(t, "client"), tp.AddNST(t, "server")
	must(host.AddBridge("br0"))
	must(host.Sysctl("net.ipv4.ip_forward", "1"))
	must(host.AddAddr("br0", netip.MustParsePrefix("10.204.0.1/24")))
	for _, p := range []struct {
		ns   *topology.NS
		port string
		addr string
	}{{client, "c0", "10.204.0.2/24"}, {server, "s0", "10.204.0.3/24"}} {
		must(tp.Veth(host, p.port, p.ns, "eth0"))
		must(host.SetMaster(p.port, "br0"))
		must(p.ns.AddAddr("eth0", netip.MustParsePrefix(p.addr)))
		must(p.ns.AddRoute(netip.MustParsePrefix("0.0.0.0/0"), addr("10.204.0.1")))
	}
	const podBackend = "10.204.0.3"
	ln, err := server.Listen("tcp", podBackend+":8080")
	must(err)
	serveReply(t, ln, "backend "+sockBackends[1]+" (the pod "+podBackend+")") // isBackendReply

	host.Enter(t)
	d := openTest(t, configWith(smallConfig, func(c *Config) {
		c.SocketLBHostNetnsOnly = true
		c.MasqueradeAll = true
		c.NodeIPs = []netip.Addr{addr("10.204.0.1")}
	})(testPinDir(t)))
	toHost, toPod := l4("10.96.0.60", 80, model.TCP), l4("10.96.0.61", 80, model.TCP)
	applyServices(t, d, clusterIP(toHost, l4(sockBackends[0], 8080, model.TCP)), clusterIP(toPod, l4(podBackend, 8080, model.TCP)))
	joinSockCgroup(t, d)
	addLoopbackAddrs(t, host, sockBackends[0])
	startBackends(t, sockBackends[0])
	must(d.AttachDevices([]string{"br0"}))
	syns, err := host.CaptureSYNs("c0")
	must(err)

	for _, vip := range []model.L4Addr{toHost, toPod} {
		fd := socketIn(t, client, unix.AF_INET, unix.SOCK_STREAM)
		connectSeesPeer(t, fd, unix.AF_INET, vip)
		readGreeting(t, fd)
		if syn := synOf(t, syns, fd); syn.Dst != apOf(vip) {
			t.Errorf("the pod's SYN to %s went to %s, want the ClusterIP", vip, syn.Dst)
		}
	}
}

// TestSockHostNetnsOnlyExplain: ExplainSocket reads the agent's
// host_netns_cookie from the program attached to the hook, not its own
// copy's (0). Asked from the pod's namespace (nsenter into a pod, as one
// debugs an Istio pod), it says the socket passes untranslated where the
// option is on, and a backend where it is off; from the host's, a
// backend either way. Each answer is checked against a real connect from
// the same namespace (the SYN on p0 carries the ClusterIP or a backend)
// and a real datagram of a new unconnected UDP socket (sendmsg's hook).
// Over each family.
func TestSockHostNetnsOnlyExplain(t *testing.T) {
	forHostNetnsOnlyFamilies(t, testSockHostNetnsOnlyExplain)
}

func testSockHostNetnsOnlyExplain(t *testing.T, on bool, f hostNetnsCase) {
	testutil.Privileged(t)
	host, pod := hostAndPod(t, f)
	host.Enter(t)
	bpffs := testPinDir(t)
	d := openTest(t, configWith(smallConfig, func(c *Config) { c.SocketLBHostNetnsOnly = on })(bpffs))
	_, podSYNs, _ := hostServes(t, d, host, f)

	tcp := SocketExplainRequest{To: apOf(f.vip), Proto: unix.IPPROTO_TCP}
	udp := SocketExplainRequest{To: apOf(f.vipU), Proto: unix.IPPROTO_UDP, Unconnected: true}
	hook := map[bool]string{false: "connect", true: "sendmsg"}

	// The pod. (The real connect comes last: its packets would move
	// the counters sockExplainIn checks.)
	for _, req := range []SocketExplainRequest{tcp, udp} {
		e := sockExplainIn(t, d, bpffs, pod, req)
		if on {
			if !e.NotServed || e.Verdict != "pass" || e.DNAT || !strings.Contains(e.Program, hook[req.Unconnected]) || e.ProgramID == 0 {
				t.Errorf("from the pod, %s with the option (the real SYN goes to the ClusterIP): %+v; want NotServed, pass, the attached %s program",
					req.To, e, hook[req.Unconnected])
			}
			continue
		}
		if e.NotServed || e.Verdict != "connect to backend" || !slices.Contains(f.backends, e.Backend.Addr().String()) {
			t.Errorf("from the pod, %s without the option (the real SYN goes to a backend): %+v; want a backend", req.To, e)
		}
	}

	// The host: served either way.
	for _, req := range []SocketExplainRequest{tcp, udp} {
		e := sockExplainIn(t, d, bpffs, host, req)
		if e.NotServed || e.Verdict != "connect to backend" || !slices.Contains(f.backends, e.Backend.Addr().String()) {
			t.Errorf("from the host, %s: %+v; want a backend", req.To, e)
		}
	}

	fd := socketIn(t, pod, f.domain, unix.SOCK_STREAM)
	connectSeesPeer(t, fd, f.domain, f.vip)
	readGreeting(t, fd)
	if untranslated := synOf(t, podSYNs, fd).Dst == apOf(f.vip); untranslated != on {
		t.Errorf("the pod's real SYN untranslated: %v, want %v", untranslated, on)
	}
}

// TestAttachedHostNetns reads host_netns_cookie from the attached
// programs of every forward hook: the agent's namespace's cookie with the
// option, 0 without; and no answer where no socket program is attached.
func TestAttachedHostNetns(t *testing.T) {
	forHostNetnsOnly(t, testAttachedHostNetns)
}

func testAttachedHostNetns(t *testing.T, on bool) {
	testutil.Privileged(t)
	bpffs := testPinDir(t)
	d := openTest(t, configWith(smallConfig, func(c *Config) { c.SocketLBHostNetnsOnly = on })(bpffs))
	dir := filepath.Join(bpffs, "sluice")
	if a, err := attachedHostNetns(dir, "connect4"); err != nil || a != nil {
		t.Fatalf("before any attach: %+v, %v; want nothing", a, err)
	}
	joinSockCgroup(t, d)
	want := uint64(0)
	if on {
		c, err := NetnsCookie()
		if err != nil {
			t.Fatal(err)
		}
		want = c
	}
	for _, hook := range []string{"connect4", "sendmsg4", "connect6", "sendmsg6"} {
		a, err := attachedHostNetns(dir, hook)
		if err != nil || a == nil || a.Cookie != want || a.ProgramID == 0 {
			t.Errorf("%s: %+v, %v; want cookie %d", hook, a, err, want)
		}
	}
}

// TestRodataU64 reads a variable at the offset the map's own BTF gives
// (an agent of another build may lay .rodata out otherwise), and finds
// none in a section without it (an agent older than the option: 0).
func TestRodataU64(t *testing.T) {
	testutil.Privileged(t)
	u64 := &btf.Int{Name: "__u64", Size: 8}
	section := func(vars ...string) *ebpf.Map {
		ds := &btf.Datasec{Name: ".rodata", Size: uint32(8 * len(vars))}
		for i, v := range vars {
			ds.Vars = append(ds.Vars, btf.VarSecinfo{Type: &btf.Var{Name: v, Type: u64, Linkage: btf.GlobalVar}, Offset: uint32(8 * i), Size: 8})
		}
		val := make([]byte, ds.Size)
		for i := range vars {
			binary.NativeEndian.PutUint64(val[8*i:], uint64(100+i))
		}
		// Made as an object's .rodata is: its contents, then frozen.
		m, err := ebpf.NewMap(&ebpf.MapSpec{Name: ".rodata", Type: ebpf.Array, KeySize: 4, ValueSize: ds.Size, MaxEntries: 1,
			Key: &btf.Int{Name: "__u32", Size: 4}, Value: ds, Contents: []ebpf.MapKV{{Key: uint32(0), Value: val}}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		return m
	}
	id := func(m *ebpf.Map) ebpf.MapID {
		info, err := m.Info()
		if err != nil {
			t.Fatal(err)
		}
		i, _ := info.ID()
		return i
	}
	if v, found, err := rodataU64(id(section("node_ip4", varHostNetnsCookie)), varHostNetnsCookie); err != nil || !found || v != 101 {
		t.Errorf("second variable: %d, %v, %v; want 101 (offset 8)", v, found, err)
	}
	if v, found, err := rodataU64(id(section("node_ip4", "nodeport_min")), varHostNetnsCookie); err != nil || found {
		t.Errorf("a section without it: %d, %v, %v; want not found", v, found, err)
	}
}
