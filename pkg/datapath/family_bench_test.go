package datapath

import (
	"net/netip"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/packet"
	"github.com/sluice-lb/sluice/pkg/model"
)

// BenchmarkClusterIPFamilies is issue 10's per-packet figure: what the tc
// ingress program costs for a TCP packet to an IPv6 ClusterIP beside the
// same packet to an IPv4 one (target: within 1.2x), with 10,000 Services of
// each family programmed, for the last Service programmed:
//
//   - new: a new flow's first packet (service lookup, backend pick, DNAT,
//     conntrack insert), each from a new source port;
//   - established: a packet of a flow conntrack knows (lookup, DNAT).
//
// Each iteration runs the IPv4 packet, then the IPv6 one, so both see the
// same machine load: "v6/v4" is the figure to read on a busy machine.
// "v4-ns/pkt" and "v6-ns/pkt" are the kernel's own measure of the program
// run (BPF_PROG_TEST_RUN's duration), without the syscall around it.
//
//	go test -run '^$' -bench ClusterIPFamilies ./pkg/datapath
func BenchmarkClusterIPFamilies(b *testing.B) {
	testutil.Privileged(b)
	const n = 10000
	d := openTestWith(b, smallConfig, func(c *Config) {
		c.MaxServices, c.MaxBackends, c.MaxServiceEntries = 4*n, 8*n, 8*n
		c.MaxConntrack, c.MaxConntrackNew = 1<<20, 1<<20
	})
	var svcs []*model.Service
	for i := range n {
		v4 := netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})
		v6 := netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 0x96, 14: byte(i >> 8), 15: byte(i)})
		be4 := netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})
		be6 := netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 1, 14: byte(i >> 8), 15: byte(i)})
		svcs = append(svcs, clusterIP(model.L4Addr{Addr: v4, Port: 80, Proto: model.TCP}, model.L4Addr{Addr: be4, Port: 8080, Proto: model.TCP}),
			clusterIP(model.L4Addr{Addr: v6, Port: 80, Proto: model.TCP}, model.L4Addr{Addr: be6, Port: 8080, Proto: model.TCP}))
	}
	applyServices(b, d, svcs...)
	last := svcs[len(svcs)-2:]
	pkt := func(fam int, sport uint16) []byte {
		src := [2]string{"10.0.0.1", "2001:db8::1"}[fam]
		return ether(packet.Packet{Src: addr(src), Dst: last[fam].Frontend.Addr, Proto: packet.TCP,
			SrcPort: sport, DstPort: 80, TCPFlags: packet.SYN, Payload: make([]byte, 64)})
	}
	// Both families DNAT: the programs take the packets as the tests do.
	for fam := range 2 {
		_, out, err := runProgErr(d.TCIngress(), pkt(fam, 999))
		if err != nil {
			b.Fatal(err)
		}
		p, err := packet.Parse(out)
		if err != nil || p.Dst != last[fam].Backends[0].Addr {
			b.Fatalf("family %d: not DNATed to %s: %v %+v", fam, last[fam].Backends[0].Addr, err, p)
		}
	}
	for _, kind := range []string{"new", "established"} {
		b.Run(kind, func(b *testing.B) {
			var took [2]time.Duration
			sport := uint16(1000)
			for b.Loop() {
				if kind == "new" {
					sport++
				}
				for fam := range 2 {
					_, dt, err := d.TCIngress().Benchmark(pkt(fam, sport), 1, nil)
					if err != nil {
						b.Fatal(err)
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
