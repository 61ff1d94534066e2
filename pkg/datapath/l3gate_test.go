package datapath

// dev_l3_maybe (bpf/lib/parse.h, devices.go): the word that spares a frame
// whose destination MAC starts with the IP version a lookup of its device
// in sluice_devices, unless the map may hold an L3 device. TestTCL3Device
// shows the L3 devices themselves (tun) still translated with it set.

import (
	"bytes"
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/packet"
	"github.com/sluice-lb/sluice/pkg/model"
)

// l3Gates reads dev_l3_maybe of each of d's loaded objects that has it.
func l3Gates(t *testing.T, d *Datapath) []uint8 {
	t.Helper()
	var out []uint8
	for _, v := range d.maps.l3Gates {
		var g uint8
		if err := v.Get(&g); err != nil {
			t.Fatalf("read dev_l3_maybe: %v", err)
		}
		out = append(out, g)
	}
	return out
}

// wantL3Gate fails t unless every dev_l3_maybe of d (tc's and XDP's: two)
// reads want.
func wantL3Gate(t *testing.T, d *Datapath, want uint8, when string) {
	t.Helper()
	got := l3Gates(t, d)
	if len(got) != 2 {
		t.Fatalf("%s: %d dev_l3_maybe words, want tc's and XDP's", when, len(got))
	}
	for _, g := range got {
		if g != want {
			t.Fatalf("%s: dev_l3_maybe %v, want %d in each", when, got, want)
		}
	}
}

// TestL3Gate: on an Ethernet device whose MAC's first byte reads like an
// IP header's (0x46, 0x66 with v6), a frame is parsed at ETH_HLEN and
// translated without its device being looked up while no node device is
// L3: an entry flagging it L3, written behind the agent's back, is not
// seen (without the gate it is, and the frame is read from offset 0 and
// passed untranslated). The agent sets the word when it records an L3
// device (a tun), keeps it across a restart on the same pins (a new load
// starts at 1 and reads the pinned map), and clears it once Prune has
// forgotten the last one. Over each family.
func TestL3Gate(t *testing.T) {
	testutil.Privileged(t)
	forFamilies(t, func(t *testing.T, v6 bool) {
		_, _, _, ethIdx := tunNetns(t, v6)
		bpffs := testPinDir(t)
		d := openTest(t, xdpConfig(bpffs))
		wantL3Gate(t, d, 0, "opened on an empty device map")
		if err := d.AttachDevices([]string{"eth0"}); err != nil {
			t.Fatal(err)
		}
		wantL3Gate(t, d, 0, "Ethernet device attached")

		client := twinAddr(v6, "10.0.0.9")
		vip := twinL4(v6, l4("10.96.0.64", 80, model.TCP))
		be := testBackend{64, twinL4(v6, l4("10.1.6.4", 8080, model.TCP))}
		addService(t, d.Maps(), 1, vip, be)
		mac := [6]byte{ipVersion(v6)<<4 | 6, 0, 0, 0, 0, 1}
		sport := uint16(41000)
		translated := func(when string) {
			t.Helper()
			sport++
			in := frame(mac, clientMAC, tcpPacket(client, sport, vip.Addr.String(), 80, 0x02, nil))
			want := frame(mac, clientMAC, tcpPacket(client, sport, be.addr.Addr.String(), 8080, 0x02, nil))
			verdict, out := runCtx(t, d.TCIngress(), skbCtx{Ifindex: uint32(ethIdx)}, in)
			if verdict != tcActOK || !bytes.Equal(out, want) {
				t.Fatalf("%s: Ethernet, MAC %x:...: verdict %d, output %s", when, mac[0], verdict, packet.Diff(out, want))
			}
		}
		translated("gate clear")

		// The device map is not asked: eth0 flagged L3 there is not seen.
		var nd sockNodeDev
		if err := d.maps.devices.Lookup(uint32(ethIdx), &nd); err != nil {
			t.Fatalf("eth0's entry: %v", err)
		}
		lie := nd
		lie.Flags |= nodeDevL3
		if err := d.maps.devices.Put(uint32(ethIdx), &lie); err != nil {
			t.Fatal(err)
		}
		translated("gate clear, eth0 flagged L3 behind the agent's back")
		if err := d.maps.devices.Put(uint32(ethIdx), &nd); err != nil {
			t.Fatal(err)
		}

		// An L3 device recorded: the word is set, and the map, asked
		// again, says eth0 is Ethernet.
		if err := d.AttachDevices([]string{"eth0", "tun0"}); err != nil {
			t.Fatal(err)
		}
		wantL3Gate(t, d, 1, "tun0 attached")
		translated("gate set")

		// A restart on the same pins: the new load's word reads the
		// pinned map (tun0 still L3 there).
		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
		d = openTest(t, xdpConfig(bpffs))
		wantL3Gate(t, d, 1, "reopened with tun0 recorded")
		if err := d.Prune("", []string{"eth0"}); err != nil {
			t.Fatal(err)
		}
		wantL3Gate(t, d, 0, "tun0 pruned")
		if err := d.AttachDevices([]string{"eth0"}); err != nil {
			t.Fatal(err)
		}
		wantL3Gate(t, d, 0, "Ethernet device attached again")
		translated("gate cleared again")
	})
}

// TestL3FlagBeforeTC: AttachDevices makes a device's L3 flag right before
// its tc programs go on it, not with the record it writes after them: a
// new tun's first packets are read from their IPv4 header on (dev_l3_maybe
// set too), and an Ethernet device whose entry says L3 (its ifindex was an
// L3 device's) from its MAC on. The rest of the entry a previous agent
// wrote (its SNAT address, flags) stays meanwhile; the record after the
// attach has the device's own.
func TestL3FlagBeforeTC(t *testing.T) {
	testutil.Privileged(t)
	_, _, _, ethIdx := tunNetns(t, false)
	tun, err := net.InterfaceByName("tun0")
	if err != nil {
		t.Fatal(err)
	}
	index := map[string]int{"eth0": ethIdx, "tun0": tun.Index}
	d := openTest(t, xdpConfig(testPinDir(t)))
	stale := sockNodeDev{Addr: be32(netip.MustParseAddr("192.0.2.7")), Flags: nodeDevL3 | nodeDevTC}
	if err := d.maps.devices.Put(uint32(ethIdx), &stale); err != nil {
		t.Fatal(err)
	}
	calls := 0
	afterAttachTC = func(dev string) {
		calls++
		var nd sockNodeDev
		if err := d.maps.devices.Lookup(uint32(index[dev]), &nd); err != nil {
			t.Fatalf("%s's tc program attached before its entry is written: %v", dev, err)
		}
		if l3 := nd.Flags&nodeDevL3 != 0; l3 != (dev == "tun0") {
			t.Fatalf("%s's tc program attached while its entry says L3 %v (flags %#x)", dev, l3, nd.Flags)
		}
		if dev == "eth0" && (nd.Addr != stale.Addr || nd.Flags != nodeDevTC) {
			t.Fatalf("eth0's entry while attaching: %+v, want the previous one's address and TC flag kept", nd)
		}
		if g := l3Gates(t, d); slices.Contains(g, 0) {
			t.Fatalf("%s's tc program attached with dev_l3_maybe %v", dev, g)
		}
	}
	t.Cleanup(func() { afterAttachTC = nil })
	if err := d.AttachDevices([]string{"eth0", "tun0"}); err != nil {
		t.Fatal(err)
	}
	if calls != 4 {
		t.Fatalf("%d tc attaches seen, want ingress and egress of two devices", calls)
	}
	for dev, want := range map[string]uint32{"eth0": nodeDevTC, "tun0": nodeDevL3 | nodeDevTC} {
		var nd sockNodeDev
		if err := d.maps.devices.Lookup(uint32(index[dev]), &nd); err != nil {
			t.Fatal(err)
		}
		if nd.Flags != want {
			t.Fatalf("%s recorded with flags %#x, want %#x", dev, nd.Flags, want)
		}
	}
	wantL3Gate(t, d, 1, "tun0 attached")
}
