package datapath

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/internal/testutil/topology"
)

// tunnelNode enters a node namespace of the test's own with eth0 (a veth,
// up) holding the node IP 10.215.0.1/24, and opens a datapath there:
// base's configuration (smallConfig or xdpConfig) for that node IP,
// changed by set (nil: unchanged).
func tunnelNode(t *testing.T, name string, base func(bpffs string) Config, set func(*Config)) *Datapath {
	t.Helper()
	bpffs, _ := attachNode(t, name)
	addVeth(t, "eth0", "wire0")
	if err := netlink.LinkSetUp(linkNamed(t, "eth0")); err != nil {
		t.Fatal(err)
	}
	if err := netlink.AddrAdd(linkNamed(t, "eth0"), &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(10, 215, 0, 1), Mask: net.CIDRMask(24, 32)}}); err != nil {
		t.Fatal(err)
	}
	cfg := base(bpffs)
	cfg.NodeIPs = []netip.Addr{netip.MustParseAddr("10.215.0.1")}
	if set != nil {
		set(&cfg)
	}
	return openTest(t, cfg)
}

func linkNamed(t *testing.T, name string) netlink.Link {
	t.Helper()
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// addVxlan adds the vxlan name (vni) over eth0 in the calling thread's
// namespace, flow-based (external: collect-metadata) if asked, up if
// asked; it skips t when the kernel has no vxlan devices.
func addVxlan(t *testing.T, name string, vni int, flowBased, up bool) netlink.Link {
	t.Helper()
	vx := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: name}, VxlanId: vni, SrcAddr: net.IPv4(10, 215, 0, 1), Port: 4789 + vni}
	if flowBased {
		vx.FlowBased, vx.VxlanId, vx.SrcAddr = true, 0, nil
	}
	return topology.AddVxlan(t, vx, up)
}

// has6 says whether l has a sluice6_devices entry.
func has6(t *testing.T, d *Datapath, l netlink.Link) bool {
	t.Helper()
	v := make([]byte, d.maps.devices6.ValueSize())
	err := d.maps.devices6.Lookup(uint32(l.Attrs().Index), &v)
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Fatalf("%s: sluice6_devices: %v", l.Attrs().Name, err)
	}
	return err == nil
}

// startTunnelWatch attaches devs (the start's devices), commits d and
// returns d's tunnel watch, not running yet, beside the node-address
// devices nodeDevices.
func startTunnelWatch(t *testing.T, d *Datapath, devs []string, nodeDevices ...string) *DeviceWatch {
	t.Helper()
	if err := d.AttachDevices(devs); err != nil {
		t.Fatal(err)
	}
	if err := d.Commit(); err != nil {
		t.Fatal(err)
	}
	w, err := d.NewTunnelWatch(nodeDevices...)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// TestTunnelWatchFollowsOverlays runs the tunnel watch (no --devices) in
// a node namespace of the test's own whose start attached eth0 (the node
// IP's) and the overlay ovs (up, routed; Config.FollowedTunnels): ovs's
// entry is flagged followed by the start, before the watch, and ovs is
// "attached already"; eth0 not the watch's business (not flagged). After the start: the vxlan ov0, up with an
// address and a flannel-style route to a pod subnet, is attached (tc
// programs, pins, its entry flagged tunnel and tc, with its address; no
// XDP though XDP is on); eth0 getting routes is passed over; the
// flow-based vxlan ov3, up and routed, never is; ov1, up but routed only later, is attached when its route comes
// (its entry with the node IP: it has no address); ov1 losing its route
// stays attached; each attached is flagged followed; ov0 and ovs deleted are forgotten (pins and entries
// gone), eth0 kept.
func TestTunnelWatchFollowsOverlays(t *testing.T) {
	d := tunnelNode(t, "tunwatch", xdpConfig, func(c *Config) {
		c.FollowedTunnels = []string{"ovs"} // as cmd/sluice's withTunnels
	})
	ovs := addVxlan(t, "ovs", 9, false, true)
	topology.PodRoute(t, ovs, 9)
	start, err := TunnelDevices()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(start, []string{"ovs"}) {
		t.Fatalf("TunnelDevices at start: %q, want [ovs]", start)
	}
	if err := d.AttachDevices([]string{"eth0", "ovs"}); err != nil {
		t.Fatal(err)
	}
	if err := d.Commit(); err != nil {
		t.Fatal(err)
	}
	// Flagged followed by the start itself, before any watch: an agent
	// stopping now has ovs kept at its restart.
	if kept, err := PinnedTunnelDevices(d.cfg.BPFFS); err != nil || !slices.Equal(kept, []string{"ovs"}) {
		t.Fatalf("tunnels followed after the start, before the watch: %q (%v), want [ovs]", kept, err)
	}
	w, err := d.NewTunnelWatch("eth0")
	if err != nil {
		t.Fatal(err)
	}
	nextEvent, stop := runDeviceWatch(t, w)
	expect := func(dev string, attached bool, reason string) {
		t.Helper()
		e := nextEvent(dev + " " + reason)
		if e.Err != nil || e.Device != dev || e.Attached != attached || e.Reason != reason {
			t.Fatalf("event %+v, want %s attached=%v %s", e, dev, attached, reason)
		}
	}
	attachedHere := func(l netlink.Link) bool { t.Helper(); return tcAttached(t, d, l) }
	entry := func(l netlink.Link) (sockNodeDev, bool) { return deviceEntry(d, l) }
	wantTunnelEntry := func(l netlink.Link, addr string) {
		t.Helper()
		nd, ok := entry(l)
		if want := nodeDevTunnel | nodeDevTC | nodeDevFollowed; !ok || nd.Flags&want != want || nd.Addr != be32(netip.MustParseAddr(addr)) {
			t.Fatalf("%s: device entry %+v (present %v), want one flagged tunnel, tc and followed with %s", l.Attrs().Name, nd, ok, addr)
		}
	}
	wantPins := func(want ...string) { t.Helper(); wantLinkPins(t, d, want...) }
	expect("ovs", true, "attached already")
	wantTunnelEntry(ovs, "10.215.0.1") // the start's, followed
	if nd, _ := entry(linkNamed(t, "eth0")); nd.Flags&nodeDevFollowed != 0 {
		t.Fatalf("eth0: entry %+v flagged followed", nd)
	}

	// ov0 after the start: up, its address, then its route.
	ov0 := addVxlan(t, "ov0", 1, false, true)
	if err := netlink.AddrAdd(ov0, &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(10, 244, 1, 0), Mask: net.CIDRMask(32, 32)}}); err != nil {
		t.Fatal(err)
	}
	// And an IPv6 one (a sluice6_devices entry, removed with it).
	if err := netlink.AddrAdd(ov0, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP("fd00:244:1::1"), Mask: net.CIDRMask(128, 128)}, Flags: unix.IFA_F_NODAD}); err != nil {
		t.Fatal(err)
	}
	topology.PodRoute(t, ov0, 2)
	expect("ov0", true, "appeared")
	if !attachedHere(ov0) {
		t.Fatal("ov0: tc programs not attached")
	}
	wantTunnelEntry(ov0, "10.244.1.0")
	if !has6(t, d, ov0) {
		t.Fatal("ov0: no sluice6_devices entry for its IPv6 address")
	}
	wantPins("tcx_egress_eth0", "tcx_ingress_eth0", "xdp_generic_eth0", "tcx_egress_ovs", "tcx_ingress_ovs", "tcx_egress_ov0", "tcx_ingress_ov0")

	// The flow-based ov3, up and routed, then ov1 up, routed later: the
	// next event is ov1's, so ov3's messages were heard and passed over.
	// A route through eth0 (no tunnel: passed over, twice) before them.
	for _, dst := range []string{"10.99.0.0/16", "10.98.0.0/16"} {
		_, n, _ := net.ParseCIDR(dst)
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: linkNamed(t, "eth0").Attrs().Index, Dst: n, Gw: net.IPv4(10, 215, 0, 254)}); err != nil {
			t.Fatal(err)
		}
	}
	ov3 := addVxlan(t, "ov3", 3, true, true)
	topology.PodRoute(t, ov3, 3)
	ov1 := addVxlan(t, "ov1", 2, false, true)
	if _, ok := entry(ov1); ok {
		t.Fatal("ov1 has a device entry before a route leaves through it")
	}
	r1 := topology.PodRoute(t, ov1, 4)
	expect("ov1", true, "appeared")
	if !attachedHere(ov1) {
		t.Fatal("ov1: tc programs not attached")
	}
	wantTunnelEntry(ov1, "10.215.0.1") // no address: the node IP
	if attachedHere(ov3) {
		t.Fatal("the flow-based ov3 has the tc programs")
	}
	if _, ok := entry(ov3); ok {
		t.Fatal("the flow-based ov3 has a device entry")
	}

	// ov1 loses its route: kept (the next event is ov0's removal).
	if err := netlink.RouteDel(r1); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkDel(ov0); err != nil {
		t.Fatal(err)
	}
	expect("ov0", false, "removed")
	if _, ok := entry(ov0); ok {
		t.Fatal("ov0: device entry left after it was deleted")
	}
	if has6(t, d, ov0) {
		t.Fatal("ov0: sluice6_devices entry left after it was deleted")
	}
	if !attachedHere(ov1) {
		t.Fatal("ov1: tc programs taken off when it lost its route")
	}
	if err := netlink.LinkDel(ovs); err != nil {
		t.Fatal(err)
	}
	expect("ovs", false, "removed")
	if _, ok := entry(ovs); ok {
		t.Fatal("ovs: device entry left after it was deleted")
	}
	wantPins("tcx_egress_eth0", "tcx_ingress_eth0", "xdp_generic_eth0", "tcx_egress_ov1", "tcx_ingress_ov1")
	stop()
	if nd, ok := entry(linkNamed(t, "eth0")); !ok || nd.Flags&nodeDevTC == 0 {
		t.Fatalf("eth0: entry %+v (present %v) after the watch, want it kept", nd, ok)
	}
}

// TestTunnelWatchLeavesNodeDevices: a node IP on a tunnel (the vxlan nd0
// holding 10.216.0.1, as a VPN's wg0 may) makes it one of the start's
// node-address devices (NewTunnelWatch's nodeDevices), not the tunnel
// watch's: its entry is not flagged followed, and renamed (nd1), then
// given a route of the kind an overlay routes by, it keeps its tc
// programs and its entry (flagged tc), with no event: the next is the
// vxlan ov0's, attached after them. The watch held every start entry
// flagged tunnel: nd0's rename detached it ("renamed away"), and its
// route attached it again under the new name.
func TestTunnelWatchLeavesNodeDevices(t *testing.T) {
	nodeIPs := []netip.Addr{netip.MustParseAddr("10.215.0.1"), netip.MustParseAddr("10.216.0.1")}
	d := tunnelNode(t, "tunnodedev", smallConfig, func(c *Config) { c.NodeIPs = nodeIPs })
	nd := addVxlan(t, "nd0", 5, false, true)
	if err := netlink.AddrAdd(nd, &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(10, 216, 0, 1), Mask: net.CIDRMask(24, 32)}}); err != nil {
		t.Fatal(err)
	}
	held, err := DevicesOf(nodeIPs)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(held, []string{"eth0", "nd0"}) {
		t.Fatalf("devices holding the node IPs: %q, want eth0 and nd0", held)
	}
	w := startTunnelWatch(t, d, held, held...)
	next, stop := runDeviceWatch(t, w)
	ingressID := progID(t, d.tc.SluiceIngress)
	wantKept := func(when string) {
		t.Helper()
		var e sockNodeDev
		if err := d.maps.devices.Lookup(uint32(nd.Attrs().Index), &e); err != nil || e.Flags&(nodeDevTunnel|nodeDevTC) != nodeDevTunnel|nodeDevTC || e.Flags&nodeDevFollowed != 0 {
			t.Fatalf("nd0 %s: entry %+v (%v), want one flagged tunnel and tc, not followed", when, e, err)
		}
		if !slices.Contains(attachedIDs(t, nd.Attrs().Index, ebpf.AttachTCXIngress), ingressID) {
			t.Fatalf("nd0 %s: tc programs taken off", when)
		}
	}
	wantKept("at the start")
	if err := netlink.LinkSetName(nd, "nd1"); err != nil {
		t.Fatal(err)
	}
	topology.PodRoute(t, nd, 5)
	ov0 := addVxlan(t, "ov0", 1, false, true)
	topology.PodRoute(t, ov0, 2)
	if e := next("ov0"); e.Err != nil || e.Device != "ov0" || !e.Attached || e.Reason != "appeared" {
		t.Fatalf("event %+v, want ov0 attached (appeared): nd0 is not the watch's", e)
	}
	wantKept("renamed nd1 and routed")
	if _, err := os.Stat(d.linkPin("tcx_ingress_nd1")); err == nil {
		t.Error("nd1 attached again under its new name")
	}
	stop()
	if !w.notOurs[nd.Attrs().Index] || len(w.have) != 1 {
		t.Errorf("the watch holds %v, passes over %v: want ov0 held, nd0's ifindex passed over", w.have, w.notOurs)
	}
}

// TestTunnelWatchResubscribes: when the route subscription fails (an
// overrun: ENOBUFS), the failure is reported, the watch subscribes again
// and lists again: a tunnel whose route came unheard is attached then.
func TestTunnelWatchResubscribes(t *testing.T) {
	d := tunnelNode(t, "tunresub", smallConfig, nil)
	ovs := addVxlan(t, "ovs", 9, false, true)
	topology.PodRoute(t, ovs, 9)
	w := startTunnelWatch(t, d, []string{"eth0", "ovs"}, "eth0")
	// The first route subscription hears nothing and fails when told
	// to; the second is the real one.
	fail, subscriptions := failFirstSubscription(&w.subscribeRoutes,
		func(o netlink.RouteSubscribeOptions) func(error) { return o.ErrorCallback }, unix.ENOBUFS)
	nextEvent, _ := runDeviceWatch(t, w)
	next := func(what string) DeviceEvent { t.Helper(); return nextEvent(what) }
	if e := next("ovs"); e.Err != nil || e.Device != "ovs" || e.Reason != "attached already" {
		t.Fatalf("first event %+v, want ovs attached already", e)
	}
	// Not in Config.FollowedTunnels, so not flagged by the start: the
	// watch flags what it finds attached already (its fallback).
	if nd, ok := deviceEntry(d, ovs); !ok || nd.Flags&nodeDevFollowed == 0 {
		t.Fatalf("ovs's entry after \"attached already\": %+v (found %v), want flagged followed", nd, ok)
	}
	// ov0 up without a route; ovs's removal, heard after it on the
	// same subscription, says its message was handled. Then ov0's
	// route, unheard.
	ov0 := addVxlan(t, "ov0", 1, false, true)
	if err := netlink.LinkDel(ovs); err != nil {
		t.Fatal(err)
	}
	if e := next("ovs removed"); e.Err != nil || e.Device != "ovs" || e.Attached || e.Reason != "removed" {
		t.Fatalf("event %+v, want ovs removed", e)
	}
	topology.PodRoute(t, ov0, 2)
	fail()
	if e := next("the failure"); e.Err == nil || !strings.Contains(e.Err.Error(), "subscribing again") {
		t.Fatalf("after the failure: %+v, want its error reported", e)
	}
	if e := next("ov0"); e.Err != nil || e.Device != "ov0" || !e.Attached || e.Reason != "appeared" {
		t.Fatalf("after subscribing again: %+v, want ov0 attached (appeared)", e)
	}
	var nd sockNodeDev
	if err := d.maps.devices.Lookup(uint32(ov0.Attrs().Index), &nd); err != nil || nd.Flags&(nodeDevTunnel|nodeDevTC) != nodeDevTunnel|nodeDevTC {
		t.Fatalf("ov0: entry %+v (%v), want one flagged tunnel and tc", nd, err)
	}
	if n := subscriptions(); n != 2 {
		t.Errorf("%d route subscriptions, want 2", n)
	}
}

// TestTunnelWatchMaxDevices: with --max-devices 1, held by eth0, a tunnel
// appearing after the start is not attached: its event is an error naming
// sluice_devices and --max-devices, reported once, and it has no programs
// and no entry; eth0's entry is untouched.
func TestTunnelWatchMaxDevices(t *testing.T) {
	d := tunnelNode(t, "tunmax", smallConfig, func(c *Config) { c.MaxDevices = 1 })
	w := startTunnelWatch(t, d, []string{"eth0"}, "eth0")
	next, stop := runDeviceWatch(t, w)
	ov0 := addVxlan(t, "ov0", 1, false, true)
	topology.PodRoute(t, ov0, 2)
	e := next("ov0 left out")
	if e.Device != "ov0" || e.Attached || !errors.Is(e.Err, ErrDevicesFull) {
		t.Fatalf("event %+v, want ov0 left out for want of room", e)
	}
	for _, want := range []string{"sluice_devices", "--max-devices 1"} {
		if !strings.Contains(e.Err.Error(), want) {
			t.Errorf("error %q does not name %s", e.Err, want)
		}
	}
	// More routes through it: not reported again (the next event is
	// ov1's, which fits no better), nor tried again (retryPending does
	// when a device goes).
	for n := byte(3); n < 23; n++ {
		topology.PodRoute(t, ov0, n)
	}
	ov1 := addVxlan(t, "ov1", 2, false, true)
	topology.PodRoute(t, ov1, 30)
	if e := next("ov1 left out"); e.Device != "ov1" || !errors.Is(e.Err, ErrDevicesFull) {
		t.Fatalf("event %+v, want ov1 left out for want of room", e)
	}
	stop()
	if w.attachTries != 2 {
		t.Errorf("%d attach attempts, want 2 (ov0 and ov1 once each)", w.attachTries)
	}
	var nd sockNodeDev
	if err := d.maps.devices.Lookup(uint32(ov0.Attrs().Index), &nd); err == nil {
		t.Errorf("ov0 has an entry %+v", nd)
	}
	if ids := attachedIDs(t, ov0.Attrs().Index, ebpf.AttachTCXIngress); slices.Contains(ids, progID(t, d.tc.SluiceIngress)) {
		t.Error("ov0 has the tc programs though its entry did not fit")
	}
	if err := d.maps.devices.Lookup(uint32(linkNamed(t, "eth0").Attrs().Index), &nd); err != nil || nd.Flags&nodeDevTC == 0 {
		t.Errorf("eth0: entry %+v (%v), want it kept", nd, err)
	}
}

// TestTunnelWatchRelistRoutes: a relist lists the main table's routes
// only when a link could become an overlay device (a BGP node's table is
// a full one): not while the tunnels are held, down or flow-based. A
// relist whose route list fails still forgets a tunnel deleted meanwhile
// (its pins and entries), and asks to list again later.
func TestTunnelWatchRelistRoutes(t *testing.T) {
	d := tunnelNode(t, "tunlist", smallConfig, nil)
	ovs := addVxlan(t, "ovs", 9, false, true)
	topology.PodRoute(t, ovs, 9)
	addVxlan(t, "ovd", 3, false, false) // down
	ovf := addVxlan(t, "ovf", 4, true, true)
	topology.PodRoute(t, ovf, 4) // flow-based: never an overlay device
	w := startTunnelWatch(t, d, []string{"eth0", "ovs"}, "eth0")
	dumps := 0
	list := w.routes
	w.routes = func() ([]netlink.Route, error) { dumps++; return list() }
	var events []DeviceEvent
	report := func(e DeviceEvent) { events = append(events, e) }
	w.relist(report)
	if dumps != 0 {
		t.Fatalf("%d route lists with no tunnel to pick, want none", dumps)
	}
	if len(events) != 1 || events[0].Device != "ovs" || events[0].Reason != "attached already" {
		t.Fatalf("events %+v, want ovs attached already", events)
	}
	// ov0 up and routed: listed, attached.
	ov0 := addVxlan(t, "ov0", 1, false, true)
	topology.PodRoute(t, ov0, 2)
	events = nil
	w.relist(report)
	if dumps != 1 || len(events) != 1 || events[0].Device != "ov0" || !events[0].Attached {
		t.Fatalf("%d route lists, events %+v: want one list and ov0 attached", dumps, events)
	}
	// ov2 up (a candidate: the routes are listed) and ov0 deleted; the
	// list fails.
	addVxlan(t, "ov2", 2, false, true)
	w.routes = func() ([]netlink.Route, error) { dumps++; return nil, netlink.ErrDumpInterrupted }
	if err := netlink.LinkDel(ov0); err != nil {
		t.Fatal(err)
	}
	events = nil
	w.relist(report)
	var forgot, failed bool
	for _, e := range events {
		forgot = forgot || (e.Device == "ov0" && !e.Attached && e.Err == nil && e.Reason == "missed")
		failed = failed || (e.Err != nil && errors.Is(e.Err, netlink.ErrDumpInterrupted))
	}
	if !forgot || !failed {
		t.Fatalf("events %+v: want ov0 forgotten (missed) and the failed list reported", events)
	}
	var nd sockNodeDev
	if err := d.maps.devices.Lookup(uint32(ov0.Attrs().Index), &nd); err == nil {
		t.Errorf("ov0: entry %+v left after it was deleted", nd)
	}
	for _, pin := range []string{"tcx_ingress_ov0", "tcx_egress_ov0"} {
		if _, err := os.Stat(d.linkPin(pin)); err == nil {
			t.Errorf("pin %s left after ov0 was deleted", pin)
		}
	}
	if !w.relistDue {
		t.Error("no relist due after the route list failed")
	}
}
