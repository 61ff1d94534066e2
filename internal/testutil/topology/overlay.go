package topology

import (
	"errors"
	"net"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// An overlay node's devices, for the tests of the tunnel watch
// (pkg/datapath) and of the agent that runs it (cmd/sluice). Both work in
// the network namespace of the calling thread: a test's own, entered with
// NS.Enter.

// AddVxlan adds vx, up if asked, and returns its link; it skips tb when
// the kernel has no vxlan devices.
func AddVxlan(tb testing.TB, vx *netlink.Vxlan, up bool) netlink.Link {
	tb.Helper()
	if err := netlink.LinkAdd(vx); errors.Is(err, unix.EOPNOTSUPP) {
		tb.Skip("this kernel has no vxlan devices")
	} else if err != nil {
		tb.Fatalf("add vxlan %s: %v", vx.Name, err)
	}
	l, err := netlink.LinkByName(vx.Name)
	if err != nil {
		tb.Fatal(err)
	}
	if up {
		if err := netlink.LinkSetUp(l); err != nil {
			tb.Fatal(err)
		}
	}
	return l
}

// PodRoute routes the pod subnet 10.244.n.0/24 through l as flannel
// does: via the other node's tunnel address 10.244.n.0, on link.
func PodRoute(tb testing.TB, l netlink.Link, n byte) *netlink.Route {
	tb.Helper()
	gw := net.IPv4(10, 244, n, 0)
	r := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: &net.IPNet{IP: gw, Mask: net.CIDRMask(24, 32)}, Gw: gw, Flags: int(netlink.FLAG_ONLINK)}
	if err := netlink.RouteAdd(r); err != nil {
		tb.Fatalf("route 10.244.%d.0/24 through %s: %v", n, l.Attrs().Name, err)
	}
	return r
}
