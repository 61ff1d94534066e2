package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/agentproc"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
)

// TestDevicePatternsFollowPods: the agent runs with --devices eth0,slp+
// and no socket load balancing, so a pod's traffic to a ClusterIP is
// translated only by tc on the pod's host-side device. A pod whose device
// (slp1) appears after the start reaches the Service; a link no pattern
// matches gets nothing; the pod's device deleted, its pins and device
// entry go; a pod created while the agent is down is attached by the next
// agent at its start, and reaches the Service; sluice cleanup takes the
// programs off every device.
func TestDevicePatternsFollowPods(t *testing.T) {
	e := setup(t)
	podNet := netip.MustParsePrefix("10.9.0.0/24")
	for i, be := range e.lb.Backends {
		if err := be.AddRoute(podNet, netip.AddrFrom4([4]byte{10, 1, byte(i + 1), 1})); err != nil {
			t.Fatal(err)
		}
	}
	a := agentproc.NewAgent(agentproc.Shared(t), e.lb.Node, agentproc.AgentConfig{
		Manifests: e.manifest, Devices: []string{e.lb.NodeDev, "slp+"}, BPFFS: e.bpffs,
	})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent log:\n%s", a.Log.String())
		}
		if err := a.Teardown(context.Background()); err != nil {
			t.Error(err)
		}
	})
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	if err := a.WaitReady(60 * time.Second); err != nil {
		t.Fatalf("%v\n%s", err, a.Log.String())
	}

	// pod makes a pod namespace whose host-side device is dev, with
	// address 10.9.0.<10+n>, and returns it.
	pod := func(dev string, n byte) *topology.NS {
		t.Helper()
		ns := e.topo.AddNST(t, "pod"+dev)
		if err := e.topo.Veth(ns, "eth0", e.lb.Node, dev); err != nil {
			t.Fatal(err)
		}
		// The pod's gateway is the node's address on every pod
		// device, as Calico's 169.254.1.1.
		gw := netip.AddrFrom4([4]byte{10, 9, 0, 1})
		addr := netip.AddrFrom4([4]byte{10, 9, 0, 10 + n})
		if err := e.lb.Node.AddAddr(dev, netip.PrefixFrom(gw, 32)); err != nil {
			t.Fatal(err)
		}
		if err := e.lb.Node.AddRouteDev(netip.PrefixFrom(addr, 32), dev); err != nil {
			t.Fatal(err)
		}
		if err := ns.AddAddr("eth0", netip.PrefixFrom(addr, 32)); err != nil {
			t.Fatal(err)
		}
		if err := ns.AddRouteDev(netip.PrefixFrom(gw, 32), "eth0"); err != nil {
			t.Fatal(err)
		}
		if err := ns.AddRoute(topology.ServiceRange, gw); err != nil {
			t.Fatal(err)
		}
		return ns
	}
	get := func(ns *topology.NS) error {
		resp, err := ns.HTTPClient(2 * time.Second).Get("http://" + e.webVIP() + "/")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, err = io.ReadAll(resp.Body)
		return err
	}

	pod1 := pod("slp1", 1)
	testutil.Eventually(t, "the pod behind slp1 to reach the ClusterIP", time.Minute, func() error { return get(pod1) })
	if !e.tcxOn(t, "slp1") {
		t.Fatal("slp1 reaches the Service but has no tcx programs")
	}

	// A link no pattern matches, then a pod's device after it: once
	// that one is attached, the other was seen.
	if err := e.lb.Node.Do(func() error {
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "other1"}, PeerName: "other1p"})
	}); err != nil {
		t.Fatal(err)
	}
	pod("slp3", 3)
	testutil.EventuallyTrue(t, "slp3 attached", time.Minute, func() bool { return e.tcxOn(t, "slp3") })
	if e.tcxOn(t, "other1") {
		t.Fatal("other1 matches no pattern but has tcx programs")
	}

	// slp1 deleted: its pins and device entry go.
	idx1 := e.ifindex(t, "slp1")
	if err := e.lb.Node.Do(func() error {
		l, err := netlink.LinkByName("slp1")
		if err != nil {
			return err
		}
		return netlink.LinkDel(l)
	}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "slp1's pins and device entry removed", time.Minute, func() error {
		for _, p := range []string{"tcx_ingress_slp1", "tcx_egress_slp1"} {
			if _, err := os.Stat(filepath.Join(e.bpffs, "sluice", "links", p)); !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("pin %s: %v", p, err)
			}
		}
		if slices.Contains(e.deviceEntries(t), idx1) {
			return fmt.Errorf("sluice_devices still has ifindex %d", idx1)
		}
		return nil
	})
	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}

	// A pod made while no agent runs: the next one attaches its device
	// at start (and slp3's, kept).
	pod2 := pod("slp2", 2)
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	if err := a.WaitReady(60 * time.Second); err != nil {
		t.Fatalf("%v\n%s", err, a.Log.String())
	}
	if !e.tcxOn(t, "slp2") || !e.tcxOn(t, "slp3") {
		t.Fatalf("after the restart: slp2 attached %v, slp3 %v", e.tcxOn(t, "slp2"), e.tcxOn(t, "slp3"))
	}
	testutil.Eventually(t, "the pod behind slp2 to reach the ClusterIP", time.Minute, func() error { return get(pod2) })

	// sluice cleanup takes the programs off the followed devices too.
	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := a.Uninstall(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, dev := range []string{e.lb.NodeDev, "slp2", "slp3"} {
		if e.tcxOn(t, dev) {
			t.Errorf("%s keeps tcx programs after sluice cleanup", dev)
		}
	}
}

// tcxOn says whether the node's device dev has tcx programs on ingress
// and egress.
func (e *env) tcxOn(t *testing.T, dev string) bool {
	t.Helper()
	var on bool
	if err := e.lb.Node.Do(func() error {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		in, eg, err := tcxPrograms(l)
		on = in > 0 && eg > 0
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return on
}

func (e *env) ifindex(t *testing.T, dev string) uint32 {
	t.Helper()
	var idx uint32
	if err := e.lb.Node.Do(func() error {
		l, err := netlink.LinkByName(dev)
		if err == nil {
			idx = uint32(l.Attrs().Index)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return idx
}

// deviceEntries returns the ifindexes sluice_devices holds.
func (e *env) deviceEntries(t *testing.T) []uint32 {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(e.bpffs, "sluice", "sluice_devices_v1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var out []uint32
	var k uint32
	v := make([]byte, m.ValueSize())
	it := m.Iterate()
	for it.Next(&k, &v) {
		out = append(out, k)
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
