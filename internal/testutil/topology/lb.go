package topology

import (
	"fmt"
	"net/netip"
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
// (NS.ServeHTTP) that answers with namePrefix and the backend's number
// ("backend-1", ...), and returns those names in backend order: what a
// client that asks who answered compares with.
func (lb *LB) ServeHTTP(port uint16, namePrefix string) ([]string, error) {
	var names []string
	for i, be := range lb.Backends {
		name := fmt.Sprintf("%s%d", namePrefix, i+1)
		if _, err := be.ServeHTTP(netip.AddrPortFrom(lb.BackendAddrs[i], port).String(), name); err != nil {
			return nil, err
		}
		names = append(names, name)
	}
	return names, nil
}

// BackendAddrStrings are BackendAddrs as strings, as manifests list them.
func (lb *LB) BackendAddrStrings() []string {
	var out []string
	for _, a := range lb.BackendAddrs {
		out = append(out, a.String())
	}
	return out
}
