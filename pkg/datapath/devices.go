package datapath

// The node devices (sluice_devices): which address external flows leaving
// through a device are source-NATed to, and the lookups of devices and
// addresses the agent's flags default from.

import (
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
)

// setNodeDevice records dev (ifindex) as a node device whose address is
// the SNAT source for flows leaving through it. A device without an IPv4
// address is forgotten: flows through it are not source-NATed.
func (m *Maps) setNodeDevice(ifindex int, addr netip.Addr) error {
	if !addr.IsValid() {
		return deleteIgnoringMissing(m.devices, uint32(ifindex))
	}
	v := sockNodeDev{Addr: be32(addr)}
	return m.devices.Put(uint32(ifindex), &v)
}

// deviceAddr picks the address of dev that external flows are source-NATed
// to: one of nodeIPs if dev holds one, else its first global IPv4 address.
func deviceAddr(dev string, nodeIPs []netip.Addr) (netip.Addr, error) {
	l, err := netlink.LinkByName(dev)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("device %s: %w", dev, err)
	}
	addrs, err := netlink.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("addresses of %s: %w", dev, err)
	}
	var first netip.Addr
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP.To4())
		if !ok || !ip.IsGlobalUnicast() {
			continue
		}
		if slices.Contains(nodeIPs, ip) {
			return ip, nil
		}
		if !first.IsValid() {
			first = ip
		}
	}
	return first, nil
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
