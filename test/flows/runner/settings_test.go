package runner

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/sluice-lb/sluice/test/flows"
)

func TestSettingArgs(t *testing.T) {
	n := &flows.Node{
		Name: "test-node", IPs: []netip.Addr{netip.MustParseAddr("192.168.0.2")},
		ClusterCIDR:       netip.MustParsePrefix("10.0.0.0/8"),
		NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("192.168.0.2/32"), netip.MustParsePrefix("127.0.0.1/32")},
	}
	args, dropped := settingArgs(n, func(f string) bool { return f == "--cluster-cidr" })
	want := []string{"--node-name=test-node", "--node-ip=192.168.0.2", "--nodeport-addresses=192.168.0.2/32,127.0.0.1/32", "--localhost-nodeports=false"}
	if !slices.Equal(args, want) || !slices.Equal(dropped, []string{"--cluster-cidr"}) {
		t.Errorf("settingArgs = %q dropped %q, want %q dropped [--cluster-cidr]", args, dropped, want)
	}
	n.Zone, n.MasqueradeAll, n.LocalhostNodePorts = "zone-a", true, true
	n.ServiceCIDR = netip.MustParsePrefix("172.30.0.0/16")
	args, _ = settingArgs(n, func(string) bool { return false })
	for _, a := range []string{"--node-zone=zone-a", "--masquerade-all=true", "--localhost-nodeports=true", "--service-cidr=172.30.0.0/16", "--cluster-cidr=10.0.0.0/8"} {
		if !slices.Contains(args, a) {
			t.Errorf("settingArgs = %q, lacks %s", args, a)
		}
	}
}

func TestUnknownFlag(t *testing.T) {
	for out, want := range map[string]string{
		"flag provided but not defined: -cluster-cidr\nUsage:\n": "--cluster-cidr",
		"flag provided but not defined: --node-zone\n":           "--node-zone",
		"flag provided but not defined: -bogus\n":                "", // not one of ours
		"level=ERROR msg=\"bad flag\"":                           "",
	} {
		if got := unknownFlag(out); got != want {
			t.Errorf("unknownFlag(%q) = %q, want %q", out, got, want)
		}
	}
}
