package manifest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-lb/sluice/pkg/k8s"
)

// writeCluster writes n Services with k endpoints each, as one Service
// file and one EndpointSlice file per 1,000 Services.
func writeCluster(tb testing.TB, dir string, n, k int) {
	tb.Helper()
	for start := 0; start < n; start += 1000 {
		var svcs, slices strings.Builder
		for i := start; i < min(n, start+1000); i++ {
			fmt.Fprintf(&svcs, `---
apiVersion: v1
kind: Service
metadata: {name: svc-%d, namespace: bench}
spec:
  clusterIP: 10.96.%d.%d
  ports:
  - {name: http, port: 80, protocol: TCP, targetPort: 8080}
`, i, i>>8, i&0xff)
			fmt.Fprintf(&slices, `---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: svc-%d-abc
  namespace: bench
  labels: {kubernetes.io/service-name: svc-%d}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
`, i, i)
			for j := range k {
				fmt.Fprintf(&slices, "- addresses: [10.%d.%d.%d]\n  conditions: {ready: true}\n  nodeName: node-%d\n", 1+i>>8, i&0xff, j+1, j%5)
			}
		}
		for name, body := range map[string]string{"services": svcs.String(), "slices": slices.String()} {
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-%05d.yaml", name, start)), []byte(body), 0o644); err != nil {
				tb.Fatal(err)
			}
		}
	}
}

// BenchmarkLoad parses and translates 10,000 Services x 10 endpoints.
func BenchmarkLoad(b *testing.B) {
	dir := b.TempDir()
	writeCluster(b, dir, 10000, 10)
	b.ReportAllocs()
	for b.Loop() {
		res, err := Load(dir, k8s.Options{})
		if err != nil {
			b.Fatal(err)
		}
		if len(res.Errors) > 0 || len(res.State.Services) != 10000 {
			b.Fatalf("%d errors, %d services", len(res.Errors), len(res.State.Services))
		}
	}
}

func TestLoadAtScale(t *testing.T) {
	if testing.Short() {
		t.Skip("2,000 services")
	}
	const n = 2000
	dir := t.TempDir()
	writeCluster(t, dir, n, 10)
	l := newLoader(k8s.Options{})
	res, err := l.load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if l.parsed.Load() != 4 {
		t.Errorf("parsed %d files, want 4", l.parsed.Load())
	}
	if len(res.Errors) > 0 || len(res.State.Services) != n || res.Services != n || res.Slices != n {
		t.Fatalf("%v, %d frontends", res.Errors, len(res.State.Services))
	}
	for _, s := range res.State.Services {
		if len(s.Backends) != 10 {
			t.Fatalf("%s has %d backends", s.Name, len(s.Backends))
		}
	}

	// Changing one file reparses only that file.
	p := filepath.Join(dir, "slices-01000.yaml")
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(strings.Replace(string(data), "10.4.232.1]", "10.4.232.99]", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	res2, err := l.load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if l.parsed.Load() != 5 {
		t.Errorf("parsed %d files in all, want 5", l.parsed.Load())
	}
	if len(res2.Errors) > 0 || res2.Services != n || res2.Slices != n {
		t.Fatalf("reload: %v", res2.Errors)
	}
	found := false
	for _, s := range res2.State.Services {
		for _, b := range s.Backends {
			found = found || b.Addr.String() == "10.4.232.99"
		}
	}
	if !found {
		t.Error("the change was not loaded")
	}
}
