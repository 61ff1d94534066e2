// Package rules lays out the synthetic services the benchmark programs and
// renders them the way kube-proxy would: an iptables-restore file shaped like
// kube-proxy's iptables mode and an nft script shaped like its nftables mode.
//
// Addresses live only inside the benchmark's network namespaces:
//
//	10.32.0.0/16   service VIPs (the "service CIDR"), port 80/TCP
//	10.64.0.0/10   the "cluster CIDR" (pods): clients and backends are in it,
//	               so, as for pod-to-service traffic, nothing is masqueraded
//	10.80.0.0/12   backend addresses, port 8080 (routed as local to one
//	               backend namespace, so one listener answers for all of them)
//	10.64.1.0/24   client <-> node link, 10.64.2.0/24 node <-> backend link
package rules

import (
	"fmt"
	"net/netip"
)

const (
	ServicePort  = 80
	BackendPort  = 8080
	ClusterCIDR  = "10.64.0.0/10"
	ServiceCIDR  = "10.32.0.0/16"
	BackendCIDR  = "10.80.0.0/12"
	Namespace    = "bench"
	PortName     = "http"
	maxServices  = 65000
	maxBackends  = 1 << 20
	spareBackend = 1 << 19 // spare addresses start here, used by endpoint changes
)

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

func addr(base [4]byte, off int) netip.Addr {
	v := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8 | uint32(base[3])
	v += uint32(off)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// VIP returns the VIP of service i (0-based).
func VIP(i int) netip.Addr { return addr([4]byte{10, 32, 0, 0}, i+1) }

// Backend returns endpoint j of service i, given eps endpoints per service.
func Backend(i, j, eps int) netip.AddrPort {
	return netip.AddrPortFrom(addr([4]byte{10, 80, 0, 0}, i*eps+j+1), BackendPort)
}

// SpareBackend returns the k-th spare backend address, one that no service
// uses initially: endpoint changes move an endpoint to a spare address so the
// change can be seen from the client.
func SpareBackend(k int) netip.AddrPort {
	return netip.AddrPortFrom(addr([4]byte{10, 80, 0, 0}, spareBackend+k), BackendPort)
}

// Layout returns n services with eps endpoints each.
func Layout(n, eps int) ([]Service, error) {
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
			VIP:   VIP(i),
			Port:  ServicePort,
		}
		for j := 0; j < eps; j++ {
			s.Endpoints = append(s.Endpoints, Backend(i, j, eps))
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
