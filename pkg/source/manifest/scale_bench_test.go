package manifest

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// The scale benchmarks of issue 14: one file of N Services, each with one
// EndpointSlice of 2 to 10 endpoints, read and translated from nothing
// ("initial"), and read again after one endpoint of one EndpointSlice
// changed ("one-change"), the agent's work for every edit of the file.
// The file comes in the shapes agents are handed: a JSON List (what
// test/bench writes, and kubectl get -o json prints) and a stream of YAML
// documents (what kubectl apply -f takes).

// movedAddr is where the one change moves an endpoint to.
const movedAddr = "10.250.250.250"

// scaleEndpoints is how many endpoints Service i has: 2 to 10.
func scaleEndpoints(i int) int { return 2 + i%9 }

// scaleVIP is the ClusterIP of Service i: 10.(96+i>>16).(i>>8).(i).
func scaleVIP(i int) string {
	return "10." + strconv.Itoa(96+i>>16) + "." + strconv.Itoa(i>>8&0xff) + "." + strconv.Itoa(i&0xff)
}

// scaleFrontend is Service i's frontend in the desired state.
func scaleFrontend(i int) model.L4Addr {
	return model.L4Addr{Addr: netip.MustParseAddr(scaleVIP(i)), Port: 80, Proto: model.TCP}
}

// scaleAddr is endpoint j of Service i: 10.(16*(i>>16)+j+1).(i>>8).(i),
// unique for i < 2^20 and j < 16.
func scaleAddr(i, j int) string {
	return "10." + strconv.Itoa(16*(i>>16)+j+1) + "." + strconv.Itoa(i>>8&0xff) + "." + strconv.Itoa(i&0xff)
}

// scaleFile returns the file content for n Services in format "json" or
// "yaml", and the same with endpoint 0 of Service change at another
// address (one endpoint of one EndpointSlice changed).
func scaleFile(tb testing.TB, format string, n, change int) (orig, changed []byte) {
	tb.Helper()
	var buf bytes.Buffer
	buf.Grow(n * 700)
	addr, vip := scaleAddr, scaleVIP
	switch format {
	case "json":
		buf.WriteString(`{"apiVersion":"v1","kind":"List","items":[`)
		for i := range n {
			if i > 0 {
				buf.WriteByte(',')
			}
			fmt.Fprintf(&buf, `{"apiVersion":"v1","kind":"Service","metadata":{"name":"svc-%d","namespace":"bench"},"spec":{"type":"ClusterIP","clusterIP":"%s","clusterIPs":["%s"],"ports":[{"name":"http","port":80,"protocol":"TCP","targetPort":8080}]}},`, i, vip(i), vip(i))
			fmt.Fprintf(&buf, `{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"svc-%d-abcde","namespace":"bench","labels":{"kubernetes.io/service-name":"svc-%d"}},"addressType":"IPv4","ports":[{"name":"http","port":8080,"protocol":"TCP"}],"endpoints":[`, i, i)
			for j := range scaleEndpoints(i) {
				if j > 0 {
					buf.WriteByte(',')
				}
				fmt.Fprintf(&buf, `{"addresses":["%s"],"conditions":{"ready":true,"serving":true,"terminating":false},"nodeName":"node-%d"}`, addr(i, j), j%5)
			}
			buf.WriteString(`]}`)
		}
		buf.WriteString(`]}`)
	case "yaml":
		for i := range n {
			fmt.Fprintf(&buf, "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: svc-%d\n  namespace: bench\nspec:\n  type: ClusterIP\n  clusterIP: %s\n  clusterIPs:\n  - %s\n  ports:\n  - name: http\n    port: 80\n    protocol: TCP\n    targetPort: 8080\n", i, vip(i), vip(i))
			fmt.Fprintf(&buf, "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: svc-%d-abcde\n  namespace: bench\n  labels:\n    kubernetes.io/service-name: svc-%d\naddressType: IPv4\nports:\n- name: http\n  port: 8080\n  protocol: TCP\nendpoints:\n", i, i)
			for j := range scaleEndpoints(i) {
				fmt.Fprintf(&buf, "- addresses:\n  - %s\n  conditions:\n    ready: true\n    serving: true\n    terminating: false\n  nodeName: node-%d\n", addr(i, j), j%5)
			}
		}
	default:
		tb.Fatalf("format %q", format)
	}
	orig = buf.Bytes()
	// Endpoint 0 of Service change moves to another address.
	q := byte('"')
	if format == "yaml" {
		q = ' '
	}
	from := append(append([]byte{q}, addr(change, 0)...), '"')
	to := append(append([]byte{q}, movedAddr...), '"')
	if format == "yaml" {
		from[len(from)-1], to[len(to)-1] = '\n', '\n'
	}
	changed = bytes.Replace(orig, from, to, 1)
	if bytes.Equal(orig, changed) {
		tb.Fatal("no endpoint to change")
	}
	return orig, changed
}

func scaleSizes() []int { return testutil.ScaleSizes(1, 30000, 100000) }

// BenchmarkScale: see the comment above. live-MiB is the heap the loader
// and the state it handed over hold after a load (what stays in the
// agent's RSS between changes, before the GC's headroom); cpu-ms/op the
// CPU time of a load (see testutil.CPUTime). peak-MiB is the most heap
// the first load held (testutil.HeapPeak: garbage not yet collected
// included), which the agent's peak RSS during its first load follows;
// peak-live-MiB the most a collection found live during it.
func BenchmarkScale(b *testing.B) {
	for _, format := range []string{"json", "yaml"} {
		for _, n := range scaleSizes() {
			b.Run(fmt.Sprintf("%s/%dk", format, n/1000), func(b *testing.B) {
				p := filepath.Join(b.TempDir(), "services."+format)
				// The contents are on disk only (initial and one-change
				// read them back), as for the agent: held in the heap,
				// they would add to the collector's goal (peak-MiB).
				orig, changed := scaleFile(b, format, n, n/2)
				fileMiB := float64(len(orig)) / (1 << 20)
				for _, f := range []struct {
					p    string
					data []byte
				}{{p, orig}, {p + ".changed", changed}} {
					if err := os.WriteFile(f.p, f.data, 0o644); err != nil {
						b.Fatal(err)
					}
				}
				check := func(res *Result, err error) {
					if err != nil || len(res.Errors) > 0 || res.State.Services.Len() != n {
						b.Fatalf("%v %v", err, res.Errors)
					}
				}
				b.Run("initial", func(b *testing.B) {
					b.ReportAllocs()
					var l *loader
					var res *Result
					var ms runtime.MemStats
					runtime.GC()
					runtime.ReadMemStats(&ms)
					before := ms.HeapAlloc // the benchmark's own
					t0, runs := testutil.CPUTime(b), 0
					stopPeak := testutil.HeapPeak()
					var peak, peakLive uint64
					for b.Loop() {
						runs++
						var err error
						l = newLoader(translate.Options{})
						res, err = l.load(p)
						check(res, err)
						if runs == 1 {
							// The first load's: the next ones
							// start with the last one's garbage.
							peak, peakLive = stopPeak()
						}
					}
					b.ReportMetric(float64((testutil.CPUTime(b)-t0).Microseconds())/1000/float64(runs), "cpu-ms/op")
					b.ReportMetric(float64(peak-min(before, peak))/(1<<20), "peak-MiB")
					b.ReportMetric(float64(peakLive-min(before, peakLive))/(1<<20), "peak-live-MiB")
					runtime.GC()
					runtime.ReadMemStats(&ms)
					b.ReportMetric(float64(ms.HeapAlloc-min(before, ms.HeapAlloc))/(1<<20), "live-MiB")
					b.ReportMetric(fileMiB, "file-MiB")
					runtime.KeepAlive(l)
					runtime.KeepAlive(res)
				})
				b.Run("one-change", func(b *testing.B) {
					orig, err := os.ReadFile(p)
					if err != nil {
						b.Fatal(err)
					}
					changed, err := os.ReadFile(p + ".changed")
					if err != nil {
						b.Fatal(err)
					}
					l, res := loadFresh(b, p, orig)
					check(res, nil)
					// One change before timing: the first one after a full
					// load also pays for collecting what that load left
					// (1.3 s of CPU at 100,000) and for the read buffer.
					for _, data := range [][]byte{changed, orig} {
						if err := os.WriteFile(p, data, 0o644); err != nil {
							b.Fatal(err)
						}
						check(l.load(p))
					}
					moved := netip.MustParseAddr(movedAddr)
					changeLoop(b, p, changed, orig, func() (*Result, error) { return l.load(p) }, func(res *Result, err error, i int) {
						check(res, err)
						s := res.State.Services.Get(scaleFrontend(n / 2))
						if s == nil || hasBackend(s, moved) != (i%2 == 1) {
							b.Fatalf("the change is not in the state: %v", s)
						}
					})
				})
			})
		}
	}
}

// loadFresh writes orig to p and loads it with a new loader, the state
// each change benchmark starts from.
func loadFresh(b *testing.B, p string, orig []byte) (*loader, *Result) {
	if err := os.WriteFile(p, orig, 0o644); err != nil {
		b.Fatal(err)
	}
	l := newLoader(translate.Options{})
	res, err := l.load(p)
	if err != nil {
		b.Fatal(err)
	}
	return l, res
}

// changeLoop times load after each of a run of alternating edits of p
// (writeUntimed), hands each result to check with the count of loads so
// far (odd: after changed), and reports the CPU of a load.
func changeLoop(b *testing.B, p string, changed, orig []byte, load func() (*Result, error), check func(res *Result, err error, i int)) {
	b.ReportAllocs()
	var cpu time.Duration
	i := 0
	for b.Loop() {
		writeUntimed(b, p, i, changed, orig)
		i++
		t0 := testutil.CPUTime(b)
		res, err := load()
		cpu += testutil.CPUTime(b) - t0
		check(res, err, i)
	}
	b.ReportMetric(float64(cpu.Microseconds())/1000/float64(i), "cpu-ms/op")
}

// writeUntimed writes the i-th of a run of alternating edits to p with the
// benchmark's timer stopped: changed for even i, orig (the edit undone)
// for odd i.
func writeUntimed(b *testing.B, p string, i int, changed, orig []byte) {
	b.StopTimer()
	defer b.StartTimer()
	data := changed
	if i%2 == 1 {
		data = orig
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		b.Fatal(err)
	}
}

func hasBackend(s *model.Service, a netip.Addr) bool {
	for _, b := range s.Backends {
		if b.Addr == a {
			return true
		}
	}
	return false
}

// BenchmarkDirectoryOneChange is the one change of issue 14 through a
// directory: 30,000 Services x 10 endpoints as writeCluster lays them out
// (a Service file and an EndpointSlice file per 1,000 Services, 60 files),
// one endpoint of one EndpointSlice changed, loaded as the watch asks when
// its event names the file ("named") and as a load of every file
// ("all", the watch's answer to an event it cannot place).
func BenchmarkDirectoryOneChange(b *testing.B) {
	const n = 30000
	dir := b.TempDir()
	writeCluster(b, dir, n, 10)
	name := "slices-15000.yaml"
	p := filepath.Join(dir, name)
	orig, err := os.ReadFile(p)
	if err != nil {
		b.Fatal(err)
	}
	changed := bytes.Replace(orig, []byte("[10.59.152.1]"), []byte("[10.59.152.99]"), 1)
	if bytes.Equal(orig, changed) {
		b.Fatal("no endpoint to change")
	}
	for _, c := range []struct {
		mode  string
		names map[string]bool
	}{{"named", map[string]bool{name: true}}, {"all", nil}} {
		b.Run(c.mode, func(b *testing.B) {
			l := newLoader(translate.Options{})
			if _, err := l.load(dir); err != nil {
				b.Fatal(err)
			}
			for _, data := range [][]byte{changed, orig} { // untimed, as BenchmarkScale's
				if err := os.WriteFile(p, data, 0o644); err != nil {
					b.Fatal(err)
				}
				if _, err := l.loadChanged(dir, c.names); err != nil {
					b.Fatal(err)
				}
			}
			moved := netip.MustParseAddr("10.59.152.99")
			fe := model.L4Addr{Addr: netip.MustParseAddr("10.96.58.152"), Port: 80, Proto: model.TCP}
			load := func() (*Result, error) { return l.loadChanged(dir, c.names) }
			changeLoop(b, p, changed, orig, load, func(res *Result, err error, i int) {
				if err != nil || len(res.Errors) > 0 || res.State.Services.Len() != n {
					b.Fatalf("%v %v", err, res.Errors)
				}
				if s := res.State.Services.Get(fe); s == nil || hasBackend(s, moved) != (i%2 == 1) {
					b.Fatalf("the change is not in the state: %v", s)
				}
			})
		})
	}
}
