package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/sluice-lb/sluice/internal/testutil/agentproc"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/test/bench/harness"
)

// The topology: one generator and one backend, and between them one node
// per mode, each with its own pair of links, so every mode keeps its
// datapath loaded for the whole run and switching modes is only a matter
// of which node address the generator sends to:
//
//	gen g0 10.99.10.2 ── eth0 10.99.10.1 node-0 eth1 10.99.20.1 ── n0 10.99.20.2 ┐
//	gen g1 10.99.11.2 ── eth0 10.99.11.1 node-1 eth1 10.99.21.1 ── n1 10.99.21.2 ├ router b 10.99.3.1 ── eth0 10.99.3.2 backend
//	...                                                                          ┘        (10.80.0.0/12 local)
//
// A node forwards NodePort traffic to 10.80.0.0/12 (every endpoint address)
// through the router, DNATed to an endpoint and SNATed to its eth1 address,
// so the backend is remote and its replies come back through the same node.
// Nothing is routed to or from the host.
type lab struct {
	topo            *topology.Topology
	gen, router, be *topology.NS
	nodes           []*node
	settings        []string
}

// node is the NodePort node of one mode.
type node struct {
	mode   string
	ns     *topology.NS
	genDev string     // the generator's device towards this node
	addr   netip.Addr // the NodePort address (eth0)
	snat   netip.Addr // eth1: where the router sends the backend's replies
	agent  *agentproc.Agent
}

const (
	backendNet = "10.80.0.0/12"
	udpPort    = 5353 // the backend's UDP port (dropped on arrival)
)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func buildLab(modes []string) (_ *lab, err error) {
	topo, err := topology.New()
	if err != nil {
		return nil, err
	}
	l := &lab{topo: topo}
	defer func() {
		if err != nil {
			err = errors.Join(err, l.close())
		}
	}()
	add := func(name string) *topology.NS {
		if err != nil {
			return nil
		}
		var ns *topology.NS
		ns, err = topo.AddNS(name)
		return ns
	}
	l.gen, l.router, l.be = add("gen"), add("router"), add("backend")
	if err != nil {
		return nil, err
	}
	steps := []func() error{
		func() error { return topo.Veth(l.router, "b", l.be, "eth0") },
		func() error { return l.router.AddAddr("b", pfx("10.99.3.1/24")) },
		func() error { return l.be.AddAddr("eth0", pfx("10.99.3.2/24")) },
		func() error { return l.be.AddRoute(pfx("0.0.0.0/0"), netip.MustParseAddr("10.99.3.1")) },
		// Every endpoint address is local to the backend: one listener
		// answers for all of them.
		func() error {
			return l.be.Run(context.Background(), "ip", "route", "add", "local", backendNet, "dev", "lo")
		},
		func() error { return l.router.AddRoute(pfx(backendNet), netip.MustParseAddr("10.99.3.2")) },
		func() error { return l.router.Sysctl("net/ipv4/ip_forward", "1") },
		func() error { return l.gen.Sysctl("net/ipv4/ip_local_port_range", "1024 65535") },
	}
	for k, mode := range modes {
		n := &node{mode: mode, genDev: fmt.Sprintf("g%d", k),
			addr: netip.AddrFrom4([4]byte{10, 99, byte(10 + k), 1}),
			snat: netip.AddrFrom4([4]byte{10, 99, byte(20 + k), 1})}
		if n.ns = add(fmt.Sprintf("node%d", k)); err != nil {
			return nil, err
		}
		l.nodes = append(l.nodes, n)
		rdev := fmt.Sprintf("n%d", k)
		steps = append(steps,
			func() error { return topo.Veth(l.gen, n.genDev, n.ns, "eth0") },
			func() error { return l.gen.AddAddr(n.genDev, pfx(fmt.Sprintf("10.99.%d.2/24", 10+k))) },
			func() error { return n.ns.AddAddr("eth0", netip.PrefixFrom(n.addr, 24)) },
			func() error { return topo.Veth(n.ns, "eth1", l.router, rdev) },
			func() error { return n.ns.AddAddr("eth1", netip.PrefixFrom(n.snat, 24)) },
			func() error { return l.router.AddAddr(rdev, pfx(fmt.Sprintf("10.99.%d.2/24", 20+k))) },
			func() error {
				return n.ns.AddRoute(pfx(backendNet), netip.AddrFrom4([4]byte{10, 99, byte(20 + k), 2}))
			},
			func() error { return n.ns.Sysctl("net/ipv4/ip_forward", "1") },
		)
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return nil, err
		}
	}
	l.settings = append(l.settings,
		"node netns: net.ipv4.ip_forward=1; router too",
		"gen netns: net.ipv4.ip_local_port_range=1024 65535",
		fmt.Sprintf("nf_conntrack_max is global, left at %s (counted per netns; only the iptables nodes load conntrack)", harness.ReadTrim("/proc/sys/net/netfilter/nf_conntrack_max")),
		fmt.Sprintf("net.core.netdev_max_backlog (global) left at %s", harness.ReadTrim("/proc/sys/net/core/netdev_max_backlog")))

	// Packets from a real wire carry complete checksums; a local stack
	// sending over a veth leaves them to "hardware" (CHECKSUM_PARTIAL),
	// which an XDP frame, having no skb, loses. The hosts that originate
	// traffic (generator, backend) compute checksums in software.
	for _, n := range l.nodes {
		if err := l.gen.Do(func() error { return topology.SetTxChecksumOffload(n.genDev, false) }); err != nil {
			return nil, err
		}
	}
	if err := l.be.Do(func() error { return topology.SetTxChecksumOffload("eth0", false) }); err != nil {
		return nil, err
	}
	l.settings = append(l.settings, "tx checksum offload off on the generator's and the backend's veths (complete checksums, as from a wire)")

	// Native XDP on a veth transmits (XDP_TX, redirect) into the peer's
	// NAPI queue, which only a peer running XDP itself has. Every node's
	// peers (the generator's and the router's ends) get an XDP_PASS
	// program, in every mode, so all modes see the same receive path there.
	for k, n := range l.nodes {
		if err := l.gen.AttachXDPPass(n.genDev); err != nil {
			return nil, err
		}
		if err := l.router.AttachXDPPass(fmt.Sprintf("n%d", k)); err != nil {
			return nil, err
		}
	}
	l.settings = append(l.settings, "native XDP_PASS program on the generator's and the router's ends of every node link (all modes), so native XDP_TX/redirect frames are delivered")

	// The UDP load is counted and dropped as it arrives at the backend, by
	// an nftables rule at the start of prerouting (no conntrack there), so
	// no receiver competes for the CPU and no port-unreachable goes back.
	// (tc actions are not available on every kernel build.)
	cmd := l.be.Command(context.Background(), "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(fmt.Sprintf(`table ip sink {
	chain pre {
		type filter hook prerouting priority -400; policy accept;
		udp dport %d counter drop
	}
}
`, udpPort))
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("nft sink in the backend: %w: %s", err, out)
	}
	l.settings = append(l.settings, fmt.Sprintf("UDP received = packets counted by an nftables rule (prerouting, priority -400: before conntrack, which the backend does not load anyway) that drops UDP to port %d in the backend netns, over the round plus a 200ms drain", udpPort))
	return l, nil
}

func (l *lab) close() error { return l.topo.Close() }

// backendRxPackets returns the packets the backend's UDP sink counted.
func (l *lab) backendRxPackets() (uint64, error) {
	out, err := l.be.Command(context.Background(), "nft", "list", "chain", "ip", "sink", "pre").CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("nft list chain in the backend: %w: %s", err, out)
	}
	f := strings.Fields(string(out))
	for i := range f[:max(len(f)-1, 0)] {
		if f[i] == "packets" {
			return strconv.ParseUint(f[i+1], 10, 64)
		}
	}
	return 0, fmt.Errorf("no packet counter in %q", out)
}
