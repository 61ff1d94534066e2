package datapath

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/packet"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/model"
)

// BenchmarkL3GateMAC: sluice_ingress (BPF_PROG_TEST_RUN, whose device is
// the namespace's lo: recorded as a node device, beside two veths) on a frame whose destination MAC starts with
// the IP version, 46:... (IPv4) and 66:... (IPv6), the case dev_l3_maybe
// spares a device lookup (l3gate_test.go), and on a 02:... one, which
// never paid it: a new flow (a SYN of a new port each time) and an
// established one (the same SYN again: conntrack's hit), in ns a packet;
// established_x100 is the latter repeated 100 times in one
// BPF_PROG_TEST_RUN (the kernel's mean), which spares it the system
// call's noise.
// It also logs the tc and XDP programs' verified instructions. It builds
// on main as well (the A/B of the seventy-second pass).
func BenchmarkL3GateMAC(b *testing.B) {
	testutil.Privileged(b)
	ns := topology.NewNS(b, "l3b")
	ns.Enter(b)
	for i, name := range []string{"eth4", "eth6"} {
		mac := net.HardwareAddr{0x02, 0, 0, 0, 0, byte(i + 1)}
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name, HardwareAddr: mac}, PeerName: "p" + name}); err != nil {
			b.Fatal(err)
		}
	}
	d := openTest(b, xdpConfig(testPinDir(b)))
	if err := d.AttachDevices([]string{"lo", "eth4", "eth6"}); err != nil {
		b.Fatal(err)
	}
	for _, p := range []*ebpf.Program{d.tc.SluiceIngress, d.tc.SluiceEgress, d.tc.Sluice6Ingress, d.tc.Sluice6Egress, d.xdp.SluiceXdp, d.xdp.Sluice6Xdp} {
		info, err := p.Info()
		if err != nil {
			b.Fatal(err)
		}
		n, _ := info.VerifiedInstructions()
		b.Logf("verified_insns %s %d", info.Name, n)
	}
	vip := [2]model.L4Addr{l4("10.96.0.80", 80, model.TCP), twinL4(true, l4("10.96.0.80", 80, model.TCP))}
	addService(b, d.Maps(), 1, vip[0], testBackend{80, l4("10.1.8.1", 8080, model.TCP)})
	addService(b, d.Maps(), 2, vip[1], testBackend{81, twinL4(true, l4("10.1.8.1", 8080, model.TCP))})
	client := [2]string{"10.0.0.1", "2001:db8::1"}
	for _, c := range []struct {
		name string
		mac  [6]byte
	}{{"mac4x", [6]byte{0x46, 0, 0, 0, 0, 1}}, {"mac6x", [6]byte{0x66, 0, 0, 0, 0, 1}}, {"mac02", [6]byte{0x02, 0, 0, 0, 0, 1}}} {
		for fam, famName := range []string{"v4", "v6"} {
			if c.name == "mac4x" && fam == 1 || c.name == "mac6x" && fam == 0 {
				continue // the other family's nibble: no lookup either way
			}
			pkt := func(sport uint16) []byte {
				return frame(c.mac, clientMAC, packet.Packet{Src: netip.MustParseAddr(client[fam]), Dst: vip[fam].Addr, Proto: packet.TCP,
					SrcPort: sport, DstPort: 80, TCPFlags: packet.SYN, Payload: make([]byte, 64)})
			}
			for _, kind := range []string{"new", "established", "established_x100"} {
				b.Run(c.name+"/"+famName+"/"+kind, func(b *testing.B) {
					var took time.Duration
					sport := uint16(1000)
					for b.Loop() {
						if kind == "new" {
							sport++
						}
						repeat := 1
						if kind == "established_x100" {
							repeat = 100 // in the kernel: the mean of 100 runs
						}
						_, dt, err := d.TCIngress().Benchmark(pkt(sport), repeat, nil)
						if err != nil {
							b.Fatal(err)
						}
						took += dt
					}
					b.ReportMetric(float64(took.Nanoseconds())/float64(b.N), "ns/pkt")
				})
			}
		}
	}
}
