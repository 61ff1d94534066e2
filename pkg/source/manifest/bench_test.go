package manifest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/source/translate"
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
		res, err := Load(dir, translate.Options{})
		if err != nil {
			b.Fatal(err)
		}
		if len(res.Errors) > 0 || res.State.Services.Len() != 10000 {
			b.Fatalf("%d errors, %d services", len(res.Errors), res.State.Services.Len())
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
	l := newLoader(translate.Options{})
	res, err := l.load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if l.parsed.Load() != 4 {
		t.Errorf("parsed %d files, want 4", l.parsed.Load())
	}
	if len(res.Errors) > 0 || res.State.Services.Len() != n || res.Services != n || res.Slices != n {
		t.Fatalf("%v, %d frontends", res.Errors, res.State.Services.Len())
	}
	for _, s := range res.State.Services.All() {
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
	for _, s := range res2.State.Services.All() {
		for _, b := range s.Backends {
			found = found || b.Addr.String() == "10.4.232.99"
		}
	}
	if !found {
		t.Error("the change was not loaded")
	}
}

// writeList writes n Services with k endpoints each as one JSON List, the
// way test/bench's harness hands them to the agent, and returns the file's
// content with endpoint 1 of service `change` replaced (one endpoint
// change).
func writeList(tb testing.TB, p string, n, k, change int) (orig, changed []byte) {
	tb.Helper()
	type obj = map[string]any
	items := make([]obj, 0, 2*n)
	for i := range n {
		name := fmt.Sprintf("svc-%d", i)
		items = append(items, obj{
			"apiVersion": "v1", "kind": "Service",
			"metadata": obj{"namespace": "bench", "name": name},
			"spec": obj{
				"type": "ClusterIP", "clusterIP": fmt.Sprintf("10.96.%d.%d", i>>8, i&0xff),
				"clusterIPs": []string{fmt.Sprintf("10.96.%d.%d", i>>8, i&0xff)},
				"ports":      []obj{{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}},
			},
		})
		eps := make([]obj, 0, k)
		for j := range k {
			eps = append(eps, obj{"addresses": []string{fmt.Sprintf("10.%d.%d.%d", 1+i>>8, i&0xff, j+1)},
				"conditions": obj{"ready": true, "serving": true, "terminating": false}})
		}
		items = append(items, obj{
			"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
			"metadata":    obj{"namespace": "bench", "name": name + "-bench", "labels": obj{"kubernetes.io/service-name": name}},
			"addressType": "IPv4",
			"endpoints":   eps,
			"ports":       []obj{{"name": "http", "port": 8080, "protocol": "TCP"}},
		})
	}
	orig, err := json.Marshal(obj{"apiVersion": "v1", "kind": "List", "items": items})
	if err != nil {
		tb.Fatal(err)
	}
	from := fmt.Sprintf(`"10.%d.%d.1"`, 1+change>>8, change&0xff)
	to := fmt.Sprintf(`"10.%d.%d.99"`, 1+change>>8, change&0xff)
	changed = bytes.Replace(orig, []byte(from), []byte(to), 1)
	if bytes.Equal(orig, changed) {
		tb.Fatal("no endpoint to change")
	}
	if err := os.WriteFile(p, orig, 0o644); err != nil {
		tb.Fatal(err)
	}
	return orig, changed
}

// BenchmarkLoadList is the shape test/bench measures: N Services x 10
// endpoints in ONE JSON List file, loaded from nothing ("initial") and
// then reloaded after one endpoint of one Service changed (what the agent
// does for every edit of the file).
func BenchmarkLoadList(b *testing.B) {
	for _, n := range []int{1000, 10000, 30000} {
		b.Run(fmt.Sprintf("%dk", n/1000), func(b *testing.B) {
			p := filepath.Join(b.TempDir(), "services.json")
			orig, changed := writeList(b, p, n, 10, n/2)
			b.Run("initial", func(b *testing.B) {
				b.ReportAllocs()
				var l *loader
				var res *Result
				// cpu-ms/op: the CPU time of a load, all threads (the
				// collector's included), which is what issue 14 counts.
				t0, runs := testutil.CPUTime(b), 0
				for b.Loop() {
					runs++
					var err error
					l = newLoader(translate.Options{})
					res, err = l.load(p)
					if err != nil || len(res.Errors) > 0 || res.State.Services.Len() != n {
						b.Fatalf("%v %v", err, res.Errors)
					}
				}
				b.ReportMetric(float64((testutil.CPUTime(b)-t0).Microseconds())/1000/float64(runs), "cpu-ms/op")
				// What the source holds between loads (its loader and the
				// state handed over).
				var ms runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&ms)
				b.ReportMetric(float64(ms.HeapAlloc)/(1<<20), "live-MiB")
				runtime.KeepAlive(l)
				runtime.KeepAlive(res)
			})
			b.Run("one-endpoint-change", func(b *testing.B) {
				l, _ := loadFresh(b, p, orig)
				b.ReportAllocs()
				i := 0
				var cpu time.Duration
				for b.Loop() {
					writeUntimed(b, p, i, changed, orig)
					i++
					// cpu-ms/op: the CPU time of the loads alone (the
					// writes' is not theirs), all threads.
					t0 := testutil.CPUTime(b)
					res, err := l.load(p)
					cpu += testutil.CPUTime(b) - t0
					if err != nil || len(res.Errors) > 0 || res.State.Services.Len() != n {
						b.Fatalf("%v %v", err, res.Errors)
					}
				}
				b.ReportMetric(float64(cpu.Microseconds())/1000/float64(i), "cpu-ms/op")
			})
		})
	}
}

// TestListEditDecodesOnlyTheChange: in one file holding a List, editing one
// item decodes that item only, and the result is what a fresh load gives.
func TestListEditDecodesOnlyTheChange(t *testing.T) {
	const n = 200
	p := filepath.Join(t.TempDir(), "services.json")
	_, changed := writeList(t, p, n, 10, 42)
	l := newLoader(translate.Options{})
	if _, err := l.load(p); err != nil {
		t.Fatal(err)
	}
	if got := l.decoded.Load(); got != 2*n {
		t.Fatalf("decoded %d objects, want %d", got, 2*n)
	}
	if err := os.WriteFile(p, changed, 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := l.load(p)
	if err != nil || len(res.Errors) > 0 {
		t.Fatal(err, res.Errors)
	}
	if got := l.decoded.Load(); got != 2*n+1 {
		t.Errorf("the edit decoded %d objects, want 1", got-2*n)
	}
	if l.translated != n+1 {
		t.Errorf("the edit translated %d Services, want 1", l.translated-n)
	}
	fresh, err := Load(p, translate.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := render(res.State), render(fresh.State); got != want {
		t.Errorf("incremental load differs from a fresh one:\n%s\nwant\n%s", got, want)
	}
	if !strings.Contains(render(res.State), "10.1.42.99:8080/TCP") {
		t.Error("the change was not loaded")
	}
}
