package datapath

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/internal/testutil/packet"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/model"
)

// TestRejectSourceAsTheKernels: the port unreachable tc sends in place of
// kube-proxy's reject comes from the address the kernel's would: for a
// ClusterIP (no local address: kube-proxy rejects it in the forward
// hook), the node's address that the route back to the client picks
// (__icmp_send, icmp6_send), here the node's 10.0.0.2 (2001:db8::2), not
// the VIP, which anti-spoofing may drop; for an ExternalIP the node holds
// (on its lo: kube-proxy rejects it in the input hook), that address
// itself. The node has a default route, as a node has (via its backend's
// side): the VIP is routed, not local. Real traffic from the client's
// namespace, per family: a TCP connect() is refused (ECONNREFUSED); a
// connected UDP socket gets the error on its error queue (IP_RECVERR),
// the ICMP error's source as the offender, which the kernel delivers only
// for an error whose checksums and quote it accepts; and the frame the
// client's device receives has that source, the quote of the packet to
// the frontend, and checksums that recompute.
func TestRejectSourceAsTheKernels(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		d, lb, plane := lbDatapathOf(t, v6)
		def, ext := netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("192.0.2.50/32")
		if v6 {
			def, ext = netip.MustParsePrefix("::/0"), netip.MustParsePrefix("2001:db8:50::50/128")
		}
		if err := lb.Node.AddRoute(def, plane.backends[0]); err != nil {
			t.Fatal(err)
		}
		if err := lb.Node.AddAddr("lo", ext); err != nil {
			t.Fatal(err)
		}
		if err := lb.Node.WaitLocal(ext.Addr()); err != nil {
			t.Fatal(err)
		}
		if err := lb.Client.AddRoute(ext, plane.node); err != nil {
			t.Fatal(err)
		}
		vip := addr(vipOf(v6, "10.96.0.92"))
		var svcs []*model.Service
		for _, proto := range []model.Protocol{model.TCP, model.UDP} {
			svcs = append(svcs, clusterIP(l4(vip.String(), 80, proto)),
				&model.Service{Name: model.ServicePortName{Namespace: "test", Name: "ext"}, Kind: model.ExternalIP,
					Frontend: l4(ext.Addr().String(), 80, proto)})
		}
		applyServices(t, d, svcs...)
		if err := lb.Node.Do(func() error { return d.AttachDevices([]string{lb.NodeDev}) }); err != nil {
			t.Fatal(err)
		}

		// Without BPF_FIB_LOOKUP_SRC (before Linux 6.7) the FIB cannot
		// name the node's address: a ClusterIP's reject comes from the
		// VIP (the README's fallback).
		fromNode := func(a netip.Addr) netip.Addr { return a }
		if err := haveFibLookupSrc(); errors.Is(err, ebpf.ErrNotSupported) {
			t.Logf("%v: a ClusterIP's reject is wanted from the VIP", err)
			fromNode = func(netip.Addr) netip.Addr { return vip }
		} else if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			name     string
			fe, want netip.Addr
			setup    func(t *testing.T)
		}{
			{"clusterip_from_node_address", vip, fromNode(plane.node), nil},
			{"local_externalip_from_itself", ext.Addr(), ext.Addr(), nil},
			// The node's route to the client goes through another of
			// its devices (bk1, via the backend): the kernel's error
			// takes that route's source, 10.1.1.1, the node's
			// address on bk1 (fib_result_prefsrc), and, IPv6, the
			// route's prefsrc, 2001:db8:1:1::1 (without one,
			// icmp6_send picks on the ingress device: see
			// icmp_reject_src); tc's still leaves by eth0, the
			// device the packet came in on. Before, the lookup was
			// pinned to eth0: IPv4 fell back to its connected
			// route's 10.0.0.2, IPv6 to the VIP.
			{"clusterip_client_routed_through_another_device", vip, fromNode(otherDevAddr(v6)), func(t *testing.T) {
				routeClientThroughOtherDevice(t, lb, plane, v6)
			}},
		} {
			t.Run(c.name, func(t *testing.T) {
				if c.setup != nil {
					c.setup(t)
				}
				fe := netip.AddrPortFrom(c.fe, 80)
				capture := captureOn(t, lb.Client, "eth0")
				if err := tcpRefused(lb.Client, fe); err != nil {
					t.Error(err)
				}
				offender, err := udpOffender(lb.Client, fe)
				if err != nil {
					t.Fatal(err)
				}
				if offender != c.want {
					t.Errorf("UDP to %s: port unreachable from %s, want %s", fe, offender, c.want)
				}
				frame := capture.icmpError(t, plane.client)
				p, err := packet.Parse(frame)
				if err != nil {
					t.Fatal(err)
				}
				checkChecksums(t, frame)
				if p.Src != c.want {
					t.Errorf("ICMP error frame from %s, want %s", p.Src, c.want)
				}
				if qs, qd := quoteAddrs(p.Payload); qs != plane.client || qd != c.fe {
					t.Errorf("quote %s -> %s, want %s -> %s", qs, qd, plane.client, c.fe)
				}
			})
		}
		expectCounted(t, d, "tc_no_backend")
	})
}

// otherDevAddr is the node's address on bk1, its device towards the
// first backend (topology.LB, LB6).
func otherDevAddr(v6 bool) netip.Addr {
	if v6 {
		return netip.MustParseAddr("2001:db8:1:1::1")
	}
	return netip.MustParseAddr("10.1.1.1")
}

// routeClientThroughOtherDevice routes, in lb's node, the client's address
// (a host route, more specific than eth0's connected one) through bk1, via
// the first backend; IPv6's with bk1's address as its prefsrc. The client
// reaches that address through the node (for an rp_filter).
func routeClientThroughOtherDevice(t *testing.T, lb *topology.LB, plane lbPlane, v6 bool) {
	t.Helper()
	own := otherDevAddr(v6)
	if err := lb.Client.AddRoute(netip.PrefixFrom(own, own.BitLen()), plane.node); err != nil {
		t.Fatal(err)
	}
	if err := lb.Node.Do(func() error {
		r := &netlink.Route{
			Dst: &net.IPNet{IP: plane.client.AsSlice(), Mask: net.CIDRMask(plane.client.BitLen(), plane.client.BitLen())},
			Gw:  plane.backends[0].AsSlice(),
		}
		if v6 {
			r.Src = own.AsSlice()
		}
		return netlink.RouteAdd(r)
	}); err != nil {
		t.Fatalf("route to %s through bk1: %v", plane.client, err)
	}
}

// haveFibLookupSrc reports whether bpf_fib_lookup takes BPF_FIB_LOOKUP_SRC
// (Linux 6.7, commit dab4e1f06cab; backported to some stable branches): a
// tc program that calls it with the flag alone, run once, gets -EINVAL
// from a kernel without it, which checks the flags before anything else.
func haveFibLookupSrc() error {
	const fibLen, lookupSrc = 64, 1 << 4 // sizeof(struct bpf_fib_lookup), BPF_FIB_LOOKUP_SRC
	ins := asm.Instructions{asm.Mov.Reg(asm.R6, asm.R1)}
	for off := int16(-fibLen); off < 0; off += 4 {
		ins = append(ins, asm.StoreImm(asm.RFP, off, 0, asm.Word))
	}
	ins = append(ins,
		asm.StoreImm(asm.RFP, -fibLen, unix.AF_INET, asm.Byte), // .family
		asm.StoreImm(asm.RFP, -fibLen+8, 1, asm.Word),          // .ifindex: lo
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -fibLen),
		asm.Mov.Imm(asm.R3, fibLen),
		asm.Mov.Imm(asm.R4, lookupSrc),
		asm.FnFibLookup.Call(),
		asm.Return(),
	)
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, Instructions: ins, License: "Dual BSD/GPL"})
	if err != nil {
		return fmt.Errorf("bpf_fib_lookup probe: %w", err)
	}
	defer prog.Close()
	ret, err := prog.Run(&ebpf.RunOptions{Data: make([]byte, 64)})
	if err != nil {
		return fmt.Errorf("bpf_fib_lookup probe: %w", err)
	}
	if int32(ret) == -int32(unix.EINVAL) {
		return fmt.Errorf("%w: BPF_FIB_LOOKUP_SRC (Linux 6.7)", ebpf.ErrNotSupported)
	}
	return nil
}

// tcpRefused connects from ns to fe and wants ECONNREFUSED.
func tcpRefused(ns *topology.NS, fe netip.AddrPort) error {
	return ns.Do(func() error {
		c, err := net.DialTimeout("tcp", fe.String(), 20*time.Second)
		if err == nil {
			c.Close()
			return fmt.Errorf("TCP connect to %s succeeded, want ECONNREFUSED", fe)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return fmt.Errorf("TCP connect to %s: %v, want ECONNREFUSED", fe, err)
		}
		return nil
	})
}

// udpOffender sends a datagram from a UDP socket in ns connected to fe,
// with IP_RECVERR (IPV6_RECVERR), and returns the source of the ICMP
// (ICMPv6) port unreachable the kernel queues on it (SO_EE_OFFENDER).
func udpOffender(ns *topology.NS, fe netip.AddrPort) (netip.Addr, error) {
	var offender netip.Addr
	err := ns.Do(func() error {
		family, level, opt := unix.AF_INET6, unix.SOL_IPV6, unix.IPV6_RECVERR
		var sa unix.Sockaddr = &unix.SockaddrInet6{Port: int(fe.Port()), Addr: fe.Addr().As16()}
		if fe.Addr().Is4() {
			family, level, opt = unix.AF_INET, unix.SOL_IP, unix.IP_RECVERR
			sa = &unix.SockaddrInet4{Port: int(fe.Port()), Addr: fe.Addr().As4()}
		}
		fd, err := unix.Socket(family, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := unix.SetsockoptInt(fd, level, opt, 1); err != nil {
			return err
		}
		if err := unix.Connect(fd, sa); err != nil {
			return fmt.Errorf("UDP connect to %s: %w", fe, err)
		}
		if _, err := unix.Write(fd, []byte("anyone?")); err != nil {
			return fmt.Errorf("UDP send to %s: %w", fe, err)
		}
		// The error queue: wait (not a timed assertion: 20 s is a
		// deadline for a lost error) for POLLERR.
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLERR}}
		if n, err := unix.Poll(pfd, 20000); err != nil || n == 0 {
			return fmt.Errorf("UDP to %s: no error queued (%v)", fe, err)
		}
		buf, oob := make([]byte, 256), make([]byte, 512)
		_, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, unix.MSG_ERRQUEUE)
		if err != nil {
			return fmt.Errorf("UDP to %s: error queue: %w", fe, err)
		}
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Header.Level != int32(level) || m.Header.Type != int32(opt) ||
				len(m.Data) < int(unsafe.Sizeof(unix.SockExtendedErr{})) {
				continue
			}
			ee := (*unix.SockExtendedErr)(unsafe.Pointer(&m.Data[0]))
			wantOrigin, wantType, wantCode := uint8(unix.SO_EE_ORIGIN_ICMP), uint8(3), uint8(3)
			if fe.Addr().Is6() {
				wantOrigin, wantType, wantCode = unix.SO_EE_ORIGIN_ICMP6, 1, 4
			}
			if ee.Errno != uint32(unix.ECONNREFUSED) || ee.Origin != wantOrigin || ee.Type != wantType || ee.Code != wantCode {
				return fmt.Errorf("UDP to %s: queued error errno %d origin %d type %d code %d, want ECONNREFUSED from a port unreachable",
					fe, ee.Errno, ee.Origin, ee.Type, ee.Code)
			}
			// SO_EE_OFFENDER: the sockaddr after the struct.
			off := m.Data[unsafe.Sizeof(*ee):]
			if fe.Addr().Is6() && len(off) >= 24 {
				offender = netip.AddrFrom16([16]byte(off[8:24]))
			} else if !fe.Addr().Is6() && len(off) >= 8 {
				offender = netip.AddrFrom4([4]byte(off[4:8]))
			}
			return nil
		}
		return fmt.Errorf("UDP to %s: no extended error among %d control messages", fe, len(msgs))
	})
	return offender, err
}

// frameCapture is a packet socket on a device of a test namespace.
type frameCapture struct{ fd int }

// captureOn opens a packet socket on dev in ns, closed when t ends.
func captureOn(t *testing.T, ns *topology.NS, dev string) *frameCapture {
	t.Helper()
	c := &frameCapture{fd: -1}
	t.Cleanup(func() {
		if c.fd >= 0 {
			unix.Close(c.fd)
		}
	})
	if err := ns.Do(func() error {
		ifi, err := net.InterfaceByName(dev)
		if err != nil {
			return err
		}
		proto := int(htons(unix.ETH_P_ALL))
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
		if err != nil {
			return err
		}
		c.fd = fd
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: uint16(proto), Ifindex: ifi.Index}); err != nil {
			return err
		}
		return unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 1})
	}); err != nil {
		t.Fatalf("capture on %s in %s: %v", dev, ns.Name, err)
	}
	return c
}

// icmpError returns the first ICMP destination unreachable (ICMPv6: type
// 1) to client the capture has received, within 20 s.
func (c *frameCapture) icmpError(t *testing.T, client netip.Addr) []byte {
	t.Helper()
	buf := make([]byte, 2048)
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); {
		n, from, err := unix.Recvfrom(c.fd, buf, 0)
		if err != nil {
			continue // the receive timeout: look at the clock again
		}
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue
		}
		p, err := packet.Parse(buf[:n])
		if err != nil || p.Dst != client {
			continue
		}
		if (p.Proto == packet.ICMP && p.ICMPType == packet.ICMPUnreachable) ||
			(p.Proto == packet.ICMPv6 && p.ICMPType == packet.ICMPv6Unreachable) {
			return append([]byte(nil), buf[:n]...)
		}
	}
	t.Fatalf("no ICMP error to %s captured in 20 s", client)
	return nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// quoteAddrs are the source and destination of the IP packet an ICMP
// error quotes (q: its payload after the ICMP header).
func quoteAddrs(q []byte) (src, dst netip.Addr) {
	switch {
	case len(q) >= 40 && q[0]>>4 == 6:
		return netip.AddrFrom16([16]byte(q[8:24])), netip.AddrFrom16([16]byte(q[24:40]))
	case len(q) >= 20 && q[0]>>4 == 4:
		return netip.AddrFrom4([4]byte(q[12:16])), netip.AddrFrom4([4]byte(q[16:20]))
	}
	return
}

// fibLookupSrc caches haveFibLookupSrc's answer: nil if the kernel has
// BPF_FIB_LOOKUP_SRC.
var fibLookupSrc = sync.OnceValue(haveFibLookupSrc)

// kernelRejectSrc is the source tc's port unreachable about a packet
// from client to dst takes when the packet came in on dev, asked of the
// calling thread's network namespace as icmp_reject_src asks its FIB:
// dst on a kernel without BPF_FIB_LOOKUP_SRC, with forwarding off on dev,
// for an address bpf_fib_lookup refuses (IPv6 link-local, multicast,
// loopback), when dst is not a unicast route's (a node address; no
// route); else the source of the route to the client (dst if none). The
// tests that run the tc programs with BPF_PROG_TEST_RUN (dev lo) in the
// test process's namespace use it, so that what they expect does not
// depend on the machine's forwarding and routes.
func kernelRejectSrc(dev string, dst, client netip.Addr) netip.Addr {
	if fibLookupSrc() != nil {
		return dst
	}
	fam := "ipv4"
	if dst.Is6() {
		fam = "ipv6"
		for _, a := range []netip.Addr{dst, client} {
			if a.IsLinkLocalUnicast() || a.IsMulticast() || a.IsLoopback() {
				return dst
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/net/" + fam + "/conf/" + dev + "/forwarding"); err != nil || strings.TrimSpace(string(b)) != "1" {
		return dst
	}
	rs, err := netlink.RouteGet(dst.AsSlice())
	if err != nil || len(rs) == 0 || rs[0].Type != unix.RTN_UNICAST {
		return dst
	}
	rs, err = netlink.RouteGet(client.AsSlice())
	if err != nil || len(rs) == 0 || rs[0].Type != unix.RTN_UNICAST {
		return dst
	}
	if a, ok := netip.AddrFromSlice(rs[0].Src); ok && !a.Unmap().IsUnspecified() {
		return a.Unmap()
	}
	return dst
}
