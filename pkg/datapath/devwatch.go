package datapath

// Following the devices --devices names by pattern. A name ending in '+'
// (Cilium's syntax: "veth+" matches veth0, vethab12, ...) is a prefix;
// any other name is exact. Exact devices are attached once at start
// (AttachDevices) and must exist; the links a pattern matches come and go
// with the pods (host-side veths: veth*, cali*, lxc*), so DeviceWatch
// follows them: a link that appears, or is renamed, under a matching name
// gets what AttachDevices gives a device (tc programs, XDP as configured,
// its sluice_devices entry); one that goes, or is renamed away, has its
// pins and device entries removed (its tcx and XDP links die with it, but
// their pins would stay). A pattern matching nothing is fine.
//
// The watch subscribes to RTNLGRP_LINK, then lists the links and
// reconciles against what it holds: links it missed are attached, links
// gone are forgotten. A failed receive (an overrun: ENOBUFS) ends the
// subscription; the watch subscribes again and lists again, so nothing
// is missed for long. The same watch follows the overlay devices when
// --devices is not given (NewTunnelWatch, tunwatch.go), over routes too.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// DeviceSelector is a parsed --devices list.
type DeviceSelector struct {
	exact    []string
	prefixes []string
}

// ParseDevices parses the names of --devices: each is exact, or a prefix
// when it ends in '+' (Cilium's wildcard). A bare "+" (every link, the
// loopback too) and an empty or malformed name are errors naming it.
func ParseDevices(names []string) (DeviceSelector, error) {
	var s DeviceSelector
	for _, n := range names {
		p, wild := strings.CutSuffix(n, "+")
		switch {
		case p == "" && wild:
			return DeviceSelector{}, fmt.Errorf("device pattern %q matches every link: name a prefix (eth+, veth+)", n)
		case p == "" || len(n) > unix.IFNAMSIZ-1 || strings.ContainsAny(p, "/: \t\n+"):
			return DeviceSelector{}, fmt.Errorf("device %q: not a device name or a prefix ending in +", n)
		case wild:
			if !slices.Contains(s.prefixes, p) {
				s.prefixes = append(s.prefixes, p)
			}
		default:
			if !slices.Contains(s.exact, n) {
				s.exact = append(s.exact, n)
			}
		}
	}
	return s, nil
}

// Exact returns the exact names, in the order given.
func (s DeviceSelector) Exact() []string { return slices.Clone(s.exact) }

// HasPatterns says whether s has a pattern, so that links need following.
func (s DeviceSelector) HasPatterns() bool { return len(s.prefixes) > 0 }

// Empty says whether s names nothing.
func (s DeviceSelector) Empty() bool { return len(s.exact) == 0 && len(s.prefixes) == 0 }

// followed says whether a link named name is one the watch follows: a
// pattern matches it and it is not an exact name (attached at start).
func (s DeviceSelector) followed(name string) bool {
	if slices.Contains(s.exact, name) {
		return false
	}
	for _, p := range s.prefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// Expand returns the devices s selects in the caller's network namespace
// now: the exact names (whether they exist or not: AttachDevices says),
// then the links a pattern matches, sorted.
func (s DeviceSelector) Expand() ([]string, error) {
	out := slices.Clone(s.exact)
	if !s.HasPatterns() {
		return out, nil
	}
	links, err := listLinks(linkList)
	if err != nil {
		return nil, fmt.Errorf("list devices: %w", err)
	}
	var matched []string
	for _, l := range links {
		if s.followed(l.Attrs().Name) {
			matched = append(matched, l.Attrs().Name)
		}
	}
	slices.Sort(matched)
	return append(out, matched...), nil
}

// Fit splits devs (as Expand returns them: the exact names first) into
// the devices sluice_devices, of maxDevices entries (--max-devices; 0:
// DefaultMaxDevices), has room for and the pattern matches left out.
// The exact names are all kept (attaching more than fit fails the start,
// naming --max-devices); the matches left out are the last in order,
// which the watch keeps pending until a device goes.
func (s DeviceSelector) Fit(devs []string, maxDevices int) (fit, left []string) {
	if maxDevices <= 0 {
		maxDevices = DefaultMaxDevices
	}
	n := max(maxDevices, len(s.exact))
	if len(devs) <= n {
		return devs, nil
	}
	return devs[:n], devs[n:]
}

// DeviceEvent is what a DeviceWatch did to one link.
type DeviceEvent struct {
	Device  string
	Ifindex int
	// Attached: the programs are on it now; else its state was removed
	// (Reason says why).
	Attached bool
	Reason   string // "appeared", "renamed", "attached already", "room made"; "removed", "renamed away", "missed"; "overrun" (Err: a subscription overran, reported at most once a minute)
	// Err, if set, says the step failed (nothing else is true then),
	// but for Attached with Reason "attached already": the link is
	// attached, but its entry could not be flagged the watch's (the
	// tunnel watch's nodeDevFollowed: a restart while it is down or
	// routeless detaches it).
	Err error
}

// DeviceWatch follows the links a DeviceSelector's patterns match. See
// the top of this file.
type DeviceWatch struct {
	d    *Datapath
	sel  DeviceSelector
	ns   netns.NsHandle
	have map[int]string // ifindex -> name, the followed links attached
	// pending holds the followed links that did not fit in
	// sluice_devices (--max-devices, ErrDevicesFull): tried again after
	// each device goes, and at each relist.
	pending map[int]string
	// seeded holds the links of have the start attached (AttachDevices)
	// that the watch has not seen yet: reported "attached already" when
	// the first relist finds them, forgotten if it does not.
	seeded map[int]bool
	// subscribe, if set (tests), replaces netlink.LinkSubscribeWithOptions.
	subscribe func(ch chan<- netlink.LinkUpdate, done <-chan struct{}, opts netlink.LinkSubscribeOptions) error
	// list, if set (tests), replaces netlink.LinkList.
	list func() ([]netlink.Link, error)
	// overlay: the watch follows the overlay devices (NewTunnelWatch,
	// tunwatch.go), not sel's patterns, and routes as well as links.
	overlay bool
	// overlayNow, while relist runs (overlay), holds the ifindexes of the
	// links overlayTunnels picks from its lists.
	overlayNow map[int]bool
	// subscribeRoutes (overlay) is netlink.RouteSubscribeWithOptions, or
	// a test's.
	subscribeRoutes func(ch chan<- netlink.RouteUpdate, done <-chan struct{}, opts netlink.RouteSubscribeOptions) error
	// routes (overlay) lists the main table's routes: mainRoutes, or a
	// test's.
	routes func() ([]netlink.Route, error)
	// notTunnel (overlay) holds the ifindexes of links a route message
	// named that are of no tunnel kind (routed): the next route through
	// one is passed over without asking the kernel (a BGP burst through
	// eth0). Forgotten at each message about the link and each relist.
	notTunnel map[int]bool
	// overrunBackoff is the wait before subscribing again after an
	// overrun (doubled at each in a row, up to maxOverrunBackoff).
	overrunBackoff time.Duration
	// relistDue (overlay): the last relist could not list the routes;
	// follow lists again after relistRetry.
	relistDue   bool
	relistRetry time.Duration
	// retrying: present tries a pending link again (retryPending,
	// relist); else it passes one over.
	retrying bool
	// mark (overlay: nodeDevFollowed) is the flag of the entries of the
	// links the watch holds: set when it attaches one, and on one it
	// finds attached already.
	mark uint32
	// notOurs (overlay) holds the ifindexes of the start's devices the
	// watch is not to touch (the node addresses', NewTunnelWatch):
	// passed over, renamed or not, until the link is deleted.
	notOurs map[int]bool
	// attachTries counts AttachDevice calls (tests).
	attachTries int
}

// NewDeviceWatch returns a watch over sel's patterns in the calling
// thread's network namespace (where Run works, whichever thread runs it).
// Call it after the start's Commit: it starts from what AttachDevices
// attached that sel's patterns match.
func (d *Datapath) NewDeviceWatch(sel DeviceSelector) (*DeviceWatch, error) {
	// The start's pattern matches: one deleted or renamed away before
	// the first list is forgotten by it (its pins and entry removed).
	return d.newDeviceWatch(sel, func(_ int, name string) bool { return sel.followed(name) })
}

// newDeviceWatch is a watch of sel in the calling thread's network
// namespace that holds the devices of the start (AttachDevices) seed
// says it follows.
func (d *Datapath) newDeviceWatch(sel DeviceSelector, seed func(ifindex int, name string) bool) (*DeviceWatch, error) {
	ns, err := netns.Get()
	if err != nil {
		return nil, fmt.Errorf("device watch: network namespace: %w", err)
	}
	w := &DeviceWatch{d: d, sel: sel, ns: ns, have: map[int]string{}, pending: map[int]string{}, seeded: map[int]bool{},
		subscribe: netlink.LinkSubscribeWithOptions, list: linkList,
		overrunBackoff: time.Second, relistRetry: 5 * time.Second}
	for idx, name := range d.attachedAtStart {
		if seed(idx, name) {
			w.have[idx], w.seeded[idx] = name, true
		}
	}
	return w, nil
}

// linkList lists the links of the caller's network namespace:
// netlink.LinkList, replaced by tests.
var linkList = netlink.LinkList

// listLinkTries is how many times listLinks lists the links before it
// gives up on lists interrupted by a change.
const listLinkTries = 10

// listLinks returns list's links (netlink.LinkList, or a Handle's),
// listing again, up to listLinkTries times, while the list is
// interrupted (netlink.ErrDumpInterrupted: a link changed while it was
// made, so the partial list it comes with may miss one).
func listLinks(list func() ([]netlink.Link, error)) ([]netlink.Link, error) {
	var links []netlink.Link
	var err error
	for range listLinkTries {
		if links, err = list(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	return links, nil
}

// Run follows the links until ctx is done, telling report about every
// link attached or forgotten and every failure (a failed subscription is
// retried after retry returns; retry returns false once ctx is done). It
// returns once ctx is done, with nothing of its own left running. It
// keeps its goroutine's thread (in the watch's network namespace) locked
// for good: call it on a goroutine of its own, which ends with it.
func (w *DeviceWatch) Run(ctx context.Context, report func(DeviceEvent), retry func(context.Context) bool) {
	runtime.LockOSThread()              // never unlocked: the thread ends with the goroutine
	defer func() { _ = w.ns.Close() }() // a descriptor of our own: nothing to do if closing fails
	if err := netns.Set(w.ns); err != nil {
		report(DeviceEvent{Err: fmt.Errorf("device watch: enter network namespace: %w", err)})
		return
	}
	var overruns, unreported int // overruns in a row; overruns not reported yet
	var lastReport time.Time
	for ctx.Err() == nil {
		ch := make(chan netlink.LinkUpdate, 256)
		done := make(chan struct{})
		// One slot per subscription: an overrun of one is not hidden
		// behind the other's error.
		linkErrs, routeErrs := make(chan error, 1), make(chan error, 1)
		keep := func(errs chan error) func(error) {
			return func(err error) {
				select {
				case errs <- err:
				default:
				}
			}
		}
		// The agent is privileged: the buffer is forced past
		// net.core.rmem_max (a BGP daemon's full table arrives at once).
		err := w.subscribe(ch, done, netlink.LinkSubscribeOptions{
			ReceiveBufferSize:      subscribeBuffer,
			ReceiveBufferForceSize: true,
			ErrorCallback:          keep(linkErrs),
		})
		if err != nil {
			close(done)
			report(DeviceEvent{Err: fmt.Errorf("subscribe to link changes: %w", err)})
			if !retry(ctx) {
				return
			}
			continue
		}
		var rch chan netlink.RouteUpdate // nil (never ready) unless overlay
		if w.overlay {
			rch = make(chan netlink.RouteUpdate, 256)
			err = w.subscribeRoutes(rch, done, netlink.RouteSubscribeOptions{
				ReceiveBufferSize:      subscribeBuffer,
				ReceiveBufferForceSize: true,
				ErrorCallback:          keep(routeErrs),
			})
			if err != nil {
				close(done)
				for range ch {
				}
				report(DeviceEvent{Err: fmt.Errorf("subscribe to route changes: %w", err)})
				if !retry(ctx) {
					return
				}
				continue
			}
		}
		// After subscribing: a change from here on is heard, one
		// before is in the list.
		start := time.Now()
		w.relist(report)
		w.follow(ctx, ch, rch, report)
		close(done)
		for range ch { // the subscription's goroutine ends with ch
		}
		if rch != nil {
			for range rch {
			}
		}
		if ctx.Err() != nil {
			return
		}
		var errs []error
		overrun := false
		for what, c := range map[string]chan error{"link changes": linkErrs, "route changes": routeErrs} {
			select {
			case err := <-c:
				overrun = overrun || errors.Is(err, unix.ENOBUFS)
				errs = append(errs, fmt.Errorf("%s: %w", what, err))
			default:
			}
		}
		if !overrun {
			overruns = 0
			if len(errs) > 0 {
				report(DeviceEvent{Err: fmt.Errorf("%w (subscribing again)", errors.Join(errs...))})
			}
			continue
		}
		// An overrun: subscribing again lists everything again, so a
		// burst lasting longer than the buffer must not turn into a
		// list after a list. Wait longer each overrun in a row, and
		// report at most one a minute (Reason "overrun").
		if time.Since(start) > maxOverrunBackoff*2 {
			overruns = 0
		}
		overruns++
		unreported++
		if lastReport.IsZero() || time.Since(lastReport) >= time.Minute {
			report(DeviceEvent{Reason: "overrun", Err: fmt.Errorf("%w (%d overruns since the last report; subscribing again)", errors.Join(errs...), unreported)})
			lastReport, unreported = time.Now(), 0
		}
		wait := min(w.overrunBackoff<<(min(overruns, 16)-1), maxOverrunBackoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// subscribeBuffer is the receive buffer of the watch's subscriptions.
const subscribeBuffer = 4 << 20

// maxOverrunBackoff is the longest the watch waits before it subscribes
// again after overruns in a row (DeviceWatch.overrunBackoff is the first
// wait, doubled at each).
const maxOverrunBackoff = 30 * time.Second

// follow handles link updates (and route updates: rch, nil unless
// overlay) until ctx is done or a channel closes (its subscription
// failed).
func (w *DeviceWatch) follow(ctx context.Context, ch <-chan netlink.LinkUpdate, rch <-chan netlink.RouteUpdate, report func(DeviceEvent)) {
	var again <-chan time.Time // relistDue's retry
	for {
		if w.relistDue && again == nil {
			again = time.After(w.relistRetry)
		}
		select {
		case <-ctx.Done():
			return
		case <-again:
			again = nil
			w.relist(report)
		case u, ok := <-rch:
			if !ok {
				return
			}
			w.routed(u, report)
		case u, ok := <-ch:
			if !ok {
				return
			}
			a := u.Link.Attrs()
			delete(w.notTunnel, a.Index)
			if u.Header.Type == unix.RTM_DELLINK {
				delete(w.notOurs, a.Index) // a new link may take the ifindex
				w.gone(a.Index, "removed", report)
				continue
			}
			w.present(a.Index, a.Name, u.Link, report)
		}
	}
}

// relist reconciles what the watch holds with the links there are.
// Overlay: the routes are listed only if a link could become an overlay
// device (overlayCandidates), and a failure to list them still forgets
// the links gone (and lists again later: relistDue).
func (w *DeviceWatch) relist(report func(DeviceEvent)) {
	w.relistDue = false
	links, err := listLinks(w.list)
	if err != nil {
		report(DeviceEvent{Err: fmt.Errorf("list devices: %w", err)})
		w.relistDue = w.overlay
		return
	}
	byIndex := map[int]string{}
	for _, l := range links {
		byIndex[l.Attrs().Index] = l.Attrs().Name
	}
	if w.overlay {
		w.overlayNow, w.notTunnel = map[int]bool{}, map[int]bool{}
		defer func() { w.overlayNow = nil }()
		if cands := w.overlayCandidates(links); len(cands) > 0 {
			if routes, err := w.routes(); err != nil {
				report(DeviceEvent{Err: fmt.Errorf("%w (listing again in %s)", err, w.relistRetry)})
				w.relistDue = true
			} else {
				w.overlayNow = overlayIndexes(cands, routes)
			}
		}
	}
	for idx, name := range w.have {
		if n, ok := byIndex[idx]; !ok || n != name {
			w.gone(idx, "missed", report)
		}
	}
	for idx, name := range w.pending {
		if n, ok := byIndex[idx]; !ok || n != name {
			delete(w.pending, idx)
		}
	}
	for idx := range w.notOurs {
		if _, ok := byIndex[idx]; !ok {
			delete(w.notOurs, idx)
		}
	}
	w.retrying = true
	defer func() { w.retrying = false }()
	for _, l := range links {
		w.present(l.Attrs().Index, l.Attrs().Name, l, report)
	}
}

// present handles link ifindex, named name now: l, or nil (looked up if
// needed).
func (w *DeviceWatch) present(ifindex int, name string, l netlink.Link, report func(DeviceEvent)) {
	if w.notOurs[ifindex] {
		return // the start's, whatever it is called now
	}
	if p, ok := w.pending[ifindex]; ok && p != name {
		delete(w.pending, ifindex) // renamed: tried under its new name
	} else if ok && !w.retrying {
		// Left out for want of room: tried again when a device goes
		// (retryPending) or at a relist, not at each message about it
		// (an attach that fails, E2BIG, and a detach each time).
		return
	}
	prev, held := w.have[ifindex]
	if held && prev == name {
		if w.seeded[ifindex] {
			delete(w.seeded, ifindex)
			w.attachedAlready(ifindex, name, report)
		}
		return // up, down, an address: nothing to do
	}
	if held {
		w.gone(ifindex, "renamed away", report)
	}
	if !w.follows(ifindex, name, l) {
		return
	}
	if !held && w.d.deviceAttached(name, ifindex) {
		// Attached at start (AttachDevices) or by an earlier agent
		// and kept: nothing to change.
		w.have[ifindex] = name
		w.attachedAlready(ifindex, name, report)
		return
	}
	reason := "appeared"
	if held {
		reason = "renamed"
	}
	w.attachTries++
	w.d.maps.devMu.Lock()
	err := w.d.attachDevice(name, ifindex, w.mark)
	w.d.maps.devMu.Unlock()
	if errors.Is(err, ErrDevicesFull) {
		// Tried again once a device goes; reported the first time.
		_, again := w.pending[ifindex]
		w.pending[ifindex] = name
		if !again {
			report(DeviceEvent{Device: name, Ifindex: ifindex, Reason: reason,
				Err: fmt.Errorf("%w (left out until a device goes)", err)})
		}
		return
	}
	if err != nil {
		report(DeviceEvent{Device: name, Ifindex: ifindex, Reason: reason, Err: err})
		return
	}
	if _, was := w.pending[ifindex]; was {
		delete(w.pending, ifindex)
		reason = "room made"
	}
	w.have[ifindex] = name
	report(DeviceEvent{Device: name, Ifindex: ifindex, Attached: true, Reason: reason})
}

// attachedAlready reports link ifindex (name), which the watch holds and
// found attached already, after flagging its entry w.mark (overlay:
// nodeDevFollowed, kept at a restart) if it is not yet (AttachDevices
// flags the start's followed tunnels itself). A failure to flag it is
// reported with the link attached (Attached and Err): it still is.
func (w *DeviceWatch) attachedAlready(ifindex int, name string, report func(DeviceEvent)) {
	var err error
	if w.mark != 0 {
		w.d.maps.devMu.Lock()
		err = w.d.maps.markDevice(ifindex, w.mark)
		w.d.maps.devMu.Unlock()
	}
	report(DeviceEvent{Device: name, Ifindex: ifindex, Attached: true, Reason: "attached already", Err: err})
}

// retryPending tries the links left out for want of room again, after
// a device went.
func (w *DeviceWatch) retryPending(report func(DeviceEvent)) {
	was := w.retrying
	w.retrying = true
	defer func() { w.retrying = was }()
	for idx, name := range w.pending {
		l, err := netlink.LinkByIndex(idx)
		if err != nil || l.Attrs().Name != name {
			delete(w.pending, idx) // gone or renamed: its message says
			continue
		}
		w.present(idx, name, l, report)
	}
}

// gone forgets link ifindex, attached under its name in w.have.
func (w *DeviceWatch) gone(ifindex int, reason string, report func(DeviceEvent)) {
	delete(w.pending, ifindex)
	name, held := w.have[ifindex]
	if !held {
		return
	}
	delete(w.have, ifindex)
	delete(w.seeded, ifindex)
	w.d.maps.devMu.Lock()
	err := w.d.DetachDevice(name, ifindex)
	w.d.maps.devMu.Unlock()
	report(DeviceEvent{Device: name, Ifindex: ifindex, Reason: reason, Err: err})
	w.retryPending(report)
}

// AttachDevice gives device dev (ifindex, in the caller's network
// namespace) what AttachDevices gives each of its devices, after the
// start (Commit): the tc programs, XDP as configured, and its
// sluice_devices entries. If the entry cannot be written (the map is
// full: --max-devices), the programs are taken off again.
func (d *Datapath) AttachDevice(dev string, ifindex int) error {
	return d.attachDevice(dev, ifindex, 0)
}

// attachDevice is AttachDevice, its entry flagged mark beside what the
// device is (deviceFlags): nodeDevFollowed from the tunnel watch, none
// from the --devices pattern watch.
func (d *Datapath) attachDevice(dev string, ifindex int, mark uint32) error {
	flags, err := deviceFlags(dev)
	if err != nil {
		return err
	}
	flags |= mark
	if err := d.maps.markL3(ifindex, flags&nodeDevL3 != 0); err != nil {
		return d.recordError(dev, err)
	}
	err = func() error {
		for _, dir := range []tcDir{tcIngress, tcEgress} {
			if err := d.attachTC(dev, ifindex, dir); err != nil {
				return err
			}
		}
		if err := d.attachXDP(dev, ifindex, flags&nodeDevTunnel != 0); err != nil {
			return err
		}
		var addr, addr6 netip.Addr
		if addr, err = deviceAddr(dev, d.cfg.NodeIPs, netlink.FAMILY_V4); err != nil {
			return err
		}
		if addr6, err = deviceAddr(dev, d.cfg.NodeIPs, netlink.FAMILY_V6); err != nil {
			return err
		}
		if err := d.maps.setNodeDevice(ifindex, addr, flags|nodeDevTC); err != nil {
			return d.recordError(dev, err)
		}
		if err := d.maps.setNodeDevice6(ifindex, addr6); err != nil {
			return d.recordError(dev, err)
		}
		return nil
	}()
	if err != nil {
		return errors.Join(err, d.DetachDevice(dev, ifindex))
	}
	return nil
}

// DetachDevice removes what AttachDevice gave device dev (ifindex): the
// pins of its links (detaching them if the device is still there, renamed
// or no longer wanted), Sluice's clsact filters on it, and its
// sluice_devices entries. A pin under dev's name whose link is on another
// live device (a new dev) stays.
func (d *Datapath) DetachDevice(dev string, ifindex int) error {
	var errs []error
	// First: no reply is passed up for this device's egress to translate
	// while its programs go (clearNodeDevTC).
	if err := d.maps.clearNodeDevTC(uint32(ifindex)); err != nil {
		errs = append(errs, fmt.Errorf("forget node device %s: %w", dev, err))
	}
	for _, p := range devicePinPrefixes {
		pin := d.linkPin(p + dev)
		if !pinnedLinkOn(pin, ifindex) {
			continue
		}
		if err := detachPinnedLink(pin); err != nil {
			errs = append(errs, fmt.Errorf("detach %s%s: %w", p, dev, err))
		}
	}
	for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
		// A device that is gone took its filters with it.
		if err := removeSluiceFilters(ifindex, parent, nil); err != nil && !errors.As(err, new(netlink.LinkNotFoundError)) {
			errs = append(errs, fmt.Errorf("remove clsact filters of %s: %w", dev, err))
		}
	}
	if err := errors.Join(deleteIgnoringMissing(d.maps.devices, uint32(ifindex)), deleteIgnoringMissing(d.maps.devices6, uint32(ifindex))); err != nil {
		errs = append(errs, fmt.Errorf("forget node device %s: %w", dev, err))
	}
	errs = append(errs, d.maps.syncL3Gate()) // it may have been the last L3 one
	return errors.Join(errs...)
}

// deviceAttached says whether this build's programs are on device dev
// (ifindex) and recorded: its tcx links pinned under its name run them
// there, and its sluice_devices entry says tc is on it. (A kernel
// without tcx: never, AttachDevice replaces its filters in place.)
func (d *Datapath) deviceAttached(dev string, ifindex int) bool {
	var nd sockNodeDev
	if err := d.maps.devices.Lookup(uint32(ifindex), &nd); err != nil || nd.Flags&nodeDevTC == 0 {
		return false
	}
	for _, dir := range []tcDir{tcIngress, tcEgress} {
		l, err := loadPinnedLink(d.linkPin("tcx_" + dir.name + "_" + dev))
		if err != nil || l == nil {
			return false
		}
		info, err := l.Info()
		l.Close()
		if err != nil || info.TCX() == nil || int(info.TCX().Ifindex) != ifindex {
			return false
		}
		pi, err := d.tcProg(dir).Info()
		if err != nil {
			return false
		}
		if id, ok := pi.ID(); !ok || id != info.Program {
			return false
		}
	}
	return true
}

// pinnedLinkOn says whether the link pinned at pin is on device ifindex,
// or on no device any more (its device was deleted: ifindex 0), or cannot
// be read (a stale pin).
func pinnedLinkOn(pin string, ifindex int) bool {
	l, err := loadPinnedLink(pin)
	if err != nil {
		return true
	}
	if l == nil {
		return false
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		return true
	}
	var on int
	switch {
	case info.TCX() != nil:
		on = int(info.TCX().Ifindex)
	case info.XDP() != nil:
		on = int(info.XDP().Ifindex)
	default:
		return true
	}
	return on == 0 || on == ifindex
}
