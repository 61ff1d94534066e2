package main

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/agent"
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
	overlayNode(t, "ovdev", "10.213.0.1")
	links := map[string]netlink.Link{}
	for i, name := range []string{"ov0", "ov1", "ov2", "ov3"} {
		vx := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: name}, VxlanId: 42 + i, SrcAddr: net.ParseIP("10.213.0.1"), Port: 4789 + i, FlowBased: name == "ov3"}
		if name == "ov3" {
			vx.VxlanId, vx.SrcAddr = 0, nil
		}
		links[name] = topology.AddVxlan(t, vx, name != "ov1")
	}
	for i, dev := range []string{"ov0", "ov3"} {
		topology.PodRoute(t, links[dev], byte(1+i))
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
	ns := overlayNode(t, "ovfollow", "10.214.0.1")
	cfg := overlayNodeConfig(t, "10.214.0.1")
	bpffs := cfg.BPFFS
	dp, err := datapath.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dp.Close() })
	if err := dp.AttachDevices([]string{"eth0"}); err != nil {
		t.Fatal(err)
	}
	if err := dp.Commit(); err != nil {
		t.Fatal(err)
	}
	buf := &testutil.Buffer{}
	log := slog.New(slog.NewTextHandler(buf, nil))
	runFollowTunnels(t, ns, log, closedLast{Datapath: dp, stop: func() {}})

	// The watch's first list reports nothing (eth0 is not its business):
	// ov0 made after that, or before, is attached either way.
	l := topology.AddVxlan(t, &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: "ov0"}, VxlanId: 42, SrcAddr: net.ParseIP("10.214.0.1"), Port: 4789}, true)
	topology.PodRoute(t, l, 2)
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

// TestRestartKeepsFollowedTunnel: four agents in turn, each start made
// of run's pieces (withTunnels without --devices, its tunnels as
// datapath.Config.FollowedTunnels; AttachDevices, Commit and Prune; then
// followTunnels), though run prunes first (prepareDatapath) and attaches
// and commits after (agent.Run). A: --devices eth0,vpn0 (a vxlan up
// with an address of its own and no route but the kernel's, as a VPN's
// wg0). B, without --devices: vpn0 is not kept (A attached it only
// because --devices named it), its pins gone; B's watch attaches the
// vxlan ov0, routed after its start; then ov0 loses its route and goes
// down (flanneld restarting too). C keeps ov0 attached (its pinned tcx
// links, its entry flagged tunnel, tc and followed), and so does D after
// C (C's start flagged ov0, a tunnel it kept, followed again). Keeping
// every tunnel flagged tunnel and tc kept vpn0 at B's start.
func TestRestartKeepsFollowedTunnel(t *testing.T) {
	ns := overlayNode(t, "ovrestart", "10.212.0.1")
	vxlan := func(name string, vni int) netlink.Link {
		t.Helper()
		return topology.AddVxlan(t, &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: name}, VxlanId: vni, SrcAddr: net.ParseIP("10.212.0.1"), Port: 4747 + vni}, true)
	}
	vxlan("vpn0", 7)
	if err := ns.AddAddr("vpn0", netip.MustParsePrefix("10.8.0.1/24")); err != nil {
		t.Fatal(err)
	}
	cfg := overlayNodeConfig(t, "10.212.0.1")
	bpffs := cfg.BPFFS
	buf := &testutil.Buffer{}
	log := slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	// start starts an agent on devs; without --devices (follow) its
	// tunnel watch runs until the returned stop.
	start := func(devs []string, follow bool) (stop func()) {
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
		if !follow {
			stopped := false
			stop = func() {
				if !stopped {
					stopped = true
					dp.Close()
				}
			}
			t.Cleanup(stop)
			return stop
		}
		stopWatch := runFollowTunnels(t, ns, log, dp)
		stopped := false
		stop = func() {
			if !stopped {
				stopped = true
				stopWatch()
				dp.Close()
			}
		}
		t.Cleanup(stop)
		return stop
	}
	pinned := func(dev string) []string {
		t.Helper()
		pins, err := filepath.Glob(filepath.Join(bpffs, "*", "links", "tcx_*_"+dev))
		if err != nil {
			t.Fatal(err)
		}
		return pins
	}

	// A: --devices eth0,vpn0.
	stopA := start([]string{"eth0", "vpn0"}, false)
	if p := pinned("vpn0"); len(p) != 2 {
		t.Fatalf("vpn0's pinned tcx links under --devices: %q, want ingress and egress", p)
	}
	stopA()

	// B: without --devices.
	devs, tuns := withTunnels([]string{"eth0"}, datapath.DefaultMaxDevices, bpffs, log)
	cfg.FollowedTunnels = tuns
	if len(devs) != 1 {
		t.Fatalf("B's devices %q, want eth0 alone (vpn0, named by A's --devices, not kept)", devs)
	}
	stopB := start(devs, true)
	if p := pinned("vpn0"); len(p) != 0 {
		t.Errorf("vpn0's pinned tcx links after B's start: %q, want none", p)
	}
	ov0 := vxlan("ov0", 42)
	r := topology.PodRoute(t, ov0, 2)
	testutil.EventuallyTrue(t, "ov0 attached (logged)", time.Minute, func() bool {
		return strings.Contains(buf.String(), `msg="overlay device attached to" device=ov0`)
	})
	// B exits; ov0 loses its route and goes down.
	stopB()
	if err := netlink.RouteDel(r); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetDown(ov0); err != nil {
		t.Fatal(err)
	}

	// C, then D: ov0 kept.
	for _, agent := range []string{"C", "D"} {
		devs, tuns = withTunnels([]string{"eth0"}, datapath.DefaultMaxDevices, bpffs, log)
		if len(devs) != 2 || devs[1] != "ov0" || len(tuns) != 1 || tuns[0] != "ov0" {
			t.Fatalf("%s's devices %q, followed %q, want eth0 and ov0 (kept), ov0 followed", agent, devs, tuns)
		}
		cfg.FollowedTunnels = tuns
		const held = `msg="overlay device attached already" device=ov0`
		before := strings.Count(buf.String(), held)
		stop := start(devs, true)
		if p := pinned("ov0"); len(p) != 2 {
			t.Errorf("ov0's pinned tcx links after %s's start: %q, want ingress and egress", agent, p)
		}
		testutil.EventuallyTrue(t, agent+"'s watch holding ov0 (logged)", time.Minute, func() bool {
			return strings.Count(buf.String(), held) > before
		})
		kept, err := datapath.PinnedTunnelDevices(bpffs)
		if err != nil || len(kept) != 1 || kept[0] != "ov0" {
			t.Errorf("tunnels followed after %s's start: %q (%v), want ov0", agent, kept, err)
		}
		stop()
	}
	if strings.Contains(buf.String(), "level=ERROR") {
		t.Errorf("errors logged:\n%s", buf)
	}
}

// overlayNode enters a node namespace of the test's own with eth0 (a
// veth, up) holding nodeIP/24.
func overlayNode(t *testing.T, name, nodeIP string) *topology.NS {
	t.Helper()
	testutil.Privileged(t)
	ns := topology.NewNS(t, name)
	ns.Enter(t)
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "peer0"}); err != nil {
		t.Fatal(err)
	}
	if err := ns.LinkUp("eth0"); err != nil {
		t.Fatal(err)
	}
	if err := ns.AddAddr("eth0", netip.MustParsePrefix(nodeIP+"/24")); err != nil {
		t.Fatal(err)
	}
	return ns
}

// overlayNodeConfig is a small datapath configuration for nodeIP,
// without the socket hooks, in a pin directory of the test's own that
// datapath.Cleanup empties at the end.
func overlayNodeConfig(t *testing.T, nodeIP string) datapath.Config {
	t.Helper()
	bpffs := testutil.PinDir(t)
	t.Cleanup(func() {
		if err := datapath.Cleanup(bpffs); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return datapath.Config{BPFFS: bpffs, DisableSocketLB: true, NodeIPs: []netip.Addr{netip.MustParseAddr(nodeIP)},
		MaxServices: 64, MaxBackends: 64, MaxServiceEntries: 256, MaxConntrack: 1024, MaxConntrackNew: 1024, MaxSockRev: 64}
}

// runFollowTunnels runs followTunnels (eth0 the node address's device)
// on adp until stop, or the test's end: in ns, as the agent's goroutine
// runs in the host's.
func runFollowTunnels(t *testing.T, ns *topology.NS, log *slog.Logger, adp agent.Datapath) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := ns.Do(func() error {
			followTunnels([]string{"eth0"}, log)(ctx, adp)
			return nil
		}); err != nil {
			t.Error(err)
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

// TestDeviceReporterLevels: a device watch's reporter (the --devices
// patterns' and the overlay devices') logs an overrun at Warn, one found
// attached whose entry could not be flagged followed at Warn, another
// failure at Error, an attach or a forget at Info and one found attached
// already at Debug, each with its message. The patterns' watch logged an
// overrun at Error; the flag's failure was logged at Error as a device
// whose flows are not source-NATed.
func TestDeviceReporterLevels(t *testing.T) {
	buf := &testutil.Buffer{}
	report := deviceReporter(slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug})),
		deviceMessages{overrun: "m-overrun", failed: "m-failed", already: "m-already", unflagged: "m-unflagged", attached: "m-attached", forgotten: "m-forgotten"})
	for _, c := range []struct {
		e    datapath.DeviceEvent
		want string
	}{
		{datapath.DeviceEvent{Reason: "overrun", Err: unix.ENOBUFS}, `level=WARN msg=m-overrun err="no buffer space available"`},
		{datapath.DeviceEvent{Device: "d0", Ifindex: 3, Reason: "appeared", Err: datapath.ErrDevicesFull}, `level=ERROR msg=m-failed device=d0 ifindex=3 event=appeared err=`},
		{datapath.DeviceEvent{Device: "d0", Ifindex: 3, Attached: true, Reason: "attached already"}, `level=DEBUG msg=m-already device=d0 ifindex=3`},
		{datapath.DeviceEvent{Device: "d0", Ifindex: 3, Attached: true, Reason: "attached already", Err: unix.EIO}, `level=WARN msg=m-unflagged device=d0 ifindex=3 event="attached already" err=`},
		{datapath.DeviceEvent{Device: "d0", Ifindex: 3, Attached: true, Reason: "appeared"}, `level=INFO msg=m-attached device=d0 ifindex=3 event=appeared`},
		{datapath.DeviceEvent{Device: "d0", Ifindex: 3, Reason: "removed"}, `level=INFO msg=m-forgotten device=d0 ifindex=3 event=removed`},
	} {
		before := len(buf.String())
		report(c.e)
		if got := buf.String()[before:]; !strings.Contains(got, c.want) {
			t.Errorf("event %+v logged %q, want %s", c.e, got, c.want)
		}
	}
}
