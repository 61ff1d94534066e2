package runner

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/test/flows"
)

// The network of one case:
//
//	ext (external hosts) ── router ── br0 ─┬─ node (eth0; the agent; pods behind p1..pN)
//	100.64.0.2/30            .1/30    .1   └─ other node (eth0; every remote address on lo)
//	2001:db8:ffff::2/126     ::1/126
//
// The network is of the case's family (ipFamily): an IPv6 case gets IPv6
// addresses and routes only (the namespaces keep IPv4 loopback, which the
// agent's health and metrics servers use). IPv6 pods reach their node
// through fe80::1, an address the node holds on every pod veth, instead of
// proxy ARP.
//
// The node network is the subnet of the node's primary address, on a
// bridge in the router's namespace. Routes are per address, not per
// range, because the corpus places addresses one by one (10.180.0.1 is a
// local pod in one case and a remote one in the next):
//
//   - the node: each pod over its veth (proxy ARP answers the pods'
//     link-local gateway), each remote address via the other node,
//     everything else via the router;
//   - the other node: the frontends, this node's addresses and pods via
//     the node, everything else via the router;
//   - the router: the frontends (ClusterIPs, the service CIDR, ExternalIPs,
//     LoadBalancer IPs), this node's addresses and pods via the node,
//     remote addresses via the other node, external ones via ext. An
//     external source that is itself a frontend (kube-proxy's "SNATted to
//     LB" flows) is made by source-NATing a stand-in address of ext.
//
// The router also holds the trap: a packet that comes back from the node
// network still addressed to a frontend (the node let it through
// untranslated) is redirected to a reporting server on the router, so
// that "left untouched" is told apart from "dropped".
type caseNet struct {
	topo                     *topology.Topology
	node, router, other, ext *topology.NS
	// pods holds each local address's namespace; podDevs are the node's
	// devices towards them.
	pods    map[netip.Addr]*topology.NS
	podDevs []string
	// nodeIP is the node's primary address; routerIP and otherIP are the
	// router's and the other node's on the node network.
	nodeIP, routerIP, otherIP netip.Addr
	// standIn maps an external source that is a frontend to the ext
	// address the router source-NATs to it.
	standIn map[netip.Addr]netip.Addr
	// frontends are every address a Service of any step answers on
	// (besides node addresses), placed-external ones excepted.
	frontends []netip.Addr
}

const (
	extLinkRouter = "100.64.0.1"
	extLinkExt    = "100.64.0.2"
	// podGateway is the pods' default gateway; the node answers ARP for
	// it on every pod veth (proxy ARP), as Calico does.
	podGateway = "169.254.1.1"
	// trapPort is where the router's trap listens (TCP and UDP).
	trapPort = 9999

	// The IPv6 twins of the above (documentation range).
	extLinkRouter6 = "2001:db8:ffff::1"
	extLinkExt6    = "2001:db8:ffff::2"
	podGateway6    = "fe80::1"
)

// family is what differs between an IPv4 and an IPv6 case's network.
type family struct {
	v6 bool
	// any is the default route; extRouter and extExt the router--ext link
	// (a /extBits); standIn returns the i-th stand-in source address.
	any               netip.Prefix
	extRouter, extExt netip.Addr
	extBits           int
	standIn           func(i int) netip.Addr
	// ip is the ip(8) family flag, nft the nftables family, and addrType
	// and match the nftables address type and selector.
	ip, nft, addrType, match string
}

var (
	family4 = family{any: netip.MustParsePrefix("0.0.0.0/0"),
		extRouter: netip.MustParseAddr(extLinkRouter), extExt: netip.MustParseAddr(extLinkExt), extBits: 30,
		standIn: func(i int) netip.Addr { return netip.AddrFrom4([4]byte{100, 64, 1, byte(i + 1)}) },
		ip:      "-4", nft: "ip", addrType: "ipv4_addr", match: "ip"}
	family6 = family{v6: true, any: netip.MustParsePrefix("::/0"),
		extRouter: netip.MustParseAddr(extLinkRouter6), extExt: netip.MustParseAddr(extLinkExt6), extBits: 126,
		standIn: func(i int) netip.Addr {
			return netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0xff, 0xff, 0, 1, 14: byte(i >> 8), 15: byte(i + 1)})
		},
		ip: "-6", nft: "ip6", addrType: "ipv6_addr", match: "ip6"}
)

// familyOf is the family of case c's network.
func familyOf(c *flows.Case) family {
	if c.IPFamily == corev1.IPv6Protocol {
		return family6
	}
	return family4
}

// of says whether x is of the family.
func (fm family) of(x netip.Addr) bool { return x.Unmap().Is6() == fm.v6 && x.IsValid() }

// host is x's host prefix (/32 or /128).
func host(x netip.Addr) netip.Prefix { return netip.PrefixFrom(x, x.BitLen()) }

// addrs is what a case needs placed.
type addrs struct {
	local, remote, extHeld, standIn []netip.Addr
	frontends                       []netip.Addr
}

// place lists where each address of the case lives.
func place(c *flows.Case) (addrs, error) {
	var a addrs
	fm := familyOf(c)
	add := func(l *[]netip.Addr, x netip.Addr) {
		if !slices.Contains(*l, x) {
			*l = append(*l, x)
		}
	}
	for x, pl := range c.Placement {
		switch pl {
		case flows.PlaceLocal:
			add(&a.local, x)
		case flows.PlaceRemote:
			add(&a.remote, x)
		case flows.PlaceExternal:
			add(&a.extHeld, x)
		}
	}
	for _, st := range c.Steps {
		for _, o := range st.Objects() {
			if o.Service == nil {
				continue
			}
			for _, x := range serviceAddrs(o.Service) {
				if c.Node.IsNodeAddress(x) || c.Placement[x] == flows.PlaceExternal || !fm.of(x) {
					continue
				}
				add(&a.frontends, x)
			}
		}
	}
	for _, st := range c.Steps {
		for _, f := range st.Flows {
			x := f.Source.IP
			switch f.Source.Kind {
			case flows.SourcePod:
				add(&a.local, x)
			case flows.SourceRemotePod:
				add(&a.remote, x)
			case flows.SourceExternal:
				if slices.Contains(a.frontends, x) {
					add(&a.standIn, x)
				} else {
					add(&a.extHeld, x)
				}
			}
		}
	}
	for _, l := range [][]netip.Addr{a.local, a.remote, a.extHeld, a.standIn, a.frontends} {
		slices.SortFunc(l, netip.Addr.Compare)
	}
	for _, x := range a.local {
		if slices.Contains(a.remote, x) {
			return a, fmt.Errorf("%s is both a local and a remote address", x)
		}
	}
	return a, nil
}

// serviceAddrs are the addresses a Service answers on besides NodePorts.
func serviceAddrs(svc *corev1.Service) []netip.Addr {
	ss := append([]string{svc.Spec.ClusterIP}, svc.Spec.ClusterIPs...)
	ss = append(ss, svc.Spec.ExternalIPs...)
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		ss = append(ss, ing.IP)
	}
	var out []netip.Addr
	for _, s := range ss {
		if a, err := flows.ParseAddr(strings.TrimSpace(s)); err == nil && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// buildNet creates the case's network in topo.
func buildNet(topo *topology.Topology, c *flows.Case) (_ *caseNet, err error) {
	a, err := place(c)
	if err != nil {
		return nil, err
	}
	if len(c.Node.IPs) == 0 {
		return nil, fmt.Errorf("the node has no primary address")
	}
	fm := familyOf(c)
	n := &caseNet{topo: topo, pods: map[netip.Addr]*topology.NS{}, nodeIP: c.Node.IPs[0],
		standIn: map[netip.Addr]netip.Addr{}, frontends: a.frontends}
	var nodeNet netip.Prefix
	for _, p := range c.Node.Addresses {
		if p.Addr() == n.nodeIP {
			nodeNet = p
		}
	}
	if !nodeNet.IsValid() {
		return nil, fmt.Errorf("the node's primary address %s is not among its addresses", n.nodeIP)
	}
	// The router and the other node take the first free hosts of the
	// node network.
	taken := func(x netip.Addr) bool {
		_, placed := c.Placement[x]
		return placed || c.Node.IsNodeAddress(x) || slices.Contains(a.frontends, x) || slices.Contains(a.extHeld, x)
	}
	for x := nodeNet.Masked().Addr().Next(); nodeNet.Contains(x) && !n.otherIP.IsValid(); x = x.Next() {
		switch {
		case taken(x):
		case !n.routerIP.IsValid():
			n.routerIP = x
		default:
			n.otherIP = x
		}
	}
	if !n.otherIP.IsValid() {
		return nil, fmt.Errorf("no two free addresses in the node network %s for the router and the other node", nodeNet)
	}
	// Configuration goes on after an error (the calls are independent
	// enough) and the first error is returned.
	var first error
	do := func(err error) {
		if first == nil && err != nil {
			first = err
		}
	}
	// IPv6: no duplicate address detection on the links to come. Until
	// it ends (a second or two) a link's own link-local address is
	// tentative, and the kernel sends no neighbour solicitation for
	// packets it forwards out of that link.
	addNS := func(name string) (*topology.NS, error) {
		ns, err := topo.AddNS(name)
		if err == nil && fm.v6 {
			for _, conf := range []string{"all", "default"} {
				if err = ns.Sysctl("net/ipv6/conf/"+conf+"/accept_dad", "0"); err != nil {
					break
				}
			}
		}
		return ns, err
	}
	nss := map[string]**topology.NS{"node": &n.node, "router": &n.router, "other": &n.other, "ext": &n.ext}
	for _, name := range []string{"node", "router", "other", "ext"} {
		if *nss[name], err = addNS(name); err != nil {
			return nil, err
		}
	}
	pfx := host
	bits := nodeNet.Bits()

	// The node network.
	do(n.router.AddBridge("br0"))
	if fm.v6 {
		// The trap's proxy NDP (buildTrap), answering at once.
		do(n.router.Sysctl("net/ipv6/conf/br0/proxy_ndp", "1"))
		do(n.router.Sysctl("net/ipv6/neigh/br0/proxy_delay", "0"))
	}
	do(n.router.AddAddr("br0", netip.PrefixFrom(n.routerIP, bits)))
	do(topo.Veth(n.router, "n0", n.node, "eth0"))
	do(topo.Veth(n.router, "o0", n.other, "eth0"))
	do(n.router.SetMaster("n0", "br0"))
	do(n.router.SetMaster("o0", "br0"))
	for _, p := range c.Node.Addresses {
		do(n.node.AddAddr("eth0", p))
	}
	do(n.other.AddAddr("eth0", netip.PrefixFrom(n.otherIP, bits)))

	// The external side.
	do(topo.Veth(n.router, "x0", n.ext, "eth0"))
	extRouter, extExt := fm.extRouter, fm.extExt
	do(n.router.AddAddr("x0", netip.PrefixFrom(extRouter, fm.extBits)))
	do(n.ext.AddAddr("eth0", netip.PrefixFrom(extExt, fm.extBits)))
	do(n.ext.AddRoute(fm.any, extRouter))
	for _, x := range a.extHeld {
		do(n.ext.AddAddr("lo", pfx(x)))
		do(n.router.AddRoute(pfx(x), extExt))
	}
	var snat strings.Builder
	for i, x := range a.standIn {
		s := fm.standIn(i)
		n.standIn[x] = s
		do(n.ext.AddAddr("lo", pfx(s)))
		do(n.router.AddRoute(pfx(s), extExt))
		fmt.Fprintf(&snat, "  %s saddr %s snat to %s\n", fm.match, s, x)
	}

	// Pods behind the node.
	gw := netip.MustParseAddr(podGateway)
	if fm.v6 {
		gw = netip.MustParseAddr(podGateway6)
	}
	for i, x := range a.local {
		pod, err := addNS(fmt.Sprintf("pod%d", i+1))
		if err != nil {
			return nil, err
		}
		dev := fmt.Sprintf("p%d", i+1)
		do(topo.Veth(n.node, dev, pod, "eth0"))
		do(pod.AddAddr("eth0", pfx(x)))
		if fm.v6 {
			do(n.node.AddAddr(dev, netip.PrefixFrom(gw, 64)))
			do(pod.Run(context.Background(), "ip", "-6", "route", "add", "default", "via", gw.String(), "dev", "eth0"))
		} else {
			do(pod.AddRouteDev(pfx(gw), "eth0"))
			do(pod.AddRoute(fm.any, gw))
			do(n.node.Sysctl("net/ipv4/conf/"+dev+"/proxy_arp", "1"))
			// Proxy ARP answers after a random delay of up to proxy_delay
			// (0.8 s by default): a pod's first packet would wait that long.
			do(n.node.Sysctl("net/ipv4/neigh/"+dev+"/proxy_delay", "0"))
		}
		do(n.node.AddRouteDev(pfx(x), dev))
		n.pods[x] = pod
		n.podDevs = append(n.podDevs, dev)
		do(n.router.AddRoute(pfx(x), n.nodeIP))
		do(n.other.AddRoute(pfx(x), n.nodeIP))
	}
	// Remote addresses on the other node.
	for _, x := range a.remote {
		do(n.other.AddAddr("lo", pfx(x)))
		do(n.node.AddRoute(pfx(x), n.otherIP))
		do(n.router.AddRoute(pfx(x), n.otherIP))
	}
	// The node's other addresses, and the frontends, via the node.
	var viaNode []netip.Prefix
	for _, p := range c.Node.Addresses {
		if !nodeNet.Contains(p.Addr()) {
			viaNode = append(viaNode, pfx(p.Addr()))
		}
	}
	for _, x := range a.frontends {
		viaNode = append(viaNode, pfx(x))
	}
	if sc := c.Node.ServiceCIDR; sc.IsValid() && fm.of(sc.Addr()) {
		viaNode = append(viaNode, sc.Masked())
	}
	for _, p := range slices.CompactFunc(viaNode, func(a, b netip.Prefix) bool { return a == b }) {
		do(n.router.AddRoute(p, n.nodeIP))
		do(n.other.AddRoute(p, n.nodeIP))
	}
	do(n.node.AddRoute(fm.any, n.routerIP))
	do(n.other.AddRoute(fm.any, n.routerIP))
	forward := "net/ipv4/ip_forward"
	if fm.v6 {
		forward = "net/ipv6/conf/all/forwarding"
	}
	for _, x := range []*topology.NS{n.node, n.router} {
		do(x.Sysctl(forward, "1"))
	}

	// The trap, and the stand-ins' source NAT.
	do(n.buildTrap(c))
	if snat.Len() > 0 {
		do(nft(n.router, "table "+fm.nft+" standin {\n chain post {\n  type nat hook postrouting priority srcnat;\n"+snat.String()+" }\n}\n"))
	}
	if first != nil {
		return nil, first
	}
	return n, nil
}

// buildTrap makes the router catch what the node forwards to it still
// addressed to a frontend: policy routing makes those addresses local to
// the router for packets from the node network (so that it also answers
// ARP for frontends on the node's own subnets, such as ExternalIPs in
// 192.168.99.0/24), and nftables redirects them to the trap's port.
//
// An external client's packet to a frontend has crossed the router once
// already on its way to the node. Were that first crossing tracked, the
// same packet coming back would belong to a known connection and escape
// the redirect (which only a connection's first packet meets), so the
// router does not track what its external hosts send, except the stand-
// ins' connections, whose source NAT needs it.
func (n *caseNet) buildTrap(c *flows.Case) error {
	ctx := context.Background()
	fm := familyOf(c)
	if err := n.router.Run(ctx, "ip", fm.ip, "rule", "add", "iif", "br0", "lookup", "100", "pref", "100"); err != nil {
		return err
	}
	var frontends, standIns []string
	add := func(p netip.Prefix) error {
		frontends = append(frontends, p.String())
		return n.router.Run(ctx, "ip", fm.ip, "route", "add", "local", p.String(), "dev", "lo", "table", "100")
	}
	for _, x := range n.frontends {
		if err := add(host(x)); err != nil {
			return err
		}
		// IPv6 neighbour discovery answers only for assigned and proxied
		// addresses (local routes are not enough, as they are for ARP):
		// proxy the frontends, for those on the node's own subnets.
		if fm.v6 {
			if err := n.router.Run(ctx, "ip", "-6", "neigh", "add", "proxy", x.String(), "dev", "br0"); err != nil {
				return err
			}
		}
	}
	if sc := c.Node.ServiceCIDR; sc.IsValid() && fm.of(sc.Addr()) {
		if err := add(sc.Masked()); err != nil {
			return err
		}
	}
	for _, s := range n.standIn {
		standIns = append(standIns, s.String())
	}
	slices.Sort(standIns)
	rules := fmt.Sprintf(`table %[1]s trap {
 set frontends { type %[2]s; flags interval; auto-merge;%[4]s }
 set standins { type %[2]s;%[5]s }
 chain raw {
  type filter hook prerouting priority raw;
  iifname "x0" %[3]s saddr != @standins notrack
 }
 chain pre {
  type nat hook prerouting priority dstnat;
  iifname "br0" %[3]s daddr @frontends meta l4proto tcp redirect to :%[6]d
  iifname "br0" %[3]s daddr @frontends meta l4proto udp redirect to :%[6]d
 }
}
`, fm.nft, fm.addrType, fm.match, elements(frontends), elements(standIns), trapPort)
	return nft(n.router, rules)
}

// elements is an nftables set's elements clause ("" for none).
func elements(l []string) string {
	if len(l) == 0 {
		return ""
	}
	return " elements = { " + strings.Join(l, ", ") + " };"
}

// nft loads a ruleset into ns.
func nft(ns *topology.NS, rules string) error {
	cmd := ns.Command(context.Background(), "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft in %s: %w: %s\n%s", ns.Name, err, out, rules)
	}
	return nil
}

// sourceNS is where a flow's client runs (for node and localhost sources:
// the node, through the Prober), and the address it binds.
func (n *caseNet) sourceNS(f *flows.Flow) (*topology.NS, netip.Addr, error) {
	x := f.Source.IP
	switch f.Source.Kind {
	case flows.SourcePod:
		if pod := n.pods[x]; pod != nil {
			return pod, x, nil
		}
	case flows.SourceRemotePod:
		return n.other, x, nil
	case flows.SourceExternal:
		if s, ok := n.standIn[x]; ok {
			return n.ext, s, nil
		}
		return n.ext, x, nil
	case flows.SourceNode:
		return n.node, x, nil
	case flows.SourceLocalhost:
		return n.node, netip.Addr{}, nil
	}
	return nil, netip.Addr{}, fmt.Errorf("no client for source %s %s", f.Source.Kind, x)
}

// hostOf is the namespace that holds address x, where a server for it
// goes: the node for its own and loopback addresses, else as placed.
func (n *caseNet) hostOf(c *flows.Case, x netip.Addr) (*topology.NS, error) {
	switch {
	case c.Node.IsNodeAddress(x) || x.IsLoopback():
		return n.node, nil
	case n.pods[x] != nil:
		return n.pods[x], nil
	}
	switch c.Placement[x] {
	case flows.PlaceRemote:
		return n.other, nil
	case flows.PlaceExternal:
		return n.ext, nil
	}
	return nil, fmt.Errorf("%s is placed nowhere", x)
}
