package harness

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"syscall"
	"time"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/packet"
	"github.com/sluice-lb/sluice/pkg/datapath"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
	"github.com/sluice-lb/sluice/test/bench/rules"
)

// testRun measures Sluice's tc ingress program per packet with
// BPF_PROG_TEST_RUN, with N services programmed through the production
// reconciler into maps of a private bpffs.
//
// The kernel runs a repeat loop on one skb, so after the first iteration
// the packet is already translated and later iterations measure a
// pass-through. Each figure is therefore many single runs (repeat 1, the
// kernel's own timing of the run): "new flow" sends a SYN from a fresh
// source port each time (service lookup, backend selection, conntrack
// insert, DNAT), "established" sends the same segment again (conntrack hit,
// DNAT).
func (r *runner) testRun(ctx context.Context, svcs []rules.Service) *TestRunStat {
	if !slices.Contains(r.cfg.Modes, ModeSluice) || r.cfg.TestRunCalls <= 0 {
		return nil
	}
	st := &TestRunStat{Calls: r.cfg.TestRunCalls}
	if err := r.doTestRun(ctx, svcs, st); err != nil {
		st.Result = err.Error()
	} else {
		st.Result = "ok"
	}
	return st
}

func (r *runner) doTestRun(ctx context.Context, svcs []rules.Service, st *TestRunStat) error {
	dir, err := os.MkdirTemp(r.tmp, "testrun-")
	if err != nil {
		return err
	}
	if err := syscall.Mount("bpf", dir, "bpf", 0, ""); err != nil {
		return fmt.Errorf("mount bpffs: %w", err)
	}
	defer func() {
		_ = datapath.Cleanup(dir)
		_ = syscall.Unmount(dir, syscall.MNT_DETACH)
	}()
	services, backends, entries := needs(svcs)
	dp, err := datapath.Open(datapath.Config{
		BPFFS:             dir,
		MaxServices:       mapSize(services),
		MaxBackends:       mapSize(backends),
		MaxServiceEntries: mapSize(entries),
		MaxConntrack:      max(65536, 2*r.cfg.TestRunCalls),
		MaxSockRev:        1024,
	})
	if err != nil {
		return fmt.Errorf("open datapath: %w", err)
	}
	defer dp.Close()
	state := model.NewState()
	var b model.ServicesBuilder
	for _, s := range svcs {
		fe := model.L4Addr{Addr: s.VIP, Port: s.Port, Proto: model.TCP}
		ms := &model.Service{
			Name:     model.ServicePortName{Namespace: rules.Namespace, Name: s.Name, Port: rules.PortName},
			Kind:     model.ClusterIP,
			Frontend: fe,
		}
		for _, ep := range s.Endpoints {
			ms.Backends = append(ms.Backends, model.Backend{L4Addr: model.L4Addr{Addr: ep.Addr(), Port: ep.Port(), Proto: model.TCP}})
		}
		ms.Backends = model.SortBackends(ms.Backends)
		b.Set(fe, ms)
	}
	state.Services = b.Services()
	t0 := time.Now()
	if err := reconciler.New(dp.Maps(), nil).Apply(state); err != nil {
		return fmt.Errorf("apply %d services: %w", len(svcs), err)
	}
	st.ApplyS = time.Since(t0).Seconds()
	prog := dp.TCIngress()

	client := netip.MustParseAddr(ClientSourceAddrs(r.fam)[0])
	target := svcs[r.rng.IntN(len(svcs))]
	// First, prove the translation: the SYN must leave addressed to one of
	// the service's endpoints.
	in := tcpSYN(client, 1024, target.VIP, target.Port)
	out := make([]byte, len(in)+256)
	opts := ebpf.RunOptions{Data: in, DataOut: out, Repeat: 1}
	if _, err := prog.Run(&opts); err != nil {
		return fmt.Errorf("test run: %w", err)
	}
	sent, err := packet.Parse(opts.DataOut)
	if err != nil {
		return fmt.Errorf("test run output: %w", err)
	}
	got := netip.AddrPortFrom(sent.Dst, sent.DstPort)
	if !slices.Contains(target.Endpoints, got) {
		return fmt.Errorf("SYN to %s left for %s, not one of its endpoints", target.VIPPort(), got)
	}

	const chunks = 5
	per := max(1, st.Calls/chunks)
	var newFlow, est []float64
	sport := uint16(1025)
	for c := 0; c < chunks && ctx.Err() == nil; c++ {
		var nf, es []time.Duration
		for i := 0; i < per; i++ {
			s := svcs[r.rng.IntN(len(svcs))]
			sport++
			if sport < 1025 {
				sport = 1025
				client = client.Next() // a new source address every 64k flows
			}
			d, err := runOnce(prog, tcpSYN(client, sport, s.VIP, s.Port))
			if err != nil {
				return err
			}
			nf = append(nf, d)
		}
		est1 := tcpSYN(client, sport, target.VIP, target.Port)
		if _, err := runOnce(prog, est1); err != nil {
			return err
		}
		for i := 0; i < per; i++ {
			d, err := runOnce(prog, est1)
			if err != nil {
				return err
			}
			es = append(es, d)
		}
		newFlow = append(newFlow, float64(testutil.Median(nf).Nanoseconds()))
		est = append(est, float64(testutil.Median(es).Nanoseconds()))
	}
	st.NewFlowNs, st.EstablishedNs = testutil.SpreadOf(newFlow), testutil.SpreadOf(est)
	return nil
}

func runOnce(prog *ebpf.Program, in []byte) (time.Duration, error) {
	_, d, err := prog.Benchmark(in, 1, nil)
	if err != nil {
		return 0, fmt.Errorf("test run: %w", err)
	}
	return d, nil
}

// tcpSYN builds the Ethernet + IP (the addresses' family) + TCP SYN frame
// of a new flow.
func tcpSYN(src netip.Addr, sport uint16, dst netip.Addr, dport uint16) []byte {
	return packet.Packet{
		SrcMAC: [6]byte{0x02, 0, 0, 0, 0, 0x01}, DstMAC: [6]byte{0x02, 0, 0, 0, 0, 0x02},
		Src: src, Dst: dst, Proto: packet.TCP, SrcPort: sport, DstPort: dport, TCPFlags: packet.SYN, Seq: 1,
	}.Bytes()
}
