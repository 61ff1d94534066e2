package main

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"time"

	"github.com/cilium/ebpf"

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
	d, err := datapath.Open(datapath.Config{BPFFS: n.agent.BPFFS, NodeIPs: []netip.Addr{n.addr}})
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
		{"udp request (18 B payload)", packet(genIfc, nodeMAC, gen, n.addr, 17, 40001, uint16(nodePort), 18)},
		{"tcp request (ACK, 64 B payload)", packet(genIfc, nodeMAC, gen, n.addr, 6, 40002, uint16(nodePort), 64)},
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
			r.TCNs, r.XDPNs, r.XDPOverTC = median(tcMeans), median(xdpMeans), median(ratios)
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

// packet builds an Ethernet/IPv4/UDP or TCP (ACK) frame with correct
// checksums.
func packet(srcMAC, dstMAC [6]byte, src, dst netip.Addr, proto uint8, sport, dport uint16, payload int) []byte {
	l4len := 8
	if proto == 6 {
		l4len = 20
	}
	b := make([]byte, 14+20+l4len+payload)
	copy(b[0:], dstMAC[:])
	copy(b[6:], srcMAC[:])
	binary.BigEndian.PutUint16(b[12:], 0x0800)
	ip := b[14:34]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(20+l4len+payload))
	binary.BigEndian.PutUint16(ip[4:], 1)
	ip[6] = 0x40 // DF
	ip[8] = 64
	ip[9] = proto
	s4, d4 := src.As4(), dst.As4()
	copy(ip[12:], s4[:])
	copy(ip[16:], d4[:])
	binary.BigEndian.PutUint16(ip[10:], csum(ip, 0))
	l4 := b[34:]
	binary.BigEndian.PutUint16(l4[0:], sport)
	binary.BigEndian.PutUint16(l4[2:], dport)
	for i := l4len; i < len(l4); i++ {
		l4[i] = byte(i)
	}
	if proto == 17 {
		binary.BigEndian.PutUint16(l4[4:], uint16(len(l4)))
	} else {
		binary.BigEndian.PutUint32(l4[4:], 1000) // seq
		binary.BigEndian.PutUint32(l4[8:], 2000) // ack
		l4[12] = 5 << 4
		l4[13] = 0x10 // ACK
		binary.BigEndian.PutUint16(l4[14:], 65535)
	}
	// Pseudo-header sum, then the L4 header and payload.
	var ps uint32
	ps += uint32(binary.BigEndian.Uint16(s4[0:])) + uint32(binary.BigEndian.Uint16(s4[2:]))
	ps += uint32(binary.BigEndian.Uint16(d4[0:])) + uint32(binary.BigEndian.Uint16(d4[2:]))
	ps += uint32(proto) + uint32(len(l4))
	off := 6 // UDP checksum offset
	if proto == 6 {
		off = 16
	}
	binary.BigEndian.PutUint16(l4[off:], csum(l4, ps))
	return b
}

func csum(b []byte, sum uint32) uint16 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	c := ^uint16(sum)
	if c == 0 {
		c = 0xffff
	}
	return c
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
