package datapath

import (
	"bytes"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil/packet"
	"github.com/sluice-lb/sluice/pkg/model"
)

// Fragments: only a datagram's first fragment carries its ports, so
// the programs remember them (sluice_fragments, keyed by source,
// destination, IP id and protocol; IPv6's by the fragment header's
// identification) and give every later fragment the
// translation of its first. The expected fragments are those of the
// translated datagram built from scratch: the L4 checksum, in the first
// fragment only, covers the whole datagram.

// fragFrames returns the Ethernet frames of p's fragments of size bytes.
func fragFrames(p packet.Packet, size int) [][]byte {
	var out [][]byte
	for _, f := range p.Fragments(size) {
		out = append(out, ether(f))
	}
	return out
}

// dgramOf returns a constructor of UDP datagrams carrying data, each with
// the IP id given.
func dgramOf(data []byte) func(id uint16, src string, sport uint16, dst string, dport uint16) packet.Packet {
	return func(id uint16, src string, sport uint16, dst string, dport uint16) packet.Packet {
		return udpPacket(src, sport, dst, dport, data).With(func(p *packet.Packet) { p.ID = id })
	}
}

func TestTCFragments(t *testing.T) {
	forFamilies(t, tcFragments)
}

// tcFragments is TestTCFragments over IPv4, or with v6 over IPv6 with
// the twins of its addresses (twinAddr), whose fragments carry a fragment
// header.
func tcFragments(t *testing.T, v6 bool) {
	d := newTestDatapath(t)
	m := d.Maps()
	vip := l4(twinAddr(v6, "10.96.0.40"), 53, model.UDP)
	be := testBackend{41, l4(twinAddr(v6, "10.1.4.1"), 5353, model.UDP)}
	empty := l4(twinAddr(v6, "10.96.0.41"), 53, model.UDP)
	addService(t, m, 1, vip, be)
	addService(t, m, 2, empty)

	client := twinAddr(v6, "10.0.0.1")
	dgram := dgramOf(bytes.Repeat([]byte("0123456789abcdef"), 190)) // 3040 bytes: 3 fragments
	vipS, beS := vip.Addr.String(), be.addr.Addr.String()

	// A request to the VIP, and the backend's reply.
	req := fragFrames(dgram(0x1111, client, 5300, vipS, 53), 1480)
	reqNAT := fragFrames(dgram(0x1111, client, 5300, beS, 5353), 1480)
	reply := fragFrames(dgram(0x2222, beS, 5353, client, 5300), 1480)
	replyNAT := fragFrames(dgram(0x2222, vipS, 53, client, 5300), 1480)
	if len(req) != 3 {
		t.Fatalf("%d fragments, want 3", len(req))
	}
	var steps []edgeStep
	for i := range req {
		steps = append(steps, edgeStep{name: fmt.Sprintf("request fragment %d", i), in: req[i], verdict: tcActOK, want: reqNAT[i]})
	}
	for i := range reply {
		steps = append(steps, edgeStep{name: fmt.Sprintf("reply fragment %d at egress", i), egress: true, in: reply[i], verdict: tcActOK, want: replyNAT[i]})
	}
	// The same reply seen at ingress (a backend on another node).
	for i := range reply {
		steps = append(steps, edgeStep{name: fmt.Sprintf("reply fragment %d at ingress", i), in: reply[i], verdict: tcActOK, want: replyNAT[i]})
	}

	// A later fragment that overtakes its first: nothing to go by, so it
	// passes untouched (and its datagram is lost, as the stack would time
	// its reassembly out); once the first has been seen, the rest follow it.
	late := fragFrames(dgram(0x3333, client, 5301, vipS, 53), 1480)
	lateNAT := fragFrames(dgram(0x3333, client, 5301, beS, 5353), 1480)
	steps = append(steps,
		edgeStep{name: "later fragment before its first", in: late[1], verdict: tcActOK},
		edgeStep{name: "then the first", in: late[0], verdict: tcActOK, want: lateNAT[0]},
		edgeStep{name: "then the later one again", in: late[1], verdict: tcActOK, want: lateNAT[1]},
		edgeStep{name: "and the last", in: late[2], verdict: tcActOK, want: lateNAT[2]},
	)

	// A datagram to no service, fragmented: every fragment untouched.
	for i, f := range fragFrames(dgram(0x4444, client, 5302, twinAddr(v6, "10.96.0.99"), 53), 1480) {
		steps = append(steps, edgeStep{name: fmt.Sprintf("no service, fragment %d", i), in: f, verdict: tcActOK})
	}
	runEdgeSteps(t, d, steps)

	// A service without backends refuses the first fragment with an ICMP
	// port unreachable; the later ones get none (RFC 1122 3.2.2: no ICMP
	// error about a non-first fragment) and are dropped.
	refused := fragFrames(dgram(0x5555, client, 5303, empty.Addr.String(), 53), 1480)
	if v, _ := runProg(t, d.TCIngress(), refused[0]); v != tcActRedirect {
		t.Errorf("first fragment to a service without backends: verdict %d, want an ICMP error (redirect)", v)
	}
	for i, f := range refused[1:] {
		if v, _ := runProg(t, d.TCIngress(), f); v != tcActShot {
			t.Errorf("later fragment %d to a service without backends: verdict %d, want drop", i+1, v)
		}
	}

	cs := counters(t, d)
	// Later fragments whose first was seen: 2 of the request, 2+2 of the
	// reply, 2 of the overtaken datagram, 2 to no service, 2 refused.
	if cs["tc_frag_later"] != 12 {
		t.Errorf("tc_frag_later = %d, want 12 (later fragments whose first was seen)", cs["tc_frag_later"])
	}
	if cs["tc_fragment"] != 1 {
		t.Errorf("tc_fragment = %d, want 1 (the later fragment that overtook its first)", cs["tc_fragment"])
	}
	if cs["tc_frag_drop"] != 2 {
		t.Errorf("tc_frag_drop = %d, want 2 (later fragments to a service without backends)", cs["tc_frag_drop"])
	}
}

// TestTCFragmentsNorthSouth: the fragments of a datagram to a NodePort
// with a remote backend are all DNATed and SNATed to the same port and
// redirected to the backend's node, and the fragments of its reply are all
// rewritten back and redirected to the client. Per family (the IPv6
// NodePort of nodeDatapath6).
func TestTCFragmentsNorthSouth(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		n := nsNodeOf(t, v6, smallConfig)
		ifindex, d, np, be := n.ifindex, n.d, n.npU, n.beU
		client, node, beS := nsTwin(v6, nsClientIP), nsTwin(v6, nsNodeIP), be.addr.Addr.String()
		ing := d.TCIngress()

		dgram := dgramOf(bytes.Repeat([]byte("fragmented nodeport "), 100)) // 2000 bytes
		const cport = 5400
		// Fragments that fit eth0's 1500 bytes: IPv6's carry a 40-byte
		// header and an 8-byte fragment header.
		size := 1480
		if v6 {
			size = 1448
		}
		in := dgram(0x6666, client, cport, node, np.Port).Fragments(size)
		verdict, out := runOn(t, ing, ifindex, frame(macOf(nodeEthMAC), clientMAC, in[0]))
		if verdict != tcActRedirect {
			t.Fatalf("first fragment: verdict %d, want redirect", verdict)
		}
		sp := snatPortFam(t, d, client, cport, np)
		fwd := dgram(0x6666, node, sp, beS, 5353).Fragments(size)
		for i, f := range fwd {
			f.TTL = fwdTTL
			if i > 0 {
				verdict, out = runOn(t, ing, ifindex, frame(macOf(nodeEthMAC), clientMAC, in[i]))
			}
			want := frame(macOf(node2MAC), macOf(nodeEthMAC), f)
			if verdict != tcActRedirect || !bytes.Equal(out, want) {
				t.Errorf("request fragment %d: verdict %d, output %s", i, verdict, packet.Diff(out, want))
			}
		}

		rep := dgram(0x7777, beS, 5353, node, sp).Fragments(size)
		back := dgram(0x7777, node, np.Port, client, cport).Fragments(size)
		for i := range rep {
			verdict, out := runOn(t, ing, ifindex, frame(macOf(nodeEthMAC), macOf(node2MAC), rep[i]))
			b := back[i]
			b.TTL = fwdTTL
			want := frame(clientMAC, macOf(nodeEthMAC), b)
			if verdict != tcActRedirect || !bytes.Equal(out, want) {
				t.Errorf("reply fragment %d: verdict %d, output %s", i, verdict, packet.Diff(out, want))
			}
		}
	})
}

// TestTCFragmentsEndToEnd sends a UDP datagram larger than the MTU through
// a ClusterIP and back, across veths with MTU 1500: the client's 4000
// bytes leave it in three fragments, which tc DNATs at the node's ingress;
// the backend's 4000-byte echo comes back in three fragments, which tc
// reverse-NATs at the node's egress. The client must get the whole echo,
// from the VIP. Per family: IPv6's fragments carry a fragment header.
func TestTCFragmentsEndToEnd(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		d, lb, plane := lbDatapathOf(t, v6)
		vip := l4(vipOf(v6, "10.96.0.50"), 53, model.UDP)
		be := netip.AddrPortFrom(plane.backends[0], 5353)
		addService(t, d.Maps(), 1, vip, testBackend{1, l4(be.Addr().String(), be.Port(), model.UDP)})
		if _, err := lb.Backends[0].ServeUDPEcho(be.String(), "be1"); err != nil {
			t.Fatal(err)
		}
		if err := lb.Node.Do(func() error { return d.AttachDevices([]string{lb.NodeDev}) }); err != nil {
			t.Fatal(err)
		}

		c := dialFrom(t, lb.Client, netOf("udp", vip.Addr), vip, 10*time.Second)
		msg := bytes.Repeat([]byte("0123456789"), 400) // 4000 bytes
		buf := make([]byte, 8192)
		for try := range 3 {
			if _, err := c.Write(msg); err != nil {
				t.Fatalf("write: %v", err)
			}
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			n, err := c.Read(buf)
			if err != nil {
				t.Fatalf("try %d: no echo of a 4000-byte datagram through %s: %v", try, vip, err)
			}
			if want := append([]byte("be1 "), msg...); !bytes.Equal(buf[:n], want) {
				t.Fatalf("try %d: echo of %d bytes, want %d: %.60q...", try, n, len(want), buf[:n])
			}
		}
		cs := counters(t, d)
		if cs["tc_frag_later"] < 3*4 {
			t.Errorf("tc_frag_later = %d, want at least 12 (2 later fragments each way, 3 times)", cs["tc_frag_later"])
		}
	})
}
