package datapath

// Following the overlay devices (TunnelDevices) when --devices is not
// given. At node boot the CNI's agent (flanneld, calico-node) and Sluice
// start together, so flannel.1, vxlan.calico or tunl0 often appears, or
// gets its routes, after the start attached the devices: without tc on
// it, a NodePort flow to a backend behind it is only DNATed (nat_remote)
// and the backend answers the client directly. The tunnel watch is a
// DeviceWatch over routes as well as links: a link that comes to meet
// overlayTunnels' criterion (it appears up, comes up, or gets its first
// qualifying main-table route) gets what AttachDevices gives a tunnel
// (tc programs, its sluice_devices entry flagged nodeDevTunnel and
// nodeDevFollowed, with its address or the node IP's; never XDP); a
// tunnel it holds that is deleted, or renamed (attached again under its
// new name if it still qualifies), has its pins and entries removed. The
// devices holding the node addresses are the start's, never the watch's,
// whatever their kind (a node IP on wg0).
//
// A tunnel that only loses its routes, or goes down, stays attached.
// That is harmless: while no route leaves through it, its egress program
// sees nothing, and what arrives through it is what tc would see on any
// other attached device. And it keeps the flows it carries: a CNI agent
// restarting (flanneld flushes and writes its routes again; a link
// bounced takes its routes with it) would otherwise have the programs
// taken off and put back, and replies arriving through the tunnel in
// between (the backends' answers to flows source-NATed through it) would
// miss their reverse translation.

import (
	"errors"
	"fmt"
	"net"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// NewTunnelWatch returns a watch over the overlay devices (the default
// --devices' tunnels, TunnelDevices) in the calling thread's network
// namespace, run as NewDeviceWatch's is (Run). Call it after the start's
// Commit, with nodeDevices, the start's devices that hold the node
// addresses (cmd/sluice: DevicesOf): the watch starts from the other
// tunnels AttachDevices attached (their entries flagged nodeDevTunnel:
// the overlay devices the start listed beside them), which it forgets
// when they are deleted or renamed. The devices of nodeDevices (a node
// IP on a wg0 too), and any other device of the start, are not its
// business: it never holds, detaches or attaches one, renamed or not,
// until its ifindex is deleted.
//
// Every tunnel the watch holds has its entry flagged nodeDevFollowed:
// the start's (by AttachDevices, Config.FollowedTunnels; and by the
// watch when it first finds them, if not yet) and those it attaches. A
// restart keeps those only (PinnedTunnelDevices), not a tunnel attached
// because --devices named it, whose entry AttachDevices writes without
// the flag.
func (d *Datapath) NewTunnelWatch(nodeDevices ...string) (*DeviceWatch, error) {
	ours := map[int]bool{}
	for idx, name := range d.attachedAtStart {
		var nd sockNodeDev
		if !slices.Contains(nodeDevices, name) && d.maps.devices.Lookup(uint32(idx), &nd) == nil && nd.Flags&nodeDevTunnel != 0 {
			ours[idx] = true
		}
	}
	w, err := d.newDeviceWatch(DeviceSelector{}, func(ifindex int, _ string) bool { return ours[ifindex] })
	if err != nil {
		return nil, err
	}
	w.overlay, w.notTunnel, w.mark, w.notOurs = true, map[int]bool{}, nodeDevFollowed, map[int]bool{}
	for idx := range d.attachedAtStart {
		if !ours[idx] {
			w.notOurs[idx] = true
		}
	}
	w.subscribeRoutes = netlink.RouteSubscribeWithOptions
	w.routes = mainRoutes
	return w, nil
}

// follows says whether the watch follows link ifindex, named name (l, or
// nil: looked up if needed): sel's patterns match it, or (overlay) it is
// an overlay device now.
func (w *DeviceWatch) follows(ifindex int, name string, l netlink.Link) bool {
	switch {
	case !w.overlay:
		return w.sel.followed(name)
	case w.overlayNow != nil:
		return w.overlayNow[ifindex]
	}
	if l == nil {
		var err error
		if l, err = netlink.LinkByIndex(ifindex); err != nil {
			return false // gone: its message says
		}
	}
	ok, err := isOverlayNow(l, w.routes)
	if err != nil {
		// The next message about it, or the next relist, looks again.
		return false
	}
	return ok
}

// overlayCandidate says whether link l could be an overlay device
// (overlayTunnels) if a route left through it: of a tunnel kind, up, not
// flow-based, not enslaved.
func overlayCandidate(l netlink.Link) bool {
	a := l.Attrs()
	return slices.Contains(tunnelTypes, l.Type()) && a.Flags&net.FlagUp != 0 && !flowBased(l) && a.MasterIndex == 0
}

// overlayCandidates returns the links of links that could become overlay
// devices the watch does not hold yet (overlayCandidate): only if there
// is one does relist list the routes (a BGP node's main table holds a full
// table).
func (w *DeviceWatch) overlayCandidates(links []netlink.Link) []netlink.Link {
	var out []netlink.Link
	for _, l := range links {
		a := l.Attrs()
		if name, held := w.have[a.Index]; held && name == a.Name {
			continue
		}
		if overlayCandidate(l) {
			out = append(out, l)
		}
	}
	return out
}

// isOverlayNow says whether link l is an overlay device now
// (overlayTunnels, with the main table's routes as routes lists them).
// Only a candidate (overlayCandidate) has the routes listed.
func isOverlayNow(l netlink.Link, routes func() ([]netlink.Route, error)) (bool, error) {
	if !overlayCandidate(l) {
		return false, nil
	}
	rs, err := routes()
	if err != nil {
		return false, err
	}
	return len(overlayTunnels([]netlink.Link{l}, rs)) > 0, nil
}

// routed handles a route update (overlay): a new route of the main table
// an overlay routes by (overlayRoute) may make the link it leaves by an
// overlay device. A route removed changes nothing (see the top of this
// file).
func (w *DeviceWatch) routed(u netlink.RouteUpdate, report func(DeviceEvent)) {
	if u.Type != unix.RTM_NEWROUTE || !overlayRoute(u.Route) {
		return
	}
	idxs := []int{u.LinkIndex}
	for _, nh := range u.MultiPath {
		idxs = append(idxs, nh.LinkIndex)
	}
	for _, idx := range idxs {
		_, held := w.have[idx]
		_, pending := w.pending[idx] // retryPending tries it when room is made
		if held || pending || idx == 0 || w.notTunnel[idx] || w.notOurs[idx] {
			continue
		}
		l, err := netlink.LinkByIndex(idx)
		if err != nil {
			continue // gone: its message says
		}
		if !slices.Contains(tunnelTypes, l.Type()) {
			w.notTunnel[idx] = true // a pod's veth, the uplink
			continue
		}
		w.present(idx, l.Attrs().Name, l, report)
	}
}

// overlayIndexes returns the ifindexes of the links overlayTunnels picks.
func overlayIndexes(links []netlink.Link, routes []netlink.Route) map[int]bool {
	names := overlayTunnels(links, routes)
	out := map[int]bool{}
	for _, l := range links {
		if slices.Contains(names, l.Attrs().Name) {
			out[l.Attrs().Index] = true
		}
	}
	return out
}

// mainRoutes lists the main table's routes of both families in the
// caller's network namespace, listing again, up to listLinkTries times,
// while a list is interrupted by a change (netlink.ErrDumpInterrupted).
func mainRoutes() ([]netlink.Route, error) {
	var routes []netlink.Route
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		var rs []netlink.Route
		var err error
		for range listLinkTries {
			rs, err = netlink.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
			if !errors.Is(err, netlink.ErrDumpInterrupted) {
				break
			}
		}
		if err != nil {
			return nil, fmt.Errorf("list the main table's routes: %w", err)
		}
		routes = append(routes, rs...)
	}
	return routes, nil
}
