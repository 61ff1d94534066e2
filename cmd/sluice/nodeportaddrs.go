package main

// The addresses NodePorts are served on follow the node's interfaces, as
// kube-proxy's do: its nftables proxier reads the interfaces' addresses
// on every sync and serves NodePorts on those inside --nodeport-addresses
// (GetNodeIPs; primary is the node IP's /32 or /128, so the node IP
// serves them only while an interface holds it), and with a /0 on every
// address local at the time of the packet. The agent reads them at start
// (nodePortPlan.read), then follows rtnetlink's address notifications
// (nodePortWatch): a change, debounced, reads them again, and a served
// set that differs goes to the source (SetNodeAddresses), which
// re-translates the NodePort Services alone into a new state for the
// reconciler, which adds the new frontends before it deletes the old
// (make-before-break, as for every change). A subscription that fails is
// logged and made again, and the addresses read again then, since
// notifications may have been lost. What does not follow: the node IPs
// themselves (--node-ip, the Node's addresses: the source-NAT addresses,
// the devices) and the health check servers' listen addresses, which
// kube-proxy too reads once at start.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/sluice-lb/sluice/pkg/datapath"
)

// nodePortPlan is what decides where NodePorts are served, fixed at start.
type nodePortPlan struct {
	// cidrs are --nodeport-addresses' CIDRs (with the primary addresses'
	// /32 and /128 when primary is beside CIDRs); none: primary alone.
	cidrs []netip.Prefix
	// primary are the node IPs served with no cidrs while they are local
	// (nodeAddrs.primaryNodePorts).
	primary   []netip.Addr
	localhost bool // --localhost-nodeports
	// devices are where a node without any node IP and without CIDRs
	// serves NodePorts: their global IPv4 addresses, as before there was
	// the flag. Only the devices --devices names exactly or those
	// detected, not those a pattern matches; one missing is skipped.
	devices []string
}

// onDevices reports whether p serves the devices' addresses (no node IP
// and no CIDR).
func (p nodePortPlan) onDevices() bool { return len(p.cidrs) == 0 && len(p.primary) == 0 }

// read returns where NodePorts are served now, from the interfaces'
// addresses.
func (p nodePortPlan) read() (nodePorts, error) {
	if p.onDevices() {
		var addrs []netip.Addr
		for _, dev := range p.devices {
			a, err := datapath.AddressesOf([]string{dev})
			if _, gone := errors.AsType[netlink.LinkNotFoundError](err); gone {
				continue // a device that went serves nothing until it is back
			}
			if err != nil {
				return nodePorts{}, fmt.Errorf("addresses of the devices: %w", err)
			}
			for _, ip := range a {
				if !slices.Contains(addrs, ip) {
					addrs = append(addrs, ip)
				}
			}
		}
		return nodePorts{Addrs: addrs, HealthHosts: []string{""}}, nil
	}
	local, err := localAddresses()
	if err != nil {
		return nodePorts{}, fmt.Errorf("addresses of the node: %w", err)
	}
	return nodePortsFor(p.cidrs, p.primary, local, p.localhost), nil
}

// nodeAddressSetter is a source that takes new NodePort addresses
// (manifest.Source, kube.Source).
type nodeAddressSetter interface {
	SetNodeAddresses([]netip.Addr)
}

// addrChanges is a subscription to the node's address changes: a value
// on c for each, c closed when it ends (err says why).
type addrChanges struct {
	c    <-chan struct{}
	stop func()
	err  func() error
}

// Timings of nodePortWatch, variables for tests.
var (
	// nodeAddrDebounce is how long the watch collects address changes
	// before it reads the addresses again: an interface coming up brings
	// several at once.
	nodeAddrDebounce = 200 * time.Millisecond
	// nodeAddrRetry is how long it waits before subscribing again after
	// a failure to.
	nodeAddrRetry = time.Second
)

// nodePortWatch follows where NodePorts are served.
type nodePortWatch struct {
	read      func() (nodePorts, error)
	subscribe func() (*addrChanges, error)
	log       *slog.Logger
	served    []netip.Addr  // what the source was last given
	changes   *addrChanges  // nil: not subscribed
	cancel    func()        // ends run (nil: not started)
	done      chan struct{} // closed when run ended
}

// watchNodePorts subscribes to the node's address changes, then reads
// where plan serves NodePorts now: what the source starts with. A failed
// subscription is logged and retried by run; a failed read is an error.
func watchNodePorts(plan nodePortPlan, log *slog.Logger) (*nodePortWatch, nodePorts, error) {
	w := &nodePortWatch{read: plan.read, subscribe: subscribeAddrs, log: log}
	var err error
	if w.changes, err = w.subscribe(); err != nil {
		log.Error("following the node's addresses: subscribe failed; retrying", "err", err)
	}
	np, err := w.read()
	if err != nil {
		if w.changes != nil {
			w.changes.stop()
		}
		return nil, np, err
	}
	w.served = np.Addrs
	if plan.onDevices() {
		log.Info("no node IP: NodePorts on the devices' addresses", "addresses", np.Addrs)
	} else if off := slices.DeleteFunc(slices.Clone(plan.primary), func(a netip.Addr) bool { return slices.Contains(np.Addrs, a) }); len(plan.cidrs) == 0 && len(off) > 0 {
		msg := "node IP on no interface: no NodePorts on it until it is"
		if len(plan.devices) == 0 {
			// No device named exactly nor found holding a node IP
			// (main warns of the latter): external clients get tc
			// only on a device a --devices pattern matches.
			msg += ", and then to the node's and pods' own connections only, unless a --devices pattern matches the device it comes on (no device named exactly or found holding a node IP)"
		}
		log.Warn(msg, "node_ips", off)
	} else if len(plan.cidrs) > 0 && len(np.Addrs) == 0 {
		log.Warn("no local address inside --nodeport-addresses: no NodePorts until one is", "nodeport_addresses", plan.cidrs)
	}
	return w, np, nil
}

// start runs the watch for src until stop. A source that takes no
// addresses is not followed.
func (w *nodePortWatch) start(src any) {
	set, ok := src.(nodeAddressSetter)
	if !ok {
		w.stop()
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel, w.done = cancel, make(chan struct{})
	go func() {
		defer close(w.done)
		w.run(ctx, set)
	}()
}

// stop ends the watch, started or not, and waits for it to end.
func (w *nodePortWatch) stop() {
	if w.cancel == nil {
		if w.changes != nil {
			w.changes.stop()
			w.changes = nil
		}
		return
	}
	w.cancel()
	<-w.done
}

// run follows the address changes until ctx is done, giving set the
// served addresses whenever they change.
func (w *nodePortWatch) run(ctx context.Context, set nodeAddressSetter) {
	defer func() {
		if w.changes != nil {
			w.changes.stop()
		}
	}()
	debounce := time.NewTimer(time.Hour)
	debounce.Stop()
	pending := false
	for {
		if w.changes == nil {
			var err error
			if w.changes, err = w.subscribe(); err != nil {
				w.log.Error("following the node's addresses: subscribe failed; retrying", "err", err, "in", nodeAddrRetry)
				select {
				case <-ctx.Done():
					return
				case <-time.After(nodeAddrRetry):
				}
				continue
			}
			// Changes may have been missed while not subscribed.
			w.update(set)
		}
		select {
		case <-ctx.Done():
			return
		case _, ok := <-w.changes.c:
			if !ok {
				w.log.Warn("following the node's addresses: the subscription ended; subscribing again", "err", w.changes.err())
				w.changes.stop()
				w.changes = nil
				continue
			}
			if !pending {
				pending = true
				debounce.Reset(nodeAddrDebounce)
			}
		case <-debounce.C:
			pending = false
			w.update(set)
		}
	}
}

// update reads where NodePorts are served and gives set the addresses if
// they changed, logging what did. A failed read is logged and changes
// nothing.
func (w *nodePortWatch) update(set nodeAddressSetter) {
	np, err := w.read()
	if err != nil {
		w.log.Error("following the node's addresses: NodePort addresses kept", "err", err, "addresses", w.served)
		return
	}
	added, removed := addrDiff(w.served, np.Addrs)
	if len(added) == 0 && len(removed) == 0 {
		return
	}
	w.log.Info("NodePort addresses changed", "added", added, "removed", removed, "addresses", np.Addrs)
	w.served = np.Addrs
	set.SetNodeAddresses(np.Addrs)
}

// addrDiff returns the addresses of now not in was, and of was not in now.
func addrDiff(was, now []netip.Addr) (added, removed []netip.Addr) {
	for _, a := range now {
		if !slices.Contains(was, a) {
			added = append(added, a)
		}
	}
	for _, a := range was {
		if !slices.Contains(now, a) {
			removed = append(removed, a)
		}
	}
	return added, removed
}

// subscribeAddrs subscribes to this network namespace's IPv4 and IPv6
// address changes (rtnetlink). The subscription ends on a receive error:
// an overrun socket (ENOBUFS) lost notifications.
func subscribeAddrs() (*addrChanges, error) {
	updates := make(chan netlink.AddrUpdate, 64)
	done := make(chan struct{})
	var mu sync.Mutex
	var last error
	err := netlink.AddrSubscribeWithOptions(updates, done, netlink.AddrSubscribeOptions{
		ErrorCallback: func(err error) {
			// netlink also reports messages it skips (another
			// sender, a message of another type, one it cannot
			// parse) and goes on: only its receive error ends the
			// subscription (addrSubscribeAt), and only that one is
			// the cause to name. netlink says which by its text
			// alone; another text leaves the cause unnamed.
			if !strings.HasPrefix(err.Error(), "Receive failed") {
				return
			}
			mu.Lock()
			last = err
			mu.Unlock()
		},
	})
	if err != nil {
		close(done)
		return nil, fmt.Errorf("subscribe to address changes: %w", err)
	}
	c := make(chan struct{}, 1)
	fwd := make(chan struct{})
	go func() {
		// Drains updates until netlink closes it (after done), so that
		// its receiving goroutine never blocks on a send.
		defer close(fwd)
		defer close(c)
		for range updates {
			select {
			case c <- struct{}{}:
			default: // one is pending: it says as much
			}
		}
	}()
	var once sync.Once
	return &addrChanges{
		c: c,
		stop: func() {
			once.Do(func() { close(done) })
			<-fwd
		},
		err: func() error {
			mu.Lock()
			defer mu.Unlock()
			if last == nil {
				return errors.New("closed")
			}
			return last
		},
	}, nil
}
