package main

import (
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/packet"
	"github.com/sluice-lb/sluice/pkg/datapath"
)

// progResult is the per-packet cost of one packet kind through the XDP and
// the tc program, measured by BPF_PROG_TEST_RUN on the node of the tc mode
// with its N services programmed by the agent.
type progResult struct {
	Packet     string  `json:"packet"`
	Iterations int     `json:"iterations"`
	TCNs       float64 `json:"tc_ns_per_pkt"`  // median of per-batch means
	XDPNs      float64 `json:"xdp_ns_per_pkt"` // median of per-batch means
	XDPOverTC  float64 `json:"xdp_over_tc"`    // median of per-batch ratios
	TCVerdict  uint32  `json:"tc_verdict"`     // 7: TC_ACT_REDIRECT
	XDPVerdict uint32  `json:"xdp_verdict"`    // 3: XDP_TX, 4: XDP_REDIRECT
}

const (
	tcActRedirect = 7
	xdpTX         = 3
	xdpRedirect   = 4
)

// progRun loads Sluice's programs again beside the agent of n (datapath.Open
// reuses its pinned maps, so the programs see the agent's N services and
// conntrack) and runs established-flow NodePort requests from the
// generator through tc and XDP, interleaved: each iteration is one packet
// through tc then the same packet through XDP, a fresh copy each (the
// programs rewrite in place). The duration is the kernel's own
// measurement of the program run. Without a context BPF_PROG_TEST_RUN runs
// on the namespace's loopback; routing from there is the same for both.
func (l *lab) progRun(n *node, nodePort, iterations int) ([]progResult, error) {
	// (An XDP mode loads the XDP program; nothing is attached here.)
	d, err := datapath.Open(datapath.Config{BPFFS: n.agent.BPFFS, NodeIPs: []netip.Addr{n.addr}, XDP: datapath.XDPGeneric})
	if err != nil {
		return nil, fmt.Errorf("open the agent's datapath: %w", err)
	}
	defer d.Close()
	genIfc, nodeMAC, err := l.macs(n)
	if err != nil {
		return nil, err
	}
	gen := netip.AddrFrom4([4]byte{10, 99, n.addr.As4()[2], 2})
	pkts := []struct {
		name string
		b    []byte
	}{
		{"udp request (18 B payload)", request(genIfc, nodeMAC, gen, n.addr, packet.UDP, 40001, uint16(nodePort), 18)},
		{"tcp request (ACK, 64 B payload)", request(genIfc, nodeMAC, gen, n.addr, packet.TCP, 40002, uint16(nodePort), 64)},
	}
	var out []progResult
	err = n.ns.Do(func() error {
		for _, p := range pkts {
			r := progResult{Packet: p.name, Iterations: iterations}
			// The first run creates the flow (conntrack, SNAT port);
			// the measured ones are established.
			for _, prog := range []*ebpf.Program{d.TCIngress(), d.XDP()} {
				if _, _, err := prog.Benchmark(p.b, 1, nil); err != nil {
					return fmt.Errorf("BPF_PROG_TEST_RUN %s: %w", p.name, err)
				}
			}
			const batches = 20
			per := max(iterations/batches, 1)
			var tcMeans, xdpMeans, ratios []float64
			for range batches {
				var tcSum, xdpSum time.Duration
				for range per {
					vt, dt, err := d.TCIngress().Benchmark(p.b, 1, nil)
					if err != nil {
						return err
					}
					vx, dx, err := d.XDP().Benchmark(p.b, 1, nil)
					if err != nil {
						return err
					}
					r.TCVerdict, r.XDPVerdict = vt, vx
					tcSum += dt
					xdpSum += dx
				}
				tcMeans = append(tcMeans, float64(tcSum.Nanoseconds())/float64(per))
				xdpMeans = append(xdpMeans, float64(xdpSum.Nanoseconds())/float64(per))
				ratios = append(ratios, float64(xdpSum)/float64(tcSum))
			}
			r.Iterations = per * batches
			r.TCNs, r.XDPNs, r.XDPOverTC = testutil.Median(tcMeans), testutil.Median(xdpMeans), testutil.Median(ratios)
			out = append(out, r)
		}
		return nil
	})
	return out, err
}

// macs returns the generator's MAC on its link to n and n's eth0 MAC.
func (l *lab) macs(n *node) (src, dst [6]byte, err error) {
	err = l.gen.Do(func() error {
		ifc, err := net.InterfaceByName(n.genDev)
		if err == nil {
			copy(src[:], ifc.HardwareAddr)
		}
		return err
	})
	if err != nil {
		return
	}
	err = n.ns.Do(func() error {
		ifc, err := net.InterfaceByName("eth0")
		if err == nil {
			copy(dst[:], ifc.HardwareAddr)
		}
		return err
	})
	return
}

// request builds the frame of an established flow's request from the
// generator: UDP, or a TCP ACK, with payload bytes of filler.
func request(srcMAC, dstMAC [6]byte, src, dst netip.Addr, proto uint8, sport, dport uint16, payload int) []byte {
	p := packet.Packet{SrcMAC: srcMAC, DstMAC: dstMAC, Src: src, Dst: dst, Proto: proto, SrcPort: sport, DstPort: dport,
		ID: 1, FragOff: 0x4000 /* DF */, Payload: make([]byte, payload)}
	for i := range p.Payload {
		p.Payload[i] = byte(i)
	}
	if proto == packet.TCP {
		p.TCPFlags, p.Seq, p.Ack, p.Window = packet.ACK, 1000, 2000, 65535
	}
	return p.Bytes()
}
