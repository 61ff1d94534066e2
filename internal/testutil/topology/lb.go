package topology

import (
	"fmt"
	"net/netip"
	"testing"
)

// ServiceRange is where tests put service VIPs. Only the client has a route
// for it (via the node); no interface holds an address in it.
var ServiceRange = netip.MustParsePrefix("10.96.0.0/16")

// LB is the topology Sluice's tests, demo and benchmarks share:
//
//	client 10.0.0.1/24 eth0 <-veth-> eth0 10.0.0.2/24 node
//	node   10.1.N.1/24 bkN  <-veth-> eth0 10.1.N.2/24 backend N   (N = 1..n)
//
// The client reaches the service range through the node, the backends reach
// the client subnet through the node, and the node forwards. Nothing routes
// to the host.
type LB struct {
	Client   *NS
	Node     *NS
	Backends []*NS

	ClientAddr netip.Addr // on the client's eth0
	NodeAddr   netip.Addr // on the node's client-facing eth0
	// NodeDev is the node's client-facing device, where tc programs go.
	NodeDev string
	// NodeBackendDevs[i] is the node's device towards Backends[i].
	NodeBackendDevs []string
	// BackendAddrs[i] is the address of Backends[i].
	BackendAddrs []netip.Addr
	// V6 is the IPv6 plane, once AddIPv6 made one; nil before.
	V6 *LB6
}

// BuildLB creates the LB topology with n backends (1..250).
func (t *Topology) BuildLB(n int) (*LB, error) {
	if n < 1 || n > 250 {
		return nil, fmt.Errorf("backends: %d out of range 1..250", n)
	}
	lb := &LB{
		ClientAddr: netip.MustParseAddr("10.0.0.1"),
		NodeAddr:   netip.MustParseAddr("10.0.0.2"),
		NodeDev:    "eth0",
	}
	clientNet := netip.PrefixFrom(lb.ClientAddr, 24).Masked()
	var err error
	if lb.Client, err = t.AddNS("client"); err != nil {
		return nil, err
	}
	if lb.Node, err = t.AddNS("node"); err != nil {
		return nil, err
	}
	if err := t.Veth(lb.Client, "eth0", lb.Node, lb.NodeDev); err != nil {
		return nil, err
	}
	if err := lb.Client.AddAddr("eth0", netip.PrefixFrom(lb.ClientAddr, 24)); err != nil {
		return nil, err
	}
	if err := lb.Node.AddAddr(lb.NodeDev, netip.PrefixFrom(lb.NodeAddr, 24)); err != nil {
		return nil, err
	}
	if err := lb.Client.AddRoute(ServiceRange, lb.NodeAddr); err != nil {
		return nil, err
	}
	if err := lb.Node.Sysctl("net/ipv4/ip_forward", "1"); err != nil {
		return nil, err
	}
	for i := 1; i <= n; i++ {
		be, err := t.AddNS(fmt.Sprintf("backend%d", i))
		if err != nil {
			return nil, err
		}
		dev := fmt.Sprintf("bk%d", i)
		if err := t.Veth(lb.Node, dev, be, "eth0"); err != nil {
			return nil, err
		}
		gw := netip.AddrFrom4([4]byte{10, 1, byte(i), 1})
		addr := netip.AddrFrom4([4]byte{10, 1, byte(i), 2})
		if err := lb.Node.AddAddr(dev, netip.PrefixFrom(gw, 24)); err != nil {
			return nil, err
		}
		if err := be.AddAddr("eth0", netip.PrefixFrom(addr, 24)); err != nil {
			return nil, err
		}
		if err := be.AddRoute(clientNet, gw); err != nil {
			return nil, err
		}
		lb.Backends = append(lb.Backends, be)
		lb.NodeBackendDevs = append(lb.NodeBackendDevs, dev)
		lb.BackendAddrs = append(lb.BackendAddrs, addr)
	}
	return lb, nil
}

// ServeHTTP starts on every backend an HTTP server on port of its address
// (NS.ServeHTTP; on each of its addresses, with an IPv6 plane) that answers with namePrefix and the backend's number
// ("backend-1", ...), and returns those names in backend order: what a
// client that asks who answered compares with.
func (lb *LB) ServeHTTP(port uint16, namePrefix string) ([]string, error) {
	var names []string
	for i, be := range lb.Backends {
		name := fmt.Sprintf("%s%d", namePrefix, i+1)
		for _, a := range lb.backendAddrs(i) {
			if _, err := be.ServeHTTP(netip.AddrPortFrom(a, port).String(), name); err != nil {
				return nil, err
			}
		}
		names = append(names, name)
	}
	return names, nil
}

// ServeEchoes starts on every backend, on each of its addresses as
// ServeHTTP does, a TCP echo server on tcpPort and a UDP echo server on
// udpPort (NS.ServeTCPEcho, NS.ServeUDPEcho) that answer with names[i]:
// ServeHTTP's names, so that every protocol says the same backend.
func (lb *LB) ServeEchoes(tcpPort, udpPort uint16, names []string) error {
	for i, be := range lb.Backends {
		for _, a := range lb.backendAddrs(i) {
			if _, err := be.ServeTCPEcho(netip.AddrPortFrom(a, tcpPort).String(), names[i]); err != nil {
				return err
			}
			if _, err := be.ServeUDPEcho(netip.AddrPortFrom(a, udpPort).String(), names[i]); err != nil {
				return err
			}
		}
	}
	return nil
}

// backendAddrs are Backends[i]'s addresses: IPv4, and IPv6 once AddIPv6
// made its plane.
func (lb *LB) backendAddrs(i int) []netip.Addr {
	if lb.V6 == nil {
		return []netip.Addr{lb.BackendAddrs[i]}
	}
	return []netip.Addr{lb.BackendAddrs[i], lb.V6.BackendAddrs[i]}
}

// BackendAddrStrings are BackendAddrs as strings, as manifests list them.
func (lb *LB) BackendAddrStrings() []string { return addrStrings(lb.BackendAddrs) }

// BackendAddrStrings are the IPv6 BackendAddrs as strings, as manifests
// list them.
func (v6 *LB6) BackendAddrStrings() []string { return addrStrings(v6.BackendAddrs) }

func addrStrings(as []netip.Addr) []string {
	var out []string
	for _, a := range as {
		out = append(out, a.String())
	}
	return out
}

// BuildLBT is BuildLB for a test: it fails tb if the topology cannot be
// built.
func (t *Topology) BuildLBT(tb testing.TB, n int) *LB {
	tb.Helper()
	return orFail(t.BuildLB(n))(tb)
}

// AddIPv6T is AddIPv6 for a test: it fails tb if the plane cannot be
// added.
func (lb *LB) AddIPv6T(tb testing.TB) *LB6 {
	tb.Helper()
	return orFail(lb.AddIPv6())(tb)
}

// ServiceRange6 is where tests put IPv6 service VIPs, as ServiceRange: only
// the client of a dual-stack LB (AddIPv6) has a route for it.
var ServiceRange6 = netip.MustParsePrefix("2001:db8:96::/112")

// LB6 is the IPv6 plane of a dual-stack LB, beside its IPv4 one:
//
//	client 2001:db8::1/64 eth0 <-veth-> eth0 2001:db8::2/64 node
//	node   2001:db8:1:N::1/64 bkN <-veth-> eth0 2001:db8:1:N::2/64 backend N
//
// with the same routes and forwarding as IPv4's (documentation addresses,
// inside the test's namespaces only).
type LB6 struct {
	ClientAddr   netip.Addr
	NodeAddr     netip.Addr
	BackendAddrs []netip.Addr // BackendAddrs[i] is Backends[i]'s
}

// AddIPv6 gives lb an IPv6 plane (LB6), on the same devices, and returns
// it; lb.V6 holds it too. Its addresses are usable when it returns (no
// DAD, and routed as local: NS.WaitLocal), and the node forwards at once
// (its devices' link-local addresses past DAD: NS.WaitDAD).
func (lb *LB) AddIPv6() (*LB6, error) {
	if lb.V6 != nil {
		return lb.V6, nil
	}
	v6 := &LB6{ClientAddr: netip.MustParseAddr("2001:db8::1"), NodeAddr: netip.MustParseAddr("2001:db8::2")}
	clientNet := netip.PrefixFrom(v6.ClientAddr, 64).Masked()
	for _, step := range []func() error{
		func() error { return lb.Client.AddAddr("eth0", netip.PrefixFrom(v6.ClientAddr, 64)) },
		func() error { return lb.Node.AddAddr(lb.NodeDev, netip.PrefixFrom(v6.NodeAddr, 64)) },
		func() error { return lb.Client.AddRoute(ServiceRange6, v6.NodeAddr) },
		func() error { return lb.Node.Sysctl("net/ipv6/conf/all/forwarding", "1") },
	} {
		if err := step(); err != nil {
			return nil, err
		}
	}
	for i, be := range lb.Backends {
		gw := netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 1, 0, byte(i + 1), 15: 1})
		addr := netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 1, 0, byte(i + 1), 15: 2})
		if err := lb.Node.AddAddr(lb.NodeBackendDevs[i], netip.PrefixFrom(gw, 64)); err != nil {
			return nil, err
		}
		if err := be.AddAddr("eth0", netip.PrefixFrom(addr, 64)); err != nil {
			return nil, err
		}
		if err := be.AddRoute(clientNet, gw); err != nil {
			return nil, err
		}
		if err := be.WaitLocal(addr); err != nil {
			return nil, err
		}
		v6.BackendAddrs = append(v6.BackendAddrs, addr)
	}
	for _, w := range []struct {
		ns *NS
		a  netip.Addr
	}{{lb.Client, v6.ClientAddr}, {lb.Node, v6.NodeAddr}} {
		if err := w.ns.WaitLocal(w.a); err != nil {
			return nil, err
		}
	}
	for _, dev := range append([]string{lb.NodeDev}, lb.NodeBackendDevs...) {
		if err := lb.Node.WaitDAD(dev); err != nil {
			return nil, err
		}
	}
	lb.V6 = v6
	return v6, nil
}
