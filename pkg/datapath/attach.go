package datapath

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
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
// the old one is unpinned and closed. Prune detaches what an earlier agent
// attached and this configuration does not name (a device dropped from
// --devices, --socket-lb=false, --xdp=off).
//
// Kernels without tcx get a clsact qdisc and direct-action bpf filters
// instead, named with filterPrefix so Cleanup can find them, at a priority
// and handle of their own (clsactPriority): a filter of another tool is
// never replaced.

const filterPrefix = "sluice_"

// The clsact filters' place: lower priorities run first. 1 is where tc,
// Cilium and Sluice's release 0 put theirs, and 0xc000 is tc's default;
// Sluice's are between, and the migration shim just before them.
const (
	clsactPriority     = 0x5c
	clsactHandle       = 0x5c
	clsactShimPriority = clsactPriority - 1
)

type cgroupProg struct {
	name   string
	attach ebpf.AttachType
	prog   func(*Datapath) *ebpf.Program
}

var cgroupProgs = []cgroupProg{
	{"connect4", ebpf.AttachCGroupInet4Connect, func(d *Datapath) *ebpf.Program { return d.sock.Connect4 }},
	{"sendmsg4", ebpf.AttachCGroupUDP4Sendmsg, func(d *Datapath) *ebpf.Program { return d.sock.Sendmsg4 }},
	{"recvmsg4", ebpf.AttachCGroupUDP4Recvmsg, func(d *Datapath) *ebpf.Program { return d.sock.Recvmsg4 }},
	{"getpeername4", ebpf.AttachCgroupInet4GetPeername, func(d *Datapath) *ebpf.Program { return d.sock.Getpeername4 }},
	// IPv6 sockets, and dual-stack ones reaching IPv4-mapped addresses.
	{"connect6", ebpf.AttachCGroupInet6Connect, func(d *Datapath) *ebpf.Program { return d.sock.Connect6 }},
	{"sendmsg6", ebpf.AttachCGroupUDP6Sendmsg, func(d *Datapath) *ebpf.Program { return d.sock.Sendmsg6 }},
	{"recvmsg6", ebpf.AttachCGroupUDP6Recvmsg, func(d *Datapath) *ebpf.Program { return d.sock.Recvmsg6 }},
	{"getpeername6", ebpf.AttachCgroupInet6GetPeername, func(d *Datapath) *ebpf.Program { return d.sock.Getpeername6 }},
	// Both families: a closing socket's sock_rev entry goes with it.
	{"sock_release", ebpf.AttachCgroupInetSockRelease, func(d *Datapath) *ebpf.Program { return d.sock.SockRelease }},
}

// sockWrittenMaps are the maps only the socket programs write.
var sockWrittenMaps = map[string]bool{mapSockRev: true, mapUDPStick: true, mapSockRev6: true, mapUDPStick6: true}

// A link's pin is named after its hook (cgroup_getpeername4), not after
// its program, and re-attaching updates the program behind the pinned
// link: a program renamed between releases (sluice_getpeer4 became
// sluice_getpeername4) replaces its predecessor in place.

func (d *Datapath) linkPin(name string) string { return filepath.Join(d.dir, "links", name) }

// Pin name prefixes of the device links: tcx_<dir>_<device>,
// xdp_<mode>_<device>.
var devicePinPrefixes = []string{"tcx_ingress_", "tcx_egress_", "xdp_native_", "xdp_generic_"}

// AttachCgroup attaches the socket programs (cgroupProgs, both families)
// to the cgroup v2 directory path (normally the root of the cgroup2
// mount, see CgroupV2Mount). The socket programs must be loaded
// (Config.DisableSocketLB unset).
func (d *Datapath) AttachCgroup(path string) error {
	if d.sock.Connect4 == nil {
		return fmt.Errorf("attach cgroup %s: socket load balancing is off: its programs are not loaded", path)
	}
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
				if err := d.pins.keepLinkProgram(pin, old); err != nil {
					old.Close()
					return fmt.Errorf("update %s link on cgroup %s: %w", cp.name, path, err)
				}
				err = old.Update(prog)
				old.Close()
				if err != nil {
					return fmt.Errorf("update %s link on cgroup %s: %w", cp.name, path, err)
				}
				continue
			}
		}
		// A link on another cgroup is not put back if the start
		// fails (rollback.go): the new one stays.
		if old == nil {
			if err := d.pins.keepNoLink(pin); err != nil {
				return fmt.Errorf("attach %s to cgroup %s: %w", cp.name, path, err)
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
	// The previous agent's socket programs are gone: what they wrote to
	// maps being resized can be carried over now.
	return d.settle(sockWrittenMaps)
}

// tcDir is one direction of a device's tc hook.
type tcDir struct {
	name   string
	attach ebpf.AttachType
	parent uint32
}

var (
	tcIngress = tcDir{"ingress", ebpf.AttachTCXIngress, netlink.HANDLE_MIN_INGRESS}
	tcEgress  = tcDir{"egress", ebpf.AttachTCXEgress, netlink.HANDLE_MIN_EGRESS}
)

func (d *Datapath) tcProg(dir tcDir) *ebpf.Program {
	if dir == tcIngress {
		return d.tc.SluiceIngress
	}
	return d.tc.SluiceEgress
}

// AttachDevices attaches the tc programs to ingress and egress of each
// device (names in the caller's network namespace) and records each as a
// node device (sluice_devices) with the address external flows leaving
// through it are source-NATed to, flagged followed (nodeDevFollowed)
// if Config.FollowedTunnels names it; with Config.XDP native or generic
// it also attaches the XDP program (and with off, detaches one an
// earlier agent attached). It is idempotent.
//
// When conntrack is being migrated to a new map (migrate.go), the
// migration shims go in front of the programs on every device first, the
// programs are replaced device after device, ingress before egress or the
// other way round as migrating says, and once all are, the rest of the old
// map is carried over, XDP attached and the shims removed. Until Commit,
// each link and program array it changes is noted: a start that fails
// (Abort) puts the previous programs back, and the pins (rollback.go).
func (d *Datapath) AttachDevices(devs []string) error {
	ifindex := make([]int, len(devs))
	for i, dev := range devs {
		iface, err := net.InterfaceByName(dev)
		if err != nil {
			return fmt.Errorf("attach to %s: %w", dev, err)
		}
		ifindex[i] = iface.Index
	}
	// The device entries as they were, for a start that fails (undone
	// last, once the previous programs are back: markL3 writes only what
	// the devices are); then each device's L3 flag made right before a
	// program goes on it (markL3).
	if err := errors.Join(d.pins.keepEntries(d.maps.devices, mapDevices), d.pins.keepEntries(d.maps.devices6, mapDevices6)); err != nil {
		return err
	}
	flags := make([]uint32, len(devs))
	for i, dev := range devs {
		f, err := deviceFlags(dev)
		if err != nil {
			return err
		}
		if f&nodeDevTunnel != 0 && slices.Contains(d.cfg.FollowedTunnels, dev) {
			// Flagged in the record below, not later by the tunnel
			// watch: an agent that stops, or whose watch fails,
			// before the watch runs still has it kept at its restart.
			f |= nodeDevFollowed
		}
		flags[i] = f
		if err := d.maps.markL3(ifindex[i], f&nodeDevL3 != 0); err != nil {
			return d.recordError(dev, err)
		}
	}
	// Before any program of this release goes on a device: the LRU's
	// word set, and kept set until Commit (HoldConntrackNew).
	if err := d.maps.HoldConntrackNew(); err != nil {
		return err
	}
	shim, egressFirst := d.migrating()
	dirs := []tcDir{tcIngress, tcEgress}
	var shims shimLinks
	if shim {
		// On success the last line detaches them and reports how. On
		// an error below, before Commit, they go with the undo, after
		// it has put the previous programs back (noted before the
		// links, undone after them): detaching a tcx link waits for
		// an RCU grace period, milliseconds during which a link this
		// start updated would still run the new programs beside the
		// old ones (a reply at an old egress missing the flow a new
		// ingress started). After Commit, on return.
		detachShims := func() error { return shims.detach() }
		if err := d.pins.note(false, detachShims, func() { _ = detachShims() }); err != nil {
			return err
		}
		if d.pins == nil {
			defer func() { _ = shims.detach() }()
		}
		for i, dev := range devs {
			for _, dir := range dirs {
				if err := d.attachShim(dev, ifindex[i], dir, &shims); err != nil {
					return err
				}
			}
			// XDP, before tc, hands every packet to tc meanwhile.
			if err := d.updateXDPTo(dev, ifindex[i], d.shim.SluiceMigXdp); err != nil {
				return err
			}
		}
		if egressFirst {
			dirs = []tcDir{tcEgress, tcIngress}
		}
	}
	for _, dir := range dirs {
		for i, dev := range devs {
			if err := d.attachTC(dev, ifindex[i], dir); err != nil {
				return err
			}
			if afterAttachTC != nil {
				afterAttachTC(dev)
			}
		}
	}
	if shim {
		if err := d.finishTCSwitch(); err != nil {
			return err
		}
	}
	// Again before the records below (addresses, nodeDevTC): a start
	// that fails puts them back before the previous programs, which read
	// them, return.
	if err := errors.Join(d.pins.keepEntries(d.maps.devices, mapDevices), d.pins.keepEntries(d.maps.devices6, mapDevices6)); err != nil {
		return err
	}
	for i, dev := range devs {
		if err := d.attachXDP(dev, ifindex[i], flags[i]&nodeDevTunnel != 0); err != nil {
			return err
		}
		addr, err := deviceAddr(dev, d.cfg.NodeIPs, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		addr6, err := deviceAddr(dev, d.cfg.NodeIPs, netlink.FAMILY_V6)
		if err != nil {
			return err
		}
		// Its tc programs see what comes back through it.
		if err := d.maps.setNodeDevice(ifindex[i], addr, flags[i]|nodeDevTC); err != nil {
			return d.recordError(dev, err)
		}
		if err := d.maps.setNodeDevice6(ifindex[i], addr6); err != nil {
			return d.recordError(dev, err)
		}
	}
	d.attachedAtStart = map[int]string{}
	for i, dev := range devs {
		d.attachedAtStart[ifindex[i]] = dev
	}
	return shims.detach()
}

// ErrDevicesFull is what attaching a device returns (errors.Is) when
// sluice_devices has no room for its entry: --max-devices devices hold
// entries already.
var ErrDevicesFull = errors.New("no room for another device")

// recordError is err, from writing device dev's entry, naming dev; when
// the map was full (E2BIG), it says ErrDevicesFull and names the map and
// --max-devices.
func (d *Datapath) recordError(dev string, err error) error {
	if errors.Is(err, unix.E2BIG) {
		return fmt.Errorf("record node device %s: %w: %s holds %d devices (--max-devices %d): raise --max-devices: %w",
			dev, ErrDevicesFull, mapDevices, d.cfg.MaxDevices, d.cfg.MaxDevices, err)
	}
	return fmt.Errorf("record node device %s: %w", dev, err)
}

// afterAttachTC, if set (by tests only), is called by AttachDevices each
// time it has attached a tc program to dev.
var afterAttachTC func(dev string)

// attachTC attaches the tc program of dir to dev: a tcx link, or on a
// kernel without tcx a clsact filter. Sluice's clsact filters are removed
// from a device that has the tcx link (left by an agent that ran before the
// kernel was upgraded, they would translate a second time).
func (d *Datapath) attachTC(dev string, ifindex int, dir tcDir) error {
	prog := d.tcProg(dir)
	if err := d.pins.keepFilters(ifindex, dir.parent); err != nil {
		return fmt.Errorf("attach tc %s to %s: %w", dir.name, dev, err)
	}
	err := d.attachTCX(dev, ifindex, dir.name, dir.attach, prog)
	if errors.Is(err, ebpf.ErrNotSupported) {
		if err := attachClsact(ifindex, dir.parent, filterPrefix+dir.name, prog, d.keepFilter); err != nil {
			return fmt.Errorf("attach tc %s filter to %s: %w", dir.name, dev, err)
		}
		return nil
	}
	if err != nil {
		return err
	}
	if err := removeSluiceFilters(ifindex, dir.parent, d.keepFilter); err != nil {
		return fmt.Errorf("remove clsact filters of %s after attaching tcx: %w", dev, err)
	}
	return nil
}

// keepFilter says which of Sluice's clsact filters other than the
// program's own stay: the migration shims while a migration runs.
func (d *Datapath) keepFilter(f *netlink.BpfFilter) bool {
	shim, _ := d.migrating()
	return shim && strings.HasPrefix(f.Name, filterPrefix+"mig_")
}

// attachShim puts the migration shim in front of the tc program of dir on
// dev, for the time of AttachDevices (not pinned: if the agent dies, the
// kernel detaches it).
func (d *Datapath) attachShim(dev string, ifindex int, dir tcDir, shims *shimLinks) error {
	l, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: d.shim.SluiceMigTc, Attach: dir.attach, Anchor: link.Head()})
	if err == nil {
		shims.tcx = append(shims.tcx, l)
		return nil
	}
	if !errors.Is(err, ebpf.ErrNotSupported) {
		return fmt.Errorf("attach migration shim to %s %s: %w", dev, dir.name, err)
	}
	f, err := addClsactFilter(ifindex, dir.parent, clsactShimPriority, clsactHandle, filterPrefix+"mig_"+dir.name, d.shim.SluiceMigTc)
	if err != nil {
		return fmt.Errorf("attach migration shim filter to %s %s: %w", dev, dir.name, err)
	}
	shims.filters = append(shims.filters, f)
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
			if err := d.pins.keepLinkProgram(pin, old); err != nil {
				old.Close()
				return fmt.Errorf("update tcx %s link of %s: %w", dir, dev, err)
			}
			err = old.Update(prog)
			old.Close()
			if err != nil {
				return fmt.Errorf("update tcx %s link of %s: %w", dir, dev, err)
			}
			return nil
		}
	}
	if err := d.pins.keepNoLink(pin); err != nil {
		closeLink(old)
		return fmt.Errorf("attach tcx %s to %s: %w", dir, dev, err)
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

// updateXDPTo makes dev's XDP link, if an earlier agent left one, run
// prog: the migration shim, while conntrack is carried over.
func (d *Datapath) updateXDPTo(dev string, ifindex int, prog *ebpf.Program) error {
	for _, m := range []XDPMode{XDPNative, XDPGeneric} {
		l, err := loadPinnedLink(d.linkPin("xdp_" + string(m) + "_" + dev))
		if err != nil {
			return fmt.Errorf("XDP link of %s: %w", dev, err)
		}
		if l == nil {
			continue
		}
		info, err := l.Info()
		if err == nil && info.XDP() != nil && int(info.XDP().Ifindex) == ifindex {
			if err = d.pins.keepLinkProgram(d.linkPin("xdp_"+string(m)+"_"+dev), l); err == nil {
				err = l.Update(prog)
			}
		}
		l.Close()
		if err != nil {
			return fmt.Errorf("update XDP link of %s: %w", dev, err)
		}
	}
	return nil
}

// attachXDP attaches the XDP program to dev in the configured mode, pinned
// as xdp_<mode>_<dev>, and removes an attachment in the other mode (the
// kernel allows one mode at a time, so a mode change detaches first), or
// in either with XDP off. A tunnel (tunnel: its deviceFlags, which the
// caller has, say nodeDevTunnel) gets none: its packets come decapsulated
// from the stack, not from a wire, and native XDP is not there.
func (d *Datapath) attachXDP(dev string, ifindex int, tunnel bool) error {
	mode := d.cfg.XDP
	if tunnel {
		mode = XDPOff
	}
	for _, m := range []XDPMode{XDPNative, XDPGeneric} {
		if m == mode {
			continue
		}
		if err := d.pins.keepXDPLink(d.linkPin("xdp_"+string(m)+"_"+dev), xdpFlags(m)); err != nil {
			return fmt.Errorf("detach XDP (%s) from %s: %w", m, dev, err)
		}
		if err := detachPinnedLink(d.linkPin("xdp_" + string(m) + "_" + dev)); err != nil {
			return fmt.Errorf("detach XDP (%s) from %s: %w", m, dev, err)
		}
	}
	if mode == XDPOff || mode == "" {
		return nil
	}
	flags := xdpFlags(d.cfg.XDP)
	pin := d.linkPin("xdp_" + string(d.cfg.XDP) + "_" + dev)
	old, err := loadPinnedLink(pin)
	if err != nil {
		return fmt.Errorf("attach XDP to %s: %w", dev, err)
	}
	if old != nil {
		info, err := old.Info()
		if err == nil && info.XDP() != nil && int(info.XDP().Ifindex) == ifindex {
			if err := d.pins.keepLinkProgram(pin, old); err != nil {
				old.Close()
				return fmt.Errorf("update XDP link of %s: %w", dev, err)
			}
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
	if err := d.pins.keepNoLink(pin); err != nil {
		return fmt.Errorf("attach XDP to %s: %w", dev, err)
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

// xdpFlags are the attach flags of XDP mode m (generic unless native).
func xdpFlags(m XDPMode) link.XDPAttachFlags {
	if m == XDPNative {
		return link.XDPDriverMode
	}
	return link.XDPGenericMode
}

// Prune detaches what an earlier agent attached and this configuration
// does not name: the socket programs if cgroup is "" (socket load
// balancing off), the tc and XDP programs of devices not in devices
// (tcx links, clsact filters, their sluice_devices entries), and XDP
// everywhere with XDP off. Call it before the Attach methods; it leaves
// alone what they will replace in place. Pins a previous release left
// under other names are its concern too: anything under links/ that this
// build would not have pinned for this configuration goes.
func (d *Datapath) Prune(cgroup string, devices []string) error {
	var errs []error
	want := map[string]bool{}
	for _, dev := range devices {
		for _, p := range devicePinPrefixes {
			if strings.HasPrefix(p, "xdp_") && p != "xdp_"+string(d.cfg.XDP)+"_" {
				continue
			}
			want[p+dev] = true
		}
	}
	if cgroup != "" {
		for _, cp := range cgroupProgs {
			want["cgroup_"+cp.name] = true
		}
	}
	// The stale devices' entries lose their tc flag before their links
	// go (clearNodeDevTC), then go themselves.
	wantIfindex := map[uint32]bool{}
	for _, dev := range devices {
		if iface, err := net.InterfaceByName(dev); err == nil {
			wantIfindex[uint32(iface.Index)] = true
		}
	}
	var ifidx uint32
	var nd sockNodeDev
	var stale []uint32
	for it := d.maps.devices.Iterate(); it.Next(&ifidx, &nd); {
		if !wantIfindex[ifidx] {
			stale = append(stale, ifidx)
		}
	}
	for _, i := range stale {
		if err := d.maps.clearNodeDevTC(i); err != nil {
			errs = append(errs, err)
		}
	}
	var addr6 sockV6addr
	for it := d.maps.devices6.Iterate(); it.Next(&ifidx, &addr6); {
		if !wantIfindex[ifidx] && !slices.Contains(stale, ifidx) {
			stale = append(stale, ifidx)
		}
	}
	pins, err := os.ReadDir(filepath.Join(d.dir, "links"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("list pinned links: %w", err))
	}
	for _, e := range pins {
		if want[e.Name()] || !ownLinkPin(e.Name()) {
			continue
		}
		if err := detachPinnedLink(d.linkPin(e.Name())); err != nil {
			errs = append(errs, fmt.Errorf("detach %s: %w", e.Name(), err))
		}
	}
	if err := removeClsactFilters(func(l netlink.Link) bool { return wantIfindex[uint32(l.Attrs().Index)] }); err != nil {
		errs = append(errs, err)
	}
	for _, i := range stale {
		if err := errors.Join(deleteIgnoringMissing(d.maps.devices, i), deleteIgnoringMissing(d.maps.devices6, i)); err != nil {
			errs = append(errs, fmt.Errorf("forget node device %d: %w", i, err))
		}
	}
	if len(stale) > 0 {
		// The last L3 device may have gone (devices.go).
		errs = append(errs, d.maps.syncL3Gate())
	}
	// What nothing will replace: no program of the previous agent uses
	// its old maps any more.
	if len(devices) == 0 {
		errs = append(errs, d.finishTCSwitch())
	}
	if cgroup == "" {
		errs = append(errs, d.settle(sockWrittenMaps))
	}
	// With XDP off, nothing tail-calls the IPv6 XDP program an earlier
	// agent left in its pinned program array: the pin goes, and the
	// program with it.
	if d.cfg.XDP == XDPOff {
		if err := os.Remove(filepath.Join(d.dir, mapXDP6)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("unpin %s: %w", mapXDP6, err))
		}
	}
	return errors.Join(errs...)
}

// ownLinkPin reports whether name is a pin this package makes under
// links/ (anything else there is left alone).
func ownLinkPin(name string) bool {
	if strings.HasPrefix(name, "cgroup_") {
		return true
	}
	for _, p := range devicePinPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// detachPinnedLink detaches the link pinned at pin, if there is one, and
// removes the pin.
func detachPinnedLink(pin string) error {
	l, err := link.LoadPinnedLink(pin, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err == nil {
		// A link whose device or cgroup is gone is detached already;
		// removing the pin releases it in any case.
		_ = l.Detach()
		l.Close()
	}
	if err := os.Remove(pin); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// attachClsact installs prog as Sluice's direct-action bpf filter under
// parent (ingress or egress) of a clsact qdisc, at clsactPriority and
// clsactHandle, replacing Sluice's filter there in one step, and then
// removes the other Sluice filters of parent that keep does not keep
// (release 0 put its own at priority 1). A filter of another tool in that
// place is an error, never replaced.
func attachClsact(ifindex int, parent uint32, name string, prog *ebpf.Program, keep func(*netlink.BpfFilter) bool) error {
	if _, err := addClsactFilter(ifindex, parent, clsactPriority, clsactHandle, name, prog); err != nil {
		return err
	}
	return removeSluiceFilters(ifindex, parent, func(f *netlink.BpfFilter) bool {
		return (f.Priority == clsactPriority && f.Handle == clsactHandle) || (keep != nil && keep(f))
	})
}

// addClsactFilter installs prog as the filter name at prio and handle of
// parent, adding a clsact qdisc if there is none, unless a filter not
// named filterPrefix* is there.
func addClsactFilter(ifindex int, parent uint32, prio uint16, handle uint32, name string, prog *ebpf.Program) (*netlink.BpfFilter, error) {
	qdisc := &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{
			LinkIndex: ifindex,
			Handle:    netlink.MakeHandle(0xffff, 0),
			Parent:    netlink.HANDLE_CLSACT,
		},
		QdiscType: "clsact",
	}
	if err := netlink.QdiscReplace(qdisc); err != nil {
		return nil, fmt.Errorf("add clsact qdisc: %w", err)
	}
	l, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		return nil, err
	}
	filters, err := netlink.FilterList(l, parent)
	if err != nil {
		return nil, fmt.Errorf("list filters: %w", err)
	}
	for _, f := range filters {
		a := f.Attrs()
		if a.Priority != prio || a.Handle != handle {
			continue
		}
		if bf, ok := f.(*netlink.BpfFilter); !ok || !strings.HasPrefix(bf.Name, filterPrefix) {
			return nil, fmt.Errorf("a filter of another tool (%s %q) is at priority %d handle %#x: not replacing it",
				f.Type(), filterName(f), prio, handle)
		}
	}
	filter := &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: ifindex,
			Parent:    parent,
			Handle:    handle,
			Priority:  prio,
			Protocol:  unix.ETH_P_ALL,
		},
		Fd:           prog.FD(),
		Name:         name,
		DirectAction: true,
	}
	if err := netlink.FilterReplace(filter); err != nil {
		return nil, fmt.Errorf("add bpf filter: %w", err)
	}
	return filter, nil
}

func filterName(f netlink.Filter) string {
	if bf, ok := f.(*netlink.BpfFilter); ok {
		return bf.Name
	}
	return ""
}

// removeSluiceFilters deletes the filters named filterPrefix* of parent
// on ifindex that keep does not keep.
func removeSluiceFilters(ifindex int, parent uint32, keep func(*netlink.BpfFilter) bool) error {
	l, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		return err
	}
	filters, err := netlink.FilterList(l, parent)
	if err != nil {
		return nil // no clsact qdisc: no filters
	}
	var errs []error
	for _, f := range filters {
		bf, ok := f.(*netlink.BpfFilter)
		if !ok || !strings.HasPrefix(bf.Name, filterPrefix) || (keep != nil && keep(bf)) {
			continue
		}
		if err := netlink.FilterDel(bf); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("delete filter %s: %w", bf.Name, err))
		}
	}
	return errors.Join(errs...)
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
	if err := refuseDefaultBPFFSInTest(bpffs); err != nil {
		return err
	}
	dir := filepath.Join(bpffs, "sluice")
	var errs []error

	// Every device's entry loses its tc flag before any link goes, as
	// on the normal detach path (clearNodeDevTC): otherwise, while the
	// links go one by one, a DNAT-only reply would still be passed up
	// untranslated (tc_rev_at_egress) to an egress whose program is gone.
	if err := clearPinnedNodeDevTC(filepath.Join(dir, mapDevices)); err != nil {
		errs = append(errs, err)
	}
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
	if err := removeClsactFilters(nil); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// clearPinnedNodeDevTC clears the nodeDevTC flag of every entry of the
// node-device map pinned at pin (Cleanup has no Maps). No pin: nothing.
func clearPinnedNodeDevTC(pin string) error {
	m, err := loadPinnedNodeDevs(pin, nil)
	if m == nil || err != nil {
		return err
	}
	defer m.Close()
	tc, err := nodeDevsWith(m, nodeDevTC)
	if err != nil {
		return err
	}
	var nd sockNodeDev
	var errs []error
	for _, i := range tc {
		if err := m.Lookup(i, &nd); err != nil {
			if !errors.Is(err, ebpf.ErrKeyNotExist) {
				errs = append(errs, fmt.Errorf("look up node device %d: %w", i, err))
			}
			continue
		}
		nd.Flags &^= nodeDevTC
		if err := m.Update(i, &nd, ebpf.UpdateExist); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("clear the tc flag of node device %d: %w", i, err))
		}
	}
	return errors.Join(errs...)
}

// removeClsactFilters deletes the bpf filters named filterPrefix* on the
// ingress and egress of every device but those skip skips.
func removeClsactFilters(skip func(netlink.Link) bool) error {
	devs, err := netlink.LinkList()
	if err != nil {
		return fmt.Errorf("list devices: %w", err)
	}
	var errs []error
	for _, dev := range devs {
		if skip != nil && skip(dev) {
			continue
		}
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
