package translate

import "testing"

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
