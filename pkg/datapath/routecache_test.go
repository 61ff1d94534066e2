package datapath

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/packet"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// Tests of XDP's route cache (bpf/xdp.c, routecache.go), per family, on
// the north-south node of the packet tables (nodeNetns with its IPv6
// twins): a NodePort flow to a backend on node 2 (behind eth0), which
// XDP sends on itself.

// cacheNode is that node with a datapath whose route cache keeps an
// entry for age, attached to eth0 and eth1, and a NodePort of v6's
// family (id 1) to a backend on node 2. It returns eth0's ifindex, the
// datapath, and the flow's request (a data segment) and reply, after XDP
// started the flow.
type cacheNode struct {
	eth0       int
	d          *Datapath
	np         model.L4Addr
	be         testBackend
	req, reply packet.Packet
	sp         uint16
}

func newCacheNode(t *testing.T, v6 bool, age time.Duration) *cacheNode {
	t.Helper()
	testutil.Privileged(t)
	eth0 := nodeNetnsOf(t, v6)
	d := openTest(t, configWith(xdpConfig, func(c *Config) { c.XDPRouteCacheAge = age })(testPinDir(t)))
	if err := d.AttachDevices([]string{"eth0", "eth1"}); err != nil {
		t.Fatal(err)
	}
	n := &cacheNode{eth0: eth0, d: d, np: nsTwinL4(v6, npRemote), be: testBackend{beRemote.id, nsTwinL4(v6, beRemote.addr)}}
	addExternal(t, d.Maps(), 1, n.np, reconciler.FlagExternal, n.be)
	syn := nsClient(43000, n.np)
	n.sp = xdpRoundTrip(t, d, eth0, syn, n.np, n.be, packet.SYN|packet.ACK)
	n.req = syn.With(func(p *packet.Packet) { p.TCPFlags, p.Payload = packet.ACK, []byte("GET / HTTP/1.0\r\n\r\n") })
	n.reply = replyFrom(n.be, n.sp, packet.ACK)
	return n
}

// run sends p through XDP, arriving on eth0.
func (n *cacheNode) run(t *testing.T, p packet.Packet) (uint32, []byte) {
	t.Helper()
	return runXDP(t, n.d.XDP(), n.eth0, p.Bytes())
}

// sentReq is the request as XDP sends it on: to the backend, leaving
// through the device with MAC smac to the next hop dmac.
func (n *cacheNode) sentReq(smac, dmac net.HardwareAddr) packet.Packet {
	w := toRemote(n.req, n.sp, n.be)
	w.SrcMAC, w.DstMAC = macOf(smac), macOf(dmac)
	return w
}

// cache is the route cache of the flow's family, and the key of the
// route of its requests (<node -> backend>, in on eth0) and of its
// replies (<NodePort -> client>).
func (n *cacheNode) cache() (m *ebpf.Map, req, reply any) {
	node, client := ofFamily(n.be.addr.Addr, nsNodeIP, nsNodeIP6), ofFamily(n.be.addr.Addr, nsClientIP, nsClientIP6)
	if n.be.addr.Addr.Is4() {
		return n.d.xdp.Fib4,
			xdpFib4Key{Ifindex: uint32(n.eth0), Saddr: be32(node), Daddr: be32(n.be.addr.Addr)},
			xdpFib4Key{Ifindex: uint32(n.eth0), Saddr: be32(n.np.Addr), Daddr: be32(client)}
	}
	k := func(s, d netip.Addr) xdpFib6Key {
		k := xdpFib6Key{Ifindex: uint32(n.eth0)}
		k.Saddr.Addr, k.Daddr.Addr = s.As16(), d.As16()
		return k
	}
	return n.d.xdp.Fib6, k(node, n.be.addr.Addr), k(n.np.Addr, client)
}

// cached is the entry under key in m, or false.
func cached(t *testing.T, m *ebpf.Map, key any) (xdpFibHop, bool) {
	t.Helper()
	var h xdpFibHop
	if err := m.Lookup(key, &h); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return h, false
		}
		t.Fatal(err)
	}
	return h, true
}

// cacheGen is the route cache's generation, as the programs read it.
func cacheGen(t *testing.T, d *Datapath) uint32 {
	t.Helper()
	var g uint32
	if err := d.xdp.FibGen.Get(&g); err != nil {
		t.Fatal(err)
	}
	return g
}

// replaceRoute points the route to the backend's range (node 2's pods)
// at node 3, behind eth1.
func replaceRoute(t *testing.T, v6 bool) {
	t.Helper()
	dst, gw := "10.2.0.0/16", "192.168.3.2"
	if v6 {
		dst, gw = "2001:db8:2::/64", "2001:db8:103::2"
	}
	_, ipnet, _ := net.ParseCIDR(dst)
	if err := netlink.RouteReplace(&netlink.Route{LinkIndex: mustLink(t, "eth1").Attrs().Index, Dst: ipnet, Gw: net.ParseIP(gw)}); err != nil {
		t.Fatalf("route %s via %s: %v", dst, gw, err)
	}
}

// TestXDPRouteCacheForwardsAsUncached: a request and a reply routed
// through the cache leave exactly as when looked up (the same bytes);
// the cache holds both routes, of the current generation; while an entry
// is of the current generation and young, it is what routes the flow (a
// route changed without a bump is not seen), and a bump of the
// generation makes the next packet look its route up again. A packet
// over the egress MTU is still left to tc, which answers it, whatever
// the cache holds.
func TestXDPRouteCacheForwardsAsUncached(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		n := newCacheNode(t, v6, time.Hour)
		m, reqKey, replyKey := n.cache()
		for _, k := range []any{reqKey, replyKey} {
			if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				t.Fatal(err)
			}
		}
		wantReq := n.sentReq(nodeEthMAC, node2MAC)
		wantReply := toClient(n.reply, n.np, n.req.SrcPort)
		for _, round := range []string{"looked up", "cached"} {
			v, out := n.run(t, n.req)
			expectPacket(t, "request, "+round, v, xdpTx, out, wantReq)
			v, out = n.run(t, n.reply)
			expectPacket(t, "reply, "+round, v, xdpTx, out, wantReply)
		}
		gen := cacheGen(t, n.d)
		for name, c := range map[string]struct {
			key  any
			dmac net.HardwareAddr
		}{"request": {reqKey, node2MAC}, "reply": {replyKey, nsClientMAC}} {
			h, ok := cached(t, m, c.key)
			if !ok || h.Gen != gen || h.Ifindex != uint32(n.eth0) || h.Smac != macOf(nodeEthMAC) || h.Dmac != macOf(c.dmac) {
				t.Errorf("%s route: cached %v %+v, want eth0 (%d) to %s, generation %d", name, ok, h, n.eth0, c.dmac, gen)
			}
		}

		// The metrics see the caches' fill.
		fills, err := n.d.MapFill()
		if err != nil {
			t.Fatal(err)
		}
		filled := map[string]int{}
		for _, f := range fills {
			filled[f.Pin] = f.Entries
		}
		if filled["sluice_fib_v1"]+filled["sluice6_fib_v1"] < 2 {
			t.Errorf("route caches' fill %v, want the flow's 2 routes", filled)
		}

		// The route changes and no one bumps the generation: the
		// cached one still routes the flow.
		replaceRoute(t, v6)
		v, out := n.run(t, n.req)
		expectPacket(t, "request, route changed, generation not bumped", v, xdpTx, out, wantReq)
		if err := n.d.bumpRoutes(); err != nil {
			t.Fatal(err)
		}
		v, out = n.run(t, n.req)
		expectPacket(t, "request, generation bumped", v, xdpRedirect, out, n.sentReq(nodeEth1MAC, node3MAC))

		// Over eth1's MTU, its route cached: to tc untouched, which
		// answers with the ICMP error (IPv4: fragmentation needed; DF
		// set).
		setMTUHere(t, "eth1", 1280)
		big := n.req.With(func(p *packet.Packet) { p.Payload, p.FragOff = bytes.Repeat([]byte("m"), 1300), packet.DF })
		if _, ok := cached(t, m, reqKey); !ok {
			t.Fatal("request route not cached")
		}
		b := big.Bytes()
		if v, out := n.run(t, big); v != xdpPass || !bytes.Equal(out[:len(b)], b) {
			t.Errorf("over the MTU: verdict %d (want XDP_PASS), output changed: %v", v, !bytes.Equal(out[:len(b)], b))
		}
		expectCounted(t, n.d, "xdp_mtu_exceeded")
		v, out = runOn(t, n.d.TCIngress(), n.eth0, b)
		icmp, err := packet.Parse(out)
		if err != nil {
			t.Fatal(err)
		}
		typ, code := icmpTooBig.typ4, icmpTooBig.code4
		if v6 {
			typ, code = icmpTooBig.typ6, icmpTooBig.code6
		}
		if v != tcActRedirect || icmp.ICMPType != typ || icmp.ICMPCode != code || icmp.ICMPRest != [4]byte{0, 0, 1280 >> 8, 1280 & 0xff} {
			t.Errorf("over the MTU, tc: verdict %d, ICMP type %d code %d rest %v; want %d, %d, %d and MTU 1280",
				v, icmp.ICMPType, icmp.ICMPCode, icmp.ICMPRest, tcActRedirect, typ, code)
		}
	})
}

// TestXDPRouteCacheFollowsRouting: with WatchRouting running (as the
// agent runs it), each change of the node's routing is followed by the
// next packet of a flow whose routes are cached: a route replaced, a
// neighbour's MAC changed (the next hop's and the client's), a policy
// rule that sends the node's traffic by another table, and the backend's
// address made the node's own (a local-table route: XDP then leaves the
// packet to the stack, as without the cache). After each change the test
// waits for the watch to bump the generation: only the test changes the
// namespace after the watch subscribed, so the bump is the change's.
func TestXDPRouteCacheFollowsRouting(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		n := newCacheNode(t, v6, time.Hour)
		w, err := n.d.WatchRouting()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := w.Close(); err != nil {
				t.Error(err)
			}
		})
		// Fill the cache with both routes.
		for range 2 {
			if v, _ := n.run(t, n.req); v != xdpTx {
				t.Fatalf("request: verdict %d", v)
			}
			if v, _ := n.run(t, n.reply); v != xdpTx {
				t.Fatalf("reply: verdict %d", v)
			}
		}
		m, reqKey, _ := n.cache()
		if _, ok := cached(t, m, reqKey); !ok {
			t.Fatal("request route not cached")
		}
		change := func(what string, f func() error) {
			t.Helper()
			gen := cacheGen(t, n.d)
			if err := f(); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			for deadline := time.Now().Add(10 * time.Second); cacheGen(t, n.d) == gen; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("%s: the route cache's generation is still %d", what, gen)
				}
			}
		}
		eth0, eth1 := mustLink(t, "eth0"), mustLink(t, "eth1")
		fam, node2, node3, client := netlink.FAMILY_V4, nsNode2IP, "192.168.3.2", nsClientIP
		if v6 {
			fam, node2, node3, client = netlink.FAMILY_V6, nsNode2IP6, "2001:db8:103::2", nsClientIP6
		}
		newMAC := net.HardwareAddr{0x02, 0, 0, 0, 0x03, 0x09}
		neigh := func(l netlink.Link, ip string, mac net.HardwareAddr) func() error {
			return func() error {
				return netlink.NeighSet(&netlink.Neigh{LinkIndex: l.Attrs().Index, Family: fam, State: netlink.NUD_PERMANENT,
					IP: net.ParseIP(ip), HardwareAddr: mac})
			}
		}

		change("route replaced", func() error { replaceRoute(t, v6); return nil })
		v, out := n.run(t, n.req)
		expectPacket(t, "request, route via node 3", v, xdpRedirect, out, n.sentReq(nodeEth1MAC, node3MAC))

		change("node 3's MAC", neigh(eth1, node3, newMAC))
		v, out = n.run(t, n.req)
		expectPacket(t, "request, node 3's new MAC", v, xdpRedirect, out, n.sentReq(nodeEth1MAC, newMAC))

		change("the client's MAC", neigh(eth0, client, newMAC))
		v, out = n.run(t, n.reply)
		wantReply := toClient(n.reply, n.np, n.req.SrcPort)
		wantReply.DstMAC = macOf(newMAC)
		expectPacket(t, "reply, the client's new MAC", v, xdpTx, out, wantReply)

		// A rule: the node's own traffic (its address as the source)
		// by table 100, where the backend's range is behind node 2
		// again.
		const table = 100
		bits := 32
		if v6 {
			bits = 128
		}
		nodeAddr := ofFamily(n.be.addr.Addr, nsNodeIP, nsNodeIP6)
		rule := netlink.NewRule()
		rule.Family, rule.Table, rule.Priority = fam, table, 100
		rule.Src = &net.IPNet{IP: nodeAddr.AsSlice(), Mask: net.CIDRMask(bits, bits)}
		dst := netip.PrefixFrom(n.be.addr.Addr, bits/2).Masked()
		route := &netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: &net.IPNet{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(bits/2, bits)},
			Gw: net.ParseIP(node2), Table: table}
		if err := netlink.RouteAdd(route); err != nil {
			t.Fatal(err)
		}
		change("rule from the node by table 100", func() error { return netlink.RuleAdd(rule) })
		v, out = n.run(t, n.req)
		expectPacket(t, "request, by the rule's table", v, xdpTx, out, n.sentReq(nodeEthMAC, node2MAC))

		// The backend's address becomes the node's own. (IPv6 may
		// install its local route after the address's message, from a
		// work queue: the route's own message bumps the generation
		// again, so the packet is sent until it passes.)
		a := &netlink.Addr{IPNet: &net.IPNet{IP: n.be.addr.Addr.AsSlice(), Mask: net.CIDRMask(bits, bits)}}
		if v6 {
			a.Flags = unix.IFA_F_NODAD
		}
		change("the backend's address local", func() error { return netlink.AddrAdd(eth0, a) })
		b := n.req.Bytes()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
			v, out := n.run(t, n.req)
			if v == xdpPass && bytes.Equal(out[:len(b)], b) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("request to a local address: verdict %d (want XDP_PASS), output changed: %v", v, !bytes.Equal(out[:len(b)], b))
			}
		}
		if h, ok := cached(t, m, reqKey); ok && h.Gen == cacheGen(t, n.d) {
			t.Errorf("a route to a local address cached: %+v", h)
		}
	})
}

// TestXDPRouteCacheAgesOut: without a watch, a cached route is used for
// at most the cache's age: after it, the next packet follows a route
// that changed.
func TestXDPRouteCacheAgesOut(t *testing.T) {
	const age = 50 * time.Millisecond
	forFamilies(t, func(t *testing.T, v6 bool) {
		n := newCacheNode(t, v6, age)
		if v, _ := n.run(t, n.req); v != xdpTx {
			t.Fatalf("request: verdict %d", v)
		}
		m, reqKey, _ := n.cache()
		if _, ok := cached(t, m, reqKey); !ok {
			t.Fatal("request route not cached")
		}
		gen := cacheGen(t, n.d)
		replaceRoute(t, v6)
		time.Sleep(4 * age)
		v, out := n.run(t, n.req)
		expectPacket(t, "request, route changed, entry aged", v, xdpRedirect, out, n.sentReq(nodeEth1MAC, node3MAC))
		if g := cacheGen(t, n.d); g != gen {
			t.Errorf("generation bumped (%d to %d) with no watch", gen, g)
		}
	})
}

// TestXDPRepliesOutsideSNATRange: XDP looks a packet up as the reply of
// a source-NATed flow only if it comes to a port of the SNAT range (the
// reverse lookup is skipped for the rest). A flow whose port another
// agent reserved, from another range, is then served by tc: its reply,
// passed by the XDP program of an agent whose range leaves the port out,
// is sent back to the client by tc, per family.
func TestXDPRepliesOutsideSNATRange(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		n := newCacheNode(t, v6, time.Hour)
		// The next agent, on the same pins, reserves from another
		// range.
		cfg := n.d.cfg
		cfg.SNATPortMin, cfg.SNATPortMax = 50000, 50999
		d2 := openTest(t, cfg)
		b := n.reply.Bytes()
		if v, out := runXDP(t, d2.XDP(), n.eth0, b); v != xdpPass || !bytes.Equal(out[:len(b)], b) {
			t.Errorf("reply to port %d, outside %d-%d: verdict %d (want XDP_PASS), output changed: %v",
				n.sp, cfg.SNATPortMin, cfg.SNATPortMax, v, !bytes.Equal(out[:len(b)], b))
		}
		v, out := runOn(t, d2.TCIngress(), n.eth0, b)
		expectPacket(t, "reply by tc", v, tcActRedirect, out[:len(toClient(n.reply, n.np, n.req.SrcPort).Bytes())],
			toClient(n.reply, n.np, n.req.SrcPort))
	})
}
