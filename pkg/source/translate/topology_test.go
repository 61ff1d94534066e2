package translate

import (
	"math/rand/v2"
	"net/netip"
	"testing"

	netutils "k8s.io/utils/net"
)

// TestParseCIDRSloppyUnmaps: an IPv4-mapped prefix is the IPv4 prefix it
// maps, as kube-proxy's family test takes it (found by FuzzServiceToModel:
// "::ffff:10.0.0.0/104" in loadBalancerSourceRanges reached an IPv6
// frontend as a 4in6 range).
func TestParseCIDRSloppyUnmaps(t *testing.T) {
	for in, want := range map[string]string{
		"::ffff:10.0.0.0/104": "10.0.0.0/8",
		"::ffff:10.1.2.3/128": "10.1.2.3/32",
		"::ffff:0.0.0.0/96":   "0.0.0.0/0",
		"::ffff:10.0.0.0/80":  "::/80",
		"010.000.0.0/8":       "10.0.0.0/8",
		"2001:db8::1/64":      "2001:db8::/64",
	} {
		got, ok := parseCIDRSloppy(in)
		if !ok || got.String() != want {
			t.Errorf("parseCIDRSloppy(%q) = %v, %v; want %s", in, got, ok, want)
		}
	}
}

// TestParseIPSloppyAsNetutils: parseIPSloppy reads every address as
// netutils.ParseIPSloppy (kube-proxy's parser) does, whichever of its
// paths takes it: addresses of both families, IPv4-mapped ones, leading
// zeros, zones, and strings drawn at random from the characters of
// addresses.
func TestParseIPSloppyAsNetutils(t *testing.T) {
	ins := []string{"", "10.0.0.1", "010.000.00.1", "10.0.0.256", "10.0.0", "1.2.3.4.5", "::", "::1", "fd00::10",
		"::ffff:10.0.0.1", "::ffff:010.0.0.1", "::ffff:a00:1", "0:0:0:0:0:ffff:10.0.0.1", "::10.0.0.1", "1::10.0.0.1",
		"fe80::1%eth0", "10.0.0.1%eth0", "FD00::A", "fd00:0:0:0:0:0:0:10", "fd00::10::1", "00010.0.0.1", " 10.0.0.1", "1:2:3:4:5:6:7:8:9"}
	r := rand.New(rand.NewPCG(14, 3))
	const chars = "0123456789abcdef.:%f"
	for range 20000 {
		b := make([]byte, 1+r.IntN(20))
		for i := range b {
			b[i] = chars[r.IntN(len(chars))]
		}
		ins = append(ins, string(b))
	}
	for _, in := range ins {
		got, ok := parseIPSloppy(in)
		var want netip.Addr
		ip := netutils.ParseIPSloppy(in)
		if v4 := ip.To4(); v4 != nil {
			want = netip.AddrFrom4([4]byte(v4))
		} else if ip != nil {
			want = netip.AddrFrom16([16]byte(ip))
		}
		if got != want || ok != want.IsValid() {
			t.Errorf("parseIPSloppy(%q) = %v, %v; netutils reads %v", in, got, ok, ip)
		}
	}
}
