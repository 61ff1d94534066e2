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

// NftEndpointChain is kube-proxy's nftables per-endpoint chain name.
func NftEndpointChain(s Service, ep netip.AddrPort) string {
	return "endpoint-" + nftHash(s.PortName()+"tcp"+ep.String()) + "-" + nftBase(s) + "__" + ep.Addr().String() + "/" + fmt.Sprint(ep.Port())
}

// NftRuleset renders services as a kube-proxy-shaped nftables ruleset (like
// kube-proxy's nftables mode): one verdict map service-ips keyed by
// daddr . l4proto . dport, a chain per service that picks an endpoint with
// numgen random into a verdict map, and a chain per endpoint that DNATs. The
// script deletes and recreates the table in one transaction.
func NftRuleset(svcs []Service) []byte {
	var b bytes.Buffer
	b.Grow(len(svcs) * 3072)
	fmt.Fprintf(&b, "add table ip %[1]s\ndelete table ip %[1]s\ntable ip %[1]s {\n", NftTable)
	fmt.Fprintf(&b, "\tcomment \"rules for kube-proxy\"\n")
	b.WriteString(`	set cluster-ips { type ipv4_addr; comment "Active ClusterIPs"; }
	map service-ips { type ipv4_addr . inet_proto . inet_service : verdict; comment "ClusterIP, ExternalIP and LoadBalancer IP traffic"; }
	map service-nodeports { type inet_proto . inet_service : verdict; comment "NodePort traffic"; }
	map no-endpoint-services { type ipv4_addr . inet_proto . inet_service : verdict; comment "vmap to drop or reject packets to services with no endpoints"; }
	chain filter-prerouting { type filter hook prerouting priority -110; ct state new jump firewall-check; }
	chain filter-forward { type filter hook forward priority -110; ct state new jump service-endpoints-check; ct state new jump cluster-ips-check; }
	chain filter-output { type filter hook output priority -110; ct state new jump service-endpoints-check; }
	chain filter-output-post-dnat { type filter hook output priority -90; ct state new jump cluster-ips-check; }
	chain firewall-check { }
	chain service-endpoints-check { ip daddr . meta l4proto . th dport vmap @no-endpoint-services; }
	chain cluster-ips-check { ip daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"; ip daddr ` + ServiceCIDR + ` drop comment "Drop traffic to unallocated ClusterIPs"; }
	chain mark-for-masquerade { mark set mark or 0x4000; }
	chain masquerading { meta mark & 0x4000 == 0 return; meta mark set meta mark ^ 0x4000; masquerade fully-random; }
	chain services { ip daddr . meta l4proto . th dport vmap @service-ips; fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports; }
	chain nat-prerouting { type nat hook prerouting priority -100; jump services; }
	chain nat-output { type nat hook output priority -100; jump services; }
	chain nat-postrouting { type nat hook postrouting priority 100; jump masquerading; }
`)
	for _, s := range svcs {
		writeNftServiceChain(&b, s, "\t")
		for _, ep := range s.Endpoints {
			writeNftEndpointChain(&b, s, ep, "\t")
		}
	}
	b.WriteString("}\n")
	// Elements go in batches: one statement per element would be slow to parse.
	const batch = 2000
	for i := 0; i < len(svcs); i += batch {
		j := min(i+batch, len(svcs))
		fmt.Fprintf(&b, "add element ip %s cluster-ips {", NftTable)
		for k, s := range svcs[i:j] {
			if k > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, " %s", s.VIP)
		}
		b.WriteString(" }\n")
		fmt.Fprintf(&b, "add element ip %s service-ips {", NftTable)
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

func writeNftServiceChain(b *bytes.Buffer, s Service, indent string) {
	fmt.Fprintf(b, "%schain %s {\n", indent, NftServiceChain(s))
	fmt.Fprintf(b, "%s\tip daddr %s tcp dport %d ip saddr != %s jump mark-for-masquerade\n", indent, s.VIP, s.Port, ClusterCIDR)
	fmt.Fprintf(b, "%s\tnumgen random mod %d vmap {", indent, len(s.Endpoints))
	for i, ep := range s.Endpoints {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(b, " %d : goto %s", i, NftEndpointChain(s, ep))
	}
	fmt.Fprintf(b, " }\n%s}\n", indent)
}

func writeNftEndpointChain(b *bytes.Buffer, s Service, ep netip.AddrPort, indent string) {
	fmt.Fprintf(b, "%schain %s {\n", indent, NftEndpointChain(s, ep))
	fmt.Fprintf(b, "%s\tip saddr %s jump mark-for-masquerade\n", indent, ep.Addr())
	fmt.Fprintf(b, "%s\tmeta l4proto tcp dnat to %s\n%s}\n", indent, ep, indent)
}

// NftEndpointChange is the transaction kube-proxy's nftables mode sends when
// one endpoint of a service is replaced: create the new endpoint chain,
// rewrite the service chain, delete the old endpoint chain.
func NftEndpointChange(old, new Service) []byte {
	var b bytes.Buffer
	have := map[netip.AddrPort]bool{}
	for _, ep := range old.Endpoints {
		have[ep] = true
	}
	want := map[netip.AddrPort]bool{}
	for _, ep := range new.Endpoints {
		want[ep] = true
		if !have[ep] {
			fmt.Fprintf(&b, "add chain ip %s %s\n", NftTable, NftEndpointChain(new, ep))
			fmt.Fprintf(&b, "flush chain ip %s %s\n", NftTable, NftEndpointChain(new, ep))
			fmt.Fprintf(&b, "add rule ip %s %s ip saddr %s jump mark-for-masquerade\n", NftTable, NftEndpointChain(new, ep), ep.Addr())
			fmt.Fprintf(&b, "add rule ip %s %s meta l4proto tcp dnat to %s\n", NftTable, NftEndpointChain(new, ep), ep)
		}
	}
	svc := NftServiceChain(new)
	fmt.Fprintf(&b, "flush chain ip %s %s\n", NftTable, svc)
	fmt.Fprintf(&b, "add rule ip %s %s ip daddr %s tcp dport %d ip saddr != %s jump mark-for-masquerade\n", NftTable, svc, new.VIP, new.Port, ClusterCIDR)
	fmt.Fprintf(&b, "add rule ip %s %s numgen random mod %d vmap {", NftTable, svc, len(new.Endpoints))
	for i, ep := range new.Endpoints {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, " %d : goto %s", i, NftEndpointChain(new, ep))
	}
	b.WriteString(" }\n")
	for _, ep := range old.Endpoints {
		if !want[ep] {
			fmt.Fprintf(&b, "delete chain ip %s %s\n", NftTable, NftEndpointChain(old, ep))
		}
	}
	return b.Bytes()
}
