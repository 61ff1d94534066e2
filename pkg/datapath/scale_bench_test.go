package datapath

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// BenchmarkMapsFromEmpty is issue 14's "programming from empty" figure
// over the real maps: N ClusterIP services x 10 endpoints (1M backends at
// 100k) programmed through the production reconciler into freshly
// created maps (no program attached), i.e. the agent's first Apply. The
// time is the reconciler's work plus the map writes; opening the maps is
// not timed.
func BenchmarkMapsFromEmpty(b *testing.B) {
	testutil.Privileged(b)
	sizes := []int{30000, 100000}
	if testing.Short() {
		sizes = sizes[:1]
	}
	for _, n := range sizes {
		var sb model.ServicesBuilder
		for _, s := range benchServices(n) {
			sb.Set(s.Frontend, s)
		}
		st := &model.State{Services: sb.Services()}
		cfg := smallConfig(testPinDir(b))
		cfg.MaxServices, cfg.MaxBackends, cfg.MaxServiceEntries = n+n/4, 11*n+64, 12*n
		b.Run(fmt.Sprintf("%dk", n/1000), func(b *testing.B) {
			var cpu time.Duration // the process's CPU time in Apply
			for b.Loop() {
				b.StopTimer()
				d := openTest(b, cfg)
				b.StartTimer()
				cpu0 := testutil.CPUTime(b)
				if err := reconciler.New(d.Maps(), nil).Apply(st); err != nil {
					b.Fatal(err)
				}
				cpu += testutil.CPUTime(b) - cpu0
				b.StopTimer()
				d.Close()
				if err := os.RemoveAll(filepath.Join(cfg.BPFFS, "sluice")); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			// On a loaded machine the wall time mostly waits for a
			// CPU; the CPU time is the agent's work.
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}

// benchServices is the scale benchmarks' cluster: n ClusterIP services
// (10.96.0.0 on, port 80) of 10 endpoints each (11-20.x.y.z:8080, with
// x.y.z the service's number).
func benchServices(n int) []*model.Service {
	svcs := make([]*model.Service, n)
	for i := range svcs {
		fe := model.L4Addr{Addr: netip.AddrFrom4([4]byte{10, byte(96 + i>>16), byte(i >> 8), byte(i)}), Port: 80, Proto: model.TCP}
		s := &model.Service{Name: model.ServicePortName{Namespace: "bench", Name: fmt.Sprint("svc-", i)}, Kind: model.ClusterIP, Frontend: fe}
		for j := range 10 {
			s.Backends = append(s.Backends, model.Backend{L4Addr: model.L4Addr{
				Addr: netip.AddrFrom4([4]byte{byte(11 + j), byte(i >> 16), byte(i >> 8), byte(i)}), Port: 8080, Proto: model.TCP}})
		}
		svcs[i] = s
	}
	return svcs
}
