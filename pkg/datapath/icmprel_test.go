package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// ICMP errors about DNAT-only flows and the node's netfilter conntrack,
// as ctinvalid_test.go's replies: conntrack recorded such a flow as
// <C -> B> (tc ingress translates before netfilter), so an error from B
// (or a router between) must reach it quoting [C -> B], which it takes
// for RELATED, and be translated back at the egress of the client's
// device. Translated at the ingress it meets first, it quoted [C -> F],
// a flow conntrack never saw: INVALID, and dropped by rules that drop
// INVALID in FORWARD; the client never learnt of the port unreachable
// or of the path MTU.

// icmpRelFamily is a family's addresses for TestDNATOnlyICMPErrorValid.
type icmpRelFamily struct {
	podNodeAddrs
	udp                string
	clientFar, far     netip.Prefix // the client's namespace, a router, and far's (remote on its lo)
	clientAlt, nodeAlt netip.Prefix // a second link of client and node, without tc
	ratelimit          string       // the sysctl of ICMP errors' rate limit
}

func icmpRelFamilyOf(v6 bool) icmpRelFamily {
	p := netip.MustParsePrefix
	if v6 {
		return icmpRelFamily{podNodeAddrs: podNodeAddrsOf(v6), udp: "udp6",
			clientFar: p("2001:db8:d::1/64"), far: p("2001:db8:d::2/64"),
			clientAlt: p("2001:db8:e::1/64"), nodeAlt: p("2001:db8:e::2/64"),
			ratelimit: "net/ipv6/icmp/ratelimit"}
	}
	return icmpRelFamily{podNodeAddrs: podNodeAddrsOf(v6), udp: "udp4",
		clientFar: p("10.3.0.1/24"), far: p("10.3.0.2/24"),
		clientAlt: p("10.4.0.1/24"), nodeAlt: p("10.4.0.2/24"),
		ratelimit: "net/ipv4/icmp_ratelimit"}
}

// farMTU is the MTU of the link from the client's namespace, a router, to
// far, the remote backend's namespace: what a frag-needed or packet-too-big
// tells pod B.
const farMTU = 1300

// TestDNATOnlyICMPErrorValid runs UDP flows that DNAT only through a node
// whose pods' devices are among the attached ones, with
// `iptables -I FORWARD -m conntrack --ctstate INVALID -j DROP` (and
// ip6tables') in the node's namespace:
//
//	client (eth0; router) <-> eth0 node pod0 <-> pod A (local backend)
//	  | far0, MTU 1300  alt0 <-> alt0  pod1 <-> pod B (client)
//	far (remote backend on lo)           (alt0: no tc)
//
// to ports nothing listens on: a NodePort with externalTrafficPolicy
// Local from the client to pod A, and ClusterIPs from pod B to pod A and
// to far, and from one port of pod B to two ClusterIPs of pod A (the
// second flow remapped to another client port, tc_ct_clash_remap). Each
// backend answers with a port unreachable; each client's connected UDP
// socket gets ECONNREFUSED. And pod B's datagram bigger than far's link
// gets a frag-needed (ICMPv6 packet too big) from the router: its socket
// gets EMSGSIZE, and the route to the ClusterIP the path's MTU. Each
// socket's error queue (IP_RECVERR) names the offender as the client
// must see it: the frontend for a backend's error (the node address it
// used for the NodePort, the VIP for a ClusterIP), the router's own
// address for its frag-needed; and the quote's destination, the
// frontend. The DROP rule matches no packet, and each error went up
// untranslated at the ingress it met first (tc_rev_at_egress) and was
// translated at the client device's egress (tc_icmp_xlate): both counters
// rise over each exchange. Last, with the node's route to the client by
// alt0, which has no tc, a NodePort's error is translated at the ingress
// it meets first, as before (tc_icmp_xlate rises, tc_rev_at_egress does
// not), and still reaches the client (the DROP rule deleted first: the
// node's conntrack takes that error for INVALID). Over each family; for
// IPv6 also an error about pod B's flow that pod A sends to the client's
// address, not the quote's source, is left alone (strayICMP6Error).
func TestDNATOnlyICMPErrorValid(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) { testDNATOnlyICMPErrorValid(t, icmpRelFamilyOf(v6)) })
}

func testDNATOnlyICMPErrorValid(t *testing.T, f icmpRelFamily) {
	d := newTestDatapath(t)
	topo := topology.NewT(t)
	pn := podNodeTopology(t, topo, f.podNodeAddrs)
	client, node, podA, podB := pn.client, pn.node, pn.podA, pn.podB
	far := topo.AddNST(t, "far")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	v6, bits := f.v6, pn.bits
	must(topo.Veth(client, "far0", far, "eth0"))
	must(topo.Veth(client, "alt0", node, "alt0"))
	setMTU(t, client, "far0", farMTU)
	setMTU(t, far, "eth0", farMTU)
	must(client.AddAddr("far0", f.clientFar))
	must(far.AddAddr("eth0", f.far))
	must(client.AddAddr("alt0", f.clientAlt))
	must(node.AddAddr("alt0", f.nodeAlt))
	must(far.AddAddr("lo", netip.PrefixFrom(f.remote, bits)))
	fwd := "net/ipv4/ip_forward"
	if v6 {
		fwd = "net/ipv6/conf/all/forwarding"
	}
	for _, ns := range []*topology.NS{node, client} {
		must(ns.Sysctl(fwd, "1"))
		if !v6 {
			// The fallback's asymmetric route (alt0) passes a
			// reverse path filter's check.
			for _, dev := range []string{"all", "eth0", "alt0"} {
				must(ns.Sysctl("net/ipv4/conf/"+dev+"/rp_filter", "0"))
			}
		}
	}
	// Every error the test waits for is sent: none held back by the
	// senders' rate limit.
	for _, ns := range []*topology.NS{podA, far, client} {
		must(ns.Sysctl(f.ratelimit, "0"))
	}
	// The client's namespace routes to far's backend; far's default
	// route is the client's namespace.
	must(client.AddRoute(netip.PrefixFrom(f.remote, bits), f.far.Addr()))
	must(far.AddRoute(f.dflt, f.clientFar.Addr()))
	pn.waitLocal(t, f.podNodeAddrs, nsAddr{client, f.clientFar.Addr()}, nsAddr{client, f.clientAlt.Addr()},
		nsAddr{far, f.far.Addr()}, nsAddr{node, f.nodeAlt.Addr()})

	// Nothing listens on port 9 of pod A or far.
	m := d.Maps()
	nodeIP := f.node.Addr().String()
	beA := testBackend{1, l4(f.podA.String(), 9, model.UDP)}
	beR := testBackend{2, l4(f.remote.String(), 9, model.UDP)}
	npLocal := l4(nodeIP, 30090, model.UDP)
	addExternal(t, m, 1, npLocal, reconciler.FlagExternal|reconciler.FlagLocal, beA)
	cipLocal := l4(f.cipLocal, 53, model.UDP)
	cipRemote := l4(f.cipRemote, 53, model.UDP)
	cipFar := l4(f.cipRemote, 54, model.UDP)
	addService(t, m, 2, cipLocal, beA)
	addService(t, m, 3, cipRemote, beR)
	addService(t, m, 4, cipFar, beR)
	cipTwin := l4(f.cipTwin, 53, model.UDP)
	addService(t, m, 5, cipTwin, beA)
	pn.attach(t, d)
	dropInvalid(t, node, f.iptables, true)

	// Each exchange, with the counters before and after it: each error
	// passed up at its first ingress (tc_rev_at_egress) and translated
	// at the client device's egress (tc_icmp_xlate), not a retry's.
	exchange := func(name string, fe model.L4Addr, atEgress bool, also string, run func() error) {
		t.Helper()
		before := counters(t, d)
		if err := run(); err != nil {
			t.Errorf("%s (%s): %v", name, apOf(fe), err)
		}
		after := counters(t, d)
		rose := func(c string) bool { return after[c] > before[c] }
		if rose("tc_rev_at_egress") != atEgress || !rose("tc_icmp_xlate") || (also != "" && !rose(also)) {
			t.Errorf("%s (%s): counters before -> after: tc_rev_at_egress %d -> %d (want a rise: %v), tc_icmp_xlate %d -> %d (want a rise)%s",
				name, apOf(fe), before["tc_rev_at_egress"], after["tc_rev_at_egress"], atEgress,
				before["tc_icmp_xlate"], after["tc_icmp_xlate"], func() string {
					if also == "" {
						return ""
					}
					return fmt.Sprintf(", %s %d -> %d (want a rise)", also, before[also], after[also])
				}())
		}
	}
	refused := func(from *topology.NS, local netip.AddrPort, fe model.L4Addr, offender netip.Addr) func() error {
		return func() error {
			c, err := icmpRelDial(from, f.udp, local, fe)
			if err != nil {
				return err
			}
			defer c.Close()
			return udpRefused(c, fe, offender)
		}
	}
	vip := func(fe model.L4Addr) netip.Addr { return apOf(fe).Addr() }
	for _, c := range []struct {
		name     string
		from     *topology.NS
		fe       model.L4Addr
		offender netip.Addr
	}{
		{"NodePort, externalTrafficPolicy Local, local pod", client, npLocal, f.node.Addr()},
		{"pod to ClusterIP, local backend", podB, cipLocal, vip(cipLocal)},
		{"pod to ClusterIP, remote backend", podB, cipRemote, vip(cipRemote)},
	} {
		exchange(c.name, c.fe, true, "", refused(c.from, netip.AddrPort{}, c.fe, c.offender))
	}
	// From a router: its own address, untranslated.
	exchange("pod to ClusterIP, remote backend behind a smaller MTU", cipFar, true, "", func() error {
		c, err := icmpRelDial(podB, f.udp, netip.AddrPort{}, cipFar)
		if err != nil {
			return err
		}
		defer c.Close()
		return udpTooBig(c, f.udp, cipFar, f.client.Addr())
	})
	// One client port of pod B to two ClusterIPs sharing pod A: the
	// second flow's reply tuple is the first's, so it is remapped to
	// another client port (lb4_remap); its error, quoting that port, must
	// reach the second socket, quoting the client's port and the second
	// ClusterIP, not the first socket.
	local := netip.AddrPortFrom(f.podB, 40000)
	first, err := icmpRelDial(podB, f.udp, local, cipLocal)
	must(err)
	defer first.Close()
	exchange("one port to two ClusterIPs, first flow", cipLocal, true, "", func() error { return udpRefused(first, cipLocal, vip(cipLocal)) })
	exchange("one port to two ClusterIPs, second flow (remapped)", cipTwin, true, "tc_ct_clash_remap", refused(podB, local, cipTwin, vip(cipTwin)))
	if n := invalidDrops(t, node, f.iptables); n != 0 {
		t.Errorf("the FORWARD rule dropping conntrack INVALID matched %d packets, want 0 (conntrack saw an ICMP error about a flow it did not know)", n)
	}

	// The DROP rule goes: the node's conntrack takes the next errors for
	// INVALID.
	dropInvalid(t, node, f.iptables, false)
	if v6 {
		// An error about a live flow of pod B's, sent by pod A to
		// another address (the client's): not the quote's source, so
		// about no flow of ours (as IPv4's errors, icmp_xlate.h). It
		// goes on as it came, neither passed up by its destination's
		// route nor translated at eth0's egress (and past the node's
		// conntrack, which takes it for INVALID: the DROP rule is gone).
		if err := strayICMP6Error(t, d, podA, podB, client, f, cipLocal); err != nil {
			t.Error(err)
		}
	}

	// The fallback: the node's route to the client leaves by alt0, which
	// has no tc. The error is translated at the ingress it meets first,
	// as before (its quote [C -> F] is no flow the node's conntrack saw:
	// INVALID).
	must(node.AddRoute(netip.PrefixFrom(f.client.Addr(), bits), f.clientAlt.Addr()))
	exchange("NodePort, route to the client by a device without tc", npLocal, false, "", refused(client, netip.AddrPort{}, npLocal, f.node.Addr()))
}

// icmpRelDial connects a UDP socket in ns to fe, from local if it is
// valid (SO_REUSEADDR: one port may connect to several peers), with
// IP_RECVERR (IPV6_RECVERR) on: its ICMP errors are queued, each with
// its offender, for icmpRelErrQueue.
func icmpRelDial(ns *topology.NS, network string, local netip.AddrPort, fe model.L4Addr) (net.Conn, error) {
	var c net.Conn
	err := ns.Do(func() error {
		d := net.Dialer{
			Timeout: 3 * time.Second,
			Control: func(_, _ string, rc syscall.RawConn) error {
				var serr error
				if err := rc.Control(func(fd uintptr) {
					if local.IsValid() {
						serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
					}
					if serr == nil && network == "udp6" {
						serr = unix.SetsockoptInt(int(fd), unix.SOL_IPV6, unix.IPV6_RECVERR, 1)
					} else if serr == nil {
						serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_RECVERR, 1)
					}
				}); err != nil {
					return err
				}
				return serr
			},
		}
		if local.IsValid() {
			d.LocalAddr = net.UDPAddrFromAddrPort(local)
		}
		var err error
		c, err = d.Dial(network, apOf(fe).String())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	return c, nil
}

// icmpRelErr is an ICMP error from a socket's error queue.
type icmpRelErr struct {
	errno     syscall.Errno
	origin    uint8
	offender  netip.Addr     // the error's outer source
	to        netip.AddrPort // the quoted datagram's destination
	typ, code uint8
	found     bool
}

// icmpRelErrQueue reads c's error queue (MSG_ERRQUEUE) until it is
// empty.
func icmpRelErrQueue(c net.Conn) ([]icmpRelErr, error) {
	rc, err := c.(*net.UDPConn).SyscallConn()
	if err != nil {
		return nil, err
	}
	var errs []icmpRelErr
	var rerr error
	if err := rc.Control(func(fd uintptr) {
		for {
			oob := make([]byte, 512)
			_, oobn, _, from, err := unix.Recvmsg(int(fd), make([]byte, 2048), oob, unix.MSG_ERRQUEUE|unix.MSG_DONTWAIT)
			if errors.Is(err, unix.EAGAIN) {
				return
			}
			if err != nil {
				rerr = fmt.Errorf("recvmsg MSG_ERRQUEUE: %w", err)
				return
			}
			msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
			if err != nil {
				rerr = err
				return
			}
			var e icmpRelErr
			switch a := from.(type) {
			case *unix.SockaddrInet4:
				e.to = netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port))
			case *unix.SockaddrInet6:
				e.to = netip.AddrPortFrom(netip.AddrFrom16(a.Addr), uint16(a.Port))
			}
			for _, m := range msgs {
				if (m.Header.Level != unix.SOL_IP || m.Header.Type != unix.IP_RECVERR) &&
					(m.Header.Level != unix.SOL_IPV6 || m.Header.Type != unix.IPV6_RECVERR) {
					continue
				}
				// struct sock_extended_err, then the offender's
				// sockaddr_in or sockaddr_in6 (SO_EE_OFFENDER).
				d := m.Data
				if len(d) < 16+8 {
					rerr = fmt.Errorf("short IP_RECVERR message: %d bytes", len(d))
					return
				}
				e.found = true
				e.errno = syscall.Errno(binary.NativeEndian.Uint32(d[0:4]))
				e.origin, e.typ, e.code = d[4], d[5], d[6]
				off := d[16:]
				switch binary.NativeEndian.Uint16(off[0:2]) {
				case unix.AF_INET:
					e.offender = netip.AddrFrom4([4]byte(off[4:8]))
				case unix.AF_INET6:
					if len(off) < 24 {
						rerr = fmt.Errorf("short offender: %d bytes", len(off))
						return
					}
					e.offender = netip.AddrFrom16([16]byte(off[8:24]))
				}
			}
			if e.found {
				errs = append(errs, e)
			}
		}
	}); err != nil {
		return nil, err
	}
	return errs, rerr
}

// checkErrQueue expects c's error queue to hold ICMP errors (at least
// one: a resent datagram may have had its own) carrying errno, each from
// offender and quoting a datagram to fe: the socket learnt its error from
// the address it must.
func checkErrQueue(c net.Conn, fe model.L4Addr, errno syscall.Errno, offender netip.Addr) error {
	errs, err := icmpRelErrQueue(c)
	if err != nil {
		return err
	}
	if len(errs) == 0 {
		return errors.New("no ICMP error in the socket's error queue")
	}
	for _, e := range errs {
		if e.origin != unix.SO_EE_ORIGIN_ICMP && e.origin != unix.SO_EE_ORIGIN_ICMP6 {
			return fmt.Errorf("error queue: %v from origin %d, want an ICMP error", e.errno, e.origin)
		}
		if e.errno != errno || e.offender.Unmap() != offender || e.to != apOf(fe) {
			return fmt.Errorf("error queue: %v (type %d code %d) from %s quoting a datagram to %s, want %v from %s quoting one to %s",
				e.errno, e.typ, e.code, e.offender, e.to, errno, offender, apOf(fe))
		}
	}
	return nil
}

// icmpRelExchange sends size bytes on c, a connected UDP socket, and
// returns the error its receive gets; a receive that times out sends
// again (a datagram may be lost while a neighbour is resolved), up to
// three times.
func icmpRelExchange(c net.Conn, size int, after func(net.Conn) error) error {
	msg := []byte(strings.Repeat("x", size))
	var rerr error
	for range 3 {
		if _, err := c.Write(msg); err != nil {
			rerr = err
		} else {
			if err := c.SetReadDeadline(time.Now().Add(2 * time.Second)); err != nil {
				return err
			}
			_, rerr = c.Read(make([]byte, 2048))
		}
		var nerr net.Error
		if !errors.As(rerr, &nerr) || !nerr.Timeout() {
			break
		}
	}
	if after != nil {
		if err := after(c); err != nil {
			return err
		}
	}
	return rerr
}

// udpRefused expects a datagram on c to fe answered by an ICMP port
// unreachable from offender: ECONNREFUSED on the connected socket.
func udpRefused(c net.Conn, fe model.L4Addr, offender netip.Addr) error {
	err := icmpRelExchange(c, 5, nil)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("receive: %v, want ECONNREFUSED (the backend's port unreachable)", err)
	}
	return checkErrQueue(c, fe, syscall.ECONNREFUSED, offender)
}

// udpTooBig expects a datagram of 1400 bytes on c to fe answered by a
// frag-needed (packet too big) from offender saying farMTU: EMSGSIZE on
// the connected socket, and the socket's path MTU farMTU.
func udpTooBig(c net.Conn, network string, fe model.L4Addr, offender netip.Addr) error {
	mtu := 0
	err := icmpRelExchange(c, 1400, func(c net.Conn) error {
		rc, err := c.(*net.UDPConn).SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		if err := rc.Control(func(fd uintptr) {
			if network == "udp6" {
				mtu, serr = unix.GetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_MTU)
			} else {
				mtu, serr = unix.GetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU)
			}
		}); err != nil {
			return err
		}
		return serr
	})
	if !errors.Is(err, syscall.EMSGSIZE) {
		return fmt.Errorf("receive: %v, want EMSGSIZE (the router's frag-needed)", err)
	}
	if mtu != farMTU {
		return fmt.Errorf("path MTU %d, want %d", mtu, farMTU)
	}
	return checkErrQueue(c, fe, syscall.EMSGSIZE, offender)
}

// strayICMP6Error opens a flow from pod B (port 40100) to fe, pod A's,
// then sends from pod A a port unreachable quoting that flow's datagram
// [B:40100 -> A:9] to the client's address instead of B's, and expects
// the client to receive it as it was sent (its quote still to A:9), with
// tc_rev_at_egress and tc_icmp_xlate unchanged.
func strayICMP6Error(t *testing.T, d *Datapath, podA, podB, client *topology.NS, f icmpRelFamily, fe model.L4Addr) error {
	t.Helper()
	const sport = 40100
	c, err := icmpRelDial(podB, f.udp, netip.AddrPortFrom(f.podB, sport), fe)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := udpRefused(c, fe, apOf(fe).Addr()); err != nil {
		return fmt.Errorf("the flow the stray error is about: %w", err)
	}
	var tx, rx net.PacketConn
	if err := podA.Do(func() (err error) {
		tx, err = net.ListenPacket("ip6:ipv6-icmp", f.podA.String())
		return err
	}); err != nil {
		return err
	}
	defer tx.Close()
	if err := client.Do(func() (err error) {
		rx, err = net.ListenPacket("ip6:ipv6-icmp", "::")
		return err
	}); err != nil {
		return err
	}
	defer rx.Close()
	// Type 1 code 4 (port unreachable), then the quote: an IPv6 header
	// and a UDP header. The kernel sums ICMPv6 for a raw socket.
	msg := make([]byte, 8+40+8)
	msg[0], msg[1] = 1, 4
	q := msg[8:]
	q[0] = 0x60
	binary.BigEndian.PutUint16(q[4:], 8+5)
	q[6], q[7] = unix.IPPROTO_UDP, 64
	copy(q[8:24], f.podB.AsSlice())
	copy(q[24:40], f.podA.AsSlice())
	binary.BigEndian.PutUint16(q[40:], sport)
	binary.BigEndian.PutUint16(q[42:], 9)
	binary.BigEndian.PutUint16(q[44:], 8+5)
	before := counters(t, d)
	var got []byte
	for range 3 {
		if _, err := tx.WriteTo(msg, &net.IPAddr{IP: f.client.Addr().AsSlice()}); err != nil {
			return fmt.Errorf("send the stray error: %w", err)
		}
		if err := rx.SetReadDeadline(time.Now().Add(2 * time.Second)); err != nil {
			return err
		}
		for got == nil {
			buf := make([]byte, 1500)
			n, _, err := rx.ReadFrom(buf)
			if err != nil {
				break
			}
			// Only this error: type 1 quoting UDP from B:40100.
			if n >= len(msg) && buf[0] == 1 && buf[8+6] == unix.IPPROTO_UDP &&
				netip.AddrFrom16([16]byte(buf[8+8:8+24])) == f.podB &&
				binary.BigEndian.Uint16(buf[8+40:]) == sport {
				got = buf[:n]
			}
		}
		if got != nil {
			break
		}
	}
	if got == nil {
		return errors.New("the client never received the stray error")
	}
	after := counters(t, d)
	qd := netip.AddrPortFrom(netip.AddrFrom16([16]byte(got[8+24:8+40])), binary.BigEndian.Uint16(got[8+42:]))
	if want := netip.AddrPortFrom(f.podA, 9); qd != want {
		return fmt.Errorf("the stray error reached the client quoting a datagram to %s, want %s (as sent: it is about no flow of ours)", qd, want)
	}
	for _, n := range []string{"tc_rev_at_egress", "tc_icmp_xlate"} {
		if after[n] != before[n] {
			return fmt.Errorf("the stray error: %s %d -> %d, want no change", n, before[n], after[n])
		}
	}
	return nil
}
