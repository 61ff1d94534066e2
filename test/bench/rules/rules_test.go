package rules

import (
	"os"
	"strings"
	"testing"
)

func TestIptablesShape(t *testing.T) {
	svcs, err := Layout(3, 4)
	if err != nil {
		t.Fatal(err)
	}
	out := string(IptablesRestore(svcs, IptablesOptions{Jumps: true}))
	if p := os.Getenv("RULES_DUMP"); p != "" {
		_ = os.WriteFile(p+".iptables", []byte(out), 0o644)
		_ = os.WriteFile(p+".nft", NftRuleset(svcs), 0o644)
		next := Clone(svcs)
		next[1].Endpoints[0] = SpareBackend(0)
		_ = os.WriteFile(p+".nft-update", NftEndpointChange(svcs[1], next[1]), 0o644)
		_ = os.WriteFile(p+".iptables-update", IptablesRestore(next, IptablesOptions{Stale: []string{SepChain(svcs[1], svcs[1].Endpoints[0])}}), 0o644)
	}
	// One KUBE-SERVICES rule per service, in order, then the nodeports rule.
	var svcRules []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "-A KUBE-SERVICES") && strings.Contains(l, "nat") == false && strings.Contains(l, "KUBE-SVC-") {
			svcRules = append(svcRules, l)
		}
	}
	if len(svcRules) != 3 || !strings.Contains(svcRules[2], svcs[2].VIP.String()+"/32") {
		t.Fatalf("KUBE-SERVICES rules: %q", svcRules)
	}
	// Probabilities 1/4, 1/3, 1/2, then unconditional.
	svc := SvcChain(svcs[0])
	for _, want := range []string{"0.2500000000", "0.3333333333", "0.5000000000"} {
		if !strings.Contains(out, "--probability "+want+" -j KUBE-SEP-") {
			t.Errorf("missing probability %s", want)
		}
	}
	if !strings.Contains(out, "-A "+svc+" -m comment --comment \"bench/svc-00000:http -> 10.80.0.4:8080\" -j KUBE-SEP-") {
		t.Errorf("last endpoint rule is not unconditional")
	}
	if !strings.Contains(out, "-j DNAT --to-destination 10.80.0.1:8080") || !strings.Contains(out, "-j KUBE-MARK-MASQ") {
		t.Errorf("missing DNAT or KUBE-MARK-MASQ")
	}
	if len(SvcChain(svcs[0])) != len("KUBE-SVC-")+16 {
		t.Errorf("chain name %q", SvcChain(svcs[0]))
	}
}

func TestNftShape(t *testing.T) {
	svcs, _ := Layout(2, 3)
	out := string(NftRuleset(svcs))
	for _, want := range []string{
		"map service-ips { type ipv4_addr . inet_proto . inet_service : verdict;",
		"10.32.0.2 . tcp . 80 : goto " + NftServiceChain(svcs[1]),
		"numgen random mod 3 vmap { 0 : goto " + NftEndpointChain(svcs[0], svcs[0].Endpoints[0]),
		"meta l4proto tcp dnat to 10.80.0.6:8080",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("ruleset lacks %q", want)
		}
	}
	next := Clone(svcs)
	next[0].Endpoints[1] = SpareBackend(0)
	up := string(NftEndpointChange(svcs[0], next[0]))
	if !strings.Contains(up, "add chain ip kube-proxy "+NftEndpointChain(next[0], SpareBackend(0))) ||
		!strings.Contains(up, "delete chain ip kube-proxy "+NftEndpointChain(svcs[0], svcs[0].Endpoints[1])) {
		t.Errorf("update transaction:\n%s", up)
	}
}

func TestLayoutBounds(t *testing.T) {
	if _, err := Layout(30000, 10); err != nil {
		t.Fatal(err)
	}
	if _, err := Layout(0, 10); err == nil {
		t.Fatal("0 services accepted")
	}
	a, b := Backend(29999, 9, 10), SpareBackend(0)
	if a.Addr().Compare(b.Addr()) >= 0 {
		t.Fatalf("spare %s overlaps backends (last %s)", b, a)
	}
}
