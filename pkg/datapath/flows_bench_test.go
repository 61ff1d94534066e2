package datapath

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/packet"
	"github.com/sluice-lb/sluice/pkg/model"
)

// BenchmarkTCFlows is issue 14's per-packet figure over many flows and
// services: what the tc programs cost per packet when every packet meets
// entries other packets have pushed out of the cache, as in real traffic,
// where BenchmarkClusterIPFamilies reruns one flow on hot entries.
//
// N ClusterIP services x 10 endpoints (benchServices) are programmed
// (the agent's default map sizes). Each iteration is one TCP connection from a client tuple
// never used before to a VIP picked at random, the ten packets a short
// request and response make (the load runs' mix: six client packets at
// the client-facing device's ingress, four replies at its egress):
//
//	ingress SYN (new), egress SYN-ACK (first reply: promotes the flow),
//	ingress ACK, request; egress ACK, response; ingress ACK, FIN;
//	egress FIN; ingress ACK.
//
// The connections run in batches, packet by packet across the batch (the
// SYNs of all of them, then their SYN-ACKs, ...), so that between two
// packets of one flow the programs have handled a batch of others. Each
// packet is one BPF_PROG_TEST_RUN (repeat 1, a fresh skb), timed by the
// kernel. Metrics, in ns per packet of each kind: "new" (the SYN),
// "first-reply" (the SYN-ACK), "est" (the other client packets), "reply"
// (the other replies); "conn-ns" is all ten, the programs' cost per
// connection. Flows older than a window are deleted from conntrack
// outside the timing (the agent's GC would), so the tables hold about
// as many entries as in a load run.
//
//	go test -run '^$' -bench TCFlows ./pkg/datapath
func BenchmarkTCFlows(b *testing.B) {
	testutil.Privileged(b)
	for _, n := range testutil.ScaleSizes(1, 10000, 30000) {
		b.Run(fmt.Sprintf("%dk", n/1000), func(b *testing.B) {
			d := openTestWith(b, smallConfig, func(c *Config) {
				c.MaxServices, c.MaxBackends, c.MaxServiceEntries = DefaultMaxServices, max(DefaultMaxBackends, 11*n), 1<<20
				c.MaxConntrack, c.MaxConntrackNew = DefaultMaxConntrack, DefaultMaxConntrackNew
			})
			svcs := benchServices(n)
			applyServices(b, d, svcs...)
			fl := &tcFlows{d: d, svcs: svcs, rng: rand.New(rand.NewPCG(1, uint64(n)))}
			fl.run(b)
		})
	}
}

// tcFlowStep is one packet of BenchmarkTCFlows's connection: its
// direction, TCP flags and payload, and the metric it counts in.
type tcFlowStep struct {
	reply  bool
	flags  uint8
	data   int
	metric int
}

const (
	tcFlowNew = iota
	tcFlowFirstReply
	tcFlowEst
	tcFlowReply
	tcFlowMetrics
)

var tcFlowSteps = []tcFlowStep{
	{false, packet.SYN, 0, tcFlowNew},
	{true, packet.SYN | packet.ACK, 0, tcFlowFirstReply},
	{false, packet.ACK, 0, tcFlowEst},
	{false, packet.PSH | packet.ACK, 64, tcFlowEst},
	{true, packet.ACK, 0, tcFlowReply},
	{true, packet.PSH | packet.ACK, 256, tcFlowReply},
	{false, packet.ACK, 0, tcFlowEst},
	{false, packet.FIN | packet.ACK, 0, tcFlowEst},
	{true, packet.FIN | packet.ACK, 0, tcFlowReply},
	{false, packet.ACK, 0, tcFlowEst},
}

// tcFlow is one connection of BenchmarkTCFlows: client, frontend, and the
// backend its SYN was sent to.
type tcFlow struct {
	client, fe, be netip.AddrPort
}

type tcFlows struct {
	d    *Datapath
	svcs []*model.Service
	rng  *rand.Rand
	next int      // flows made so far: the next client tuple
	old  []tcFlow // flows still in conntrack, oldest first
}

const (
	tcFlowBatch  = 2048  // connections handled packet by packet together
	tcFlowWindow = 32768 // connections kept in conntrack
)

func (fl *tcFlows) run(b *testing.B) {
	var took [tcFlowMetrics]time.Duration
	var count [tcFlowMetrics]int
	b.ResetTimer()
	for done := 0; done < b.N; {
		batch := make([]tcFlow, min(tcFlowBatch, b.N-done))
		for i := range batch {
			// A tuple never used before: 50,000 ports per client
			// address, client addresses in 10.200.0.0/16 on.
			k := fl.next
			fl.next++
			batch[i].client = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(200 + k/50000>>16), byte(k / 50000 >> 8), byte(k / 50000)}), uint16(10000+k%50000))
			batch[i].fe = netip.AddrPortFrom(fl.svcs[fl.rng.IntN(len(fl.svcs))].Frontend.Addr, 80)
		}
		for s, st := range tcFlowSteps {
			for i := range batch {
				f := &batch[i]
				p := packet.Packet{Src: f.client.Addr(), SrcPort: f.client.Port(), Dst: f.fe.Addr(), DstPort: f.fe.Port(),
					Proto: packet.TCP, TCPFlags: st.flags, Payload: make([]byte, st.data)}
				prog := fl.d.TCIngress()
				if st.reply {
					p.Src, p.SrcPort, p.Dst, p.DstPort = f.be.Addr(), f.be.Port(), f.client.Addr(), f.client.Port()
					prog = fl.d.TCEgress()
				}
				ret, dt, err := prog.Benchmark(ether(p), 1, nil)
				if err != nil || ret != tcActOK {
					b.Fatalf("packet %d of %s -> %s: verdict %d, %v", s, f.client, f.fe, ret, err)
				}
				took[st.metric] += dt
				count[st.metric]++
				if s == 0 {
					b.StopTimer()
					f.be = fl.backendOf(b, f)
					b.StartTimer()
				}
			}
		}
		done += len(batch)
		b.StopTimer()
		fl.forget(b, batch)
		b.StartTimer()
	}
	var conn time.Duration
	for m, name := range []string{"new", "first-reply", "est", "reply"} {
		conn += took[m]
		b.ReportMetric(float64(took[m].Nanoseconds())/float64(max(count[m], 1)), name+"-ns/pkt")
	}
	b.ReportMetric(float64(conn.Nanoseconds())/float64(b.N), "conn-ns")
}

// backendOf is the backend f's SYN was sent to, from its forward entry.
func (fl *tcFlows) backendOf(b *testing.B, f *tcFlow) netip.AddrPort {
	k := sockCt4Key{Saddr: be32(f.client.Addr()), Daddr: be32(f.fe.Addr()), Sport: be16(f.client.Port()), Dport: be16(f.fe.Port()),
		Proto: uint8(model.TCP), Dir: ctForward}
	v, ok := ctGet(fl.d.Maps(), k)
	if !ok {
		b.Fatalf("no forward conntrack entry of %s -> %s", f.client, f.fe)
	}
	return netip.AddrPortFrom(addrFromBE32(v.NatAddr), portFromBE16(v.NatPort))
}

// forget checks that the programs took every flow of batch through its
// life (its forward entry established and closed in both directions: the
// replies were translated, not passed through), adds batch to the flows in
// conntrack, and deletes the oldest beyond tcFlowWindow, both of their
// entries.
func (fl *tcFlows) forget(b *testing.B, batch []tcFlow) {
	for _, f := range batch {
		k := sockCt4Key{Saddr: be32(f.client.Addr()), Daddr: be32(f.fe.Addr()), Sport: be16(f.client.Port()), Dport: be16(f.fe.Port()),
			Proto: uint8(model.TCP), Dir: ctForward}
		var v sockCt4Entry
		const want = ctFlagReplied | ctFlagFinFwd | ctFlagFinRev
		if err := fl.d.Maps().conntrack.Lookup(&k, &v); err != nil || uint32(v.Flags)&want != want {
			b.Fatalf("flow %s -> %s (backend %s) not established and closed: %v, flags %#x", f.client, f.fe, f.be, err, v.Flags)
		}
	}
	fl.old = append(fl.old, batch...)
	drop := max(len(fl.old)-tcFlowWindow, 0)
	for _, f := range fl.old[:drop] {
		keys := []sockCt4Key{
			{Saddr: be32(f.client.Addr()), Daddr: be32(f.fe.Addr()), Sport: be16(f.client.Port()), Dport: be16(f.fe.Port()), Proto: uint8(model.TCP), Dir: ctForward},
			{Saddr: be32(f.be.Addr()), Daddr: be32(f.client.Addr()), Sport: be16(f.be.Port()), Dport: be16(f.client.Port()), Proto: uint8(model.TCP), Dir: ctReverse},
		}
		for _, k := range keys {
			if err := fl.d.Maps().conntrack.Delete(&k); err != nil {
				b.Fatalf("delete %+v: %v", k, err)
			}
		}
	}
	fl.old = fl.old[drop:]
}
