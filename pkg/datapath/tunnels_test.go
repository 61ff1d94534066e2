package datapath

import (
	"net"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TestOverlayTunnels: overlayTunnels takes an up tunnel of a kind an
// overlay CNI uses that a unicast, non-default, non-host-local route of
// the main table leaves through, and no other link.
func TestOverlayTunnels(t *testing.T) {
	up := func(i int, name string) netlink.LinkAttrs {
		return netlink.LinkAttrs{Index: i, Name: name, Flags: net.FlagUp}
	}
	links := []netlink.Link{
		&netlink.Device{LinkAttrs: up(1, "eth0")},
		&netlink.Vxlan{LinkAttrs: up(2, "flannel.1")},
		&netlink.Iptun{LinkAttrs: up(3, "tunl0")},
		&netlink.Vxlan{LinkAttrs: up(4, "cilium_vxlan"), FlowBased: true},
		&netlink.Geneve{LinkAttrs: up(5, "genev_sys_6081"), FlowBased: true},
		&netlink.Iptun{LinkAttrs: netlink.LinkAttrs{Index: 6, Name: "tunl1"}},                                     // down
		&netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Index: 7, Name: "vx-br", Flags: net.FlagUp, MasterIndex: 20}}, // a bridge's port
		&netlink.Wireguard{LinkAttrs: up(8, "wg0")},
		&netlink.Vxlan{LinkAttrs: up(9, "vx-noroute")},
		&netlink.Gretun{LinkAttrs: up(10, "gre1")},
		&netlink.Ip6tnl{LinkAttrs: up(11, "ip6tnl1")},
		&netlink.Vxlan{LinkAttrs: up(12, "vx-dflt")},
		&netlink.Vxlan{LinkAttrs: up(13, "vx-mp")},
	}
	cidr := func(s string) *net.IPNet {
		_, n, err := net.ParseCIDR(s)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	route := func(dev int, dst string) netlink.Route {
		return netlink.Route{LinkIndex: dev, Dst: cidr(dst), Type: unix.RTN_UNICAST, Table: unix.RT_TABLE_MAIN, Protocol: unix.RTPROT_BOOT}
	}
	kernel := route(8, "10.8.0.0/24")
	kernel.Protocol = unix.RTPROT_KERNEL
	host := route(9, "10.9.0.1/32")
	host.Scope = netlink.SCOPE_HOST
	blackhole := route(9, "10.9.1.0/24")
	blackhole.Type = unix.RTN_BLACKHOLE
	other := route(9, "10.9.2.0/24")
	other.Table = 100
	mp := netlink.Route{Dst: cidr("10.13.0.0/16"), Type: unix.RTN_UNICAST, Table: unix.RT_TABLE_MAIN,
		MultiPath: []*netlink.NexthopInfo{{LinkIndex: 1}, {LinkIndex: 13}}}
	routes := []netlink.Route{
		route(1, "192.168.0.0/24"),
		route(2, "10.244.1.0/24"),
		route(3, "fd00:244:2::/64"),
		route(4, "10.0.0.0/8"), route(5, "10.0.0.0/8"), route(6, "10.0.0.0/8"), route(7, "10.0.0.0/8"),
		route(10, "10.0.0.0/8"),
		route(11, "fd00::/16"),
		kernel, host, blackhole, other,
		route(9, "fe80::/64"), route(9, "169.254.0.0/16"),
		route(12, "0.0.0.0/0"), route(12, "::/0"),
		mp,
	}
	got := overlayTunnels(links, routes)
	want := []string{"flannel.1", "tunl0", "ip6tnl1", "vx-mp"}
	if !slices.Equal(got, want) {
		t.Errorf("overlayTunnels = %v, want %v", got, want)
	}
}
