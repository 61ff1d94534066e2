package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/datapath"
)

// TestOverlayDevicesDefault: in a node namespace of its own (eth0 holding
// the node IP, the vxlan ov0 up with a flannel-style on-link route to a
// pod subnet, the vxlan ov1 down, the vxlan ov2 up with no route through
// it, the flow-based vxlan ov3 up with a route), the devices by default
// are eth0 and ov0 (logged); --max-devices 1 leaves ov0 out,
// warned; --devices eth0 warns about ov0 (not ov1, which is down), and
// --devices eth0,ov0 or a pattern matching ov0 does not. The start then
// fails at the missing --manifests, before it loads or pins anything.
func TestOverlayDevicesDefault(t *testing.T) {
	testutil.Privileged(t)
	ns := topology.NewNS(t, "ovdev")
	ns.Enter(t)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "peer0"}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	if err := ns.LinkUp("eth0"); err != nil {
		t.Fatal(err)
	}
	if err := ns.AddAddr("eth0", netip.MustParsePrefix("10.213.0.1/24")); err != nil {
		t.Fatal(err)
	}
	for i, name := range []string{"ov0", "ov1", "ov2", "ov3"} {
		vx := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: name}, VxlanId: 42 + i, SrcAddr: net.ParseIP("10.213.0.1"), Port: 4789 + i, FlowBased: name == "ov3"}
		if name == "ov3" {
			vx.VxlanId, vx.SrcAddr = 0, nil
		}
		if err := netlink.LinkAdd(vx); errors.Is(err, unix.EOPNOTSUPP) {
			// As pkg/datapath's overlay tests: no vxlan module.
			t.Skip("this kernel has no vxlan devices")
		} else if err != nil {
			t.Fatal(err)
		}
		if name == "ov1" {
			continue
		}
		if err := ns.LinkUp(name); err != nil {
			t.Fatal(err)
		}
	}
	for i, dev := range []string{"ov0", "ov3"} {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			t.Fatal(err)
		}
		gw := net.IPv4(10, 244, byte(1+i), 0)
		r := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: &net.IPNet{IP: gw, Mask: net.CIDRMask(24, 32)}, Gw: gw, Flags: int(netlink.FLAG_ONLINK)}
		if err := netlink.RouteAdd(r); err != nil {
			t.Fatalf("route through %s: %v", dev, err)
		}
	}
	const (
		attached = `msg="overlay devices attached to beside the node addresses'`
		full     = `msg="more overlay devices than --max-devices leaves room for`
		leftOut  = `msg="overlay device not in --devices`
	)
	for _, c := range []struct {
		args      []string
		want, not []string
	}{
		{[]string{"--node-ip", "10.213.0.1"}, []string{attached + `" devices=[ov0]`}, []string{leftOut, full}},
		{[]string{"--node-ip", "10.213.0.1", "--max-devices", "1"}, []string{full, `left_out=[ov0]`}, []string{attached, leftOut}},
		{[]string{"--node-ip", "10.213.0.1", "--devices", "eth0"}, []string{leftOut + `: NodePort`, `device=ov0`}, []string{attached, `device=ov1`, `device=ov2`, `device=ov3`}},
		{[]string{"--devices", "eth0,ov0"}, nil, []string{leftOut, attached}},
		{[]string{"--devices", "eth0,ov+"}, nil, []string{leftOut + `: NodePort, ExternalIP and LoadBalancer flows (and ClusterIP ones from outside --cluster-cidr) routed through it to another node's backend are not source-NATed, and the backend's replies go around this node; add it to --devices" device=ov0`}},
	} {
		stderr := runToMissingManifests(t, append([]string{"--socket-lb=false"}, c.args...)...)
		for _, w := range c.want {
			if !strings.Contains(stderr, w) {
				t.Errorf("%q: no %s; stderr:\n%s", c.args, w, stderr)
			}
		}
		for _, n := range c.not {
			if strings.Contains(stderr, n) {
				t.Errorf("%q: %s; stderr:\n%s", c.args, n, stderr)
			}
		}
	}
}

// TestFollowTunnelsAttachesLater: followTunnels (the agent without
// --devices), on a datapath whose start attached eth0 in a node namespace
// of the test's own, attaches the vxlan ov0 created after the start with
// a flannel-style route (logged at Info: "overlay device attached to",
// its entry in sluice_devices), and forgets it once deleted ("overlay
// device forgotten"); runAgent's datapath (closedLast) is taken as the
// datapath itself is.
func TestFollowTunnelsAttachesLater(t *testing.T) {
	testutil.Privileged(t)
	ns := topology.NewNS(t, "ovfollow")
	ns.Enter(t)
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "peer0"}); err != nil {
		t.Fatal(err)
	}
	if err := ns.LinkUp("eth0"); err != nil {
		t.Fatal(err)
	}
	if err := ns.AddAddr("eth0", netip.MustParsePrefix("10.214.0.1/24")); err != nil {
		t.Fatal(err)
	}
	bpffs := testutil.PinDir(t)
	dp, err := datapath.Open(datapath.Config{BPFFS: bpffs, DisableSocketLB: true, NodeIPs: []netip.Addr{netip.MustParseAddr("10.214.0.1")},
		MaxServices: 64, MaxBackends: 64, MaxServiceEntries: 256, MaxConntrack: 1024, MaxConntrackNew: 1024, MaxSockRev: 64})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := datapath.Cleanup(bpffs); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	t.Cleanup(func() { dp.Close() })
	if err := dp.AttachDevices([]string{"eth0"}); err != nil {
		t.Fatal(err)
	}
	if err := dp.Commit(); err != nil {
		t.Fatal(err)
	}
	buf := &testutil.Buffer{}
	log := slog.New(slog.NewTextHandler(buf, nil))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		// In the node namespace, as the agent's goroutine is in the
		// host's.
		if err := ns.Do(func() error {
			followTunnels(log)(ctx, closedLast{Datapath: dp, stop: func() {}})
			return nil
		}); err != nil {
			t.Error(err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })

	// The watch's first list reports nothing (eth0 is not its business):
	// ov0 made after that, or before, is attached either way.
	vx := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: "ov0"}, VxlanId: 42, SrcAddr: net.ParseIP("10.214.0.1"), Port: 4789}
	if err := netlink.LinkAdd(vx); errors.Is(err, unix.EOPNOTSUPP) {
		t.Skip("this kernel has no vxlan devices")
	} else if err != nil {
		t.Fatal(err)
	}
	if err := ns.LinkUp("ov0"); err != nil {
		t.Fatal(err)
	}
	l, err := netlink.LinkByName("ov0")
	if err != nil {
		t.Fatal(err)
	}
	gw := net.IPv4(10, 244, 2, 0)
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: &net.IPNet{IP: gw, Mask: net.CIDRMask(24, 32)}, Gw: gw, Flags: int(netlink.FLAG_ONLINK)}); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyTrue(t, "ov0 attached (logged)", time.Minute, func() bool {
		return strings.Contains(buf.String(), `msg="overlay device attached to" device=ov0`)
	})
	pinned := func() []string {
		t.Helper()
		m, err := filepath.Glob(filepath.Join(bpffs, "*", "links", "tcx_*_ov0"))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	if p := pinned(); len(p) != 2 {
		t.Fatalf("ov0's pinned tcx links: %q, want ingress and egress", p)
	}
	if err := netlink.LinkDel(l); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyTrue(t, "ov0 forgotten (logged)", time.Minute, func() bool {
		return strings.Contains(buf.String(), `msg="overlay device forgotten" device=ov0`)
	})
	if p := pinned(); len(p) != 0 {
		t.Errorf("ov0's pinned tcx links left after it was deleted: %q", p)
	}
	if strings.Contains(buf.String(), "level=ERROR") {
		t.Errorf("errors logged:\n%s", buf)
	}
}

// TestRestartKeepsFollowedTunnel: an agent's watch attached the vxlan
// ov0 after its start; the agent exits, and ov0 loses its route (flanneld
// restarting too) before the next start. The next start, as run composes
// it (withTunnels, AttachDevices, Commit, Prune), keeps ov0 attached: its
// pinned tcx links and its entry flagged tunnel and tc. Pruning to the
// tunnels up and routed at the start took it off.
func TestRestartKeepsFollowedTunnel(t *testing.T) {
	testutil.Privileged(t)
	ns := topology.NewNS(t, "ovrestart")
	ns.Enter(t)
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "peer0"}); err != nil {
		t.Fatal(err)
	}
	if err := ns.LinkUp("eth0"); err != nil {
		t.Fatal(err)
	}
	if err := ns.AddAddr("eth0", netip.MustParsePrefix("10.212.0.1/24")); err != nil {
		t.Fatal(err)
	}
	bpffs := testutil.PinDir(t)
	cfg := datapath.Config{BPFFS: bpffs, DisableSocketLB: true, NodeIPs: []netip.Addr{netip.MustParseAddr("10.212.0.1")},
		MaxServices: 64, MaxBackends: 64, MaxServiceEntries: 256, MaxConntrack: 1024, MaxConntrackNew: 1024, MaxSockRev: 64}
	t.Cleanup(func() {
		if err := datapath.Cleanup(bpffs); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	start := func(devs []string) *datapath.Datapath {
		t.Helper()
		dp, err := datapath.Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := dp.AttachDevices(devs); err != nil {
			dp.Close()
			t.Fatal(err)
		}
		if err := dp.Commit(); err != nil {
			dp.Close()
			t.Fatal(err)
		}
		if err := dp.Prune("", devs); err != nil {
			dp.Close()
			t.Fatal(err)
		}
		return dp
	}
	buf := &testutil.Buffer{}
	log := slog.New(slog.NewTextHandler(buf, nil))
	devs := withTunnels([]string{"eth0"}, datapath.DefaultMaxDevices, bpffs, log)
	if len(devs) != 1 {
		t.Fatalf("first start's devices %q, want eth0 alone", devs)
	}
	dp := start(devs)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := ns.Do(func() error {
			followTunnels(log)(ctx, dp)
			return nil
		}); err != nil {
			t.Error(err)
		}
	}()
	stopped := false
	stopWatch := func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	t.Cleanup(stopWatch)
	vx := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: "ov0"}, VxlanId: 42, SrcAddr: net.ParseIP("10.212.0.1"), Port: 4789}
	if err := netlink.LinkAdd(vx); errors.Is(err, unix.EOPNOTSUPP) {
		t.Skip("this kernel has no vxlan devices")
	} else if err != nil {
		t.Fatal(err)
	}
	if err := ns.LinkUp("ov0"); err != nil {
		t.Fatal(err)
	}
	l, err := netlink.LinkByName("ov0")
	if err != nil {
		t.Fatal(err)
	}
	gw := net.IPv4(10, 244, 2, 0)
	r := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: &net.IPNet{IP: gw, Mask: net.CIDRMask(24, 32)}, Gw: gw, Flags: int(netlink.FLAG_ONLINK)}
	if err := netlink.RouteAdd(r); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyTrue(t, "ov0 attached (logged)", time.Minute, func() bool {
		return strings.Contains(buf.String(), `msg="overlay device attached to" device=ov0`)
	})
	// The agent exits; ov0 loses its route and goes down.
	stopWatch()
	dp.Close()
	if err := netlink.RouteDel(r); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetDown(l); err != nil {
		t.Fatal(err)
	}
	devs = withTunnels([]string{"eth0"}, datapath.DefaultMaxDevices, bpffs, log)
	if len(devs) != 2 || devs[1] != "ov0" {
		t.Fatalf("restart's devices %q, want eth0 and ov0 (kept)", devs)
	}
	dp2 := start(devs)
	defer dp2.Close()
	pins, err := filepath.Glob(filepath.Join(bpffs, "*", "links", "tcx_*_ov0"))
	if err != nil {
		t.Fatal(err)
	}
	if len(pins) != 2 {
		t.Errorf("ov0's pinned tcx links after the restart: %q, want ingress and egress", pins)
	}
	kept, err := datapath.PinnedTunnelDevices(bpffs)
	if err != nil || len(kept) != 1 || kept[0] != "ov0" {
		t.Errorf("tunnels flagged tunnel and tc after the restart: %q (%v), want ov0", kept, err)
	}
	if strings.Contains(buf.String(), "level=ERROR") {
		t.Errorf("errors logged:\n%s", buf)
	}
}
