package datapath

import (
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/model"
)

// TestDevicePortFollowsMaster: a device the agent attached to while it
// had no master, enslaved to a bridge afterwards, is flagged nodeDevPort
// by WatchPorts, and tc then answers its frames to another host's MAC
// (the bridge's may be such a MAC), as the kernel does from the moment
// of the enslave; released, and then enslaved again and its bridge
// deleted, it is a port no more, and such frames are dropped again.
// Without the watch the flag stays what the attach saw.
func TestDevicePortFollowsMaster(t *testing.T) {
	testutil.Privileged(t)
	nodeNetns(t)
	d := openTestWith(t, smallConfig, slowRefill)
	applyServices(t, d, clusterIP(l4("10.96.0.10", 80, model.TCP), l4("10.1.0.1", 8080, model.TCP)))
	if err := d.AttachDevices([]string{"eth0", "eth1"}); err != nil {
		t.Fatal(err)
	}
	eth1 := mustLink(t, "eth1")
	ifindex := eth1.Attrs().Index

	changes := make(chan bool, 16)
	w, err := d.WatchPorts(func(i int, _ string, port bool) {
		if i == ifindex {
			changes <- port
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := w.Close(); err != nil {
			t.Errorf("watch: %v", err)
		}
	})

	sport := uint16(40000)
	// check says whether eth1's entry and tc's answer to a frame for
	// another MAC on eth1 are a port's (answered) or not (dropped).
	check := func(what string, port bool) {
		t.Helper()
		var nd sockNodeDev
		if err := d.maps.devices.Lookup(uint32(ifindex), &nd); err != nil {
			t.Fatal(err)
		}
		want := nodeDevTC
		if port {
			want |= nodeDevPort
		}
		if nd.Flags != want {
			t.Errorf("%s: eth1 recorded with flags %#x, want %#x", what, nd.Flags, want)
		}
		p := tcpPacket("10.0.0.1", sport, "10.96.0.10", 81, 0, nil)
		sport++
		verdict, _ := runOn(t, d.TCIngress(), ifindex, frame(otherHostMAC, clientMAC, p))
		if wantV := map[bool]uint32{true: tcActRedirect, false: tcActShot}[port]; verdict != wantV {
			t.Errorf("%s: a frame to another MAC on eth1: verdict %d, want %d", what, verdict, wantV)
		}
	}
	// wait waits for the watch to have reported eth1's flag changed to
	// port and for the entry to say so: a message handled later may
	// set it again, so the state settles on what is asserted (the
	// bound only keeps a broken watch from hanging the test).
	wait := func(what string, port bool) {
		t.Helper()
		reported := false
		deadline := time.After(30 * time.Second)
		for {
			var nd sockNodeDev
			if err := d.maps.devices.Lookup(uint32(ifindex), &nd); err != nil {
				t.Fatal(err)
			}
			if reported && (nd.Flags&nodeDevPort != 0) == port {
				return
			}
			select {
			case got := <-changes:
				reported = reported || got == port
			case <-time.After(10 * time.Millisecond):
			case <-deadline:
				t.Fatalf("%s: eth1's flag not changed to port %v (reported %v, flags %#x)", what, port, reported, nd.Flags)
			}
		}
	}

	check("attached without a master", false)
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}
	if err := netlink.LinkAdd(br); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetMaster(eth1, br); err != nil {
		t.Fatal(err)
	}
	wait("enslaved to br0 after the attach", true)
	check("enslaved to br0 after the attach", true)

	if err := netlink.LinkSetNoMaster(eth1); err != nil {
		t.Fatal(err)
	}
	wait("released", false)
	check("released", false)

	if err := netlink.LinkSetMaster(eth1, br); err != nil {
		t.Fatal(err)
	}
	wait("enslaved again", true)
	if err := netlink.LinkDel(br); err != nil {
		t.Fatal(err)
	}
	wait("its bridge deleted", false)
	check("its bridge deleted", false)

	// A device the agent did not attach to is not recorded.
	if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br1"}}); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetMasterByIndex(mustLink(t, "pod0"), mustLink(t, "br1").Attrs().Index); err != nil {
		t.Fatal(err)
	}
	// The watch handles messages in order: one about eth1 after pod0's
	// shows pod0's was handled.
	if err := netlink.LinkSetMasterByIndex(eth1, mustLink(t, "br1").Attrs().Index); err != nil {
		t.Fatal(err)
	}
	wait("enslaved to br1", true)
	var nd sockNodeDev
	if err := d.maps.devices.Lookup(uint32(mustLink(t, "pod0").Attrs().Index), &nd); err == nil {
		t.Errorf("pod0, not attached, recorded with flags %#x", nd.Flags)
	}
}
