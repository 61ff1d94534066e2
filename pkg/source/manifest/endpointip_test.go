package manifest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// endpointIPCases are endpoint addresses the API server refuses
// (ValidateEndpointIP), of both families, with its words.
var endpointIPCases = []struct{ family, addr, why string }{
	{"IPv4", "127.0.0.1", "may not be in the loopback range (127.0.0.0/8, ::1/128)"},
	{"IPv4", "169.254.169.254", "may not be in the link-local range (169.254.0.0/16, fe80::/10)"},
	{"IPv4", "0.0.0.0", "may not be unspecified (0.0.0.0)"},
	{"IPv4", "224.0.0.251", "may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)"},
	{"IPv4", "::ffff:169.254.169.254", "may not be in the link-local range (169.254.0.0/16, fe80::/10)"},
	{"IPv6", "::1", "may not be in the loopback range (127.0.0.0/8, ::1/128)"},
	{"IPv6", "fe80::1", "may not be in the link-local range (169.254.0.0/16, fe80::/10)"},
	{"IPv6", "::", "may not be unspecified (::)"},
	{"IPv6", "ff02::fb", "may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)"},
}

// endpointIPFiles returns a file of Service ns/a and its slice ns/a-1
// whose second endpoint has address addr (of the slice's family), as
// YAML or as a JSON List as encoding/json writes it (each endpoint in the
// form the fast decoder's compactEndpoint reads), and the file's name.
func endpointIPFiles(format, family, addr string) (name, content string) {
	svc := `{"apiVersion":"v1","kind":"Service","metadata":{"name":"a","namespace":"ns"},"spec":{"clusterIP":"10.96.0.1","clusterIPs":["10.96.0.1","2001:db8::1"],"ipFamilies":["IPv4","IPv6"],"ipFamilyPolicy":"PreferDualStack","ports":[{"name":"http","port":80,"protocol":"TCP"}]}}`
	good := map[string]string{"IPv4": "10.0.0.1", "IPv6": "2001:db8:1::1"}[family]
	es := fmt.Sprintf(`{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"a-1","namespace":"ns","labels":{"kubernetes.io/service-name":"a"}},"addressType":%q,"ports":[{"name":"http","port":8080,"protocol":"TCP"}],"endpoints":[{"addresses":[%q],"conditions":{"ready":true,"serving":true,"terminating":false}},{"addresses":[%q],"conditions":{"ready":true,"serving":true,"terminating":false}}]}`,
		family, good, addr)
	if format == "json" {
		return "f.json", `{"apiVersion":"v1","kind":"List","items":[` + svc + "," + es + "]}"
	}
	// JSON is YAML: one document each.
	return "f.yaml", svc + "\n---\n" + es + "\n"
}

// TestManifestRefusesEndpointAddressesTheAPIServerRefuses: a manifest
// slice with an endpoint address the API server would refuse (loopback,
// link-local such as the cloud metadata address, unspecified, link-local
// multicast; both families, IPv4-mapped too) is refused as a whole, as
// any invalid slice: an error names the file, the slice, the endpoint
// and the address, and its Service gets no backend from it. A slice that
// was good before keeps its last good version, so nothing programmed is
// lost. YAML and JSON Lists alike (the List's compact endpoints are read
// by the fast decoder's own IPv4 parser).
func TestManifestRefusesEndpointAddressesTheAPIServerRefuses(t *testing.T) {
	for _, format := range []string{"yaml", "json"} {
		for _, c := range endpointIPCases {
			t.Run(format+"/"+c.family+"/"+c.addr, func(t *testing.T) {
				dir := t.TempDir()
				name, content := endpointIPFiles(format, c.family, c.addr)
				writeFile(t, dir, name, content)
				res, err := Load(dir, translate.Options{})
				if err != nil {
					t.Fatal(err)
				}
				where := name + ": document 2: "
				if format == "json" {
					where = name + ": document 1: items[1]: "
				}
				want := fmt.Sprintf(`%sEndpointSlice ns/a-1: endpointslice "ns/a-1": endpoints[1]: address %q %s`, where, c.addr, c.why)
				if len(res.Errors) != 1 || !strings.HasSuffix(res.Errors[0].Error(), want) {
					t.Fatalf("errors %v, want one ending %q", res.Errors, want)
				}
				if got := render(res.State); strings.Contains(got, "8080") {
					t.Errorf("the refused slice's endpoints are backends:\n%s", got)
				}

				// Good first, then the bad address: the good version stays.
				l := newLoader(translate.Options{})
				goodName, goodContent := endpointIPFiles(format, c.family, map[string]string{"IPv4": "10.0.0.2", "IPv6": "2001:db8:1::2"}[c.family])
				if goodName != name {
					t.Fatal("the files' names differ")
				}
				writeFile(t, dir, name, goodContent)
				res, err = l.load(dir)
				if err != nil || len(res.Errors) != 0 {
					t.Fatalf("good version: %v, %v", err, res.Errors)
				}
				before := render(res.State)
				if !strings.Contains(before, ":8080/TCP") {
					t.Fatalf("the good version has no backends:\n%s", before)
				}
				writeFile(t, dir, name, content)
				res, err = l.load(dir)
				if err != nil {
					t.Fatal(err)
				}
				if len(res.Errors) != 1 || !strings.Contains(res.Errors[0].Error(), want) || !strings.HasSuffix(res.Errors[0].Error(), "(keeping the last good version)") {
					t.Fatalf("errors %v, want one with %q, keeping the last good version", res.Errors, want)
				}
				if got := render(res.State); got != before {
					t.Errorf("state after the bad version:\n%s\nwant the good one's:\n%s", got, before)
				}
			})
		}
	}
}
