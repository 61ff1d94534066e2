package datapath

import (
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/packet"
	"github.com/sluice-lb/sluice/pkg/model"
)

// TestProgramsReadTheAgentsClock: the expiry a new flow's entry gets is
// the programs' clock plus the SYN timeout, and that clock is the one
// monotonicNow reads (CLOCK_MONOTONIC_COARSE, bpf_ktime_get_coarse_ns):
// read before and after the packet, it brackets the entry's "now". With
// the two on different clocks (the programs on bpf_ktime_get_ns, or the
// agent on CLOCK_MONOTONIC) it does not, but in the rare run where a
// tick falls between the packet and the second reading: then what the
// agent plants or judges a nanosecond either side of "now" (the GC, the
// migration's copy, the tests' expired entries) would not be what the
// programs see.
func TestProgramsReadTheAgentsClock(t *testing.T) {
	d := newTestDatapath(t)
	fe := model.L4Addr{Addr: addr("10.96.0.77"), Port: 80, Proto: model.TCP}
	applyServices(t, d, clusterIP(fe, model.L4Addr{Addr: addr("10.1.0.77"), Port: 8080, Proto: model.TCP}))
	for i := range 20 {
		cport := uint16(40000 + i)
		before, err := monotonicNow()
		if err != nil {
			t.Fatal(err)
		}
		runProg(t, d.TCIngress(), ether(packet.Packet{Src: addr("10.0.0.1"), SrcPort: cport, Dst: fe.Addr, DstPort: fe.Port,
			Proto: packet.TCP, TCPFlags: packet.SYN}))
		after, err := monotonicNow()
		if err != nil {
			t.Fatal(err)
		}
		k := sockCt4Key{Saddr: be32(addr("10.0.0.1")), Daddr: be32(fe.Addr), Sport: be16(cport), Dport: be16(fe.Port),
			Proto: uint8(model.TCP), Dir: ctForward}
		var v sockCt4Entry
		// Half-open in sluice_conntrack (the half-open share has room).
		if err := d.tc.SluiceConntrackV2.Lookup(&k, &v); err != nil {
			t.Fatalf("flow %d: no half-open entry: %v", i, err)
		}
		syn := uint64(d.cfg.CTTimeoutSYN)
		if v.Expires < before+syn || v.Expires > after+syn {
			t.Fatalf("flow %d: expires at %d, want %d-%d (the agent's clock before and after the packet, plus the SYN timeout): the programs read %d, the agent %d-%d",
				i, v.Expires, before+syn, after+syn, v.Expires-syn, before, after)
		}
	}
}

// BenchmarkClock is what one reading of the programs' clock costs in a tc
// program on this machine: bpf_ktime_get_ns (the clock source: a TSC read
// here, a pvclock or an HPET read elsewhere) against
// bpf_ktime_get_coarse_ns (a variable the timekeeper's tick writes), which
// now_ns() in bpf/lib/consts.h reads since issue 14's sixty-fifth pass.
// Every per-packet program run reads it once, some ten runs a connection.
//
// Each iteration runs, under BPF_PROG_TEST_RUN, a program of clockCalls
// calls of each helper in turn (and one of as many moves, the run's own
// cost), so that both see the same load; "*-ns/call" is the kernel's
// time of a run over clockCalls, the empty program's taken off.
//
//	go test -run '^$' -bench Clock ./pkg/datapath
func BenchmarkClock(b *testing.B) {
	testutil.Privileged(b)
	const clockCalls, repeat = 64, 1000
	prog := func(fn asm.BuiltinFunc) *ebpf.Program {
		var ins asm.Instructions
		for range clockCalls {
			if fn == asm.FnUnspec {
				ins = append(ins, asm.Mov.Imm(asm.R0, 0))
			} else {
				ins = append(ins, fn.Call())
			}
		}
		ins = append(ins, asm.Mov.Imm(asm.R0, 0), asm.Return())
		p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, Instructions: ins, License: "Dual BSD/GPL"})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = p.Close() })
		return p
	}
	progs := []*ebpf.Program{prog(asm.FnUnspec), prog(asm.FnKtimeGetNs), prog(asm.FnKtimeGetCoarseNs)}
	pkt := ether(packet.Packet{Src: addr("10.0.0.1"), Dst: addr("10.96.0.1"), Proto: packet.TCP, SrcPort: 1000, DstPort: 80})
	var took [3]time.Duration
	for b.Loop() {
		for i, p := range progs {
			_, dt, err := p.Benchmark(pkt, repeat, nil)
			if err != nil {
				b.Fatal(err)
			}
			took[i] += dt
		}
	}
	perCall := func(i int) float64 {
		return float64((took[i] - took[0]).Nanoseconds()) / float64(b.N) / clockCalls
	}
	b.ReportMetric(perCall(1), "ktime-ns/call")
	b.ReportMetric(perCall(2), "coarse-ns/call")
}
