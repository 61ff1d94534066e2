package datapath

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Attachments are bpf_links pinned under BPFFS/sluice/links/ (names below),
// so they stay after the agent exits. Re-attaching updates the program of
// a pinned link in place (link.Update): no moment without a program. A
// pinned link that points somewhere else (another cgroup, a device that was
// recreated) is replaced make-before-break: the new link is attached before
// the old one is unpinned and closed.
//
// Kernels without tcx get a clsact qdisc and direct-action bpf filters
// instead, named with filterPrefix so Cleanup can find them.

const filterPrefix = "sluice_"

type cgroupProg struct {
	name   string
	attach ebpf.AttachType
	prog   func(*Datapath) *ebpf.Program
}

var cgroupProgs = []cgroupProg{
	{"connect4", ebpf.AttachCGroupInet4Connect, func(d *Datapath) *ebpf.Program { return d.sock.SluiceConnect4 }},
	{"sendmsg4", ebpf.AttachCGroupUDP4Sendmsg, func(d *Datapath) *ebpf.Program { return d.sock.SluiceSendmsg4 }},
	{"recvmsg4", ebpf.AttachCGroupUDP4Recvmsg, func(d *Datapath) *ebpf.Program { return d.sock.SluiceRecvmsg4 }},
	{"getpeername4", ebpf.AttachCgroupInet4GetPeername, func(d *Datapath) *ebpf.Program { return d.sock.SluiceGetpeername4 }},
}

// A link's pin is named after its hook (cgroup_getpeername4), not after
// its program, and re-attaching updates the program behind the pinned
// link: a program renamed between releases (sluice_getpeer4 became
// sluice_getpeername4) replaces its predecessor in place.

func (d *Datapath) linkPin(name string) string { return filepath.Join(d.dir, "links", name) }

// AttachCgroup attaches the four socket programs to the cgroup v2 directory
// path (normally the root of the cgroup2 mount, see CgroupV2Mount).
func (d *Datapath) AttachCgroup(path string) error {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fmt.Errorf("attach cgroup %s: %w", path, err)
	}
	cgroupID := st.Ino // a cgroup2 directory's inode number is its cgroup id

	for _, cp := range cgroupProgs {
		pin := d.linkPin("cgroup_" + cp.name)
		prog := cp.prog(d)
		old, err := loadPinnedLink(pin)
		if err != nil {
			return fmt.Errorf("attach %s to cgroup %s: %w", cp.name, path, err)
		}
		if old != nil {
			info, err := old.Info()
			if err == nil && info.Cgroup() != nil && info.Cgroup().CgroupId == cgroupID {
				err = old.Update(prog)
				old.Close()
				if err != nil {
					return fmt.Errorf("update %s link on cgroup %s: %w", cp.name, path, err)
				}
				continue
			}
		}
		l, err := link.AttachCgroup(link.CgroupOptions{Path: path, Attach: cp.attach, Program: prog})
		if err != nil {
			closeLink(old)
			return fmt.Errorf("attach %s to cgroup %s: %w", cp.name, path, err)
		}
		if err := replacePinned(old, l, pin); err != nil {
			return fmt.Errorf("pin %s link of cgroup %s: %w", cp.name, path, err)
		}
	}
	return nil
}

// AttachDevices attaches the tc programs to ingress and egress of each
// device (names in the caller's network namespace) and records each as a
// node device (sluice_devices) with the address external flows leaving
// through it are source-NATed to; with Config.XDP native or generic it
// also attaches the XDP program (and with off, detaches one an earlier
// agent attached). It is idempotent.
func (d *Datapath) AttachDevices(devs []string) error {
	for _, dev := range devs {
		iface, err := net.InterfaceByName(dev)
		if err != nil {
			return fmt.Errorf("attach to %s: %w", dev, err)
		}
		for _, dir := range []struct {
			name   string
			attach ebpf.AttachType
			parent uint32
			prog   *ebpf.Program
		}{
			{"ingress", ebpf.AttachTCXIngress, netlink.HANDLE_MIN_INGRESS, d.tc.SluiceIngress},
			{"egress", ebpf.AttachTCXEgress, netlink.HANDLE_MIN_EGRESS, d.tc.SluiceEgress},
		} {
			err := d.attachTCX(dev, iface.Index, dir.name, dir.attach, dir.prog)
			if errors.Is(err, ebpf.ErrNotSupported) {
				err = attachClsact(iface.Index, dir.parent, filterPrefix+dir.name, dir.prog)
				if err != nil {
					err = fmt.Errorf("attach tc %s filter to %s: %w", dir.name, dev, err)
				}
			}
			if err != nil {
				return err
			}
		}
		if err := d.attachXDP(dev, iface.Index); err != nil {
			return err
		}
		addr, err := deviceAddr(dev, d.cfg.NodeIPs)
		if err != nil {
			return err
		}
		flags, err := deviceFlags(dev)
		if err != nil {
			return err
		}
		// Its tc programs see what comes back through it.
		flags |= nodeDevTC
		if err := d.maps.setNodeDevice(iface.Index, addr, flags); err != nil {
			return fmt.Errorf("record node device %s: %w", dev, err)
		}
	}
	return nil
}

func (d *Datapath) attachTCX(dev string, ifindex int, dir string, attach ebpf.AttachType, prog *ebpf.Program) error {
	pin := d.linkPin("tcx_" + dir + "_" + dev)
	old, err := loadPinnedLink(pin)
	if err != nil {
		return fmt.Errorf("attach tcx %s to %s: %w", dir, dev, err)
	}
	if old != nil {
		info, err := old.Info()
		if err == nil && info.TCX() != nil && int(info.TCX().Ifindex) == ifindex {
			err = old.Update(prog)
			old.Close()
			if err != nil {
				return fmt.Errorf("update tcx %s link of %s: %w", dir, dev, err)
			}
			return nil
		}
	}
	l, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: attach})
	if err != nil {
		closeLink(old)
		if errors.Is(err, ebpf.ErrNotSupported) {
			return err
		}
		return fmt.Errorf("attach tcx %s to %s: %w", dir, dev, err)
	}
	if err := replacePinned(old, l, pin); err != nil {
		return fmt.Errorf("pin tcx %s link of %s: %w", dir, dev, err)
	}
	return nil
}

// attachXDP attaches the XDP program to dev in the configured mode, pinned
// as xdp_<mode>_<dev>, and removes an attachment in the other mode (the
// kernel allows one mode at a time, so a mode change detaches first).
func (d *Datapath) attachXDP(dev string, ifindex int) error {
	for _, m := range []XDPMode{XDPNative, XDPGeneric} {
		if m == d.cfg.XDP {
			continue
		}
		pin := d.linkPin("xdp_" + string(m) + "_" + dev)
		old, err := loadPinnedLink(pin)
		if err != nil {
			return fmt.Errorf("detach XDP (%s) from %s: %w", m, dev, err)
		}
		if old != nil {
			_ = old.Unpin()
			old.Close()
		}
	}
	if d.cfg.XDP == XDPOff || d.cfg.XDP == "" {
		return nil
	}
	flags := link.XDPGenericMode
	if d.cfg.XDP == XDPNative {
		flags = link.XDPDriverMode
	}
	pin := d.linkPin("xdp_" + string(d.cfg.XDP) + "_" + dev)
	old, err := loadPinnedLink(pin)
	if err != nil {
		return fmt.Errorf("attach XDP to %s: %w", dev, err)
	}
	if old != nil {
		info, err := old.Info()
		if err == nil && info.XDP() != nil && int(info.XDP().Ifindex) == ifindex {
			err = old.Update(d.xdp.SluiceXdp)
			old.Close()
			if err != nil {
				return fmt.Errorf("update XDP link of %s: %w", dev, err)
			}
			return nil
		}
		// The device was re-created: the old link is dead.
		_ = old.Unpin()
		old.Close()
	}
	l, err := link.AttachXDP(link.XDPOptions{Program: d.xdp.SluiceXdp, Interface: ifindex, Flags: flags})
	if err != nil {
		return fmt.Errorf("attach XDP (%s) to %s: %w", d.cfg.XDP, dev, err)
	}
	if err := replacePinned(nil, l, pin); err != nil {
		return fmt.Errorf("pin XDP link of %s: %w", dev, err)
	}
	return nil
}

// attachClsact installs prog as a direct-action bpf filter under parent
// (ingress or egress) of a clsact qdisc, replacing an earlier one.
func attachClsact(ifindex int, parent uint32, name string, prog *ebpf.Program) error {
	qdisc := &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{
			LinkIndex: ifindex,
			Handle:    netlink.MakeHandle(0xffff, 0),
			Parent:    netlink.HANDLE_CLSACT,
		},
		QdiscType: "clsact",
	}
	if err := netlink.QdiscReplace(qdisc); err != nil {
		return fmt.Errorf("add clsact qdisc: %w", err)
	}
	filter := &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: ifindex,
			Parent:    parent,
			Handle:    1,
			Priority:  1,
			Protocol:  unix.ETH_P_ALL,
		},
		Fd:           prog.FD(),
		Name:         name,
		DirectAction: true,
	}
	if err := netlink.FilterReplace(filter); err != nil {
		return fmt.Errorf("add bpf filter: %w", err)
	}
	return nil
}

// loadPinnedLink opens the link pinned at pin, or returns nil if there is
// none.
func loadPinnedLink(pin string) (link.Link, error) {
	l, err := link.LoadPinnedLink(pin, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("load pinned link %s: %w", pin, err)
	}
	return l, nil
}

func closeLink(l link.Link) {
	if l != nil {
		l.Close()
	}
}

// replacePinned pins l at pin in place of old (which may be nil), then
// detaches old: l is attached before old goes away.
func replacePinned(old, l link.Link, pin string) error {
	if old != nil {
		if err := old.Unpin(); err != nil {
			l.Close()
			old.Close()
			return err
		}
	} else if err := os.Remove(pin); err != nil && !errors.Is(err, os.ErrNotExist) {
		// A pin we could not open as a link: stale or foreign.
		l.Close()
		return err
	}
	err := l.Pin(pin)
	if old != nil {
		old.Close()
	}
	if err != nil {
		l.Close()
		return err
	}
	l.Close() // the pin keeps it attached
	return nil
}

// Cleanup removes everything Sluice installed: it detaches and unpins every
// link under bpffs/sluice/links, removes the pinned maps, and deletes the
// clsact bpf filters it added in the caller's network namespace. Traffic to
// services stops being translated. It is idempotent.
func Cleanup(bpffs string) error {
	if bpffs == "" {
		bpffs = DefaultBPFFS
	}
	dir := filepath.Join(bpffs, "sluice")
	var errs []error

	links, err := os.ReadDir(filepath.Join(dir, "links"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("list pinned links: %w", err))
	}
	for _, e := range links {
		pin := filepath.Join(dir, "links", e.Name())
		if l, err := link.LoadPinnedLink(pin, nil); err == nil {
			// Detach even if something else still holds the link.
			// Failure is not an error: a link whose device or
			// cgroup is gone is already detached, and unpinning
			// below releases the link in any case.
			_ = l.Detach()
			l.Close()
		}
		if err := os.Remove(pin); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("unpin %s: %w", pin, err))
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		errs = append(errs, fmt.Errorf("remove pins in %s: %w", dir, err))
	}
	if err := removeClsactFilters(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// removeClsactFilters deletes the bpf filters named filterPrefix* on every
// device's ingress and egress.
func removeClsactFilters() error {
	devs, err := netlink.LinkList()
	if err != nil {
		return fmt.Errorf("list devices: %w", err)
	}
	var errs []error
	for _, dev := range devs {
		for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
			filters, err := netlink.FilterList(dev, parent)
			if err != nil {
				continue // no clsact qdisc on this device
			}
			for _, f := range filters {
				bf, ok := f.(*netlink.BpfFilter)
				if !ok || !strings.HasPrefix(bf.Name, filterPrefix) {
					continue
				}
				if err := netlink.FilterDel(bf); err != nil && !errors.Is(err, unix.ENOENT) {
					errs = append(errs, fmt.Errorf("delete filter %s on %s: %w", bf.Name, dev.Attrs().Name, err))
				}
			}
		}
	}
	return errors.Join(errs...)
}

// CgroupV2Mount returns where the cgroup2 hierarchy is mounted, from
// /proc/self/mountinfo (it is /sys/fs/cgroup on a unified system and often
// /sys/fs/cgroup/unified on a hybrid one).
func CgroupV2Mount() (string, error) {
	mountinfo, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", fmt.Errorf("find cgroup2 mount: %w", err)
	}
	return parseCgroup2Mount(bufio.NewScanner(bytes.NewReader(mountinfo)))
}

// parseCgroup2Mount finds the first cgroup2 mount point in mountinfo lines:
// "36 35 0:30 / /sys/fs/cgroup/unified rw,... shared:9 - cgroup2 cgroup2 rw".
func parseCgroup2Mount(sc *bufio.Scanner) (string, error) {
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		for i, f := range fields {
			if f != "-" {
				continue
			}
			if i+1 < len(fields) && fields[i+1] == "cgroup2" && len(fields) > 4 {
				return unescapeMountinfo(fields[4]), nil
			}
			break
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("find cgroup2 mount: %w", err)
	}
	return "", errors.New("find cgroup2 mount: no cgroup2 file system mounted")
}

// unescapeMountinfo undoes the octal escapes (\040 for a space) of
// mountinfo paths.
func unescapeMountinfo(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
