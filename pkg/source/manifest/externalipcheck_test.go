package manifest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// externalIPFiles returns a file of dual-stack Service ns/a, whose
// externalIPs are 203.0.113.7 and addr, and its slice ns/a-1, as YAML
// or as a JSON List (whose Service the fast decoder reads), and the
// file's name.
func externalIPFiles(format, addr string) (name, content string) {
	svc := fmt.Sprintf(`{"apiVersion":"v1","kind":"Service","metadata":{"name":"a","namespace":"ns"},"spec":{"clusterIP":"10.96.0.1","clusterIPs":["10.96.0.1","2001:db8::1"],"ipFamilies":["IPv4","IPv6"],"ipFamilyPolicy":"PreferDualStack","externalIPs":["203.0.113.7",%q],"ports":[{"name":"http","port":80,"protocol":"TCP"}]}}`, addr)
	es := `{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"a-1","namespace":"ns","labels":{"kubernetes.io/service-name":"a"}},"addressType":"IPv4","ports":[{"name":"http","port":8080,"protocol":"TCP"}],"endpoints":[{"addresses":["10.0.0.1"],"conditions":{"ready":true,"serving":true,"terminating":false}}]}`
	if format == "json" {
		return "f.json", `{"apiVersion":"v1","kind":"List","items":[` + svc + "," + es + "]}"
	}
	return "f.yaml", svc + "\n---\n" + es + "\n"
}

// TestManifestRefusesExternalIPsTheAPIServerRefuses: a manifest Service
// whose spec.externalIPs has an address the API server refuses for a
// new Service (the endpoint address rule: loopback, link-local such as
// the cloud metadata address, unspecified, link-local multicast; both
// families, IPv4-mapped too) is refused as a whole, as any invalid
// Service: an error names the file, the Service, the entry's index, the
// address and the API server's words, and the Service gets no frontend.
// A Service that was good before keeps its last good version, so
// nothing programmed is lost. YAML and JSON Lists alike.
func TestManifestRefusesExternalIPsTheAPIServerRefuses(t *testing.T) {
	good := map[string]string{"IPv4": "203.0.113.8", "IPv6": "2001:db8:ff::8"}
	for _, format := range []string{"yaml", "json"} {
		for _, c := range endpointIPCases {
			t.Run(format+"/"+c.family+"/"+c.addr, func(t *testing.T) {
				dir := t.TempDir()
				name, content := externalIPFiles(format, c.addr)
				writeFile(t, dir, name, content)
				res, err := Load(dir, translate.Options{})
				if err != nil {
					t.Fatal(err)
				}
				where := name + ": document 1: "
				if format == "json" {
					where = name + ": document 1: items[0]: "
				}
				want := fmt.Sprintf(`%sService ns/a: service "ns/a": externalIPs[1]: address %q %s`, where, c.addr, c.why)
				if len(res.Errors) != 1 || !strings.HasSuffix(res.Errors[0].Error(), want) {
					t.Fatalf("errors %v, want one ending %q", res.Errors, want)
				}
				if got := render(res.State); strings.Contains(got, "10.96.0.1") || strings.Contains(got, "203.0.113.7") {
					t.Errorf("the refused Service has frontends:\n%s", got)
				}

				// Good first, then the bad address: the good version stays.
				l := newLoader(translate.Options{})
				goodName, goodContent := externalIPFiles(format, good[c.family])
				if goodName != name {
					t.Fatal("the files' names differ")
				}
				writeFile(t, dir, name, goodContent)
				res, err = l.load(dir)
				if err != nil || len(res.Errors) != 0 {
					t.Fatalf("good version: %v, %v", err, res.Errors)
				}
				before := render(res.State)
				if !strings.Contains(before, "203.0.113.7:80/TCP") || !strings.Contains(before, good[c.family]) {
					t.Fatalf("the good version has no ExternalIP frontends:\n%s", before)
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
