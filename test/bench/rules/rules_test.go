package rules

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-lb/sluice/internal/testutil"
)

func TestIptablesShape(t *testing.T) {
	for _, f := range []Family{IPv4, IPv6} {
		t.Run(f.Name, func(t *testing.T) {
			svcs, err := f.Layout(3, 4)
			if err != nil {
				t.Fatal(err)
			}
			out := string(f.IptablesRestore(svcs, IptablesOptions{Jumps: true}))
			if p := os.Getenv("RULES_DUMP"); p != "" {
				p += "." + f.Name
				_ = os.WriteFile(p+".iptables", []byte(out), 0o644)
				_ = os.WriteFile(p+".nft", f.NftRuleset(svcs), 0o644)
				next := Clone(svcs)
				next[1].Endpoints[0] = f.SpareBackend(0)
				_ = os.WriteFile(p+".nft-update", f.NftEndpointChange(svcs[1], next[1]), 0o644)
				_ = os.WriteFile(p+".iptables-update", f.IptablesRestore(next, IptablesOptions{Stale: []string{SepChain(svcs[1], svcs[1].Endpoints[0])}}), 0o644)
			}
			host := fmt.Sprintf("/%d", f.HostBits())
			// One KUBE-SERVICES rule per service, in order, then the nodeports rule.
			var svcRules []string
			for _, l := range strings.Split(out, "\n") {
				if strings.HasPrefix(l, "-A KUBE-SERVICES") && strings.Contains(l, "KUBE-SVC-") {
					svcRules = append(svcRules, l)
				}
			}
			if len(svcRules) != 3 || !strings.Contains(svcRules[2], svcs[2].VIP.String()+host) {
				t.Fatalf("KUBE-SERVICES rules: %q", svcRules)
			}
			// Probabilities 1/4, 1/3, 1/2, then unconditional.
			svc := SvcChain(svcs[0])
			for _, want := range []string{"0.2500000000", "0.3333333333", "0.5000000000"} {
				if !strings.Contains(out, "--probability "+want+" -j KUBE-SEP-") {
					t.Errorf("missing probability %s", want)
				}
			}
			last := svcs[0].Endpoints[3]
			if !strings.Contains(out, "-A "+svc+" -m comment --comment \"bench/svc-00000:http -> "+last.String()+"\" -j KUBE-SEP-") {
				t.Errorf("last endpoint rule is not unconditional")
			}
			first := svcs[0].Endpoints[0]
			if !strings.Contains(out, "-j DNAT --to-destination "+first.String()+"\n") ||
				!strings.Contains(out, "-s "+first.Addr().String()+host+" -j KUBE-MARK-MASQ") {
				t.Errorf("missing DNAT or the endpoint's KUBE-MARK-MASQ")
			}
			if !strings.Contains(out, "! -s "+f.ClusterCIDR+" -j KUBE-MARK-MASQ") {
				t.Errorf("missing the cluster CIDR masquerade rule")
			}
			if got := strings.Contains(out, "127.0.0.0/8"); got == f.Is6() {
				t.Errorf("localnet rule present: %v, want %v (IPv4 only)", got, !f.Is6())
			}
			if len(SvcChain(svcs[0])) != len("KUBE-SVC-")+16 {
				t.Errorf("chain name %q", SvcChain(svcs[0]))
			}
		})
	}
}

func TestNftShape(t *testing.T) {
	for _, tc := range []struct {
		f          Family
		addrType   string
		vip1, ep05 string
	}{
		{IPv4, "ipv4_addr", "10.32.0.2", "10.80.0.6:8080"},
		{IPv6, "ipv6_addr", "2001:db8:32::2", "[2001:db8:64:80::6]:8080"},
	} {
		t.Run(tc.f.Name, func(t *testing.T) {
			f := tc.f
			svcs, _ := f.Layout(2, 3)
			out := string(f.NftRuleset(svcs))
			for _, want := range []string{
				"table " + f.NftFamily() + " kube-proxy {",
				"map service-ips { type " + tc.addrType + " . inet_proto . inet_service : verdict;",
				tc.vip1 + " . tcp . 80 : goto " + NftServiceChain(svcs[1]),
				"numgen random mod 3 vmap { 0 : goto " + NftEndpointChain(svcs[0], svcs[0].Endpoints[0]),
				"meta l4proto tcp dnat to " + tc.ep05,
				f.NftFamily() + " daddr " + f.ServiceCIDR + " drop",
			} {
				if !strings.Contains(out, want) {
					t.Errorf("ruleset lacks %q", want)
				}
			}
			next := Clone(svcs)
			next[0].Endpoints[1] = f.SpareBackend(0)
			up := string(f.NftEndpointChange(svcs[0], next[0]))
			ip := f.NftFamily()
			if !strings.Contains(up, "add chain "+ip+" kube-proxy "+NftEndpointChain(next[0], f.SpareBackend(0))) ||
				!strings.Contains(up, "add rule "+ip+" kube-proxy "+NftEndpointChain(next[0], f.SpareBackend(0))+" "+ip+" saddr "+f.SpareBackend(0).Addr().String()+" jump") ||
				!strings.Contains(up, "delete chain "+ip+" kube-proxy "+NftEndpointChain(svcs[0], svcs[0].Endpoints[1])) {
				t.Errorf("update transaction:\n%s", up)
			}
		})
	}
}

// TestNftParses has nft check the rulesets of both families (nft -c: parse
// and validate against the kernel, without committing).
func TestNftParses(t *testing.T) {
	testutil.Privileged(t)
	testutil.NeedCommands(t, "nft")
	for _, f := range []Family{IPv4, IPv6} {
		t.Run(f.Name, func(t *testing.T) {
			svcs, _ := f.Layout(3, 2)
			next := Clone(svcs)
			next[2].Endpoints[0] = f.SpareBackend(0)
			for name, data := range map[string][]byte{"ruleset": f.NftRuleset(svcs), "update": append(f.NftRuleset(svcs), f.NftEndpointChange(svcs[2], next[2])...)} {
				p := filepath.Join(t.TempDir(), name+".nft")
				if err := os.WriteFile(p, data, 0o644); err != nil {
					t.Fatal(err)
				}
				if out, err := exec.Command("nft", "-c", "-f", p).CombinedOutput(); err != nil {
					t.Errorf("nft -c %s: %v\n%s", name, err, out)
				}
			}
		})
	}
}

func TestLayoutBounds(t *testing.T) {
	for _, f := range []Family{IPv4, IPv6} {
		// 100,000 Services x 10 endpoints: the suite's largest row (issue 14).
		if _, err := f.Layout(100000, 10); err != nil {
			t.Fatal(err)
		}
		if _, err := f.Layout(maxServices+1, 1); err == nil {
			t.Fatalf("%d services accepted", maxServices+1)
		}
		if _, err := f.Layout(0, 10); err == nil {
			t.Fatal("0 services accepted")
		}
		a, b := f.Backend(99999, 9, 10), f.SpareBackend(0)
		if a.Addr().Compare(b.Addr()) >= 0 {
			t.Fatalf("%s: spare %s overlaps backends (last %s)", f.Name, b, a)
		}
		for _, in := range []struct {
			a      string
			prefix string
		}{
			{f.VIP(maxServices - 1).String(), f.ServiceCIDR},
			{b.Addr().String(), f.BackendCIDR},
			{f.SpareBackend(maxBackends - spareBackend - 1).Addr().String(), f.BackendCIDR},
			{a.Addr().String(), f.ClusterCIDR},
		} {
			if !netip.MustParsePrefix(in.prefix).Contains(netip.MustParseAddr(in.a)) {
				t.Errorf("%s: %s not in %s", f.Name, in.a, in.prefix)
			}
		}
	}
	if _, err := FamilyOf("ipv5"); err == nil {
		t.Error("FamilyOf(ipv5) accepted")
	}
}
