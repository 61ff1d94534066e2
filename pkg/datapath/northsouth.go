package datapath

import (
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"

	"github.com/sluice-lb/sluice/pkg/model"
)

// North-south state the reconciler does not write: the node devices
// (sluice_devices) and the loadBalancerSourceRanges (sluice_src_ranges).
// (Conntrack garbage collection is in ctgc.go.)

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

func srcRangeKey(fe model.L4Addr, p netip.Prefix) sockSrcRangeKey {
	p = p.Masked()
	return sockSrcRangeKey{
		Prefixlen: 64 + uint32(p.Bits()),
		Vip:       be32(fe.Addr),
		Port:      be16(fe.Port),
		Proto:     uint8(fe.Proto),
		Saddr:     be32(p.Addr()),
	}
}

// wantSourceRanges returns the sluice_src_ranges keys st asks for.
func wantSourceRanges(st *model.State) map[sockSrcRangeKey]bool {
	want := map[sockSrcRangeKey]bool{}
	if st == nil {
		return want
	}
	for fe, svc := range st.Services {
		if svc == nil || svc.Kind == model.ClusterIP {
			continue
		}
		fe, err := checkL4(fe)
		if err != nil {
			continue
		}
		for _, p := range svc.SourceRanges {
			if p.Addr().Unmap().Is4() {
				p = netip.PrefixFrom(p.Addr().Unmap(), min(p.Bits(), 32))
				want[srcRangeKey(fe, p)] = true
			}
		}
	}
	return want
}

// AddSourceRanges writes the loadBalancerSourceRanges st asks for. Run it
// before the reconciler sets SVC_F_SRC_RANGES on a master, so a frontend
// never checks ranges that are not there yet.
func (m *Maps) AddSourceRanges(st *model.State) error {
	one := uint8(1)
	for k := range wantSourceRanges(st) {
		if err := m.srcRanges.Put(&k, &one); err != nil {
			return fmt.Errorf("add source range of %s: %w", addrFromBE32(k.Vip), err)
		}
	}
	return nil
}

// PruneSourceRanges deletes the ranges st does not ask for (after the
// reconciler has applied st).
func (m *Maps) PruneSourceRanges(st *model.State) error {
	want := wantSourceRanges(st)
	var doomed []sockSrcRangeKey
	var k sockSrcRangeKey
	var v uint8
	it := m.srcRanges.Iterate()
	for it.Next(&k, &v) {
		if !want[k] {
			doomed = append(doomed, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("list source ranges: %w", err)
	}
	for i := range doomed {
		if err := deleteIgnoringMissing(m.srcRanges, &doomed[i]); err != nil {
			return fmt.Errorf("delete source range: %w", err)
		}
	}
	return nil
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
