// Package rules lays out the synthetic services the benchmark programs and
// renders them the way kube-proxy would: an iptables-restore file shaped like
// kube-proxy's iptables mode and an nft script shaped like its nftables mode.
//
// Each IP family has its own plan (a Family: IPv4 or IPv6), with addresses
// that live only inside the benchmark's network namespaces:
//
//	IPv4              IPv6
//	10.32.0.0/15      2001:db8:32::/111     service VIPs (the "service
//	                                        CIDR"), port 80/TCP: room for
//	                                        100,000 Services
//	10.64.0.0/10      2001:db8:64::/48      the "cluster CIDR" (pods):
//	                                        clients and backends are in it,
//	                                        so, as for pod-to-service
//	                                        traffic, nothing is masqueraded
//	10.80.0.0/12      2001:db8:64:80::/96   backend addresses, port 8080:
//	                                        1,040,384 for endpoints (100,000
//	                                        Services x 10), the last 8192
//	                                        spare
//	                                        (routed as local to one backend
//	                                        namespace, so one listener
//	                                        answers for all of them)
//	10.64.1.0/24      2001:db8:64:1::/64    client <-> node link
//	10.64.2.0/24      2001:db8:64:2::/64    node <-> backend link
package rules

import (
	"fmt"
	"net/netip"
)

const (
	ServicePort  = 80
	BackendPort  = 8080
	Namespace    = "bench"
	PortName     = "http"
	maxServices  = 131000 // the service CIDR's /15 (/111), less the network address
	maxBackends  = 1 << 20
	spareBackend = maxBackends - 1<<13 // spare addresses start here, used by endpoint changes
)

// Family is one IP family's address plan and how its rules are spelled.
type Family struct {
	Name        string // "IPv4" or "IPv6", an EndpointSlice's addressType
	ServiceCIDR string
	ClusterCIDR string
	BackendCIDR string
	ClientLink  string // client <-> node link prefix
	BackLink    string // node <-> backend link prefix
	vipBase     netip.Addr
	backendBase netip.Addr
}

// The two plans.
var (
	IPv4 = Family{
		Name: "IPv4", ServiceCIDR: "10.32.0.0/15", ClusterCIDR: "10.64.0.0/10", BackendCIDR: "10.80.0.0/12",
		ClientLink: "10.64.1.0/24", BackLink: "10.64.2.0/24",
		vipBase: netip.MustParseAddr("10.32.0.0"), backendBase: netip.MustParseAddr("10.80.0.0"),
	}
	IPv6 = Family{
		Name: "IPv6", ServiceCIDR: "2001:db8:32::/111", ClusterCIDR: "2001:db8:64::/48", BackendCIDR: "2001:db8:64:80::/96",
		ClientLink: "2001:db8:64:1::/64", BackLink: "2001:db8:64:2::/64",
		vipBase: netip.MustParseAddr("2001:db8:32::"), backendBase: netip.MustParseAddr("2001:db8:64:80::"),
	}
)

// FamilyOf returns the plan named "ipv4" or "ipv6" (any case).
func FamilyOf(name string) (Family, error) {
	switch name {
	case "ipv4", "IPv4":
		return IPv4, nil
	case "ipv6", "IPv6":
		return IPv6, nil
	}
	return Family{}, fmt.Errorf("IP family %q: want ipv4 or ipv6", name)
}

// Is6 says whether this is the IPv6 plan.
func (f Family) Is6() bool { return f.vipBase.Is6() }

// HostBits is the prefix length of one address: 32 or 128.
func (f Family) HostBits() int { return f.vipBase.BitLen() }

// Link returns host h (1 = the node's side) of a link prefix.
func (f Family) Link(prefix string, h int) netip.Addr {
	return offset(netip.MustParsePrefix(prefix).Addr(), h)
}

// offset adds off to the low 32 bits of base (every plan's ranges fit).
func offset(base netip.Addr, off int) netip.Addr {
	b := base.As16()
	v := uint32(b[12])<<24 | uint32(b[13])<<16 | uint32(b[14])<<8 | uint32(b[15])
	v += uint32(off)
	b[12], b[13], b[14], b[15] = byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
	a := netip.AddrFrom16(b)
	if base.Is4() {
		return a.Unmap()
	}
	return a
}

// Service is one service port and its endpoints.
type Service struct {
	Index     int
	Name      string // namespace/name, as kube-proxy prints it
	VIP       netip.Addr
	Port      uint16
	Endpoints []netip.AddrPort
}

// PortName is the kube-proxy ServicePortName string: namespace/name:port.
func (s Service) PortName() string { return s.Name + ":" + PortName }

// VIPPort is the service frontend.
func (s Service) VIPPort() netip.AddrPort { return netip.AddrPortFrom(s.VIP, s.Port) }

// VIP returns the VIP of service i (0-based).
func (f Family) VIP(i int) netip.Addr { return offset(f.vipBase, i+1) }

// Backend returns endpoint j of service i, given eps endpoints per service.
func (f Family) Backend(i, j, eps int) netip.AddrPort {
	return netip.AddrPortFrom(offset(f.backendBase, i*eps+j+1), BackendPort)
}

// SpareBackend returns the k-th spare backend address, one that no service
// uses initially: endpoint changes move an endpoint to a spare address so the
// change can be seen from the client.
func (f Family) SpareBackend(k int) netip.AddrPort {
	return netip.AddrPortFrom(offset(f.backendBase, spareBackend+k), BackendPort)
}

// Layout returns n services with eps endpoints each.
func (f Family) Layout(n, eps int) ([]Service, error) {
	if n < 1 || n > maxServices {
		return nil, fmt.Errorf("services: %d out of range 1..%d", n, maxServices)
	}
	if eps < 1 || n*eps >= spareBackend {
		return nil, fmt.Errorf("endpoints: %d per service out of range for %d services", eps, n)
	}
	svcs := make([]Service, n)
	for i := range svcs {
		s := Service{
			Index: i,
			Name:  fmt.Sprintf("%s/svc-%05d", Namespace, i),
			VIP:   f.VIP(i),
			Port:  ServicePort,
		}
		for j := 0; j < eps; j++ {
			s.Endpoints = append(s.Endpoints, f.Backend(i, j, eps))
		}
		svcs[i] = s
	}
	return svcs, nil
}

// Clone deep-copies services so one can be changed without touching the other.
func Clone(svcs []Service) []Service {
	out := make([]Service, len(svcs))
	for i, s := range svcs {
		s.Endpoints = append([]netip.AddrPort(nil), s.Endpoints...)
		out[i] = s
	}
	return out
}
