package datapath

// The node devices (sluice_devices, and sluice6_devices for their IPv6
// addresses): which address external flows leaving through a device are
// source-NATed to, which devices have no link-layer header, and the lookups of devices and addresses the agent's flags
// default from.

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// setNodeDevice records dev (ifindex) as a node device whose address is
// the SNAT source for flows leaving through it, with its flags
// (nodeDevL3). A device without an IPv4 address is not an IPv4 SNAT
// source: it is recorded with address 0 if it has flags, else forgotten.
//
// The programs ask the map whether a device is L3 only while
// dev_l3_maybe says one may be (bpf/lib/parse.h), so the word changes
// make-before-break: set before an L3 device's entry is written, cleared
// only after the write that left none (syncL3Gate). XDP's
// dev_tunnel_maybe (bpf/lib/nat.h) is kept so for tunnels (nodeDevTunnel). (The word is a store
// to mapped memory; the map update publishes its entry with a release
// store, after it.)
func (m *Maps) setNodeDevice(ifindex int, addr netip.Addr, flags uint32) error {
	if flags&nodeDevL3 != 0 {
		if err := m.setL3Gate(true); err != nil {
			return err
		}
	}
	if flags&nodeDevTunnel != 0 {
		if err := setGates(m.tunGates, "dev_tunnel_maybe", true); err != nil {
			return err
		}
	}
	var err error
	if !addr.IsValid() && flags == 0 {
		err = deleteIgnoringMissing(m.devices, uint32(ifindex))
	} else {
		v := sockNodeDev{Flags: flags}
		if addr.IsValid() {
			v.Addr = be32(addr)
		}
		err = m.devices.Put(uint32(ifindex), &v)
	}
	if err != nil || flags&(nodeDevL3|nodeDevTunnel) == nodeDevL3|nodeDevTunnel {
		return err
	}
	// It may have replaced or removed the last L3 or tunnel entry.
	return m.syncL3Gate()
}

// clearNodeDevTC clears the nodeDevTC flag of device ifindex's entry,
// keeping its address and other flags, before its tc programs are
// detached (DetachDevice, Prune). Otherwise, until the entry goes, a
// DNAT-only reply at another device's ingress whose route leaves by this
// one would still be passed up untranslated for an egress program that
// is no longer there (rev_at_egress4, rev_at_egress6). No entry: nothing.
// It takes no lock: the device watch calls DetachDevice holding devMu,
// Prune runs before the watch starts.
func (m *Maps) clearNodeDevTC(ifindex uint32) error {
	var v sockNodeDev
	if err := m.devices.Lookup(ifindex, &v); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		return fmt.Errorf("look up %s: %w", mapDevices, err)
	}
	if v.Flags&nodeDevTC == 0 {
		return nil
	}
	v.Flags &^= nodeDevTC
	if err := m.devices.Update(ifindex, &v, ebpf.UpdateExist); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("clear the tc flag of node device %d: %w", ifindex, err)
	}
	return nil
}

// markDevice adds flag (nodeDevFollowed) to device ifindex's entry if it
// is one the agent attached tc to (nodeDevTC), keeping its address and
// other flags; no such entry, or the flag set already: nothing. The
// caller holds devMu (the port watch rewrites entries too).
func (m *Maps) markDevice(ifindex int, flag uint32) error {
	var v sockNodeDev
	if err := m.devices.Lookup(uint32(ifindex), &v); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		return fmt.Errorf("look up %s: %w", mapDevices, err)
	}
	if v.Flags&nodeDevTC == 0 || v.Flags&flag == flag {
		return nil
	}
	v.Flags |= flag
	if err := m.devices.Update(uint32(ifindex), &v, ebpf.UpdateExist); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("flag node device %d followed: %w", ifindex, err)
	}
	return nil
}

// markL3 makes the L3 flag (nodeDevL3) of device ifindex's entry say l3
// before AttachDevices puts its tc programs on it. Otherwise, until the
// device is recorded after the attach, a new tun's tc program would read
// a packet's IPv4 header as an Ethernet header, and a device that reuses
// an L3 device's ifindex would have its frames read from their MAC on.
// The rest of the entry stays as it is (the same device under a previous
// agent: the address and flags its flows' replies still need; an ifindex
// another device had: its stale address, as before, until the record
// after the attach), written by setNodeDevice, which orders the gate
// word around it and deletes an entry left empty. Nothing is written
// when the flag is right already.
func (m *Maps) markL3(ifindex int, l3 bool) error {
	var v sockNodeDev
	if err := m.devices.Lookup(uint32(ifindex), &v); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("look up %s: %w", mapDevices, err)
	}
	if (v.Flags&nodeDevL3 != 0) == l3 {
		return nil
	}
	var addr netip.Addr
	if v.Addr != 0 {
		addr = addrFromBE32(v.Addr)
	}
	return m.setNodeDevice(ifindex, addr, v.Flags^nodeDevL3)
}

// syncL3Gate makes dev_l3_maybe say whether sluice_devices holds an L3
// device (nodeDevL3) now, and dev_tunnel_maybe whether it holds a tunnel
// (nodeDevTunnel): after a write or delete that may have removed
// the last one, or to clear a new load's word (1 until written) once the
// device map, pinned across agents, has been looked at. If the map cannot
// be walked the word stays 1, which is always correct.
func (m *Maps) syncL3Gate() error {
	if len(m.l3Gates) == 0 && len(m.tunGates) == 0 {
		return nil
	}
	var ifidx uint32
	var nd sockNodeDev
	l3, tun := false, false
	it := m.devices.Iterate()
	for it.Next(&ifidx, &nd) {
		l3 = l3 || nd.Flags&nodeDevL3 != 0
		tun = tun || nd.Flags&nodeDevTunnel != 0
	}
	if err := it.Err(); err != nil {
		return errors.Join(fmt.Errorf("walk %s: %w", mapDevices, err), m.setL3Gate(true), setGates(m.tunGates, "dev_tunnel_maybe", true))
	}
	return errors.Join(m.setL3Gate(l3), setGates(m.tunGates, "dev_tunnel_maybe", tun))
}

// setL3Gate writes dev_l3_maybe in every loaded object that has it. A
// word that cannot be written (a kernel without mmapable .data: the
// variable has no memory) stays at 1, its programs as before the gate.
func (m *Maps) setL3Gate(maybe bool) error { return setGates(m.l3Gates, "dev_l3_maybe", maybe) }

// setGates writes maybe in each of gates (the variable name), as
// setL3Gate says.
func setGates(gates []*ebpf.Variable, name string, maybe bool) error {
	var errs []error
	for _, v := range gates {
		if err := v.Set(boolU8(maybe)); err != nil && !errors.Is(err, ebpf.ErrNotSupported) {
			errs = append(errs, fmt.Errorf("set %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// setNodeDevice6 records addr as the IPv6 SNAT source of node device
// ifindex (sluice6_devices), or forgets the device's if addr is not
// valid (no global IPv6 address). Its flags are setNodeDevice's.
func (m *Maps) setNodeDevice6(ifindex int, addr netip.Addr) error {
	if !addr.IsValid() {
		return deleteIgnoringMissing(m.devices6, uint32(ifindex))
	}
	v := v6addr(addr)
	return m.devices6.Put(uint32(ifindex), &v)
}

// l3EncapTypes are the link types (as netlink names them) of devices
// without a link-layer header, where tc sees a packet from its IPv4
// header on: tun and wireguard ("none"), ipip, ip6tnl, sit, and raw IP
// (ARPHRD_RAWIP, cellular modems). GRE devices are left out: whether they
// have a header depends on their mode.
var l3EncapTypes = []string{"none", "ipip", "tunnel6", "sit", "unknown519"}

// isPortMaster says whether m is a master whose ports hand their frames
// to it before IP sees them (an rx_handler: bridge, bond, team, Open
// vSwitch's datapath), so that a frame to the master's MAC reaches tc on
// the port as PACKET_OTHERHOST and the kernel still answers it at the
// master. A VRF is not one: IP runs on its slave (ip_rcv_core), which
// drops such a frame as any device does.
func isPortMaster(m netlink.Link) bool {
	return slices.Contains([]string{"bridge", "bond", "team", "openvswitch"}, m.Type())
}

// deviceFlags returns the sluice_devices flags of dev: L3 (nodeDevL3),
// and a port of a bridge, bond, team or Open vSwitch (nodeDevPort: its
// master is one: isPortMaster), whose frames to another MAC tc still
// answers (bpf/lib/icmp.h, icmp_link_answerable). A device enslaved or
// freed after the agent attached to it has its flag changed by
// WatchPorts (portwatch.go), which the agent runs (FollowPorts).
func deviceFlags(dev string) (uint32, error) {
	l, err := netlink.LinkByName(dev)
	if err != nil {
		return 0, fmt.Errorf("device %s: %w", dev, err)
	}
	var f uint32
	if slices.Contains(l3EncapTypes, l.Attrs().EncapType) {
		f |= nodeDevL3
	}
	if isTunnel(l) {
		f |= nodeDevTunnel
	}
	if mi := l.Attrs().MasterIndex; mi != 0 {
		m, err := netlink.LinkByIndex(mi)
		if err != nil {
			return 0, fmt.Errorf("device %s's master (ifindex %d): %w", dev, mi, err)
		}
		if isPortMaster(m) {
			f |= nodeDevPort
		}
	}
	return f, nil
}

// deviceAddr picks the address of dev that external flows of the family
// (netlink.FAMILY_V4 or FAMILY_V6) are source-NATed to: one of nodeIPs
// if dev holds one, else its first global address of the family.
func deviceAddr(dev string, nodeIPs []netip.Addr, family int) (netip.Addr, error) {
	l, err := netlink.LinkByName(dev)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("device %s: %w", dev, err)
	}
	addrs, err := netlink.AddrList(l, family)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("addresses of %s: %w", dev, err)
	}
	var first netip.Addr
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		ip = ip.Unmap()
		if !ok || !ip.IsGlobalUnicast() || ip.Is4() != (family == netlink.FAMILY_V4) {
			continue
		}
		if slices.Contains(nodeIPs, ip) {
			return ip, nil
		}
		if !first.IsValid() {
			first = ip
		}
	}
	if !first.IsValid() && isTunnel(l) {
		// A tunnel without an address of the family: the node's
		// address of it, as kube-proxy's MASQUERADE takes another
		// device's (inet_select_addr), so that a flow routed through
		// it is still source-NATed. Replies to it come back through
		// the node IP's device, which the agent attaches to by
		// default.
		if i := slices.IndexFunc(nodeIPs, func(a netip.Addr) bool { return a.Is4() == (family == netlink.FAMILY_V4) }); i >= 0 {
			first = nodeIPs[i]
		}
	}
	return first, nil
}

// tunnelTypes are the link types (netlink's Type(), the kernel's
// IFLA_INFO_KIND) of overlay devices: an overlay CNI routes the pods of
// other nodes through one (flannel's flannel.1 and Calico's vxlan.calico
// are vxlan, Calico's tunl0 ipip, flannel's WireGuard wireguard), so a
// flow to a backend behind it is to another node. GRE and ERSPAN kinds
// are left out: a point-to-point GRE device has no link-layer header but
// no L3 encap type (l3EncapTypes), so tc would misparse its packets, and
// ERSPAN mirrors; bareudp is always flow-based (overlayTunnels).
var tunnelTypes = []string{"vxlan", "geneve", "ipip", "ip6tnl", "sit", "wireguard"}

// tunnelKinds are every tunnel kind, those left out of tunnelTypes too:
// one named in --devices is still flagged a tunnel (nodeDevTunnel: XDP
// sends nothing out of it, none is attached to it) and source-NATs to the
// node IP without an address of its own (deviceAddr).
var tunnelKinds = append(slices.Clone(tunnelTypes), "gre", "gretap", "ip6gre", "ip6gretap", "erspan", "ip6erspan", "bareudp")

// isTunnel says whether l is of a tunnel kind (tunnelKinds).
func isTunnel(l netlink.Link) bool { return slices.Contains(tunnelKinds, l.Type()) }

// flowBased says whether l is a flow-based (collect-metadata, "external")
// tunnel: a program of another datapath (Cilium's cilium_vxlan, OVS's
// genev_sys_6081 of Antrea or OVN) sets each packet's destination, and no
// route of the main table picks a node through it.
func flowBased(l netlink.Link) bool {
	switch t := l.(type) {
	case *netlink.Vxlan:
		return t.FlowBased
	case *netlink.Geneve:
		return t.FlowBased
	case *netlink.Iptun:
		return t.FlowBased
	case *netlink.Ip6tnl:
		return t.FlowBased
	}
	return false
}

// overlayRoute says whether r (of the main table) is one an overlay routes
// other nodes' pods by: unicast, not a default route, and not a host-local
// prefix (host scope, a link-local destination, or the kernel's route to
// the prefix of an address the device holds, as a VPN's wg0 has).
func overlayRoute(r netlink.Route) bool {
	if r.Type != unix.RTN_UNICAST || r.Scope == netlink.SCOPE_HOST || r.Protocol == unix.RTPROT_KERNEL ||
		(r.Table != 0 && r.Table != unix.RT_TABLE_MAIN) || r.Dst == nil {
		return false
	}
	ones, _ := r.Dst.Mask.Size()
	if ones == 0 {
		return false
	}
	ip, ok := netip.AddrFromSlice(r.Dst.IP)
	return ok && !ip.Unmap().IsLinkLocalUnicast()
}

// overlayTunnels returns the names of links (in their order) an overlay
// CNI routes other nodes' pods through: up, of a tunnel kind
// (tunnelTypes), not flow-based (flowBased), not enslaved (a gretap in a
// bridge, an OVS port), and with a route of routes (the main table's,
// overlayRoute) leaving through it.
func overlayTunnels(links []netlink.Link, routes []netlink.Route) []string {
	routed := map[int]bool{}
	for _, r := range routes {
		if !overlayRoute(r) {
			continue
		}
		routed[r.LinkIndex] = true
		for _, nh := range r.MultiPath {
			routed[nh.LinkIndex] = true
		}
	}
	var out []string
	for _, l := range links {
		a := l.Attrs()
		if slices.Contains(tunnelTypes, l.Type()) && a.Flags&net.FlagUp != 0 && !flowBased(l) && a.MasterIndex == 0 && routed[a.Index] {
			out = append(out, a.Name)
		}
	}
	return out
}

// TunnelDevices returns the overlay devices (overlayTunnels, in the
// caller's network namespace), in ifindex order: what --devices adds to
// the devices holding the node addresses by default. A down one (the
// fallback devices tunl0, sit0, ip6tnl0 the kernel makes with its module)
// is left out, as is one no route of the main table leaves through.
// Without --devices the agent follows them after the start too
// (NewTunnelWatch).
func TunnelDevices() ([]string, error) {
	links, err := listLinks(netlink.LinkList)
	if err != nil {
		return nil, fmt.Errorf("list devices: %w", err)
	}
	routes, err := mainRoutes()
	if err != nil {
		return nil, err
	}
	return overlayTunnels(links, routes), nil
}

// DevicesOf returns the devices (in the caller's network namespace) that
// hold any of addrs: the default for --devices when node IPs are known.
func DevicesOf(addrs []netip.Addr) ([]string, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("list devices: %w", err)
	}
	var out []string
	for _, ifc := range ifs {
		as, err := ifc.Addrs()
		if err != nil {
			return nil, fmt.Errorf("addresses of %s: %w", ifc.Name, err)
		}
		for _, a := range as {
			ipn, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			ip, ok := netip.AddrFromSlice(ipn.IP)
			if ok && slices.Contains(addrs, ip.Unmap()) {
				out = append(out, ifc.Name)
				break
			}
		}
	}
	return out, nil
}

// AddressesOf returns the global IPv4 addresses of devs (in the caller's
// network namespace), in device order: where NodePorts answer.
func AddressesOf(devs []string) ([]netip.Addr, error) {
	var out []netip.Addr
	for _, dev := range devs {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			return nil, fmt.Errorf("device %s: %w", dev, err)
		}
		addrs, err := netlink.AddrList(l, netlink.FAMILY_V4)
		if err != nil {
			return nil, fmt.Errorf("addresses of %s: %w", dev, err)
		}
		for _, a := range addrs {
			ip, ok := netip.AddrFromSlice(a.IP.To4())
			if ok && ip.IsGlobalUnicast() && !slices.Contains(out, ip) {
				out = append(out, ip)
			}
		}
	}
	return out, nil
}

// PinnedTunnelDevices returns the overlay devices a previous agent
// followed (their sluice_devices entries, pinned under bpffs/sluice/,
// flagged tunnel, tc and followed: its tunnel watch held them,
// NewTunnelWatch) that are still links of a tunnel kind, not flow-based
// and not enslaved, in the caller's network namespace, in ifindex order;
// whether they are up or routed now does not matter. A restart keeps
// them (cmd/sluice's withTunnels): a tunnel the previous agent's watch
// attached after its start may be down, or routeless, while the CNI's
// agent restarts too (a node reboot, a rollout), and pruning it would
// drop the flows it carries until its routes return. A tunnel attached
// only because --devices named it, or because it held a node address, is
// not followed (its entry lacks nodeDevFollowed): once left out of the
// devices it is not kept. No pin: nothing.
func PinnedTunnelDevices(bpffs string) ([]string, error) {
	if bpffs == "" {
		bpffs = DefaultBPFFS
	}
	m, err := loadPinnedNodeDevs(filepath.Join(bpffs, "sluice", mapDevices), &ebpf.LoadPinOptions{ReadOnly: true})
	if m == nil || err != nil {
		return nil, err
	}
	defer m.Close()
	idxs, err := nodeDevsWith(m, nodeDevTunnel|nodeDevTC|nodeDevFollowed)
	if err != nil {
		return nil, err
	}
	slices.Sort(idxs)
	var out []string
	for _, idx := range idxs {
		l, err := netlink.LinkByIndex(int(idx))
		if err != nil {
			continue // gone (or another link since: its kind says)
		}
		if a := l.Attrs(); slices.Contains(tunnelTypes, l.Type()) && !flowBased(l) && a.MasterIndex == 0 {
			out = append(out, a.Name)
		}
	}
	return out, nil
}

// loadPinnedNodeDevs opens the node-device map pinned at pin, or returns
// nil (and no error) when nothing is pinned there.
func loadPinnedNodeDevs(pin string, opts *ebpf.LoadPinOptions) (*ebpf.Map, error) {
	m, err := ebpf.LoadPinnedMap(pin, opts)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("open %s: %w", pin, err)
	}
	return m, nil
}

// nodeDevsWith returns the ifindexes of the entries of m, a node-device
// map, whose flags hold every bit of want, in the map's order.
func nodeDevsWith(m *ebpf.Map, want uint32) ([]uint32, error) {
	var ifindex uint32
	var nd sockNodeDev
	var idxs []uint32
	it := m.Iterate()
	for it.Next(&ifindex, &nd) {
		if nd.Flags&want == want {
			idxs = append(idxs, ifindex)
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("walk %s: %w", mapDevices, err)
	}
	return idxs, nil
}
