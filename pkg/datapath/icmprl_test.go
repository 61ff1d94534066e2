package datapath

import (
	"bytes"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/packet"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// The kernel's ICMP rate limits on tc's own errors (bpf/lib/icmp.h,
// icmp_rl_allow). No test waits for a bucket to refill: one that shows a
// refill moves a bucket's last refill back in the map, and the others use
// costs long enough (10 s an error) that no machine is slow enough to
// earn another token between their packets.

// slowRefill is ICMPRateLimits with a destination's error costing 10 s
// (its burst stays 6: a new destination starts with 60 s of tokens).
func slowRefill(c *Config) {
	rl := DefaultICMPRateLimits()
	rl.PerDestination, rl.PerDestination6 = 10*time.Second, 10*time.Second
	c.ICMPRateLimits = &rl
}

// rejectHarness is a datapath with a ClusterIP 10.96.0.10 (its IPv6
// twin) serving TCP port 80 only, and a packet to its port 81 from src
// (sport varied): what tc answers with a port unreachable.
type rejectHarness struct {
	d  *Datapath
	tw func(string) string
}

func newRejectHarness(t *testing.T, v6 bool, set func(*Config)) rejectHarness {
	tw := twinOf(v6)
	d := openTestWith(t, smallConfig, set)
	applyServices(t, d, clusterIP(l4(tw("10.96.0.10"), 80, model.TCP), l4(tw("10.1.0.1"), 8080, model.TCP)))
	return rejectHarness{d: d, tw: tw}
}

func (h rejectHarness) unserved(src string, sport uint16) packet.Packet {
	p := tcpPacket(h.tw(src), sport, h.tw("10.96.0.10"), 81, 0, nil)
	p.SrcMAC, p.DstMAC = clientMAC, nodeMAC
	return p
}

// answered sends n packets to the unserved port from src and returns how
// many were answered (redirected back); the others must be dropped.
func (h rejectHarness) answered(t *testing.T, src string, n int) int {
	t.Helper()
	got := 0
	for i := range n {
		switch v, _ := runProg(t, h.d.TCIngress(), h.unserved(src, uint16(40000+i)).Bytes()); v {
		case tcActRedirect:
			got++
		case tcActShot:
		default:
			t.Fatalf("packet %d from %s: verdict %d, want redirect or drop", i, src, v)
		}
	}
	return got
}

// TestICMPRateLimitPerDestination: a burst of packets to a ClusterIP's
// unserved port from one source gets the kernel's burst of port
// unreachables (6, XRLIM_BURST_FACTOR) and then none; the rest are
// dropped, counted as tc_unknown_port and tc_icmp_ratelimited. Another
// source still gets its own 6. Time refills a bucket: with its last
// refill moved back by one error's cost, one more goes. Per family.
func TestICMPRateLimitPerDestination(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		h := newRejectHarness(t, v6, slowRefill)
		if got := h.answered(t, "10.0.0.1", 10); got != 6 {
			t.Errorf("10 packets from one source: %d answered, want 6", got)
		}
		if got := h.answered(t, "10.0.0.2", 10); got != 6 {
			t.Errorf("10 packets from another source: %d answered, want 6", got)
		}
		cs := counters(t, h.d)
		if cs["tc_unknown_port"] != 20 || cs["tc_icmp_ratelimited"] != 8 || cs["tc_rewrite_err"] != 0 {
			t.Errorf("tc_unknown_port %d, tc_icmp_ratelimited %d, tc_rewrite_err %d; want 20, 8, 0",
				cs["tc_unknown_port"], cs["tc_icmp_ratelimited"], cs["tc_rewrite_err"])
		}

		// The first source's bucket, as if 10 s (one error) had passed.
		key := tcIcmpRlKey{Family: 4}
		if v6 {
			key.Family = 6
		}
		a := addr(h.tw("10.0.0.1")).As16()
		if !v6 {
			copy(key.Addr.Addr[:4], a[12:])
		} else {
			key.Addr.Addr = a
		}
		var b tcIcmpRlPeer
		if err := h.d.tc.SluiceIcmpPeersV1.Lookup(&key, &b); err != nil {
			t.Fatalf("bucket of 10.0.0.1: %v", err)
		}
		if b.Tokens >= uint64(10*time.Second) {
			t.Fatalf("bucket of 10.0.0.1 holds %d ns of tokens after its burst, want less than one error's", b.Tokens)
		}
		b.Last -= uint64(10 * time.Second)
		if err := h.d.tc.SluiceIcmpPeersV1.Put(&key, &b); err != nil {
			t.Fatal(err)
		}
		if got := h.answered(t, "10.0.0.1", 3); got != 1 {
			t.Errorf("3 packets after one error's refill: %d answered, want 1", got)
		}
	})
}

// TestICMPRateLimitNode: the node's bucket (icmp_msgs_per_sec,
// icmp_msgs_burst) limits errors to every source together: 100 sources
// with a packet each, under a burst of 10, get about 10 answers (each
// answer takes 0, 1 or 2 credits at random, as the kernel's: at least 5,
// and more than 60 only with odds of none), the rest dropped as
// tc_icmp_ratelimited. The refill (10 a second, one per 100 ms) cannot
// add 50 during the run. Per family (the bucket is both's).
func TestICMPRateLimitNode(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		h := newRejectHarness(t, v6, func(c *Config) {
			rl := DefaultICMPRateLimits()
			rl.MsgsPerSec, rl.MsgsBurst = 10, 10
			c.ICMPRateLimits = &rl
		})
		got := 0
		for i := range 100 {
			got += h.answered(t, "10.0.1."+strconv.Itoa(i+1), 1)
		}
		if got < 5 || got > 60 {
			t.Errorf("100 sources, a packet each: %d answered, want 5 to 60 (about 10)", got)
		}
		if cs := counters(t, h.d); cs["tc_icmp_ratelimited"] != uint64(100-got) {
			t.Errorf("tc_icmp_ratelimited %d, want %d", cs["tc_icmp_ratelimited"], 100-got)
		}
	})
}

// TestICMPRateLimitZeroDisables: a ratelimit of 0 (net.ipv4.icmp_ratelimit,
// net.ipv6.icmp.ratelimit) is no per-destination limit, as in the kernel:
// 20 packets from one source get 20 errors (the node's bucket, 50, is not
// spent: 20 errors take at most 40 credits). So does a ratemask without
// destination unreachable. Per family.
func TestICMPRateLimitZeroDisables(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		for _, c := range []struct {
			name string
			set  func(*ICMPRateLimits)
		}{
			{"ratelimit_0", func(rl *ICMPRateLimits) { rl.PerDestination, rl.PerDestination6 = 0, 0 }},
			{"ratemask_without_unreachable", func(rl *ICMPRateLimits) { rl.Mask &^= 1 << 3; rl.Mask6 &^= 1 << 1 }},
		} {
			t.Run(c.name, func(t *testing.T) {
				h := newRejectHarness(t, v6, func(cfg *Config) {
					rl := DefaultICMPRateLimits()
					c.set(&rl)
					cfg.ICMPRateLimits = &rl
				})
				if got := h.answered(t, "10.0.0.1", 20); got != 20 {
					t.Errorf("20 packets from one source: %d answered, want 20", got)
				}
				if cs := counters(t, h.d); cs["tc_icmp_ratelimited"] != 0 {
					t.Errorf("tc_icmp_ratelimited %d, want 0", cs["tc_icmp_ratelimited"])
				}
			})
		}
	})
}

// TestTCRejectNotToOtherHost: a frame the device received for another
// host's MAC (PACKET_OTHERHOST, a promiscuous device's: BPF_PROG_TEST_RUN
// marks so a frame not to its device's address) gets no ICMP error: the
// kernel drops it before routing. It is dropped, counted under its
// reason (tc_unknown_port, tc_no_backend), and takes no token: the
// source's burst of 6 is whole after it. On a bridge's port (its frames
// go to the bridge) it is answered. Per family.
func TestTCRejectNotToOtherHost(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		h := newRejectHarness(t, v6, slowRefill)
		applyServices(t, h.d, clusterIP(l4(h.tw("10.96.0.11"), 80, model.TCP)))
		for _, p := range []packet.Packet{h.unserved("10.0.0.1", 40000), tcpPacket(h.tw("10.0.0.1"), 40001, h.tw("10.96.0.11"), 80, 0, nil)} {
			in := frame(otherHostMAC, clientMAC, p)
			if v, out := runProg(t, h.d.TCIngress(), in); v != tcActShot || !bytes.Equal(out[:len(in)], in) {
				t.Errorf("%s -> %s to another host's MAC: verdict %d, want drop, untouched", p.Src, p.Dst, v)
			}
		}
		cs := counters(t, h.d)
		if cs["tc_unknown_port"] != 1 || cs["tc_no_backend"] != 1 || cs["tc_rewrite_err"] != 0 || cs["tc_icmp_ratelimited"] != 0 {
			t.Errorf("tc_unknown_port %d, tc_no_backend %d, tc_rewrite_err %d, tc_icmp_ratelimited %d; want 1, 1, 0, 0",
				cs["tc_unknown_port"], cs["tc_no_backend"], cs["tc_rewrite_err"], cs["tc_icmp_ratelimited"])
		}
		if got := h.answered(t, "10.0.0.1", 7); got != 6 {
			t.Errorf("then 7 packets to this host's MAC: %d answered, want 6", got)
		}

		// On a port of a bridge (the device has a master: the loopback
		// device BPF_PROG_TEST_RUN receives on, recorded so), such a
		// frame may be to the bridge's MAC, which the bridge takes in:
		// answered.
		if err := h.d.Maps().setNodeDevice(1, netip.Addr{}, nodeDevPort); err != nil {
			t.Fatal(err)
		}
		// The answer goes from the MAC the frame was sent to (the
		// master's: not zero, as nodeMAC is, so a swap that lost it
		// shows) back to the client's.
		in := h.unserved("10.0.0.3", 40000)
		in.DstMAC = otherHostMAC
		want := portUnreachable(in)
		if v, out := runProg(t, h.d.TCIngress(), in.Bytes()); v != tcActRedirect || !bytes.Equal(out[:len(want)], want) {
			t.Errorf("to another MAC on a bridge's port: verdict %d, want the port unreachable from %x\n got %x\nwant %x", v, otherHostMAC, out, want)
		}
	})
}

// TestReadICMPRateLimits: the sysctls are read as the kernel writes them
// (milliseconds, a decimal mask, IPv6's mask as ranges); a missing one
// keeps its default, one that does not parse is an error.
func TestReadICMPRateLimits(t *testing.T) {
	dir := t.TempDir()
	write := func(name, v string) {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("ipv4/icmp_ratelimit", "250")
	write("ipv4/icmp_ratemask", "6168")
	write("ipv4/icmp_msgs_per_sec", "0")
	write("ipv4/icmp_msgs_burst", "7")
	write("ipv6/icmp/ratemask", "1,3-4,128-255")
	got, err := ReadICMPRateLimits(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := ICMPRateLimits{PerDestination: 250 * time.Millisecond, PerDestination6: 100 * time.Millisecond,
		Mask: 0x1818, Mask6: 0x1a, MsgsPerSec: 0, MsgsBurst: 7}
	if got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	for _, bad := range []string{"-", "3-1", "x", "1,,2"} {
		if _, err := parseICMP6Ratemask(bad); err == nil {
			t.Errorf("ratemask %q parsed", bad)
		}
	}
	if m, err := parseICMP6Ratemask("0-1,3-127"); err != nil || m != 0xfffffffb {
		t.Errorf("the default ratemask: %#x, %v", m, err)
	}
	// icmp_ratemask is a signed int: -1 is every type, not an error
	// that would leave every sysctl at its default.
	write("ipv4/icmp_ratemask", "-1")
	if got, err := ReadICMPRateLimits(dir); err != nil || got.Mask != 0xffffffff || got.MsgsBurst != 7 {
		t.Errorf("icmp_ratemask -1: %+v, %v; want mask 0xffffffff, the others read", got, err)
	}
	write("ipv4/icmp_msgs_burst", "lots")
	if _, err := ReadICMPRateLimits(dir); err == nil {
		t.Error("a burst of \"lots\" read")
	}
	// This machine's, which the agent reads.
	if _, err := ReadICMPRateLimits(DefaultProcSysNet); err != nil {
		t.Errorf("%s: %v", DefaultProcSysNet, err)
	}
}

// TestICMPRateLimitForwarding: on tc's redirect path, the time exceeded
// it sends for a TTL (hop limit) of 1 is rate-limited as the kernel's
// is, and the fragmentation needed (packet too big) for a packet over the
// egress MTU is not (path MTU discovery must not stall: the kernel exempts
// it always over IPv4, by its default ratemask over IPv6). From one
// client, 10 oversize packets get 10 errors, then 10 SYNs with TTL 1 get
// 6. Per family.
func TestICMPRateLimitForwarding(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		ethIdx := nodeNetnsOf(t, v6)
		setMTUHere(t, "eth1", 1280)
		d := openTestWith(t, smallConfig, slowRefill)
		m := d.Maps()
		if err := d.AttachDevices([]string{"eth0", "eth1"}); err != nil {
			t.Fatal(err)
		}
		client, node := nsTwin(v6, nsClientIP), nsTwin(v6, nsNodeIP)
		npRem := nsTwinL4(v6, npRemote)
		addExternal(t, m, 1, npRem, reconciler.FlagExternal, testBackend{beRemote.id, nsTwinL4(v6, beRemote.addr)})
		npNode3 := l4(node, 30083, model.TCP)
		addExternal(t, m, 7, npNode3, reconciler.FlagExternal, testBackend{7, l4(nsTwin(v6, "10.3.0.7"), 8080, model.TCP)})
		eth := macOf(nodeEthMAC)
		send := func(n int, port uint16, ttl uint8, size int, k icmpKind, rest uint32) int {
			answered := 0
			for i := range n {
				p := tcpPacket(client, uint16(44000+int(ttl)*100+i), node, port, 0x18, bytes.Repeat([]byte("m"), size))
				p.TTL, p.FragOff = ttl, packet.DF
				in := frame(eth, clientMAC, p)
				switch v, out := runOn(t, d.TCIngress(), ethIdx, in); {
				case v == tcActRedirect && bytes.Equal(out, icmpAboutFam(in, k, rest)):
					answered++
				case v != tcActShot:
					t.Fatalf("packet %d: verdict %d, output %x", i, v, out)
				}
			}
			return answered
		}
		if got := send(10, npNode3.Port, 0, 1300, icmpTooBig, 1280); got != 10 {
			t.Errorf("10 packets over the MTU: %d answered, want 10", got)
		}
		if got := send(10, npRem.Port, 1, 0, icmpTimeExceeded, 0); got != 6 {
			t.Errorf("10 packets with TTL 1: %d answered, want 6", got)
		}
		cs := counters(t, d)
		if cs["tc_frag_needed"] != 10 || cs["tc_ttl_exceeded"] != 10 || cs["tc_icmp_ratelimited"] != 4 {
			t.Errorf("tc_frag_needed %d, tc_ttl_exceeded %d, tc_icmp_ratelimited %d; want 10, 10, 4",
				cs["tc_frag_needed"], cs["tc_ttl_exceeded"], cs["tc_icmp_ratelimited"])
		}
	})
}

// TestDevicePortFlag: AttachDevices records a port of a bridge with
// nodeDevPort (its frames to the bridge's MAC are answered, icmp.h) and a
// device without a master without; a master that hands its ports' frames
// to no rx_handler (a VRF: IP runs on the slave, which drops a frame to
// another MAC) makes no port. The test machine's kernel makes no VRF,
// bond or team device ("Unknown device type"), so those are checked by
// their link types only.
func TestDevicePortFlag(t *testing.T) {
	testutil.Privileged(t)
	nodeNetns(t)
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}
	if err := netlink.LinkAdd(br); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetMaster(mustLink(t, "eth1"), br); err != nil {
		t.Fatal(err)
	}
	d := openTest(t, smallConfig(testPinDir(t)))
	if err := d.AttachDevices([]string{"eth0", "eth1"}); err != nil {
		t.Fatal(err)
	}
	for dev, want := range map[string]uint32{"eth0": nodeDevTC, "eth1": nodeDevTC | nodeDevPort} {
		var nd sockNodeDev
		if err := d.maps.devices.Lookup(uint32(mustLink(t, dev).Attrs().Index), &nd); err != nil {
			t.Fatal(err)
		}
		if nd.Flags != want {
			t.Errorf("%s recorded with flags %#x, want %#x", dev, nd.Flags, want)
		}
	}

	for _, c := range []struct {
		m    netlink.Link
		port bool
	}{
		{&netlink.Bridge{}, true}, {&netlink.Bond{}, true},
		{&netlink.GenericLink{LinkType: "team"}, true}, {&netlink.GenericLink{LinkType: "openvswitch"}, true},
		{&netlink.Vrf{}, false}, {&netlink.GenericLink{LinkType: "vrf"}, false},
	} {
		if got := isPortMaster(c.m); got != c.port {
			t.Errorf("a slave of a %s a port: %v, want %v", c.m.Type(), got, c.port)
		}
	}
}

// TestICMPRateLimitLaterStamp: a bucket whose stamp is later than the
// packet's clock (another CPU read the clock after it and stored first)
// has gained nothing: the packet is not answered, where an unsigned
// difference made it a full refill (a burst of 6 for a destination, a
// second's worth for the node). Per family.
func TestICMPRateLimitLaterStamp(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		h := newRejectHarness(t, v6, slowRefill)
		if got := h.answered(t, "10.0.0.1", 7); got != 6 {
			t.Fatalf("7 packets from one source: %d answered, want 6", got)
		}
		key := tcIcmpRlKey{Family: 4}
		a := addr(h.tw("10.0.0.1")).As16()
		if v6 {
			key.Family, key.Addr.Addr = 6, a
		} else {
			copy(key.Addr.Addr[:4], a[12:])
		}
		var b tcIcmpRlPeer
		if err := h.d.tc.SluiceIcmpPeersV1.Lookup(&key, &b); err != nil {
			t.Fatal(err)
		}
		b.Last += uint64(time.Hour)
		if err := h.d.tc.SluiceIcmpPeersV1.Put(&key, &b); err != nil {
			t.Fatal(err)
		}
		if got := h.answered(t, "10.0.0.1", 3); got != 0 {
			t.Errorf("a destination's bucket stamped later: %d of 3 answered, want 0", got)
		}

		// The node's bucket, empty, stamped an hour ahead.
		now, err := monotonicNow()
		if err != nil {
			t.Fatal(err)
		}
		g := tcIcmpRlGlobal{Credit: 0, Stamp: now + uint64(time.Hour)}
		if err := h.d.tc.SluiceIcmpGlobalV1.Put(uint32(0), &g); err != nil {
			t.Fatal(err)
		}
		if got := h.answered(t, "10.0.0.2", 3); got != 0 {
			t.Errorf("the node's bucket stamped later: %d of 3 answered, want 0", got)
		}
	})
}

// TestICMPRateLimitsBeforeIPv6Programs: Open writes the ICMP rate limits
// into a sluice_icmp_limits_v1 it creates before the IPv6 tc programs go
// into the pinned sluice6_tc_v1, which the previous agent's running IPv4
// entry tail-calls on an upgrade: they never run with the new map's
// zeros (ratemask 0: nothing limited).
func TestICMPRateLimitsBeforeIPv6Programs(t *testing.T) {
	testutil.Privileged(t)
	cfg := smallConfig(testPinDir(t))
	want := DefaultICMPRateLimits().conf()
	var got tcIcmpRlConf
	called := false
	beforeIPv6Programs = func(d *Datapath) {
		called = true
		if err := d.tc.SluiceIcmpLimitsV1.Lookup(uint32(0), &got); err != nil {
			t.Errorf("read %s: %v", mapICMPLimits, err)
		}
	}
	t.Cleanup(func() { beforeIPv6Programs = nil })
	openTest(t, cfg)
	if !called {
		t.Fatal("the IPv6 programs were not put into sluice6_tc_v1 by a fresh Open")
	}
	if got != want {
		t.Fatalf("%s when the IPv6 programs went into sluice6_tc_v1: %+v, want %+v", mapICMPLimits, got, want)
	}
}
