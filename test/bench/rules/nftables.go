package rules

import (
	"bytes"
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"net/netip"
	"strings"
)

// NftTable is the table the nftables stand-in programs, as kube-proxy does.
const NftTable = "kube-proxy"

func nftHash(s string) string {
	h := sha256.Sum256([]byte(s))
	return base32.StdEncoding.EncodeToString(h[:])[:8]
}

func nftBase(s Service) string {
	ns, name, _ := strings.Cut(s.Name, "/")
	return ns + "/" + name + "/tcp/" + PortName
}

// NftServiceChain is kube-proxy's nftables per-service chain name.
func NftServiceChain(s Service) string {
	return "service-" + nftHash(s.PortName()+"tcp") + "-" + nftBase(s)
}

// NftEndpointChain is kube-proxy's nftables per-endpoint chain name. An
// IPv6 address's colons become dots, which a chain name may hold.
func NftEndpointChain(s Service, ep netip.AddrPort) string {
	return "endpoint-" + nftHash(s.PortName()+"tcp"+ep.String()) + "-" + nftBase(s) + "__" +
		strings.ReplaceAll(ep.Addr().String(), ":", ".") + "/" + fmt.Sprint(ep.Port())
}

// NftFamily is the nftables family of the plan's table: ip or ip6. It is
// also the keyword of its address matches (ip daddr, ip6 daddr).
func (f Family) NftFamily() string {
	if f.Is6() {
		return "ip6"
	}
	return "ip"
}

// nftWords are the words of the ruleset that differ by family.
func (f Family) nftWords() (addrType, localhost string) {
	if f.Is6() {
		return "ipv6_addr", "::1"
	}
	return "ipv4_addr", "127.0.0.0/8"
}

// NftRuleset renders services as a kube-proxy-shaped nftables ruleset (like
// kube-proxy's nftables mode): one verdict map service-ips keyed by
// daddr . l4proto . dport, a chain per service that picks an endpoint with
// numgen random into a verdict map, and a chain per endpoint that DNATs. The
// script deletes and recreates the table in one transaction.
func (f Family) NftRuleset(svcs []Service) []byte {
	var b bytes.Buffer
	b.Grow(len(svcs) * 3072)
	ip := f.NftFamily()
	addrType, localhost := f.nftWords()
	fmt.Fprintf(&b, "add table %[2]s %[1]s\ndelete table %[2]s %[1]s\ntable %[2]s %[1]s {\n", NftTable, ip)
	fmt.Fprintf(&b, "\tcomment \"rules for kube-proxy\"\n")
	b.WriteString(strings.NewReplacer("IP ", ip+" ", "ADDR", addrType, "LOCALHOST", localhost, "SERVICECIDR", f.ServiceCIDR).Replace(
		`	set cluster-ips { type ADDR; comment "Active ClusterIPs"; }
	map service-ips { type ADDR . inet_proto . inet_service : verdict; comment "ClusterIP, ExternalIP and LoadBalancer IP traffic"; }
	map service-nodeports { type inet_proto . inet_service : verdict; comment "NodePort traffic"; }
	map no-endpoint-services { type ADDR . inet_proto . inet_service : verdict; comment "vmap to drop or reject packets to services with no endpoints"; }
	chain filter-prerouting { type filter hook prerouting priority -110; ct state new jump firewall-check; }
	chain filter-forward { type filter hook forward priority -110; ct state new jump service-endpoints-check; ct state new jump cluster-ips-check; }
	chain filter-output { type filter hook output priority -110; ct state new jump service-endpoints-check; }
	chain filter-output-post-dnat { type filter hook output priority -90; ct state new jump cluster-ips-check; }
	chain firewall-check { }
	chain service-endpoints-check { IP daddr . meta l4proto . th dport vmap @no-endpoint-services; }
	chain cluster-ips-check { IP daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"; IP daddr SERVICECIDR drop comment "Drop traffic to unallocated ClusterIPs"; }
	chain mark-for-masquerade { mark set mark or 0x4000; }
	chain masquerading { meta mark & 0x4000 == 0 return; meta mark set meta mark ^ 0x4000; masquerade fully-random; }
	chain services { IP daddr . meta l4proto . th dport vmap @service-ips; fib daddr type local IP daddr != LOCALHOST meta l4proto . th dport vmap @service-nodeports; }
	chain nat-prerouting { type nat hook prerouting priority -100; jump services; }
	chain nat-output { type nat hook output priority -100; jump services; }
	chain nat-postrouting { type nat hook postrouting priority 100; jump masquerading; }
`))
	for _, s := range svcs {
		f.writeNftServiceChain(&b, s, "\t")
		for _, ep := range s.Endpoints {
			writeNftEndpointChain(&b, ip, s, ep, "\t")
		}
	}
	b.WriteString("}\n")
	// Elements go in batches: one statement per element would be slow to parse.
	const batch = 2000
	for i := 0; i < len(svcs); i += batch {
		j := min(i+batch, len(svcs))
		fmt.Fprintf(&b, "add element %s %s cluster-ips {", ip, NftTable)
		for k, s := range svcs[i:j] {
			if k > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, " %s", s.VIP)
		}
		b.WriteString(" }\n")
		fmt.Fprintf(&b, "add element %s %s service-ips {", ip, NftTable)
		for k, s := range svcs[i:j] {
			if k > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, " %s . tcp . %d : goto %s", s.VIP, s.Port, NftServiceChain(s))
		}
		b.WriteString(" }\n")
	}
	return b.Bytes()
}

func (f Family) writeNftServiceChain(b *bytes.Buffer, s Service, indent string) {
	ip := f.NftFamily()
	fmt.Fprintf(b, "%schain %s {\n", indent, NftServiceChain(s))
	fmt.Fprintf(b, "%s\t%s daddr %s tcp dport %d %s saddr != %s jump mark-for-masquerade\n", indent, ip, s.VIP, s.Port, ip, f.ClusterCIDR)
	fmt.Fprintf(b, "%s\tnumgen random mod %d vmap {", indent, len(s.Endpoints))
	for i, ep := range s.Endpoints {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(b, " %d : goto %s", i, NftEndpointChain(s, ep))
	}
	fmt.Fprintf(b, " }\n%s}\n", indent)
}

func writeNftEndpointChain(b *bytes.Buffer, ip string, s Service, ep netip.AddrPort, indent string) {
	fmt.Fprintf(b, "%schain %s {\n", indent, NftEndpointChain(s, ep))
	fmt.Fprintf(b, "%s\t%s saddr %s jump mark-for-masquerade\n", indent, ip, ep.Addr())
	fmt.Fprintf(b, "%s\tmeta l4proto tcp dnat to %s\n%s}\n", indent, ep, indent)
}

// NftEndpointChange is the transaction kube-proxy's nftables mode sends when
// one endpoint of a service is replaced: create the new endpoint chain,
// rewrite the service chain, delete the old endpoint chain.
func (f Family) NftEndpointChange(old, new Service) []byte {
	var b bytes.Buffer
	ip := f.NftFamily()
	have := map[netip.AddrPort]bool{}
	for _, ep := range old.Endpoints {
		have[ep] = true
	}
	want := map[netip.AddrPort]bool{}
	for _, ep := range new.Endpoints {
		want[ep] = true
		if !have[ep] {
			c := NftEndpointChain(new, ep)
			fmt.Fprintf(&b, "add chain %s %s %s\n", ip, NftTable, c)
			fmt.Fprintf(&b, "flush chain %s %s %s\n", ip, NftTable, c)
			fmt.Fprintf(&b, "add rule %s %s %s %s saddr %s jump mark-for-masquerade\n", ip, NftTable, c, ip, ep.Addr())
			fmt.Fprintf(&b, "add rule %s %s %s meta l4proto tcp dnat to %s\n", ip, NftTable, c, ep)
		}
	}
	svc := NftServiceChain(new)
	fmt.Fprintf(&b, "flush chain %s %s %s\n", ip, NftTable, svc)
	fmt.Fprintf(&b, "add rule %s %s %s %s daddr %s tcp dport %d %s saddr != %s jump mark-for-masquerade\n", ip, NftTable, svc, ip, new.VIP, new.Port, ip, f.ClusterCIDR)
	fmt.Fprintf(&b, "add rule %s %s %s numgen random mod %d vmap {", ip, NftTable, svc, len(new.Endpoints))
	for i, ep := range new.Endpoints {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, " %d : goto %s", i, NftEndpointChain(new, ep))
	}
	b.WriteString(" }\n")
	for _, ep := range old.Endpoints {
		if !want[ep] {
			fmt.Fprintf(&b, "delete chain %s %s %s\n", ip, NftTable, NftEndpointChain(old, ep))
		}
	}
	return b.Bytes()
}
