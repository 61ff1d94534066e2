package rules

import (
	"bytes"
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"net/netip"
)

// kube-proxy's chain-name hashes (pkg/proxy/iptables/proxier.go):
// base32(sha256(servicePortName + protocol))[:16], and for endpoints the
// endpoint string is appended before hashing.
func portProtoHash(servicePortName, protocol string) string {
	h := sha256.Sum256([]byte(servicePortName + protocol))
	return base32.StdEncoding.EncodeToString(h[:])[:16]
}

// SvcChain is the KUBE-SVC-<hash> chain of a service.
func SvcChain(s Service) string { return "KUBE-SVC-" + portProtoHash(s.PortName(), "tcp") }

// SepChain is the KUBE-SEP-<hash> chain of one endpoint of a service.
func SepChain(s Service, ep netip.AddrPort) string {
	h := sha256.Sum256([]byte(s.PortName() + "tcp" + ep.String()))
	return "KUBE-SEP-" + base32.StdEncoding.EncodeToString(h[:])[:16]
}

// IptablesOptions says what goes into an iptables-restore file besides the
// service chains.
type IptablesOptions struct {
	// Jumps adds the rules in the built-in chains that enter kube-proxy's
	// chains (kube-proxy adds them with iptables -I once, outside the
	// restore; with --noflush they would duplicate on every sync).
	Jumps bool
	// Stale names chains to delete with -X (endpoint chains that went
	// away), as kube-proxy's full sync does.
	Stale []string
}

// IptablesRestore renders services as a kube-proxy-shaped ruleset in
// iptables-restore format (filter and nat tables), meant for
// `iptables-restore --noflush` (`ip6tables-restore` for IPv6, whose rules
// kube-proxy's IPv6 proxier writes the same way): every chain it declares
// is flushed and rewritten, the built-in chains are left alone.
func (f Family) IptablesRestore(svcs []Service, o IptablesOptions) []byte {
	var b bytes.Buffer
	b.Grow(len(svcs) * 4096)

	f.FilterTable(&b, o.Jumps)

	b.WriteString("*nat\n")
	for _, c := range []string{"KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-MARK-MASQ"} {
		fmt.Fprintf(&b, ":%s - [0:0]\n", c)
	}
	for _, s := range svcs {
		fmt.Fprintf(&b, ":%s - [0:0]\n", SvcChain(s))
		for _, ep := range s.Endpoints {
			fmt.Fprintf(&b, ":%s - [0:0]\n", SepChain(s, ep))
		}
	}
	// Stale chains are declared (so flushed) and then deleted, as kube-proxy
	// does: -X needs an empty chain that nothing references.
	for _, c := range o.Stale {
		fmt.Fprintf(&b, ":%s - [0:0]\n", c)
	}
	if o.Jumps {
		b.WriteString(`-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
`)
	}
	b.WriteString(`-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
`)
	for _, s := range svcs {
		fmt.Fprintf(&b, "-A KUBE-SERVICES -m comment --comment \"%s cluster IP\" -m tcp -p tcp -d %s/%d --dport %d -j %s\n",
			s.PortName(), s.VIP, f.HostBits(), s.Port, SvcChain(s))
	}
	b.WriteString("-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n")
	for _, s := range svcs {
		svc := SvcChain(s)
		fmt.Fprintf(&b, "-A %s -m comment --comment \"%s cluster IP\" -m tcp -p tcp -d %s/%d --dport %d ! -s %s -j KUBE-MARK-MASQ\n",
			svc, s.PortName(), s.VIP, f.HostBits(), s.Port, f.ClusterCIDR)
		n := len(s.Endpoints)
		for i, ep := range s.Endpoints {
			if i < n-1 {
				fmt.Fprintf(&b, "-A %s -m comment --comment \"%s -> %s\" -m statistic --mode random --probability %0.10f -j %s\n",
					svc, s.PortName(), ep, 1.0/float64(n-i), SepChain(s, ep))
			} else {
				fmt.Fprintf(&b, "-A %s -m comment --comment \"%s -> %s\" -j %s\n", svc, s.PortName(), ep, SepChain(s, ep))
			}
		}
		for _, ep := range s.Endpoints {
			sep := SepChain(s, ep)
			fmt.Fprintf(&b, "-A %s -m comment --comment %s -s %s/%d -j KUBE-MARK-MASQ\n", sep, s.PortName(), ep.Addr(), f.HostBits())
			fmt.Fprintf(&b, "-A %s -m comment --comment %s -m tcp -p tcp -j DNAT --to-destination %s\n", sep, s.PortName(), ep)
		}
	}
	for _, c := range o.Stale {
		fmt.Fprintf(&b, "-X %s\n", c)
	}
	b.WriteString("COMMIT\n")
	return b.Bytes()
}

// FilterTable writes kube-proxy's fixed filter table: its chains, the rules
// that jump to them from the built-in chains (unless jumps is false: an
// update leaves those in place), and the KUBE-FORWARD and KUBE-FIREWALL
// rules. KUBE-SERVICES in filter holds REJECT rules for services without
// endpoints (none here). The NodePort benchmark writes the same table.
// KUBE-FIREWALL's localnet rule is IPv4's only, as in kube-proxy.
func (f Family) FilterTable(b *bytes.Buffer, jumps bool) {
	b.WriteString("*filter\n")
	for _, c := range []string{"KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "KUBE-FORWARD", "KUBE-NODEPORTS", "KUBE-PROXY-FIREWALL", "KUBE-FIREWALL"} {
		fmt.Fprintf(b, ":%s - [0:0]\n", c)
	}
	if jumps {
		b.WriteString(`-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-A INPUT -j KUBE-FIREWALL
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -j KUBE-FIREWALL
`)
	}
	b.WriteString(`-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
`)
	if !f.Is6() {
		b.WriteString(`-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
`)
	}
	b.WriteString("COMMIT\n")
}
