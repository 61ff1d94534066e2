package datapath

// Following the node devices' masters: a device the agent attached to is
// recorded with nodeDevPort while it is a port of a bridge, bond, team or
// Open vSwitch (devices.go, deviceFlags), whose frames to another host's
// MAC tc answers (bpf/lib/icmp.h, icmp_link_answerable), as the kernel
// does as soon as a device is enslaved or released. WatchPorts follows
// netlink's link messages and updates the flag of an attached device
// whose master changed, while the agent runs.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// PortWatch is a running WatchPorts.
type PortWatch struct {
	stop     chan struct{}
	stopOnce sync.Once
	closing  atomic.Bool // Close stopped it
	done     chan struct{}
	err      error
}

// WatchPorts follows the links of the calling thread's network
// namespace: each message about a device recorded as attached
// (nodeDevTC in sluice_devices) sets or clears its nodeDevPort to say
// whether its master now is a bridge, bond, team or Open vSwitch. It
// subscribes and asks for every link, so that a change made before it
// (since the attach) is followed too, and returns; changed is called
// with each device whose flag it changed (nil: not). A removed device
// is left as it is (its entry is the attach's business). The watch ends
// on an error (a lost message: the socket overran), which Close returns;
// a new one starts over from the list of links. A list interrupted by a
// change is made again.
func (d *Datapath) WatchPorts(changed func(ifindex int, name string, port bool)) (*PortWatch, error) {
	w := &PortWatch{stop: make(chan struct{}), done: make(chan struct{})}
	// Masters are looked up in the caller's namespace, from the
	// goroutine below, whichever thread runs it.
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink handle: %w", err)
	}
	// isPort reads the device's master now, not the message's: a
	// message queued before a later change (the subscription's own
	// list, or one older than a relist) would set the flag back.
	isPort := func(ifindex int) (bool, error) {
		l, err := h.LinkByIndex(ifindex)
		if err != nil {
			return false, err
		}
		if l.Attrs().MasterIndex == 0 {
			return false, nil
		}
		m, err := h.LinkByIndex(l.Attrs().MasterIndex)
		if err != nil {
			return false, err
		}
		return isPortMaster(m), nil
	}
	ch := make(chan netlink.LinkUpdate, 64)
	// failed ends the watch with an error; recvErr is the subscription's
	// last error, the cause when it closes ch of itself (a receive that
	// failed).
	var mu sync.Mutex
	var failed, recvErr error
	var relist atomic.Bool
	fail := func(err error) {
		mu.Lock()
		failed = errors.Join(failed, err)
		mu.Unlock()
		w.stopOnce.Do(func() { close(w.stop) })
	}
	err = netlink.LinkSubscribeWithOptions(ch, w.stop, netlink.LinkSubscribeOptions{
		ListExisting:      true,
		ReceiveBufferSize: 1 << 20, // as DeviceWatch's: a burst of pods' links

		ErrorCallback: func(err error) {
			if errors.Is(err, netlink.ErrDumpInterrupted) {
				// The list may have missed a link (one changed
				// while it was made): listed again below.
				relist.Store(true)
				return
			}
			mu.Lock()
			recvErr = err
			mu.Unlock()
		},
	})
	if err != nil {
		close(w.stop)
		h.Close()
		return nil, fmt.Errorf("subscribe to link changes: %w", err)
	}
	go func() {
		defer close(w.done)
		defer h.Close()
		for u := range ch {
			if u.Header.Type != unix.RTM_NEWLINK {
				continue
			}
			ifindex := u.Attrs().Index
			port, err := d.maps.syncDevicePort(ifindex, isPort)
			if err != nil {
				fail(err)
				break
			}
			if port != nil && changed != nil {
				changed(ifindex, u.Attrs().Name, *port)
			}
			if relist.Swap(false) {
				if err := d.relistPorts(h, isPort, changed); err != nil {
					fail(err)
					break
				}
			}
		}
		// The subscription closes ch once its socket is closed (stop)
		// or a receive failed (an overrun: messages lost).
		for range ch {
		}
		mu.Lock()
		defer mu.Unlock()
		switch {
		case failed != nil:
			w.err = failed
		case !w.closing.Load():
			w.err = fmt.Errorf("receive link changes: %w", recvErr)
		}
	}()
	return w, nil
}

// relistPorts syncs the port flag of every link (syncDevicePort), as
// h lists them now: after the subscription's list was interrupted by a
// change. A list interrupted again is made again (listLinks).
func (d *Datapath) relistPorts(h *netlink.Handle, isPort func(int) (bool, error), changed func(int, string, bool)) error {
	links, err := listLinks(h.LinkList)
	if err != nil {
		return fmt.Errorf("list links: %w", err)
	}
	for _, l := range links {
		port, err := d.maps.syncDevicePort(l.Attrs().Index, isPort)
		if err != nil {
			return err
		}
		if port != nil && changed != nil {
			changed(l.Attrs().Index, l.Attrs().Name, *port)
		}
	}
	return nil
}

// Done is closed when the watch ends: after Close, or on an error, which
// Close returns.
func (w *PortWatch) Done() <-chan struct{} { return w.done }

// Close stops the watch and returns the error that ended it, if one did.
func (w *PortWatch) Close() error {
	w.stopOnce.Do(func() {
		w.closing.Store(true)
		close(w.stop)
	})
	<-w.done
	return w.err
}

// syncDevicePort makes the nodeDevPort flag of device ifindex's entry
// say whether the device's master now is a port master (isPort: its
// master read now, isPortMaster of it; false for none), if the device
// is one the agent attached to (its entry has nodeDevTC). It returns
// the new value when it changed it, nil when it wrote nothing. A device
// or master that is gone by the time it is looked up leaves the flag as
// it is: the device's next message (its master cleared) says so.
func (m *Maps) syncDevicePort(ifindex int, isPort func(ifindex int) (bool, error)) (*bool, error) {
	m.devMu.Lock()
	defer m.devMu.Unlock()
	var v sockNodeDev
	if err := m.devices.Lookup(uint32(ifindex), &v); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("look up %s: %w", mapDevices, err)
	}
	if v.Flags&nodeDevTC == 0 {
		return nil, nil
	}
	port, err := isPort(ifindex)
	if err != nil {
		return nil, nil //nolint:nilerr // gone: see above
	}
	if (v.Flags&nodeDevPort != 0) == port {
		return nil, nil
	}
	var addr netip.Addr
	if v.Addr != 0 {
		addr = addrFromBE32(v.Addr)
	}
	if err := m.setNodeDevice(ifindex, addr, v.Flags^nodeDevPort); err != nil {
		return nil, fmt.Errorf("record node device %d: %w", ifindex, err)
	}
	return &port, nil
}

// FollowPorts runs WatchPorts, once the start is complete (Commit:
// AttachDevices has recorded the devices), until ctx is done, logging
// each flag it changes. A watch that fails is logged and started again
// after retry (from the list of links: nothing is missed but the time
// between).
func (d *Datapath) FollowPorts(ctx context.Context, retry time.Duration, log *slog.Logger) {
	if !d.waitCommitted(ctx) {
		return
	}
	changed := func(ifindex int, name string, port bool) {
		log.Info("node device's master changed: frames to another MAC answered with ICMP errors only on a port of a bridge, bond, team or Open vSwitch",
			"device", name, "ifindex", ifindex, "port", port)
	}
	FollowWatch(ctx, func() (*PortWatch, error) { return d.WatchPorts(changed) }, retry, log,
		"following the node devices' masters", "a device enslaved or released meanwhile keeps its port flag")
}

// waitCommitted waits for Commit; false if ctx is done first.
func (d *Datapath) waitCommitted(ctx context.Context) bool {
	select {
	case <-d.committed:
		return true
	case <-ctx.Done():
		return false
	}
}
