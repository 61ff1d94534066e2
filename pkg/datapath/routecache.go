package datapath

// XDP's route cache (bpf/xdp.c): the next hop bpf_fib_lookup found for a
// packet of an established flow, kept in sluice_fib_v1 (IPv4) and
// sluice6_fib_v1 (IPv6), so that the flow's next packets skip the
// kernel's route lookup. An entry is used while it is of the current
// generation of the node's routing (fib_gen) and younger than
// Config.XDPRouteCacheAge. WatchRouting bumps the generation whenever
// netlink reports a change that may change a lookup's answer, so that
// with an agent running a change is followed at once; the age bounds how
// stale an entry can be without one.

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// DefaultXDPRouteCacheAge is how long XDP uses a route it looked up at
// most, when no netlink event made it look again sooner.
const DefaultXDPRouteCacheAge = time.Second

// xdpRoutes are the route cache's maps and generation in the loaded XDP
// object: its own, not pinned (a new object starts empty). Only fields
// the loader assigns: MapFill walks them.
type xdpRoutes struct {
	Fib4   *ebpf.Map      `ebpf:"sluice_fib_v1"`
	Fib6   *ebpf.Map      `ebpf:"sluice6_fib_v1"`
	FibGen *ebpf.Variable `ebpf:"fib_gen"`
}

func (r *xdpRoutes) Close() error {
	return errors.Join(r.Fib4.Close(), r.Fib6.Close())
}

// routeGen is the generation of the node's routing that the route cache
// was last told of (fib_gen).
type routeGen struct {
	mu sync.Mutex // orders the bumps
	n  uint32
}

// bumpRoutes makes every cached route stale: the next packet of each
// flow looks its route up again.
func (d *Datapath) bumpRoutes() error {
	d.routeGen.mu.Lock()
	defer d.routeGen.mu.Unlock()
	d.routeGen.n++
	if err := d.xdp.FibGen.Set(d.routeGen.n); err != nil {
		return fmt.Errorf("bump the XDP route cache's generation: %w", err)
	}
	return nil
}

// routingGroups are the rtnetlink multicast groups whose messages may
// change what bpf_fib_lookup answers: routes and rules (the local table
// too, which an address changes), neighbours, links, addresses, and the
// forwarding settings (RTM_NEWNETCONF). Nexthop objects (RTNLGRP_NEXTHOP,
// 32) do not fit the bind mask: WatchRouting joins them by socket option.
var routingGroups = []uint{
	unix.RTNLGRP_LINK, unix.RTNLGRP_NEIGH,
	unix.RTNLGRP_IPV4_IFADDR, unix.RTNLGRP_IPV6_IFADDR,
	unix.RTNLGRP_IPV4_ROUTE, unix.RTNLGRP_IPV6_ROUTE,
	unix.RTNLGRP_IPV4_RULE, unix.RTNLGRP_IPV6_RULE,
	unix.RTNLGRP_IPV4_NETCONF, unix.RTNLGRP_IPV6_NETCONF,
}

// RoutingWatch is a running WatchRouting.
type RoutingWatch struct {
	s        *nl.NetlinkSocket
	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}
	err      error
}

// WatchRouting follows the routing of the calling thread's network
// namespace for XDP's route cache: every netlink message about a route,
// rule, neighbour, link, address, nexthop or forwarding setting (or a
// lost one: the socket overran) makes every cached route stale. It
// subscribes, then makes the cache stale once (for what changed before),
// and returns. Without XDP there is nothing to follow: it returns a watch
// that only waits for Close.
func (d *Datapath) WatchRouting() (*RoutingWatch, error) {
	w := &RoutingWatch{stop: make(chan struct{}), done: make(chan struct{})}
	if d.xdp.FibGen == nil {
		go func() { <-w.stop; close(w.done) }()
		return w, nil
	}
	s, err := nl.Subscribe(unix.NETLINK_ROUTE, routingGroups...)
	if err != nil {
		return nil, fmt.Errorf("subscribe to routing changes: %w", err)
	}
	if err := unix.SetsockoptInt(s.GetFd(), unix.SOL_NETLINK, unix.NETLINK_ADD_MEMBERSHIP, unix.RTNLGRP_NEXTHOP); err != nil {
		s.Close()
		return nil, fmt.Errorf("subscribe to nexthop changes: %w", err)
	}
	if err := d.bumpRoutes(); err != nil {
		s.Close()
		return nil, err
	}
	w.s = s
	go w.run(d)
	return w, nil
}

func (w *RoutingWatch) run(d *Datapath) {
	defer close(w.done)
	for {
		_, _, err := w.s.Receive()
		select {
		case <-w.stop:
			return
		default:
		}
		// ENOBUFS: messages were lost, so something changed.
		if err != nil && !errors.Is(err, unix.ENOBUFS) {
			w.err = fmt.Errorf("receive routing changes: %w", err)
			return
		}
		if err := d.bumpRoutes(); err != nil {
			w.err = err
			return
		}
	}
}

// Done is closed when the watch ends: after Close, or on an error, which
// Close returns. Cached routes are then used for at most the cache's age.
func (w *RoutingWatch) Done() <-chan struct{} { return w.done }

// Close stops the watch and returns the error that ended it, if one did.
func (w *RoutingWatch) Close() error {
	w.stopOnce.Do(func() {
		close(w.stop)
		if w.s != nil {
			w.s.Close()
		}
	})
	<-w.done
	return w.err
}
