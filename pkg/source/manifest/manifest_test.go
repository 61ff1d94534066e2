package manifest

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-lb/sluice/pkg/source/internal/sourcetest"
	"github.com/sluice-lb/sluice/pkg/source/translate"
)

var render = sourcetest.Render

func writeFile(t testing.TB, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

const svcA = `apiVersion: v1
kind: Service
metadata: {name: a, namespace: ns}
spec:
  clusterIP: 10.96.0.1
  ports: [{name: http, port: 80, protocol: TCP}]
`

const sliceA = `apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: a-1
  namespace: ns
  labels: {kubernetes.io/service-name: a}
addressType: IPv4
endpoints:
- addresses: [10.0.0.1]
ports: [{name: http, port: 8080, protocol: TCP}]
`

// sliceA6 is sliceA's IPv6 twin.
var sliceA6 = strings.NewReplacer("name: a-1", "name: a-6", "addressType: IPv4", "addressType: IPv6",
	"[10.0.0.1]", `["2001:db8:1::1"]`).Replace(sliceA)

// A dual-stack Service gets a frontend per family, each over its own
// family's slice; an IPv6 single-stack one only the IPv6 frontend. Nothing
// on the way filters IPv6.
func TestLoadDualStack(t *testing.T) {
	dual := strings.Replace(svcA, "  clusterIP: 10.96.0.1\n", "  clusterIP: 10.96.0.1\n  clusterIPs: [10.96.0.1, \"2001:db8::1\"]\n  ipFamilies: [IPv4, IPv6]\n  ipFamilyPolicy: PreferDualStack\n", 1)
	single6 := strings.Replace(svcA, "  clusterIP: 10.96.0.1\n", "  clusterIP: \"2001:db8::1\"\n  ipFamilies: [IPv6]\n  ipFamilyPolicy: SingleStack\n", 1)
	for _, c := range []struct{ name, svc, want string }{
		{"PreferDualStack", dual, "10.96.0.1:80/TCP ns/a:http -> 10.0.0.1:8080/TCP\n[2001:db8::1]:80/TCP ns/a:http -> [2001:db8:1::1]:8080/TCP"},
		{"IPv6 SingleStack", single6, "[2001:db8::1]:80/TCP ns/a:http -> [2001:db8:1::1]:8080/TCP"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.svc == svcA {
				t.Fatal("the test Service changed: no clusterIP line to replace")
			}
			dir := t.TempDir()
			writeFile(t, dir, "f.yaml", c.svc+"---\n"+sliceA+"---\n"+sliceA6)
			res, err := Load(dir, translate.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Errors) != 0 || len(res.Skipped) != 0 {
				t.Fatalf("errors %v, skipped %v", res.Errors, res.Skipped)
			}
			if got := render(res.State); got != c.want {
				t.Errorf("got\n%s\nwant\n%s", got, c.want)
			}
		})
	}
}

func TestLoadTestdata(t *testing.T) {
	res, err := Load("testdata/cluster", translate.Options{Node: translate.Node{Name: "node-a"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Errors) != 0 {
		t.Fatalf("errors: %v", res.Errors)
	}
	want := `10.96.0.10:53/TCP kube-system/kube-dns:dns-tcp -> 10.244.0.3:53/TCP 10.244.0.4:53/TCP
10.96.0.10:53/UDP kube-system/kube-dns:dns -> 10.244.0.3:53/UDP 10.244.0.4:53/UDP
10.96.12.34:80/TCP shop/web:http -> 10.244.1.5:8080/TCP 10.244.2.7:8080/TCP 10.244.3.2:8080/TCP
10.96.12.34:9090/TCP shop/web:metrics -> 10.244.1.5:9090/TCP 10.244.2.7:9090/TCP 10.244.3.2:9090/TCP
10.96.77.7:443/TCP default/legacy -> 192.168.10.20:8443/TCP 192.168.10.21:8443/TCP
10.96.77.8:50051/TCP default/draining:grpc -> 10.244.5.1:50051/TCP
10.96.77.9:80/UDP default/empty ->`
	if got := render(res.State); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	if res.Services != 8 || res.Slices != 5 {
		t.Errorf("counted %d services, %d slices", res.Services, res.Slices)
	}
	if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], "01-services.yaml: document 6: ignoring apps/v1 Deployment") {
		t.Errorf("warnings: %q", res.Warnings)
	}
	if len(res.Skipped) != 3 {
		t.Errorf("skipped: %q", res.Skipped)
	}
}

func TestLoadBadInput(t *testing.T) {
	tests := []struct {
		name    string
		content string
		want    string // substring of the only error
	}{
		{"invalid IP", strings.Replace(sliceA, "10.0.0.1", "10.0.0.999", 1),
			`f.yaml: document 1: EndpointSlice ns/a-1: endpointslice "ns/a-1": endpoints[0]: invalid IPv4 address "10.0.0.999"`},
		{"IPv4-mapped address in an IPv6 slice", svcA + "---\n" + strings.Replace(sliceA6, "2001:db8:1::1", "::ffff:10.0.0.1", 1),
			`f.yaml: document 2: EndpointSlice ns/a-6: endpointslice "ns/a-6": endpoints[0]: invalid IPv6 address "::ffff:10.0.0.1"`},
		{"port out of range", strings.Replace(svcA, "port: 80", "port: 70000", 1),
			`f.yaml: document 1: Service ns/a: service "ns/a": port "http": port 70000 out of range`},
		{"unknown protocol", strings.Replace(svcA, "protocol: TCP", "protocol: ICMP", 1),
			`service "ns/a": port "http": unknown protocol "ICMP"`},
		{"malformed YAML", svcA + "---\nkind: [unclosed\n", `f.yaml: document 2: malformed YAML`},
		{"wrong type", strings.Replace(svcA, "port: 80", "port: eighty", 1), `f.yaml: document 1: Service ns/a: json: cannot unmarshal`},
		{"duplicate", svcA + "---\n" + svcA, `f.yaml: document 2: Service ns/a: already defined in`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeFile(t, dir, "f.yaml", tc.content)
			res, err := Load(dir, translate.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Errors) != 1 || !strings.Contains(res.Errors[0].Error(), tc.want) {
				t.Fatalf("errors = %v, want one containing %q", res.Errors, tc.want)
			}
		})
	}
}

// An SCTP port is not an error: the port is left out, the rest of the
// Service served, and the warning names the file, the Service and the port.
func TestLoadSCTPPortWarns(t *testing.T) {
	dir := t.TempDir()
	svc := strings.Replace(svcA, "ports: [", "ports: [{name: sig, port: 3868, protocol: SCTP}, ", 1)
	if svc == svcA {
		t.Fatal("the test Service changed: no ports list to extend")
	}
	writeFile(t, dir, "f.yaml", svc+"---\n"+sliceA)
	res, err := Load(dir, translate.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Errors) != 0 || res.State.Services.Len() != 1 {
		t.Fatalf("errors %v, %d frontends; want the TCP port served", res.Errors, res.State.Services.Len())
	}
	want := `f.yaml: document 1: Service ns/a: port "sig": protocol SCTP is not supported; the port is not served`
	if len(res.Warnings) != 1 || !strings.HasSuffix(res.Warnings[0], "/"+want) {
		t.Errorf("warnings %q, want %q", res.Warnings, want)
	}
}

func TestLastGoodRetention(t *testing.T) {
	dir := t.TempDir()
	p := writeFile(t, dir, "a.yaml", svcA+"---\n"+sliceA)
	writeFile(t, dir, "b.yaml", strings.NewReplacer("name: a,", "name: b,", "10.96.0.1", "10.96.0.2").Replace(svcA))
	l := newLoader(translate.Options{})
	load := func() *Result {
		t.Helper()
		res, err := l.load(dir)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	good := `10.96.0.1:80/TCP ns/a:http -> 10.0.0.1:8080/TCP
10.96.0.2:80/TCP ns/b:http ->`
	if got := render(load().State); got != good {
		t.Fatalf("got\n%s", got)
	}

	// A bad version of the slice keeps the last good one; the Service in
	// the same file still changes.
	writeFile(t, dir, "a.yaml", strings.Replace(svcA, "port: 80", "port: 81", 1)+"---\n"+strings.Replace(sliceA, "10.0.0.1", "bogus", 1))
	res := load()
	if len(res.Errors) != 1 || !strings.Contains(res.Errors[0].Error(), "keeping the last good version") {
		t.Fatalf("errors: %v", res.Errors)
	}
	want := `10.96.0.1:81/TCP ns/a:http -> 10.0.0.1:8080/TCP
10.96.0.2:80/TCP ns/b:http ->`
	if got := render(res.State); got != want {
		t.Fatalf("bad slice: got\n%s\nwant\n%s", got, want)
	}

	// A document that cannot be parsed keeps everything the file had.
	writeFile(t, dir, "a.yaml", "kind: Service\n  bad: [indent\n")
	res = load()
	if len(res.Errors) != 1 || !strings.Contains(res.Errors[0].Error(), "a.yaml: document 1: malformed YAML") {
		t.Fatalf("errors: %v", res.Errors)
	}
	if got := render(res.State); got != want {
		t.Fatalf("malformed file: got\n%s\nwant\n%s", got, want)
	}

	// Fixed: the new content applies.
	writeFile(t, dir, "a.yaml", svcA)
	res = load()
	if len(res.Errors) != 0 {
		t.Fatal(res.Errors)
	}
	if got := render(res.State); got != "10.96.0.1:80/TCP ns/a:http ->\n10.96.0.2:80/TCP ns/b:http ->" {
		t.Fatalf("fixed: got\n%s", got)
	}

	// A new object that is bad from the start is left out.
	writeFile(t, dir, "c.yaml", strings.NewReplacer("name: a,", "name: c,", "10.96.0.1", "10.96.0.300").Replace(svcA))
	res = load()
	if len(res.Errors) != 1 || strings.Contains(res.Errors[0].Error(), "keeping") {
		t.Fatalf("errors: %v", res.Errors)
	}
	if res.State.Services.Len() != 2 {
		t.Fatalf("got\n%s", render(res.State))
	}

	// Removing a file removes its objects: that is not an error.
	for _, f := range []string{p, filepath.Join(dir, "c.yaml")} {
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
	res = load()
	if len(res.Errors) != 0 || render(res.State) != "10.96.0.2:80/TCP ns/b:http ->" {
		t.Fatalf("after removal: %v\n%s", res.Errors, render(res.State))
	}
}

func TestLoadSingleFileAndJSONList(t *testing.T) {
	dir := t.TempDir()
	p := writeFile(t, dir, "all.json", `{"apiVersion":"v1","kind":"List","items":[
 {"apiVersion":"v1","kind":"Service","metadata":{"name":"a","namespace":"ns"},
  "spec":{"clusterIP":"10.96.0.1","ports":[{"name":"http","port":80,"targetPort":8080}]}},
 {"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"a-1","namespace":"ns","labels":{"kubernetes.io/service-name":"a"}},
  "addressType":"IPv4","endpoints":[{"addresses":["10.0.0.1"]},{"addresses":["10.0.0.2"],"conditions":{"ready":false}}],
  "ports":[{"name":"http","port":8080}]},
 {"apiVersion":"discovery.k8s.io/v1beta1","kind":"EndpointSlice","metadata":{"name":"old"}}
]}`)
	writeFile(t, dir, "ignored.txt", "not a manifest")
	for _, path := range []string{p, dir} {
		res, err := Load(path, translate.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Errors) != 0 {
			t.Fatal(res.Errors)
		}
		if got := render(res.State); got != "10.96.0.1:80/TCP ns/a:http -> 10.0.0.1:8080/TCP" {
			t.Errorf("%s: got %s", path, got)
		}
		if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], "items[2]: ignoring discovery.k8s.io/v1beta1 EndpointSlice") {
			t.Errorf("warnings %q", res.Warnings)
		}
	}
	if _, err := Load(filepath.Join(dir, "missing"), translate.Options{}); err == nil {
		t.Error("missing path: no error")
	}
}

func TestSplitDocuments(t *testing.T) {
	docs := splitDocuments("x.yaml", []byte("---\na: 1\n--- \nb: 2\n---\n# only a comment\n"))
	if len(docs) != 4 || string(docs[1]) != "a: 1\n" || string(docs[2]) != "b: 2\n" || !isBlank(docs[3]) || !isBlank(docs[0]) {
		t.Errorf("docs = %q", docs)
	}
}

// Two Services claiming one frontend, loaded together: the first by
// namespace/name keeps it, and the error names both, with their files and
// documents. Skipped Services are reported with theirs.
func TestLoadReportsConflictsAndSkipped(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "a.yaml", strings.NewReplacer("name: a,", "name: z,").Replace(svcA)+"---\n"+sliceA)
	writeFile(t, dir, "b.yaml", "# the same VIP\n---\n"+svcA+"---\n"+
		strings.NewReplacer("name: a,", "name: ext,", "clusterIP: 10.96.0.1", "type: ExternalName\n  externalName: example.com").Replace(svcA))
	l := newLoader(translate.Options{})
	for range 2 { // reported on every load while they last, not only when they appear
		res, err := l.load(dir)
		if err != nil {
			t.Fatal(err)
		}
		rel := func(ss []string) []string {
			for i, s := range ss {
				ss[i] = strings.ReplaceAll(s, dir+string(filepath.Separator), "")
			}
			return ss
		}
		wantErrs := []string{`a.yaml: document 1: Service ns/z: frontend 10.96.0.1:80/TCP already belongs to Service ns/a (b.yaml: document 2); ignored`}
		if got := rel(errorStrings(res.Errors)); !slices.Equal(got, wantErrs) {
			t.Errorf("errors:\n%q\nwant\n%q", got, wantErrs)
		}
		wantSkipped := []string{"b.yaml: document 3: Service ns/ext skipped: ExternalName"}
		if got := rel(slices.Clone(res.Skipped)); !slices.Equal(got, wantSkipped) {
			t.Errorf("skipped:\n%q\nwant\n%q", got, wantSkipped)
		}
		if got := render(res.State); got != "10.96.0.1:80/TCP ns/a:http -> 10.0.0.1:8080/TCP" {
			t.Errorf("state: %s", got)
		}
	}
	// The winner goes (a file of no objects; an empty one would be a file
	// being written): the other Service takes the frontend over.
	writeFile(t, dir, "b.yaml", "# nothing\n")
	res, err := l.load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Errors) != 0 || len(res.Skipped) != 0 {
		t.Errorf("errors %v, skipped %v", res.Errors, res.Skipped)
	}
	if got := render(res.State); got != "10.96.0.1:80/TCP ns/z:http ->" {
		t.Errorf("state: %s", got)
	}
}

// An edit of a file whose objects carry a resourceVersion (as kubectl get
// -o yaml writes them) is applied though the version stays: the tracker
// takes two versions of an object with the same resourceVersion for one.
func TestEditKeepingResourceVersion(t *testing.T) {
	dir := t.TempDir()
	withRV := func(s string) string {
		return strings.Replace(s, "metadata:", "metadata:\n  resourceVersion: \"7\"", 1)
	}
	svc := withRV(strings.Replace(svcA, "metadata: {name: a, namespace: ns}", "metadata:\n  name: a\n  namespace: ns", 1))
	l := newLoader(translate.Options{})
	for _, c := range []struct{ svc, slice, want string }{
		{svc, withRV(sliceA), goodA},
		{svc, withRV(strings.Replace(sliceA, "10.0.0.1", "10.0.0.2", 1)), "10.96.0.1:80/TCP ns/a:http -> 10.0.0.2:8080/TCP"},
		{strings.Replace(svc, "port: 80,", "port: 81,", 1), withRV(strings.Replace(sliceA, "10.0.0.1", "10.0.0.2", 1)),
			"10.96.0.1:81/TCP ns/a:http -> 10.0.0.2:8080/TCP"},
	} {
		writeFile(t, dir, "a.yaml", c.svc+"---\n"+c.slice)
		res, err := l.load(dir)
		if err != nil || len(res.Errors) > 0 {
			t.Fatalf("%v %v", err, res.Errors)
		}
		if got := render(res.State); got != c.want {
			t.Errorf("state %q, want %q", got, c.want)
		}
	}
}

// A file's errors come in the order of its documents, a duplicate's where
// the duplicate is.
func TestErrorsInDocumentOrder(t *testing.T) {
	dir := t.TempDir()
	bad := strings.Replace(strings.Replace(svcA, "name: a,", "name: b,", 1), "port: 80", "port: 0", 1)
	writeFile(t, dir, "a.yaml", svcA+"---\n"+svcA+"---\n"+bad)
	res, err := Load(dir, translate.Options{})
	if err != nil {
		t.Fatal(err)
	}
	errs := errorStrings(res.Errors)
	if len(errs) != 2 || !strings.Contains(errs[0], "document 2: Service ns/a: already defined") ||
		!strings.Contains(errs[1], "document 3: Service ns/b:") {
		t.Errorf("errors %q, want document 2's duplicate, then document 3's port", errs)
	}
}
