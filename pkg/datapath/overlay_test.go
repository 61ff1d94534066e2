package datapath

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// An overlay CNI (flannel vxlan, Calico IPIP or VXLAN, WireGuard) routes
// the pods of other nodes through a tunnel device, not through the
// device holding the node IP. kube-proxy masquerades a NodePort flow to
// such a pod whatever device it leaves by; Sluice source-NATs only
// through a device it attached to (nat_remote), so the agent attaches to
// the node's overlay devices by default (TunnelDevices).
//
//	client eth0 10.212.0.100 ─┐
//	node1  eth0 10.212.0.1  ─┤ lan (bridge): node2 answers the client by it
//	node2  eth0 10.212.0.2  ─┘
//	node1 ov0 10.244.1.0/32 ══ tunnel ══ node2 ov0 10.244.2.0/32
//	node2 pod0 10.244.2.1/24 ─ pod eth0 10.244.2.5 (the endpoint, :8080)
//
// ov0 is an ipip tunnel (L3, as Calico's tunl0) or a vxlan device
// (Ethernet, as flannel.1), each with the route to the other node's pod
// subnet; with noAddr node1's has no address (the flow is source-NATed to
// node1's IP, whose replies come back by the lan).

// overlayAddrs are the addresses of the topology in one family.
type overlayAddrs struct {
	client, node1, node2 string // on the lan
	tun1, tun2           string // the tunnels' own
	podNet               [2]string
	podGW, pod           string // node2's pod0, the pod's
	bits, podBits        int
	dflt                 string
}

var overlayAddrs4 = overlayAddrs{
	client: "10.212.0.100", node1: "10.212.0.1", node2: "10.212.0.2",
	tun1: "10.244.1.0", tun2: "10.244.2.0", podNet: [2]string{"10.244.1.0", "10.244.2.0"},
	podGW: "10.244.2.1", pod: "10.244.2.5", bits: 24, podBits: 24, dflt: "0.0.0.0/0",
}

// IPv6 over the same IPv4 tunnel (vxlan carries either).
var overlayAddrs6 = overlayAddrs{
	client: "fd00:212::100", node1: "fd00:212::1", node2: "fd00:212::2",
	tun1: "fd00:244:1::ff", tun2: "fd00:244:2::ff", podNet: [2]string{"fd00:244:1::", "fd00:244:2::"},
	podGW: "fd00:244:2::1", pod: "fd00:244:2::5", bits: 64, podBits: 64, dflt: "::/0",
}

// errNoTunnel: the kernel has no devices of the tunnel's kind.
var errNoTunnel = errors.New("tunnel kind not supported")

type overlayNet struct {
	client, node1, node2, pod *topology.NS
	peers                     chan netip.AddrPort // the endpoint's peers
	// tunnel1 makes node1's ov0 and its routes (overlayTopology's late:
	// the test does, when it wants).
	tunnel1 func()
}

// overlayTopology builds the namespaces above with a tunnel of kind
// ("ipip" or "vxlan", over IPv4) carrying a's family (and IPv4 always,
// the underlay's). It skips t if the kernel has no such tunnel. With late,
// node1's tunnel is left to o.tunnel1.
func overlayTopology(t *testing.T, kind string, a overlayAddrs, noAddr, late bool) *overlayNet {
	t.Helper()
	tp := topology.NewT(t)
	o := &overlayNet{
		client: tp.AddNST(t, "client"), node1: tp.AddNST(t, "node1"), node2: tp.AddNST(t, "node2"), pod: tp.AddNST(t, "pod"),
		peers: make(chan netip.AddrPort, 16),
	}
	lan := tp.AddNST(t, "lan")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	pfx := func(s string, bits int) netip.Prefix { return netip.PrefixFrom(addr(s), bits) }
	v6 := addr(a.pod).Is6()
	must(lan.AddBridge("br0"))
	for i, ns := range []*topology.NS{o.client, o.node1, o.node2} {
		port := fmt.Sprintf("p%d", i)
		must(tp.Veth(lan, port, ns, "eth0"))
		must(lan.SetMaster(port, "br0"))
	}
	// The underlay (IPv4), and a's lan addresses.
	for _, x := range []struct {
		ns    *topology.NS
		a4, a string
	}{{o.client, overlayAddrs4.client, a.client}, {o.node1, overlayAddrs4.node1, a.node1}, {o.node2, overlayAddrs4.node2, a.node2}} {
		must(x.ns.AddAddr("eth0", pfx(x.a4, 24)))
		if v6 {
			must(x.ns.AddAddr("eth0", pfx(x.a, a.bits)))
			must(x.ns.WaitLocal(addr(x.a)))
		}
	}
	for _, ns := range []*topology.NS{o.node1, o.node2} {
		must(ns.Sysctl("net/ipv4/conf/all/forwarding", "1"))
		must(ns.Sysctl("net/ipv6/conf/all/forwarding", "1"))
	}
	// The tunnel: ov0 on each node, with the route to the other's
	// pod subnet (and tunnel address).
	tunnel := func(ns *topology.NS, local, remote, own, other, otherNet string, withAddr bool) {
		t.Helper()
		err := ns.Do(func() error {
			eth, err := netlink.LinkByName("eth0")
			if err != nil {
				return err
			}
			la := netlink.LinkAttrs{Name: "ov0"}
			var l netlink.Link
			switch kind {
			case "ipip":
				l = &netlink.Iptun{LinkAttrs: la, Local: net.ParseIP(local), Remote: net.ParseIP(remote)}
			case "vxlan":
				l = &netlink.Vxlan{LinkAttrs: la, VxlanId: 42, SrcAddr: net.ParseIP(local), Group: net.ParseIP(remote), Port: 4789, VtepDevIndex: eth.Attrs().Index}
			}
			if err := netlink.LinkAdd(l); errors.Is(err, unix.EOPNOTSUPP) {
				return errNoTunnel
			} else if err != nil {
				return fmt.Errorf("add %s ov0: %w", kind, err)
			}
			if l, err = netlink.LinkByName("ov0"); err != nil {
				return err
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
			bits := 32
			if v6 {
				bits = 128
			}
			if withAddr {
				if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(own), Mask: net.CIDRMask(bits, bits)}, Flags: unix.IFA_F_NODAD}); err != nil {
					return err
				}
			}
			for _, dst := range []string{fmt.Sprintf("%s/%d", otherNet, a.podBits), fmt.Sprintf("%s/%d", other, bits)} {
				_, n, _ := net.ParseCIDR(dst)
				r := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: n, Scope: netlink.SCOPE_LINK}
				if kind == "vxlan" {
					// flannel's: via the other node's tunnel
					// address, on link (its MAC resolved over
					// the tunnel).
					r = &netlink.Route{LinkIndex: l.Attrs().Index, Dst: n, Gw: net.ParseIP(other), Flags: int(netlink.FLAG_ONLINK)}
				}
				if err := netlink.RouteAdd(r); err != nil && !errors.Is(err, unix.EEXIST) {
					return fmt.Errorf("route %s: %w", dst, err)
				}
			}
			return nil
		})
		if errors.Is(err, errNoTunnel) {
			t.Skipf("this kernel has no %s devices", kind)
		}
		must(err)
	}
	o.tunnel1 = func() {
		t.Helper()
		tunnel(o.node1, overlayAddrs4.node1, overlayAddrs4.node2, a.tun1, a.tun2, a.podNet[1], !noAddr)
	}
	if !late {
		o.tunnel1()
	}
	tunnel(o.node2, overlayAddrs4.node2, overlayAddrs4.node1, a.tun2, a.tun1, a.podNet[0], true)
	// The pod behind node2, which routes the client by its own eth0.
	must(tp.Veth(o.node2, "pod0", o.pod, "eth0"))
	must(o.node2.AddAddr("pod0", pfx(a.podGW, a.podBits)))
	must(o.pod.AddAddr("eth0", pfx(a.pod, a.podBits)))
	if v6 {
		must(o.pod.WaitLocal(addr(a.pod)))
		must(o.node2.WaitDAD("pod0"))
		must(o.pod.WaitDAD("eth0"))
	}
	must(o.pod.AddRoute(netip.MustParsePrefix(a.dflt), addr(a.podGW)))
	ln, err := o.pod.Listen("tcp", netip.AddrPortFrom(addr(a.pod), 8080).String())
	must(err)
	acceptEach(t, ln, func(c net.Conn) {
		o.peers <- netip.MustParseAddrPort(c.RemoteAddr().String())
		go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
	})
	return o
}

// TestOverlayNodePortRemoteEndpoint: an external client's connection to
// node1's eTP Cluster NodePort, whose endpoint is a pod on node2 behind
// the overlay, completes, and the pod sees node1's tunnel address as its
// peer (or node1's IP when the tunnel has none); with the devices the
// agent attaches to by default (the node IP's, DevicesOf, and the
// overlay's, TunnelDevices) and with eth0,ov0 named. Before the overlay
// devices were attached by default, the flow was only DNATed: the pod
// answered the client directly, from its own address, and the connection
// never completed. The same for a ClusterIP the client (outside
// --cluster-cidr) reaches through node1, with native XDP on node1's
// uplink (which must leave the flow to tc: XDP cannot send through a
// tunnel), and with node1's tunnel made after the start, which the
// tunnel watch (NewTunnelWatch) attaches then.
func TestOverlayNodePortRemoteEndpoint(t *testing.T) {
	testutil.Privileged(t)
	forFamilies(t, func(t *testing.T, v6 bool) {
		a := overlayAddrs4
		if v6 {
			a = overlayAddrs6
		}
		for _, tc := range []struct {
			kind    string
			noAddr  bool
			devices []string // nil: the default
			xdp     XDPMode
			cip     bool // a ClusterIP, the client outside --cluster-cidr
			late    bool // node1's tunnel made after the start (the tunnel watch attaches it)
		}{
			{kind: "vxlan"},
			{kind: "vxlan", devices: []string{"eth0", "ov0"}},
			{kind: "vxlan", noAddr: true},
			{kind: "vxlan", noAddr: true, devices: []string{"eth0", "ov0"}},
			{kind: "vxlan", xdp: XDPNative},
			{kind: "vxlan", cip: true},
			{kind: "ipip"},
			{kind: "ipip", devices: []string{"eth0", "ov0"}},
			{kind: "vxlan", late: true},
			{kind: "vxlan", noAddr: true, late: true},
			{kind: "ipip", late: true},
		} {
			if v6 && tc.kind == "ipip" {
				continue // ipip carries IPv4 only
			}
			name := tc.kind
			if tc.devices == nil {
				name += "/default"
			} else {
				name += "/named"
			}
			if tc.noAddr {
				name += "/no-address"
			}
			if tc.xdp != "" {
				name += "/xdp-" + string(tc.xdp)
			}
			if tc.cip {
				name += "/clusterip"
			}
			if tc.late {
				name += "/after-start"
			}
			t.Run(name, func(t *testing.T) { overlayNodePort(t, tc.kind, a, tc.noAddr, tc.devices, tc.xdp, tc.cip, tc.late) })
		}
	})
}

func overlayNodePort(t *testing.T, kind string, a overlayAddrs, noAddr bool, devices []string, xdp XDPMode, cip, late bool) {
	o := overlayTopology(t, kind, a, noAddr, late)
	nodeIPs := []netip.Addr{addr(overlayAddrs4.node1)}
	if addr(a.node1).Is6() {
		nodeIPs = append(nodeIPs, addr(a.node1))
	}
	// The pods' CIDR (both nodes'), which the client is outside of.
	cidr := netip.PrefixFrom(addr(a.podNet[0]), a.podBits-8).Masked()
	d := openTest(t, configWith(smallConfig, func(c *Config) {
		c.NodeIPs, c.XDP, c.ClusterCIDRs = nodeIPs, xdp, []netip.Prefix{cidr}
	})(testPinDir(t)))
	np := l4(a.node1, 30080, model.TCP)
	be := testBackend{1, l4(a.pod, 8080, model.TCP)}
	if cip {
		// The client routes the service CIDR to node1, as a router
		// sending it into the cluster does.
		np = l4(twinAddr(addr(a.pod).Is6(), "10.96.0.50"), 80, model.TCP)
		svc := netip.PrefixFrom(np.Addr, 64)
		if np.Addr.Is4() {
			svc = netip.PrefixFrom(np.Addr, 24)
		}
		if err := o.client.AddRoute(svc, addr(a.node1)); err != nil {
			t.Fatal(err)
		}
		addService(t, d.Maps(), 1, np, be)
	} else {
		addExternal(t, d.Maps(), 1, np, reconciler.FlagExternal, be)
	}
	devs := devices
	if err := o.node1.Do(func() error {
		if devs == nil {
			held, err := DevicesOf(nodeIPs)
			if err != nil {
				return err
			}
			tuns, err := TunnelDevices()
			if err != nil {
				return err
			}
			devs = append(held, tuns...)
		}
		return d.AttachDevices(devs)
	}); err != nil {
		t.Fatal(err)
	}
	if late {
		// The agent without --devices: the start's devices, then the
		// tunnel watch, which attaches node1's ov0 once it is made.
		if !slices.Equal(devs, []string{"eth0"}) {
			t.Fatalf("default devices before the tunnel %v, want [eth0]", devs)
		}
		if err := d.Commit(); err != nil {
			t.Fatal(err)
		}
		var w *DeviceWatch
		if err := o.node1.Do(func() (err error) { w, err = d.NewTunnelWatch(); return err }); err != nil {
			t.Fatal(err)
		}
		next, _ := runDeviceWatch(t, w)
		o.tunnel1()
		if e := next("ov0"); e.Err != nil || e.Device != "ov0" || !e.Attached {
			t.Fatalf("after node1's ov0 was made: %+v, want it attached", e)
		}
	} else if devices == nil && !slices.Equal(devs, []string{"eth0", "ov0"}) {
		t.Errorf("default devices %v, want [eth0 ov0] (a fallback tunl0 is down)", devs)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := o.client.DialContext(ctx, "tcp", apOf(np).String())
	if err != nil {
		cs, _ := d.Counters()
		t.Fatalf("connect %s from the client: %v; counters %v", np, err, cs)
	}
	defer c.Close()
	if _, err := c.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	if err := c.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("echo through %s: %q, %v", np, buf, err)
	}
	want := a.tun1
	if noAddr {
		want = a.node1
	}
	if p := <-o.peers; p.Addr() != addr(want) {
		t.Errorf("the pod saw %s, want node1's %s", p, want)
	}
	expectCounted(t, d, "tc_snat_new")
}
