package harness

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/test/bench/rules"
)

// The benchmark's network: for each mode a triple of network namespaces,
// client -> node -> backend, joined by veth pairs, with addresses only
// inside them (see package rules for the plan). Each mode gets its own
// triple, in a topology of its own, so its ruleset, conntrack table and
// agent never meet another mode's, and modes can be measured in turn
// without reprogramming. Closing the topology deletes the namespaces and
// everything in them (rules, routes, tc programs); a later run removes
// those of a run that was killed.

// Devices inside every triple; its addresses are the family plan's
// (rules.Family): the client <-> node link holds the node's address (host
// 1) and the client's source addresses (hosts 2..), the node <-> backend
// link the node's (host 1) and the backend's (host 2).
const (
	NodeClientDev = "nc" // the node's client-facing veth
	NodeBackDev   = "nb"
	ClientDev     = "c0"
	BackendDev    = "b0"
	ClientSources = 8 // client source addresses, hosts 2..9 of the client link

	// The client link's MACs (setup): locally administered, starting
	// with a 0 nibble, which no IP header does.
	nodeClientMAC = "02:00:00:00:00:01"
	clientMAC     = "02:00:00:00:00:02"
)

// ClientSourceAddrs are the client namespace's source addresses.
func ClientSourceAddrs(f rules.Family) []string {
	var out []string
	for i := 0; i < ClientSources; i++ {
		out = append(out, f.Link(f.ClientLink, 2+i).String())
	}
	return out
}

// triple is one mode's client, node and backend namespaces.
type triple struct {
	topo                  *topology.Topology
	Client, Node, Backend *topology.NS
}

// newTriple creates the triple for a mode.
func newTriple(ctx context.Context, mode string, f rules.Family) (*triple, error) {
	topo, err := topology.New()
	if err != nil {
		return nil, err
	}
	t := &triple{topo: topo}
	if err := t.setup(ctx, mode, f); err != nil {
		t.close()
		return nil, fmt.Errorf("topology %s: %w", mode, err)
	}
	return t, nil
}

func (t *triple) setup(ctx context.Context, mode string, f rules.Family) error {
	var err error
	for _, ns := range []struct {
		p    **topology.NS
		name string
	}{{&t.Client, mode + "-c"}, {&t.Node, mode + "-n"}, {&t.Backend, mode + "-b"}} {
		if *ns.p, err = t.topo.AddNS(ns.name); err != nil {
			return err
		}
	}
	pfx := netip.MustParsePrefix
	clientLink, backLink := pfx(f.ClientLink), pfx(f.BackLink)
	nodeClient, nodeBack := f.Link(f.ClientLink, 1), f.Link(f.BackLink, 1)
	backend := f.Link(f.BackLink, 2)
	on := func(link netip.Prefix, a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, link.Bits()) }
	ipv, anyDst := "-4", netip.PrefixFrom(netip.IPv4Unspecified(), 0)
	if f.Is6() {
		ipv, anyDst = "-6", netip.PrefixFrom(netip.IPv6Unspecified(), 0)
	}
	steps := []func() error{
		func() error { return t.topo.Veth(t.Node, NodeClientDev, t.Client, ClientDev) },
		func() error { return t.topo.Veth(t.Node, NodeBackDev, t.Backend, BackendDev) },
		// Fixed MACs on the client link, the same in every mode's triple.
		// A random one starts with any nibble, and Sluice's programs ask
		// their device map whether the device has no link-layer header
		// when a frame starts with the IP version (parse.h, dev_is_l3):
		// a 4 (IPv4) or 6 (IPv6) drawn for nc (its ingress) or c0 (nc's
		// egress) cost one mode a hash lookup per packet that another
		// mode's triple did not pay (issue 14, sixty-eighth pass).
		func() error {
			return t.Node.Run(ctx, "ip", "link", "set", "dev", NodeClientDev, "address", nodeClientMAC)
		},
		func() error { return t.Client.Run(ctx, "ip", "link", "set", "dev", ClientDev, "address", clientMAC) },
	}
	for _, a := range ClientSourceAddrs(f) {
		steps = append(steps, func() error { return t.Client.AddAddr(ClientDev, on(clientLink, netip.MustParseAddr(a))) })
	}
	steps = append(steps,
		func() error { return t.Node.AddAddr(NodeClientDev, on(clientLink, nodeClient)) },
		func() error { return t.Node.AddAddr(NodeBackDev, on(backLink, nodeBack)) },
		func() error { return t.Node.AddRoute(pfx(f.BackendCIDR), backend) },
		// Node-local clients need a route to the service CIDR before their
		// OUTPUT DNAT runs (a real node has a default route). Only locally
		// generated traffic (iif lo) gets it: forwarded traffic to a VIP no
		// rule matches still fails at once with "net unreachable", which
		// keeps the programming-time probes sharp.
		func() error {
			return t.Node.Run(ctx, "ip", ipv, "route", "add", f.ServiceCIDR, "via", backend.String(), "table", "100")
		},
		func() error {
			return t.Node.Run(ctx, "ip", ipv, "rule", "add", "iif", "lo", "lookup", "100", "pref", "100")
		},
		func() error { return t.Client.AddRoute(anyDst, nodeClient) },
		func() error { return t.Backend.AddAddr(BackendDev, on(backLink, backend)) },
		func() error { return t.Backend.AddRoute(anyDst, nodeBack) },
		// Every backend address is local to the backend namespace, so one
		// listener on the unspecified address answers for all of them.
		func() error {
			return t.Backend.Run(ctx, "ip", ipv, "route", "add", "local", f.BackendCIDR, "dev", "lo")
		},
	)
	for _, s := range steps {
		if err := s(); err != nil {
			return err
		}
	}
	if f.Is6() {
		// A nodad IPv6 address routes as local a moment after it is added.
		for _, w := range []struct {
			ns *topology.NS
			a  netip.Addr
		}{{t.Node, nodeClient}, {t.Node, nodeBack}, {t.Backend, backend}, {t.Client, f.Link(f.ClientLink, 2)}} {
			if err := w.ns.WaitLocal(w.a); err != nil {
				return err
			}
		}
	}
	type sysctl struct {
		ns   *topology.NS
		k, v string
	}
	sysctls := []sysctl{
		{t.Node, "net.ipv4.ip_forward", "1"},
		{t.Node, "net.ipv4.ip_local_port_range", "1024 65535"},
		{t.Node, "net.ipv4.tcp_tw_reuse", "1"},
		{t.Client, "net.ipv4.ip_local_port_range", "1024 65535"},
		{t.Client, "net.ipv4.tcp_tw_reuse", "1"},
		{t.Backend, "net.core.somaxconn", "4096"},
		{t.Backend, "net.ipv4.tcp_max_syn_backlog", "4096"},
	}
	if f.Is6() {
		sysctls = append(sysctls, sysctl{t.Node, "net.ipv6.conf.all.forwarding", "1"})
	}
	for _, s := range sysctls {
		if err := s.ns.Sysctl(s.k, s.v); err != nil {
			return err
		}
	}
	return nil
}

// conntrackSysctls sizes the node's conntrack for connection churn. They
// exist only once conntrack is in use in the namespace, so call it after
// the rules are loaded; missing keys are skipped and reported.
func (t *triple) conntrackSysctls() []string {
	var set []string
	for _, kv := range [][2]string{
		{"net.netfilter.nf_conntrack_tcp_timeout_time_wait", "10"},
		{"net.netfilter.nf_conntrack_tcp_timeout_close_wait", "10"},
		{"net.netfilter.nf_conntrack_tcp_timeout_fin_wait", "10"},
	} {
		if err := t.Node.Sysctl(kv[0], kv[1]); err == nil {
			set = append(set, kv[0]+"="+kv[1])
		}
	}
	return set
}

// close deletes the triple's namespaces, after stopping what the topology
// started in them.
func (t *triple) close() { _ = t.topo.Close() }
