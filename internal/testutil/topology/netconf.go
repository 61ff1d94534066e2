package topology

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
)

// AddBridge creates a bridge named dev in the namespace and sets it up:
// the shared L2 segment of a node network, where several namespaces
// (nodes, a router) sit on one subnet as machines on one switch do.
func (n *NS) AddBridge(dev string) error {
	la := netlink.NewLinkAttrs()
	la.Name = dev
	if err := n.nl.LinkAdd(&netlink.Bridge{LinkAttrs: la}); err != nil {
		return fmt.Errorf("add bridge %s in %s: %w", dev, n.Name, err)
	}
	return n.LinkUp(dev)
}

// SetMaster makes dev a port of the bridge master (both in the namespace).
func (n *NS) SetMaster(dev, master string) error {
	link, err := n.nl.LinkByName(dev)
	if err != nil {
		return fmt.Errorf("find %s in %s: %w", dev, n.Name, err)
	}
	br, err := n.nl.LinkByName(master)
	if err != nil {
		return fmt.Errorf("find %s in %s: %w", master, n.Name, err)
	}
	if err := n.nl.LinkSetMaster(link, br); err != nil {
		return fmt.Errorf("enslave %s to %s in %s: %w", dev, master, n.Name, err)
	}
	return nil
}

// AddRouteDev routes dst straight out of dev (scope link, no gateway):
// the route a node has to each of its pods over the pod's veth, and a
// pod to the link-local gateway its node answers for.
func (n *NS) AddRouteDev(dst netip.Prefix, dev string) error {
	link, err := n.nl.LinkByName(dev)
	if err != nil {
		return fmt.Errorf("find %s in %s: %w", dev, n.Name, err)
	}
	dst = dst.Masked()
	r := &netlink.Route{
		LinkIndex: link.Attrs().Index,
		Scope:     netlink.SCOPE_LINK,
		Dst:       &net.IPNet{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(dst.Bits(), dst.Addr().BitLen())},
	}
	if err := n.nl.RouteAdd(r); err != nil {
		return fmt.Errorf("add route %s dev %s in %s: %w", dst, dev, n.Name, err)
	}
	return nil
}
