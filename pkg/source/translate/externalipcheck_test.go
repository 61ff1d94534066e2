package translate

import (
	"fmt"
	"testing"
)

// TestExternalIPsTheAPIServerRefuses: a Service whose spec.externalIPs
// has an address the API server refuses for a new Service (its
// ValidateService applies ValidateEndpointIP to each: unspecified,
// loopback, link-local unicast, link-local multicast; IPv4, IPv6 and
// IPv4-mapped IPv6) is refused by CheckExternalIPs (the manifest
// source's), naming the Service, the entry's index, the address and the
// API server's words, at any index. ValidateService and ServiceOf (the
// Kubernetes source's) take it, as kube-proxy does: the API server keeps
// an entry the Service held before it checked them. Addresses next to
// each range are accepted by all. The verdicts agree with the API
// server's, on net.IP (apiServerRefuses).
func TestExternalIPsTheAPIServerRefuses(t *testing.T) {
	const (
		loopback    = "may not be in the loopback range (127.0.0.0/8, ::1/128)"
		linkLocal   = "may not be in the link-local range (169.254.0.0/16, fe80::/10)"
		llMulticast = "may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)"
	)
	for _, c := range []struct {
		addr string
		why  string // "": accepted
	}{
		{"0.0.0.0", "may not be unspecified (0.0.0.0)"},
		{"127.0.0.1", loopback},
		{"127.255.255.254", loopback},
		{"169.254.169.254", linkLocal}, // the cloud metadata address
		{"224.0.0.251", llMulticast},
		{"::ffff:127.0.0.1", loopback},
		{"::ffff:169.254.169.254", linkLocal},
		{"::ffff:0.0.0.0", "may not be unspecified (::ffff:0.0.0.0)"},
		{"::ffff:224.0.0.1", llMulticast},
		{"::", "may not be unspecified (::)"},
		{"::1", loopback},
		{"fe80::1", linkLocal},
		{"ff02::1", llMulticast},
		{"203.0.113.7", ""},
		{"128.0.0.1", ""},
		{"169.255.0.1", ""},
		{"224.0.1.1", ""}, // global multicast: the API server takes it
		{"::ffff:203.0.113.7", ""},
		{"2001:db8::7", ""},
		{"::2", ""},
		{"fec0::1", ""},
		{"ff05::1", ""},
	} {
		t.Run(c.addr, func(t *testing.T) {
			if refused := apiServerRefuses(c.addr); refused != (c.why != "") {
				t.Fatalf("the API server refuses %s: %v; the table says %q", c.addr, refused, c.why)
			}
			// As externalIPs[0], and as externalIPs[1] after a good one.
			for i, ips := range [][]string{{c.addr}, {"198.51.100.1", c.addr}} {
				svc := service("web", []string{"10.96.0.1"}, sport("http", 80, "TCP"))
				svc.Spec.ExternalIPs = ips
				want := ""
				if c.why != "" {
					want = fmt.Sprintf(`service "default/web": externalIPs[%d]: address %q %s`, i, c.addr, c.why)
				}
				if err := CheckExternalIPs(svc); fmt.Sprint(err) != want && (err != nil || want != "") {
					t.Errorf("CheckExternalIPs with externalIPs %q = %v, want %q", ips, err, want)
				}
				if err := ValidateService(svc); err != nil {
					t.Errorf("ValidateService with externalIPs %q = %v, want nil (kube-proxy takes it)", ips, err)
				}
				if s := ServiceOf(svc); s.Invalid != nil || s.External == nil || len(s.External.IPs) != len(ips) {
					t.Errorf("ServiceOf with externalIPs %q: Invalid %v, External %+v; want every entry (kube-proxy takes it)", ips, s.Invalid, s.External)
				}
			}
		})
	}
	// An entry that does not parse is ValidateService's to refuse.
	svc := service("web", []string{"10.96.0.1"}, sport("http", 80, "TCP"))
	svc.Spec.ExternalIPs = []string{"not-an-ip", "127.0.0.1"}
	if err := CheckExternalIPs(svc); err == nil || err.Error() != `service "default/web": externalIPs[1]: address "127.0.0.1" `+loopback {
		t.Errorf("CheckExternalIPs after an entry that does not parse = %v, want externalIPs[1]'s refusal", err)
	}
	if err := ValidateService(svc); err == nil {
		t.Error("ValidateService took an externalIPs entry that does not parse")
	}
}
