package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"net/netip"

	"github.com/sluice-lb/sluice/test/bench/rules"
)

// The services: N NodePort services, service i with ClusterIP 10.32.x.y
// (rules.IPv4.VIP), port 80/TCP -> 8080 on NodePort nodePortBase+i and eps
// endpoints in 10.80.0.0/12 (rules.IPv4.Backend) on another node. The measured
// target is the last service, which also has 53/UDP -> 5353 on the same
// NodePort: its rules come last in KUBE-SERVICES and KUBE-NODEPORTS, so
// iptables walks every other service's rules before it matches.

const (
	nodePortBase = 30000
	tcpPort      = rules.BackendPort // 8080
	maxServices  = 61000 - nodePortBase
)

type svcPort struct {
	proto    string // "tcp" or "udp"
	port     int    // service port
	target   int    // endpoint port
	nodePort int
}

type service struct {
	index     int
	name      string // bench/np-00042
	vip       netip.Addr
	ports     []svcPort
	endpoints []netip.Addr
}

func layout(n, eps int) ([]service, error) {
	if n < 1 || n > maxServices {
		return nil, fmt.Errorf("services: %d out of range 1..%d (NodePorts %d.., below Sluice's SNAT ports)", n, maxServices, nodePortBase)
	}
	if eps < 1 || n*eps >= 1<<19 {
		return nil, fmt.Errorf("endpoints: %d per service out of range for %d services", eps, n)
	}
	svcs := make([]service, n)
	for i := range svcs {
		s := service{index: i, name: fmt.Sprintf("np-%05d", i), vip: rules.IPv4.VIP(i),
			ports: []svcPort{{"tcp", 80, tcpPort, nodePortBase + i}}}
		if i == n-1 {
			s.ports = append(s.ports, svcPort{"udp", 53, udpPort, nodePortBase + i})
		}
		for j := range eps {
			s.endpoints = append(s.endpoints, rules.IPv4.Backend(i, j, eps).Addr())
		}
		svcs[i] = s
	}
	return svcs, nil
}

// manifest renders the services as Service and EndpointSlice YAML for the
// agent; the endpoints are on node-b, the agents run as node-a.
func manifest(svcs []service) []byte {
	var b bytes.Buffer
	b.Grow(len(svcs) * (600 + 80*len(svcs[0].endpoints)))
	for _, s := range svcs {
		fmt.Fprintf(&b, "---\napiVersion: v1\nkind: Service\nmetadata: {name: %s, namespace: bench}\nspec:\n  type: NodePort\n  clusterIP: %s\n  ports:\n", s.name, s.vip)
		for _, p := range s.ports {
			fmt.Fprintf(&b, "  - {name: %s, port: %d, protocol: %s, targetPort: %d, nodePort: %d}\n", p.proto, p.port, upper(p.proto), p.target, p.nodePort)
		}
		fmt.Fprintf(&b, "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: %s-1, namespace: bench, labels: {kubernetes.io/service-name: %s}}\naddressType: IPv4\nports:\n", s.name, s.name)
		for _, p := range s.ports {
			fmt.Fprintf(&b, "- {name: %s, port: %d, protocol: %s}\n", p.proto, p.target, upper(p.proto))
		}
		b.WriteString("endpoints:\n")
		for _, ep := range s.endpoints {
			fmt.Fprintf(&b, "- {addresses: [%s], conditions: {ready: true}, nodeName: node-b}\n", ep)
		}
	}
	return b.Bytes()
}

func upper(proto string) string {
	if proto == "udp" {
		return "UDP"
	}
	return "TCP"
}

// kube-proxy's chain-name hash (pkg/proxy/iptables/proxier.go):
// base32(sha256(servicePortName + protocol [+ endpoint]))[:16].
func chainHash(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
	}
	return base32.StdEncoding.EncodeToString(h.Sum(nil))[:16]
}

// iptablesRestore renders the services the way kube-proxy's iptables mode
// does for NodePort services with externalTrafficPolicy Cluster, for
// `iptables-restore --noflush` into a fresh namespace (so the jumps from
// the built-in chains are included):
//
//	PREROUTING -> KUBE-SERVICES: one rule per ClusterIP:port, then
//	  "--dst-type LOCAL -j KUBE-NODEPORTS" last
//	KUBE-NODEPORTS: one rule per NodePort -> KUBE-EXT-<hash>
//	KUBE-EXT-<hash>: -j KUBE-MARK-MASQ; -j KUBE-SVC-<hash>
//	KUBE-SVC-<hash>: ClusterIP masquerade rule, then statistic random
//	  1/(n-i) jumps to KUBE-SEP-<hash>
//	KUBE-SEP-<hash>: hairpin KUBE-MARK-MASQ, DNAT
//	POSTROUTING -> KUBE-POSTROUTING: MASQUERADE what KUBE-MARK-MASQ marked
func iptablesRestore(svcs []service) []byte {
	var b bytes.Buffer
	b.Grow(len(svcs) * 4096)
	rules.IPv4.FilterTable(&b, true)
	b.WriteString(`*nat
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-MARK-MASQ - [0:0]
`)
	type chains struct{ svc, ext string }
	names := make([][]chains, len(svcs))
	for i, s := range svcs {
		for _, p := range s.ports {
			spn := "bench/" + s.name + ":" + p.proto
			c := chains{"KUBE-SVC-" + chainHash(spn, p.proto), "KUBE-EXT-" + chainHash(spn, p.proto)}
			names[i] = append(names[i], c)
			fmt.Fprintf(&b, ":%s - [0:0]\n:%s - [0:0]\n", c.svc, c.ext)
			for _, ep := range s.endpoints {
				fmt.Fprintf(&b, ":KUBE-SEP-%s - [0:0]\n", chainHash(spn, p.proto, netip.AddrPortFrom(ep, uint16(p.target)).String()))
			}
		}
	}
	b.WriteString(`-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
`)
	for i, s := range svcs {
		for k, p := range s.ports {
			fmt.Fprintf(&b, "-A KUBE-SERVICES -m comment --comment \"bench/%s:%s cluster IP\" -m %s -p %s -d %s/32 --dport %d -j %s\n",
				s.name, p.proto, p.proto, p.proto, s.vip, p.port, names[i][k].svc)
		}
	}
	b.WriteString("-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n")
	for i, s := range svcs {
		for k, p := range s.ports {
			fmt.Fprintf(&b, "-A KUBE-NODEPORTS -m comment --comment bench/%s:%s -m %s -p %s --dport %d -j %s\n",
				s.name, p.proto, p.proto, p.proto, p.nodePort, names[i][k].ext)
		}
	}
	for i, s := range svcs {
		for k, p := range s.ports {
			spn := "bench/" + s.name + ":" + p.proto
			c := names[i][k]
			fmt.Fprintf(&b, "-A %s -m comment --comment \"masquerade traffic for %s external destinations\" -j KUBE-MARK-MASQ\n", c.ext, spn)
			fmt.Fprintf(&b, "-A %s -j %s\n", c.ext, c.svc)
			fmt.Fprintf(&b, "-A %s -m comment --comment \"%s cluster IP\" -m %s -p %s -d %s/32 --dport %d ! -s %s -j KUBE-MARK-MASQ\n",
				c.svc, spn, p.proto, p.proto, s.vip, p.port, rules.IPv4.ClusterCIDR)
			n := len(s.endpoints)
			for j, ep := range s.endpoints {
				epp := netip.AddrPortFrom(ep, uint16(p.target)).String()
				sep := "KUBE-SEP-" + chainHash(spn, p.proto, epp)
				if j < n-1 {
					fmt.Fprintf(&b, "-A %s -m comment --comment \"%s -> %s\" -m statistic --mode random --probability %0.10f -j %s\n",
						c.svc, spn, epp, 1.0/float64(n-j), sep)
				} else {
					fmt.Fprintf(&b, "-A %s -m comment --comment \"%s -> %s\" -j %s\n", c.svc, spn, epp, sep)
				}
				fmt.Fprintf(&b, "-A %s -m comment --comment %s -s %s/32 -j KUBE-MARK-MASQ\n", sep, spn, ep)
				fmt.Fprintf(&b, "-A %s -m comment --comment %s -m %s -p %s -j DNAT --to-destination %s\n", sep, spn, p.proto, p.proto, epp)
			}
		}
	}
	b.WriteString("COMMIT\n")
	return b.Bytes()
}
