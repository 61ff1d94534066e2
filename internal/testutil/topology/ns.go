package topology

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NS is one named network namespace.
type NS struct {
	// Name is the namespace's name, as `ip netns list` shows it.
	Name string
	// Path is the namespace's bind mount, for nsenter --net=PATH.
	Path string

	topo   *Topology
	handle netns.NsHandle
	nl     *netlink.Handle // a netlink socket inside the namespace
}

func createNS(topo *Topology, name string) (_ *NS, err error) {
	path := filepath.Join(netnsDir, name)
	runtime.LockOSThread()
	origin, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("get current netns: %w", err)
	}
	defer origin.Close()
	handle, createErr := netns.NewNamed(name) // moves this thread into it
	if err := netns.Set(origin); err != nil {
		// The thread is stuck in another namespace: leave it locked so the
		// runtime throws it away when this goroutine exits.
		return nil, fmt.Errorf("restore netns after creating %s: %w", name, err)
	}
	runtime.UnlockOSThread()
	if createErr != nil {
		_ = unmountAndRemove(path)
		return nil, fmt.Errorf("create netns %s: %w", name, createErr)
	}
	ns := &NS{Name: name, Path: path, topo: topo, handle: handle}
	if ns.nl, err = netlink.NewHandleAt(handle); err != nil {
		_ = ns.destroy()
		return nil, fmt.Errorf("netlink handle in %s: %w", name, err)
	}
	if err := ns.LinkUp("lo"); err != nil {
		_ = ns.destroy()
		return nil, err
	}
	return ns, nil
}

// destroy removes the namespace's name. The kernel frees the namespace, and
// the veths in it, once no socket or process refers to it any more.
func (n *NS) destroy() error {
	if n.nl != nil {
		n.nl.Close()
	}
	n.handle.Close()
	if err := unmountAndRemove(n.Path); err != nil {
		return fmt.Errorf("delete netns %s: %w", n.Name, err)
	}
	return nil
}

func unmountAndRemove(path string) error {
	err := unix.Unmount(path, unix.MNT_DETACH)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// Do runs fn on an OS thread that has joined the namespace. Sockets fn
// creates belong to the namespace for good. fn must not rely on goroutines
// it starts being in the namespace: they run on other threads.
func (n *NS) Do(fn func() error) error {
	runtime.LockOSThread()
	origin, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("get current netns: %w", err)
	}
	defer origin.Close()
	if err := netns.Set(n.handle); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("enter netns %s: %w", n.Name, err)
	}
	fnErr := fn()
	if err := netns.Set(origin); err != nil {
		// Leave the thread locked: the runtime discards it with the goroutine.
		return errors.Join(fnErr, fmt.Errorf("leave netns %s: %w", n.Name, err))
	}
	runtime.UnlockOSThread()
	return fnErr
}

// Enter locks the calling goroutine to its OS thread and moves the thread
// into the namespace until t ends, when it moves back. Sockets, netlink
// requests and BPF_PROG_TEST_RUN contexts this goroutine makes meanwhile
// happen inside the namespace. Subtests run on goroutines of their own
// and must call Enter again.
func (n *NS) Enter(t testing.TB) {
	t.Helper()
	runtime.LockOSThread()
	origin, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("get current netns: %v", err)
	}
	if err := netns.Set(n.handle); err != nil {
		origin.Close()
		runtime.UnlockOSThread()
		t.Fatalf("enter netns %s: %v", n.Name, err)
	}
	t.Cleanup(func() {
		defer origin.Close()
		if err := netns.Set(origin); err != nil {
			// Leave the thread locked: the runtime discards it with
			// the goroutine.
			t.Errorf("leave netns %s: %v", n.Name, err)
			return
		}
		runtime.UnlockOSThread()
	})
}

// Fd is the namespace's file descriptor, for moving a device into it
// (netlink.LinkSetNsFd). It stays valid until the topology closes.
func (n *NS) Fd() int { return int(n.handle) }

// LinkUp sets dev up.
func (n *NS) LinkUp(dev string) error {
	link, err := n.nl.LinkByName(dev)
	if err != nil {
		return fmt.Errorf("find %s in %s: %w", dev, n.Name, err)
	}
	if err := n.nl.LinkSetUp(link); err != nil {
		return fmt.Errorf("set %s up in %s: %w", dev, n.Name, err)
	}
	return nil
}

// AddAddr assigns addr (with its prefix length) to dev.
func (n *NS) AddAddr(dev string, addr netip.Prefix) error {
	link, err := n.nl.LinkByName(dev)
	if err != nil {
		return fmt.Errorf("find %s in %s: %w", dev, n.Name, err)
	}
	a := &netlink.Addr{IPNet: &net.IPNet{IP: addr.Addr().AsSlice(), Mask: net.CIDRMask(addr.Bits(), addr.Addr().BitLen())}}
	if addr.Addr().Is6() {
		// Usable at once: without nodad an IPv6 address is tentative
		// for a second or two (duplicate address detection), and
		// binding to it fails. Addresses in a test's namespaces are
		// the test's to choose: there is nothing to detect.
		a.Flags = unix.IFA_F_NODAD
	}
	if err := n.nl.AddrAdd(link, a); err != nil {
		return fmt.Errorf("add %s to %s in %s: %w", addr, dev, n.Name, err)
	}
	return nil
}

// WaitLocal waits until a, an address just added to an up device, routes
// as local. The kernel routes even a nodad IPv6 address as local only once
// its address work has run, a moment after the add: a connect to it before
// that fails with ENETUNREACH.
func (n *NS) WaitLocal(a netip.Addr) error {
	var rs []netlink.Route
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if rs, err = n.nl.RouteGet(a.AsSlice()); err == nil && len(rs) > 0 && rs[0].Type == unix.RTN_LOCAL {
			return nil
		}
	}
	return fmt.Errorf("%s in %s: not routed as local 10s after it was added (%v, %v)", a, n.Name, rs, err)
}

// WaitDAD waits until no IPv6 address of dev is tentative. The kernel's
// own link-local address of a device goes through duplicate address
// detection for a second or two after the device comes up, whatever
// AddAddr's addresses skip; until it is done, a packet the namespace
// forwards through dev to a neighbour not yet resolved waits without a
// neighbour solicitation (one needs a source address of dev's, the
// link-local, or the forwarded packet's own, not the namespace's), and
// after three such tries it is dropped: a single datagram forwarded in
// that moment is lost, where IPv4's ARP would have gone out at once.
func (n *NS) WaitDAD(dev string) error {
	link, err := n.nl.LinkByName(dev)
	if err != nil {
		return fmt.Errorf("find %s in %s: %w", dev, n.Name, err)
	}
	var as []netlink.Addr
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if as, err = n.nl.AddrList(link, netlink.FAMILY_V6); err != nil {
			return fmt.Errorf("addresses of %s in %s: %w", dev, n.Name, err)
		}
		if !slices.ContainsFunc(as, func(a netlink.Addr) bool { return a.Flags&unix.IFA_F_TENTATIVE != 0 }) {
			return nil
		}
	}
	return fmt.Errorf("%s in %s: addresses still tentative 10s on: %v", dev, n.Name, as)
}

// AddRoute routes dst via the gateway via, which must be on a connected
// subnet.
func (n *NS) AddRoute(dst netip.Prefix, via netip.Addr) error {
	dst = dst.Masked()
	r := &netlink.Route{
		Dst: &net.IPNet{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(dst.Bits(), dst.Addr().BitLen())},
		Gw:  via.AsSlice(),
	}
	if err := n.nl.RouteAdd(r); err != nil {
		return fmt.Errorf("add route %s via %s in %s: %w", dst, via, n.Name, err)
	}
	return nil
}

// Sysctl writes a namespaced sysctl, e.g. Sysctl("net/ipv4/ip_forward", "1").
// /proc/sys/net follows the network namespace of the thread that opens it.
func (n *NS) Sysctl(key, value string) error {
	return n.Do(func() error {
		p := filepath.Join("/proc/sys", strings.ReplaceAll(key, ".", "/"))
		if err := os.WriteFile(p, []byte(value), 0o644); err != nil {
			return fmt.Errorf("sysctl %s=%s in %s: %w", key, value, n.Name, err)
		}
		return nil
	})
}

// Listen opens a stream listener inside the namespace.
func (n *NS) Listen(network, addr string) (l net.Listener, err error) {
	err = n.Do(func() error {
		l, err = net.Listen(network, addr)
		return err
	})
	return l, err
}

// ListenPacket opens a datagram socket inside the namespace.
func (n *NS) ListenPacket(network, addr string) (c net.PacketConn, err error) {
	err = n.Do(func() error {
		c, err = net.ListenPacket(network, addr)
		return err
	})
	return c, err
}

// DialContext connects from inside the namespace. The connection attempt
// runs on the locked thread; once created, the socket stays in the
// namespace.
func (n *NS) DialContext(ctx context.Context, network, addr string) (c net.Conn, err error) {
	err = n.Do(func() error {
		var d net.Dialer
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// HTTPClient returns a client whose connections start inside the namespace.
// Keep-alives are off, so every request is a new connection (and a new
// load-balancing decision).
func (n *NS) HTTPClient(timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			DialContext:       n.DialContext,
			DisableKeepAlives: true,
		},
	}
}

// Run runs name with args inside the namespace and waits for it; its
// combined output is in the error if it fails. For one-off configuration
// this package has no method for (ip rule, nft).
func (n *NS) Run(ctx context.Context, name string, args ...string) error {
	out, err := n.Command(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s in %s: %w: %s", name, strings.Join(args, " "), n.Name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Command returns a command that runs inside the namespace through nsenter.
// Only the network namespace changes: the mount namespace, and so
// /sys/fs/bpf and the cgroup filesystem, stay the host's.
func (n *NS) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + n.Path, "--", name}, args...)...)
}
