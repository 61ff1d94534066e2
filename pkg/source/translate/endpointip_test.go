package translate

import (
	"fmt"
	"net"
	"net/netip"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
	netutils "k8s.io/utils/net"
)

// apiServerRefuses is the API server's ValidateEndpointIP
// (k8s.io/kubernetes v1.36.3 pkg/apis/core/validation/validation.go) on
// net.IP, which EndpointSlice validation applies to every address of an
// IPv4 or IPv6 slice: the oracle EndpointIPRefusal must agree with.
func apiServerRefuses(a string) bool {
	ip := netutils.ParseIPSloppy(a)
	return ip == nil || ip.IsUnspecified() || ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast()
}

// TestEndpointAddressesTheAPIServerRefuses: an endpoint address the API
// server refuses (unspecified, loopback, link-local unicast, link-local
// multicast; IPv4, IPv6, and IPv4-mapped IPv6 in an IPv4 slice) makes
// CheckEndpointIPs (the manifest source's) refuse the slice, naming the
// slice, the endpoint, the address and why, in any endpoint and any
// address of one. ValidateEndpointSlice, SliceOf and EndpointAddress (the
// Kubernetes source's) take it, as kube-proxy does: the API server keeps
// such an address in a slice stored before it checked them. Addresses
// next to each range are accepted by all. The verdicts agree with the API
// server's, on net.IP.
func TestEndpointAddressesTheAPIServerRefuses(t *testing.T) {
	// The API server's words for an unspecified address quote it as
	// written: fmt.Sprintf("may not be unspecified (%v)", ipAddress).
	unspecified := func(a string) string { return "may not be unspecified (" + a + ")" }
	const (
		loopback    = "may not be in the loopback range (127.0.0.0/8, ::1/128)"
		linkLocal   = "may not be in the link-local range (169.254.0.0/16, fe80::/10)"
		llMulticast = "may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)"
	)
	good := map[discoveryv1.AddressType]string{discoveryv1.AddressTypeIPv4: "10.0.0.1", discoveryv1.AddressTypeIPv6: "2001:db8::1"}
	v4, v6 := discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6
	for _, c := range []struct {
		family discoveryv1.AddressType
		addr   string
		why    string // "": accepted
	}{
		{v4, "0.0.0.0", unspecified("0.0.0.0")},
		{v4, "127.0.0.1", loopback},
		{v4, "127.255.255.254", loopback},
		{v4, "169.254.169.254", linkLocal}, // the cloud metadata address
		{v4, "169.254.0.1", linkLocal},
		{v4, "224.0.0.251", llMulticast},
		{v4, "224.0.0.0", llMulticast},
		{v4, "::ffff:127.0.0.1", loopback},
		{v4, "::ffff:169.254.169.254", linkLocal},
		{v4, "::ffff:0.0.0.0", unspecified("::ffff:0.0.0.0")},
		{v4, "::ffff:224.0.0.1", llMulticast},
		{v4, "10.0.0.1", ""},
		{v4, "126.255.255.255", ""},
		{v4, "128.0.0.1", ""},
		{v4, "169.253.255.255", ""},
		{v4, "169.255.0.1", ""},
		{v4, "224.0.1.1", ""}, // global multicast: the API server takes it
		{v4, "::ffff:10.0.0.1", ""},
		{v6, "::", unspecified("::")},
		{v6, "0:0:0:0:0:0:0:0", unspecified("0:0:0:0:0:0:0:0")},
		{v6, "::1", loopback},
		{v6, "fe80::1", linkLocal},
		{v6, "febf:ffff::1", linkLocal},
		{v6, "ff02::1", llMulticast},
		{v6, "ff12::1:2", llMulticast}, // a transient group's flag: still link-local scope
		{v6, "2001:db8::1", ""},
		{v6, "::2", ""},
		{v6, "fe7f::1", ""},
		{v6, "fec0::1", ""},
		{v6, "ff05::1", ""},
	} {
		t.Run(string(c.family)+"/"+c.addr, func(t *testing.T) {
			if refused := apiServerRefuses(c.addr); refused != (c.why != "") {
				t.Fatalf("the API server refuses %s: %v; the table says %q", c.addr, refused, c.why)
			}
			want := ""
			if c.why != "" {
				want = fmt.Sprintf("address %q %s", c.addr, c.why)
			}
			// As endpoints[1], and as the second address of endpoints[1].
			for _, addrs := range [][]string{{c.addr}, {good[c.family], c.addr}} {
				es := slice("s", "a", nil, ep{addr: good[c.family]}, ep{addr: addrs[0]})
				es.AddressType = c.family
				es.Endpoints[1].Addresses = addrs
				wantErr := ""
				if want != "" {
					wantErr = `endpointslice "default/s": endpoints[1]: ` + want
				}
				if err := CheckEndpointIPs(es); fmt.Sprint(err) != wantErr && (err != nil || wantErr != "") {
					t.Errorf("CheckEndpointIPs with endpoints[1].addresses %q = %v, want %q", addrs, err, wantErr)
				}
				if err := ValidateEndpointSlice(es); err != nil {
					t.Errorf("ValidateEndpointSlice with endpoints[1].addresses %q = %v, want nil (kube-proxy takes it)", addrs, err)
				}
				if s := SliceOf(es); s.Invalid != nil {
					t.Errorf("SliceOf with endpoints[1].addresses %q: Invalid %v, want nil (kube-proxy takes it)", addrs, s.Invalid)
				}
			}
			if _, ok := EndpointAddress(c.family, c.addr); !ok {
				t.Errorf("EndpointAddress(%s, %q) refused it; kube-proxy takes it", c.family, c.addr)
			}
			if ip, ok := parseIPSloppy(c.addr); !ok || EndpointIPRefusal(ip, c.addr) != c.why {
				t.Errorf("EndpointIPRefusal(%s) = %q, want %q", c.addr, EndpointIPRefusal(ip, c.addr), c.why)
			}
		})
	}
	// An IPv4-mapped address as netip keeps it (not unmapped, as a source
	// parsing its own way may hold it) is judged as the IPv4 one.
	for _, a := range []string{"127.0.0.1", "169.254.169.254", "0.0.0.0", "224.0.0.5"} {
		ip, _ := parseIPSloppy(a)
		mapped := ip.As16()
		if why := EndpointIPRefusal(netip.AddrFrom16(mapped), "::ffff:"+a); why == "" {
			t.Errorf("EndpointIPRefusal(::ffff:%s held mapped) accepted it", a)
		}
	}
	if !net.ParseIP("::ffff:127.0.0.1").IsLoopback() {
		t.Fatal("net.IP no longer judges an IPv4-mapped address as IPv4: the oracle above changed")
	}
}
