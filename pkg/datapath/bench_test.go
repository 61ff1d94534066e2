package datapath

import (
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/internal/testutil/packet"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// BenchmarkNodePortRemote compares the per-packet cost of a NodePort flow
// to a backend on another node in the XDP fast path and in the tc path:
// an established flow's request (DNAT+SNAT, FIB lookup, redirect) and its
// reply (reverse NAT back to the client). Each packet is one
// BPF_PROG_TEST_RUN (a fresh copy: the programs rewrite in place, so
// repeating on one buffer would measure a rewritten packet), and
// "prog-ns/pkt" is the kernel's own measurement of the program run alone;
// ns/op adds the syscall and the skb or xdp_buff set-up around it.
//
//	go test -run '^$' -bench NodePortRemote ./pkg/datapath
func BenchmarkNodePortRemote(b *testing.B) {
	ns, _, d := northSouthNode(b)
	m := d.Maps()

	// Without a context BPF_PROG_TEST_RUN runs on the loopback device;
	// routing from there is the same for both programs.
	in := packet.Packet{SrcMAC: clientMAC, DstMAC: macOf(nodeEthMAC), Src: addr(nsClientIP), Dst: addr(nsNodeIP),
		SrcPort: 42000, DstPort: 30080, Proto: packet.TCP, TCPFlags: packet.ACK, Payload: make([]byte, 64)}
	for _, prog := range []*ebpf.Program{d.TCIngress(), d.XDP()} {
		if _, _, err := prog.Benchmark(in.Bytes(), 1, nil); err != nil {
			b.Fatal(err)
		}
	}
	sp := snatPortOf(b, m, nsClientIP, 42000, npRemote)
	reply := packet.Packet{SrcMAC: macOf(node2MAC), DstMAC: macOf(nodeEthMAC), Src: addr("10.2.0.7"), SrcPort: 8080,
		Dst: addr(nsNodeIP), DstPort: sp, Proto: packet.TCP, TCPFlags: packet.ACK, Payload: make([]byte, 64)}

	// Interleaved: each iteration runs the same packet through tc and
	// then XDP, so both see the same machine load; the ratio is what to
	// compare on a busy machine.
	for _, c := range []struct {
		name string
		in   []byte
	}{{"request/interleaved", in.Bytes()}, {"reply/interleaved", reply.Bytes()}} {
		b.Run(c.name, func(b *testing.B) {
			ns.Enter(b)
			var tcTotal, xdpTotal time.Duration
			for b.Loop() {
				_, dt, err := d.TCIngress().Benchmark(c.in, 1, nil)
				if err != nil {
					b.Fatal(err)
				}
				_, dx, err := d.XDP().Benchmark(c.in, 1, nil)
				if err != nil {
					b.Fatal(err)
				}
				tcTotal += dt
				xdpTotal += dx
			}
			b.ReportMetric(float64(tcTotal.Nanoseconds())/float64(b.N), "tc-ns/pkt")
			b.ReportMetric(float64(xdpTotal.Nanoseconds())/float64(b.N), "xdp-ns/pkt")
			b.ReportMetric(float64(xdpTotal)/float64(tcTotal), "xdp/tc")
		})
	}

	for _, c := range []struct {
		name    string
		prog    *ebpf.Program
		in      []byte
		verdict uint32
	}{
		{"request/tc", d.TCIngress(), in.Bytes(), tcActRedirect},
		{"request/xdp", d.XDP(), in.Bytes(), 4 /* XDP_REDIRECT: lo -> eth0 */},
		{"reply/tc", d.TCIngress(), reply.Bytes(), tcActRedirect},
		{"reply/xdp", d.XDP(), reply.Bytes(), 4},
	} {
		b.Run(c.name, func(b *testing.B) {
			ns.Enter(b)
			var total time.Duration
			for b.Loop() {
				ret, dur, err := c.prog.Benchmark(c.in, 1, nil)
				if err != nil {
					b.Fatal(err)
				}
				if ret != c.verdict {
					b.Fatalf("verdict %d, want %d", ret, c.verdict)
				}
				total += dur
			}
			b.ReportMetric(float64(total.Nanoseconds())/float64(b.N), "prog-ns/pkt")
		})
	}
}

// BenchmarkXDPFamilies is the XDP fast path's per-packet figure over IPv6
// beside IPv4 (issue 10): an established NodePort flow to a backend on
// another node, its request (conntrack hit, FIB lookup, DNAT and SNAT,
// redirect) and its reply (reverse NAT back to the client), through the
// attached program (sluice_xdp, which tail-calls sluice6_xdp for IPv6).
// Each round runs the IPv4 packet, then the IPv6 one, so both see the same
// machine load: "v6/v4" is the figure to read on a busy machine;
// "v4-ns/pkt" and "v6-ns/pkt" are the kernel's own measure of the program
// run, as in BenchmarkNodePortRemote.
//
//	go test -run '^$' -bench XDPFamilies ./pkg/datapath
func BenchmarkXDPFamilies(b *testing.B) {
	ns, _, d := nodeDatapath6(b, xdpConfig)
	np6, be6 := np6Remote, be6Remote
	addExternal(b, d.Maps(), 1, npRemote, reconciler.FlagExternal, beRemote)
	payload := func(p packet.Packet) packet.Packet { p.TCPFlags, p.Payload = packet.ACK, make([]byte, 64); return p }
	req := [2]packet.Packet{payload(nsClient(42000, npRemote)), payload(nsClient(42000, np6))}
	for _, p := range req {
		if v, _, err := d.XDP().Benchmark(p.Bytes(), 1, nil); err != nil || v != 4 { // XDP_REDIRECT: lo -> eth0
			b.Fatalf("request %s: verdict %d, %v", p.Dst, v, err)
		}
	}
	reply := [2]packet.Packet{
		payload(replyFrom(beRemote, snatPortOf(b, d.Maps(), nsClientIP, 42000, npRemote), 0)),
		payload(replyFrom(be6, snatPort6Of(b, d, nsClientIP6, 42000, np6), 0)),
	}
	for _, c := range []struct {
		name string
		pkts [2]packet.Packet
	}{{"request", req}, {"reply", reply}} {
		b.Run(c.name, func(b *testing.B) {
			ns.Enter(b)
			in := [2][]byte{c.pkts[0].Bytes(), c.pkts[1].Bytes()}
			var took [2]time.Duration
			for b.Loop() {
				for fam := range 2 {
					v, dt, err := d.XDP().Benchmark(in[fam], 1, nil)
					if err != nil || v != 4 {
						b.Fatalf("family %d: verdict %d, %v", fam, v, err)
					}
					took[fam] += dt
				}
			}
			b.ReportMetric(float64(took[0].Nanoseconds())/float64(b.N), "v4-ns/pkt")
			b.ReportMetric(float64(took[1].Nanoseconds())/float64(b.N), "v6-ns/pkt")
			b.ReportMetric(float64(took[1])/float64(took[0]), "v6/v4")
		})
	}
}
