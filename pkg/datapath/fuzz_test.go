package datapath

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/packet"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// Fuzzing the tc and XDP programs through BPF_PROG_TEST_RUN: random and
// mutated frames, on a node namespace (nodeNetns) whose maps hold
// ClusterIP, NodePort, ExternalIP and LoadBalancer frontends programmed by
// reconciler.Apply. Whatever the frame, a program must
//
//   - run (BPF_PROG_TEST_RUN does not fail) and return a verdict its hook
//     defines (XDP_ABORTED is a program error);
//   - for a frame it lets through (tc OK or REDIRECT, XDP TX or REDIRECT):
//     leave it byte for byte as it came, or change only the fields NAT
//     and forwarding may change (natFields: MACs, TTL, addresses, ports,
//     checksums, and in an ICMP error those of the quoted packet), at the
//     length it came with; or turn it into the ICMP (ICMPv6) error tc
//     answers with (port unreachable, time exceeded, fragmentation
//     needed or packet too big: checkICMPReply), quoting the packet
//     (of any protocol: tc refuses them all to a ClusterIP);
//   - keep checksums valid: a frame whose checksums were valid comes out
//     with valid ones (packet.Verify);
//   - pass to tc untouched what XDP does not finish (XDP_PASS).
//
// The verifier already proves every access in bounds; these properties
// catch a rewrite in bounds of the packet but outside the field it means
// (a checksum update at a wrong offset, a port written into the payload of
// a packet with IP options, a fragment treated as a first one).
//
// FuzzTCIngress, FuzzTCEgress and FuzzXDP are the go test -fuzz targets;
// their seed corpus (fuzzSeeds, fuzzSeeds6) is valid TCP, UDP and ICMP
// (ICMPv6) packets to and from every kind of frontend, ICMP errors about
// translated flows, and fragments. TestFuzzPacketsRandomized runs the same
// checks on a fixed pseudo-random stream in plain go test, and
// TestFuzzPackets6Randomized on IPv6 frames (fuzzSeeds6).

// fuzzNode is the node namespace, a datapath on its devices, and the
// frontends the frames aim at.
type fuzzNode struct {
	ns      *topology.NS
	ifindex int // eth0's
	d       *Datapath
	// Outcomes by hook, for a test to show it exercised translation:
	// frames passed unchanged, translated, answered with an ICMP error.
	same, translated, replied [3]atomic.Int64
	// The kernel's choice of a reject's source, by destination and
	// client (rejectSrc).
	mu      sync.Mutex
	rejects map[[2]netip.Addr]netip.Addr
}

// rejectSrc is the source tc gives a port unreachable about a packet
// from client to dst (kernelRejectSrc, asked of the node's namespace
// once a pair: the frames come in on eth0).
func (n *fuzzNode) rejectSrc(dst, client netip.Addr) netip.Addr {
	n.mu.Lock()
	defer n.mu.Unlock()
	k := [2]netip.Addr{dst, client}
	if a, ok := n.rejects[k]; ok {
		return a
	}
	src := dst
	_ = n.ns.Do(func() error {
		src = kernelRejectSrc("eth0", dst, client)
		return nil
	})
	if n.rejects == nil {
		n.rejects = map[[2]netip.Addr]netip.Addr{}
	}
	n.rejects[k] = src
	return src
}

var (
	fzVIPTCP   = l4("10.96.0.10", 80, model.TCP)
	fzVIPUDP   = l4("10.96.0.11", 53, model.UDP)
	fzVIPEmpty = l4("10.96.0.12", 80, model.TCP)
	fzVIPEmptU = l4("10.96.0.12", 53, model.UDP)
	fzNPRemote = l4(nsNodeIP, 30080, model.TCP)
	fzNPLocal  = l4(nsNodeIP, 30081, model.TCP)
	fzNPUDP    = l4(nsNodeIP, 30053, model.UDP)
	fzExtLocal = l4("192.168.1.201", 80, model.TCP)
	fzLBRanges = l4("192.168.1.200", 80, model.TCP)
	fzLBEmpty  = l4("192.168.1.202", 80, model.TCP)
	fzNode3    = l4(nsNodeIP, 30083, model.TCP)

	fzLocalTCP  = l4("10.1.0.7", 8080, model.TCP) // pod0's range: local
	fzLocalUDP  = l4("10.1.0.8", 5353, model.UDP)
	fzRemoteTCP = l4("10.2.0.7", 8080, model.TCP) // behind node 2
	fzRemoteUDP = l4("10.2.0.8", 5353, model.UDP)
	fzNode3TCP  = l4("10.3.0.7", 8080, model.TCP) // behind node 3, eth1

	// IPv6 (fuzzFrontends6): NodePorts on eth0's IPv6 address to
	// backends behind node 2 (addNodeIPv6).
	fzNP6Remote  = l4(nsNodeIP6, 30080, model.TCP)
	fzNP6UDP     = l4(nsNodeIP6, 30053, model.UDP)
	fzRemote6TCP = l4("2001:db8:2::7", 8080, model.TCP)
	fzRemote6UDP = l4("2001:db8:2::8", 5353, model.UDP)
	// And NodePorts without endpoints, which tc answers with an ICMPv6
	// port unreachable.
	fzNP6Empty  = l4(nsNodeIP6, 30082, model.TCP)
	fzNP6EmptyU = l4(nsNodeIP6, 30054, model.UDP)
)

// fuzzFrontends6 are the IPv6 frontends of newFuzzNode (kept apart from
// fuzzFrontends, whose addresses mutate writes into IPv4 headers).
func fuzzFrontends6() []*model.Service {
	var out []*model.Service
	for _, c := range [][]model.L4Addr{{fzNP6Remote, fzRemote6TCP}, {fzNP6UDP, fzRemote6UDP}, {fzNP6Empty}, {fzNP6EmptyU}} {
		s := &model.Service{Name: model.ServicePortName{Namespace: "fuzz", Name: c[0].String()}, Kind: model.NodePort, Frontend: c[0]}
		for _, b := range c[1:] {
			s.Backends = append(s.Backends, model.Backend{L4Addr: b})
		}
		out = append(out, s)
	}
	return out
}

// fuzzFrontends are the frontends of newFuzzNode, with their backends.
func fuzzFrontends() []*model.Service {
	svc := func(kind model.FrontendKind, fe model.L4Addr, bes ...model.L4Addr) *model.Service {
		s := &model.Service{Name: model.ServicePortName{Namespace: "fuzz", Name: fe.String()}, Kind: kind, Frontend: fe}
		for _, b := range bes {
			s.Backends = append(s.Backends, model.Backend{L4Addr: b})
		}
		return s
	}
	local := svc(model.ExternalIP, fzExtLocal, fzRemoteTCP, fzLocalTCP)
	local.ExternalLocal = true
	ranges := svc(model.LoadBalancer, fzLBRanges, fzRemoteTCP)
	ranges.SourceRanges = []netip.Prefix{netip.MustParsePrefix("192.168.1.0/28"), netip.MustParsePrefix("172.16.0.0/12")}
	return []*model.Service{
		svc(model.ClusterIP, fzVIPTCP, fzLocalTCP, fzRemoteTCP),
		svc(model.ClusterIP, fzVIPUDP, fzLocalUDP, fzRemoteUDP),
		svc(model.ClusterIP, fzVIPEmpty),
		svc(model.ClusterIP, fzVIPEmptU),
		svc(model.NodePort, fzNPRemote, fzRemoteTCP),
		svc(model.NodePort, fzNPLocal, fzLocalTCP),
		svc(model.NodePort, fzNPUDP, fzRemoteUDP),
		svc(model.NodePort, fzNode3, fzNode3TCP),
		local,
		ranges,
		svc(model.LoadBalancer, fzLBEmpty),
	}
}

// newFuzzNode builds the node namespace (entering it for tb's goroutine),
// opens a datapath attached to eth0 and eth1 and programs fuzzFrontends
// through reconciler.Apply.
func newFuzzNode(tb testing.TB) *fuzzNode {
	tb.Helper()
	testutil.Privileged(tb)
	ns, ifindex := nodeNetns(tb)
	addNodeIPv6(tb)
	d := openTest(tb, xdpConfig(testPinDir(tb))) // (XDP is loaded only in an XDP mode)
	if err := d.AttachDevices([]string{"eth0", "eth1"}); err != nil {
		tb.Fatal(err)
	}
	st := model.NewState()
	for _, s := range append(fuzzFrontends(), fuzzFrontends6()...) {
		s.Backends = model.SortBackends(s.Backends)
		st.Services.Set(s.Frontend, s)
	}
	if err := reconciler.New(d.Maps(), nil).Apply(st); err != nil {
		tb.Fatalf("reconciler.Apply: %v", err)
	}
	return &fuzzNode{ns: ns, ifindex: ifindex, d: d}
}

// fuzzHook is a program under fuzz.
type fuzzHook int

const (
	hookTCIngress fuzzHook = iota
	hookTCEgress
	hookXDP
)

func (h fuzzHook) String() string { return [...]string{"tc ingress", "tc egress", "XDP"}[h] }

// run runs frame through hook on eth0, in the node namespace (from any
// goroutine: go test -fuzz runs each input on one of its own).
func (n *fuzzNode) run(h fuzzHook, frame []byte) (verdict uint32, out []byte, err error) {
	opts := ebpf.RunOptions{Data: append([]byte(nil), frame...), DataOut: make([]byte, len(frame)+256)}
	var prog *ebpf.Program
	switch h {
	case hookTCIngress:
		prog, opts.Context = n.d.TCIngress(), skbCtx{Ifindex: uint32(n.ifindex)}
	case hookTCEgress:
		prog, opts.Context = n.d.TCEgress(), skbCtx{Ifindex: uint32(n.ifindex)}
	case hookXDP:
		prog, opts.Context = n.d.XDP(), xdpCtx{DataEnd: uint32(len(frame)), IngressIfindex: uint32(n.ifindex)}
	}
	err = n.ns.Do(func() error {
		var rerr error
		verdict, rerr = prog.Run(&opts)
		return rerr
	})
	return verdict, opts.DataOut, err
}

// Frames BPF_PROG_TEST_RUN takes: an Ethernet header at least, and (XDP)
// what fits a page with its headroom.
const (
	fuzzMinFrame = 14
	fuzzMaxFrame = 1500
)

// skbRunnable reports whether BPF_PROG_TEST_RUN takes frame for a tc
// program: it refuses (EINVAL) an IPv4 frame too short for an IPv4 header,
// or an IPv6 one for an IPv6 header, before the program runs. (Such frames
// do reach tc on a real device; the stack drops them after it.)
func skbRunnable(frame []byte) bool {
	switch binary.BigEndian.Uint16(frame[12:]) {
	case packet.EtherTypeIPv4:
		return len(frame) >= 14+20
	case packet.EtherTypeIPv6:
		return len(frame) >= 14+40
	}
	return true
}

// check runs frame through hooks (all of them if none is given) and
// returns what went wrong, if anything (see the file comment).
func (n *fuzzNode) check(frame []byte, hooks ...fuzzHook) error {
	if len(frame) < fuzzMinFrame || len(frame) > fuzzMaxFrame {
		return nil
	}
	if len(hooks) == 0 {
		hooks = []fuzzHook{hookTCIngress, hookTCEgress, hookXDP}
	}
	var errs []error
	for _, h := range hooks {
		if h != hookXDP && !skbRunnable(frame) {
			continue
		}
		verdict, out, err := n.run(h, frame)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: BPF_PROG_TEST_RUN: %w", h, err))
			continue
		}
		if err := checkOutput(h, frame, verdict, out, n.rejectSrc); err != nil {
			errs = append(errs, fmt.Errorf("%s: verdict %d: %w\n in %x\nout %x", h, verdict, err, frame, out))
			continue
		}
		switch {
		case bytes.Equal(frame, out):
			n.same[h].Add(1)
		case h != hookXDP && isICMPReply(frame, out):
			n.replied[h].Add(1)
		default:
			n.translated[h].Add(1)
		}
	}
	return errors.Join(errs...)
}

// checkOutput checks what hook h made of in; rejectSrc, if not nil, says
// where a reject's ICMP error comes from (fuzzNode.rejectSrc; nil: the
// packet's destination).
func checkOutput(h fuzzHook, in []byte, verdict uint32, out []byte, rejectSrc func(dst, client netip.Addr) netip.Addr) error {
	switch h {
	case hookXDP:
		switch verdict {
		case xdpDrop:
			return nil
		case xdpPass:
			if !bytes.Equal(in, out) {
				return fmt.Errorf("XDP_PASS of a changed frame: %s", packet.Diff(out, in))
			}
			return nil
		case xdpTx, xdpRedirect:
		default:
			return errors.New("not a verdict the XDP program returns (XDP_ABORTED is a program error)")
		}
	default:
		switch verdict {
		case tcActShot:
			return nil // dropped: it may be half rewritten
		case tcActOK, tcActRedirect:
		default:
			return errors.New("not a verdict the tc programs return")
		}
	}
	if bytes.Equal(in, out) {
		return nil
	}
	if h != hookXDP && isICMPReply(in, out) {
		return checkICMPReply(in, out, rejectSrc)
	}
	if len(out) != len(in) {
		return fmt.Errorf("length %d, came with %d", len(out), len(in))
	}
	allowed := natFields(in)
	for i := range in {
		if in[i] != out[i] && !allowed[i] {
			return fmt.Errorf("byte %d changed (%#02x -> %#02x), not a NAT field: %s", i, in[i], out[i], packet.Diff(out, in))
		}
	}
	if packet.Verify(in) == nil {
		if err := packet.Verify(out); err != nil {
			return fmt.Errorf("checksums valid in, invalid out: %w", err)
		}
	}
	return nil
}

const xdpRedirect = 4

// ipv4Of returns the IPv4 header of an Ethernet frame and the offset of
// what follows it, if the frame is IPv4 with a header that fits.
func ipv4Of(frame []byte) (ip []byte, l4off int, ok bool) {
	if len(frame) < 14+20 || binary.BigEndian.Uint16(frame[12:]) != packet.EtherTypeIPv4 {
		return nil, 0, false
	}
	ihl := int(frame[14]&0xf) * 4
	if ihl < 20 || 14+ihl > len(frame) {
		return nil, 0, false
	}
	return frame[14 : 14+ihl], 14 + ihl, true
}

// ipv6Of returns the fixed IPv6 header of an Ethernet frame, if the frame
// is IPv6 with a whole one.
func ipv6Of(frame []byte) (ip []byte, ok bool) {
	if len(frame) < 14+40 || binary.BigEndian.Uint16(frame[12:]) != packet.EtherTypeIPv6 {
		return nil, false
	}
	return frame[14 : 14+40], true
}

// natFields marks the bytes of in that NAT and forwarding may change: the
// MACs; the IPv4 TTL, checksum and addresses; unless in is a later
// fragment, the TCP or UDP ports and checksum, or an ICMP checksum; and in
// an ICMP error, the quoted packet's checksum, addresses, ports and L4
// checksum.
func natFields(in []byte) []bool {
	allow := make([]bool, len(in))
	mark := func(from, n int) {
		for i := from; i < from+n && i < len(in); i++ {
			if i >= 0 {
				allow[i] = true
			}
		}
	}
	mark(0, 12)
	markL4 := func(proto uint8, off int) {
		switch proto {
		case packet.TCP:
			mark(off, 4)
			mark(off+16, 2)
		case packet.UDP:
			mark(off, 4)
			mark(off+6, 2)
		}
	}
	if _, ok := ipv6Of(in); ok {
		// The hop limit and addresses; unless a later fragment, the
		// ports and checksum of TCP or UDP after the extension
		// headers, or an ICMPv6 checksum, and in an error the quoted
		// packet's addresses, ports and L4 checksum (icmp6_xlate.h).
		mark(14+7, 1)
		mark(14+8, 32)
		proto, l4, later, ok := ipv6L4(in[14:])
		if later || !ok {
			return allow
		}
		l4 += 14
		switch proto {
		case packet.TCP, packet.UDP:
			markL4(proto, l4)
		case packet.ICMPv6:
			mark(l4+2, 2)
			q := l4 + 8
			if l4 >= len(in) || in[l4] < 1 || in[l4] > 4 || q+40 > len(in) {
				break
			}
			mark(q+8, 32)
			if qproto, ql4, qlater, ok := ipv6L4(in[q:]); ok && !qlater {
				markL4(qproto, q+ql4)
			}
		}
		return allow
	}
	ip, l4, ok := ipv4Of(in)
	if !ok {
		return allow
	}
	mark(14+8, 1)  // TTL
	mark(14+10, 2) // checksum
	mark(14+12, 8) // addresses
	if binary.BigEndian.Uint16(ip[6:])&0x1fff != 0 {
		return allow // a later fragment: no L4 header
	}
	switch ip[9] {
	case packet.TCP, packet.UDP:
		markL4(ip[9], l4)
	case packet.ICMP:
		mark(l4+2, 2)
		q := l4 + 8 // the quoted packet of an error
		if l4 >= len(in) || !isICMPError(in[l4]) || q+20 > len(in) {
			break
		}
		mark(q+10, 2)
		mark(q+12, 8)
		if qihl := int(in[q]&0xf) * 4; qihl >= 20 {
			markL4(in[q+9], q+qihl)
		}
	}
	return allow
}

func isICMPError(typ uint8) bool {
	switch typ {
	case 3, 4, 5, 11, 12: // unreachable, source quench, redirect, time exceeded, parameter problem
		return true
	}
	return false
}

// ipv6L4 walks the extension headers of b, an IPv6 packet from its fixed
// header on (hop-by-hop and destination options, routing, fragment), and
// returns its upper-layer protocol, the offset in b of that header, and
// whether b is a later fragment (no upper-layer header); ok is false if
// the headers do not fit in b.
func ipv6L4(b []byte) (proto uint8, off int, later, ok bool) {
	if len(b) < 40 || b[0]>>4 != 6 {
		return 0, 0, false, false
	}
	proto, off = b[6], 40
	for range 8 {
		switch proto {
		case packet.HopByHop, packet.Routing, packet.DestOpts:
			if off+2 > len(b) {
				return 0, 0, false, false
			}
			proto, off = b[off], off+(int(b[off+1])+1)*8
		case packet.FragmentExt:
			if off+8 > len(b) {
				return 0, 0, false, false
			}
			later = binary.BigEndian.Uint16(b[off+2:])&0xfff8 != 0
			proto, off = b[off], off+8
		default:
			return proto, off, later, off <= len(b)
		}
	}
	return proto, off, later, off <= len(b)
}

// ipOf returns the source and destination addresses of an IPv4 or IPv6
// frame, its upper-layer protocol and the frame offset of that header
// (after IPv4 options or IPv6 extension headers), if the headers fit and
// it is no later fragment.
func ipOf(frame []byte) (src, dst []byte, proto uint8, l4 int, ok bool) {
	src, dst, proto, l4, later, ok := ipHeaders(frame)
	return src, dst, proto, l4, ok && !later
}

// quotedOf is ipOf for a packet tc may answer with an ICMP error, a later
// fragment too (a router answers one whose hop limit runs out): its
// protocol is then its first fragment's and l4 where its payload starts,
// what the error quotes as that protocol's header.
func quotedOf(frame []byte) (src, dst []byte, proto uint8, l4 int, ok bool) {
	src, dst, proto, l4, _, ok = ipHeaders(frame)
	return src, dst, proto, l4, ok
}

// ipHeaders is ipOf and whether the frame is a later fragment.
func ipHeaders(frame []byte) (src, dst []byte, proto uint8, l4 int, later, ok bool) {
	if ip, l4, ok := ipv4Of(frame); ok {
		return ip[12:16], ip[16:20], ip[9], l4, binary.BigEndian.Uint16(ip[6:])&0x1fff != 0, true
	}
	if ip6, ok := ipv6Of(frame); ok {
		proto, off, later, ok := ipv6L4(frame[14:])
		return ip6[8:24], ip6[24:40], proto, 14 + off, later, ok
	}
	return nil, nil, 0, 0, false, false
}

// isICMPReply reports whether out is an ICMP (ICMPv6) error tc made from
// in (a packet of the same family, or a later fragment of one: TCP, UDP,
// another protocol, an ICMP query, which tc refuses to a ClusterIP)
// rather than in translated (an ICMP error, translated back).
func isICMPReply(in, out []byte) bool {
	srcIn, _, pIn, l4In, ok1 := quotedOf(in)
	srcOut, _, pOut, _, ok2 := ipOf(out)
	icmp := map[int]uint8{4: packet.ICMP, 16: packet.ICMPv6}[len(srcIn)]
	if !ok1 || !ok2 || len(srcIn) != len(srcOut) || pOut != icmp {
		return false
	}
	if pIn != icmp {
		return true
	}
	// An ICMP query (parse.h's icmp_opens) is answered; an error is
	// translated.
	queries := map[uint8][]uint8{packet.ICMP: {8, 13, 15, 17}, packet.ICMPv6: {128, 139}}[icmp]
	return l4In < len(in) && slices.Contains(queries, in[l4In])
}

// checkICMPReply checks out is the ICMP error about in that icmp_reply
// (icmp6_reply for IPv6) builds: MACs swapped, from in's destination
// (a reject: from rejectSrc's answer) to its source, with valid checksums, quoting in's IP header (IPv6: and its
// extension headers) and whole fixed L4 header: a destination unreachable
// or time exceeded, or IPv6's packet too big (IPv4's is an unreachable).
func checkICMPReply(in, out []byte, rejectSrc func(dst, client netip.Addr) netip.Addr) error {
	srcIn, dstIn, pIn, l4In, _ := quotedOf(in)
	srcOut, dstOut, _, l4Out, _ := ipOf(out)
	if !bytes.Equal(out[0:6], in[6:12]) || !bytes.Equal(out[6:12], in[0:6]) {
		return errors.New("ICMP reply: MACs not swapped")
	}
	if !bytes.Equal(dstOut, srcIn) {
		return errors.New("ICMP reply: not to the packet's source")
	}
	v6 := len(srcIn) == 16
	if l4Out != 14+ipHdrLen(v6) || l4Out+8 > len(out) {
		return fmt.Errorf("ICMP reply: headers of %d bytes in %d", l4Out-14, len(out))
	}
	// From the packet's destination; a reject (port unreachable) from
	// where the kernel's would come (icmp_reject_src): rejectSrc's.
	src, _ := netip.AddrFromSlice(srcOut)
	wantSrc, _ := netip.AddrFromSlice(dstIn)
	reject := !v6 && out[l4Out] == 3 && out[l4Out+1] == 3 ||
		v6 && out[l4Out] == packet.ICMPv6Unreachable && out[l4Out+1] == 4
	if client, _ := netip.AddrFromSlice(srcIn); reject && rejectSrc != nil {
		wantSrc = rejectSrc(wantSrc, client)
	}
	if src != wantSrc {
		return fmt.Errorf("ICMP reply: from %v, want %v (reject %v)", src, wantSrc, reject)
	}
	types := []uint8{3, 11}
	if v6 {
		types = []uint8{packet.ICMPv6Unreachable, packet.ICMPv6PacketTooBig, packet.ICMPv6TimeExceeded}
	}
	if t := out[l4Out]; !slices.Contains(types, t) {
		return fmt.Errorf("ICMP reply of type %d", t)
	}
	hdr := 8 // a UDP header, or 8 bytes of another protocol's
	if pIn == packet.TCP {
		hdr = 20
	}
	want := in[14:min(l4In+hdr, len(in))]
	if got := out[l4Out+8:]; !bytes.Equal(got, want) {
		return fmt.Errorf("ICMP reply quotes %x, want %x", got, want)
	}
	if err := packet.Verify(out); err != nil {
		return fmt.Errorf("ICMP reply: %w", err)
	}
	return nil
}

// fixChecksums returns a copy of frame with its IPv4 header checksum and,
// unless it is a later fragment, its TCP, UDP (unless 0: none) or ICMP
// checksum computed over what it holds, so that a mutated header still
// makes a frame with valid checksums.
func fixChecksums(frame []byte) []byte {
	f := bytes.Clone(frame)
	if ip6, ok := ipv6Of(f); ok {
		// TCP or UDP right after the fixed header, over the payload
		// length.
		end := 14 + 40 + int(binary.BigEndian.Uint16(ip6[4:]))
		off := map[uint8]int{packet.TCP: 16, packet.UDP: 6}[ip6[6]]
		if off == 0 || end > len(f) || end < 14+40+off+2 {
			return f
		}
		seg := f[14+40 : end]
		binary.BigEndian.PutUint16(seg[off:], 0)
		binary.BigEndian.PutUint16(seg[off:], packet.L4Checksum6(ip6[8:24], ip6[24:40], ip6[6], seg))
		return f
	}
	ip, l4, ok := ipv4Of(f)
	if !ok {
		return f
	}
	end := 14 + int(binary.BigEndian.Uint16(ip[2:]))
	if end < l4 || end > len(f) {
		return f
	}
	binary.BigEndian.PutUint16(ip[10:], 0)
	binary.BigEndian.PutUint16(ip[10:], packet.Checksum(ip))
	if binary.BigEndian.Uint16(ip[6:])&0x1fff != 0 {
		return f
	}
	seg := f[l4:end]
	var off int
	switch ip[9] {
	case packet.TCP:
		off = 16
	case packet.UDP:
		off = 6
	case packet.ICMP:
		off = 2
	default:
		return f
	}
	if len(seg) < off+2 || ip[9] == packet.UDP && binary.BigEndian.Uint16(seg[6:]) == 0 {
		return f
	}
	binary.BigEndian.PutUint16(seg[off:], packet.L4Checksum4(ip[12:16], ip[16:20], ip[9], seg))
	return f
}

// fuzzSeeds are valid frames to and from every kind of frontend and
// backend of newFuzzNode, in both directions: new flows and their
// replies, ICMP echoes and errors about translated flows, fragments,
// frames with IP options, and frames that are not IPv4.
func fuzzSeeds() [][]byte {
	eth := macOf(nodeEthMAC)
	fr := func(p packet.Packet) []byte { return frame(eth, clientMAC, p) }
	tcp := func(src string, sport uint16, dst model.L4Addr, flags uint8) []byte {
		p := tcpPacket(src, sport, dst.Addr.String(), dst.Port, flags, []byte("GET / HTTP/1.0\r\n\r\n"))
		p.FragOff = packet.DF
		return fr(p)
	}
	udp := func(src string, sport uint16, dst model.L4Addr) []byte {
		return fr(udpPacket(src, sport, dst.Addr.String(), dst.Port, []byte("query")))
	}
	var seeds [][]byte
	const pod = "10.1.0.50"
	for _, fe := range []model.L4Addr{fzVIPTCP, fzVIPEmpty, fzNPRemote, fzNPLocal, fzExtLocal, fzLBRanges, fzLBEmpty, fzNode3} {
		for _, flags := range []uint8{0x02, 0x10, 0x18, 0x11, 0x04} { // SYN, ACK, PSH|ACK, FIN|ACK, RST
			seeds = append(seeds, tcp(nsClientIP, 40000, fe, flags), tcp(pod, 40001, fe, flags))
		}
		seeds = append(seeds, tcp("172.16.0.9", 40002, fe, 0x02)) // a far client
	}
	for _, fe := range []model.L4Addr{fzVIPUDP, fzVIPEmptU, fzNPUDP} {
		seeds = append(seeds, udp(nsClientIP, 40003, fe), udp(pod, 40004, fe))
	}
	// Replies of the backends, to the clients and to the node's SNAT
	// ports.
	for _, be := range []model.L4Addr{fzLocalTCP, fzRemoteTCP, fzNode3TCP} {
		for _, to := range []string{nsClientIP, pod, nsNodeIP} {
			seeds = append(seeds, fr(tcpPacket(be.Addr.String(), be.Port, to, 40000, 0x12, nil)))
		}
	}
	for _, be := range []model.L4Addr{fzLocalUDP, fzRemoteUDP} {
		seeds = append(seeds, fr(udpPacket(be.Addr.String(), be.Port, pod, 40004, []byte("answer"))))
	}
	// ICMP: an echo to a VIP, errors about a translated flow (from the
	// backend, from a router) and about a reply.
	seeds = append(seeds, fr(icmpErr(pod, fzVIPTCP.Addr.String(), 8, 0, 0x12340001, []byte("ping"))))
	req := tcpPacket(pod, 40001, fzLocalTCP.Addr.String(), fzLocalTCP.Port, 0x02, nil).L3()
	reqU := udpPacket(pod, 40004, fzLocalUDP.Addr.String(), fzLocalUDP.Port, []byte("q")).L3()
	for _, q := range [][]byte{req, reqU, req[:28]} {
		seeds = append(seeds,
			fr(icmpErr(fzLocalTCP.Addr.String(), pod, 3, 3, 0, q)),
			fr(icmpErr("10.1.0.1", pod, 3, 4, 1400, q)),
			fr(icmpErr("10.1.0.1", pod, 11, 0, 0, q)))
	}
	reply := tcpPacket(fzVIPTCP.Addr.String(), 80, pod, 40001, 0x12, nil)
	seeds = append(seeds, fr(icmpErr(pod, fzVIPTCP.Addr.String(), 3, 3, 0, reply.L3())))
	// Fragments of a large UDP datagram to a VIP and to a NodePort.
	for _, fe := range []model.L4Addr{fzVIPUDP, fzNPUDP} {
		big := udpPacket(pod, 40005, fe.Addr.String(), fe.Port, bytes.Repeat([]byte("x"), 2000))
		big.ID = 0x4242
		for _, f := range big.Fragments(1000) {
			seeds = append(seeds, fr(f))
		}
	}
	// IP options, a TTL about to expire, BIG TCP's zero total length.
	opts := tcpPacket(pod, 40006, fzVIPTCP.Addr.String(), 80, 0x02, nil)
	opts.IPOptions = []byte{1, 1, 1, 0}
	ttl1 := tcpPacket(nsClientIP, 40007, nsNodeIP, fzNPRemote.Port, 0x02, nil)
	ttl1.TTL = 1
	zero := tcpPacket(pod, 40008, fzVIPTCP.Addr.String(), 80, 0x10, []byte("data"))
	zero.ZeroTotalLen = true
	seeds = append(seeds, fr(opts), fr(ttl1), fr(zero))
	// Not IPv4: ARP, IPv6.
	seeds = append(seeds,
		packet.Packet{DstMAC: eth, SrcMAC: clientMAC, EtherType: packet.EtherTypeARP, Payload: make([]byte, 28)}.Bytes(),
		packet.Packet{DstMAC: eth, SrcMAC: clientMAC, EtherType: packet.EtherTypeIPv6, Payload: make([]byte, 60)}.Bytes())
	return seeds
}

// fuzzSeeds6 are valid IPv6 frames (fuzzFrontends6): new flows and later
// packets to the IPv6 NodePorts, their backends' answers to the node,
// frames XDP leaves to tc (an extension header, a fragment, a hop limit of
// 1, ICMPv6), new flows to the NodePorts without endpoints (tc answers an
// ICMPv6 port unreachable) and ICMPv6 errors about a flow to a backend.
func fuzzSeeds6() [][]byte {
	var seeds [][]byte
	for i, c := range []struct {
		fe model.L4Addr
		be testBackend
	}{{fzNP6Remote, testBackend{addr: fzRemote6TCP}}, {fzNP6UDP, testBackend{addr: fzRemote6UDP}}} {
		for j, flags := range []uint8{0x02, 0x10, 0x18, 0x11, 0x04} { // SYN, ACK, PSH|ACK, FIN|ACK, RST
			in := nsClient(uint16(40010+i), c.fe).With(func(p *packet.Packet) { p.TCPFlags = flags })
			seeds = append(seeds, in.Bytes(), replyFrom(c.be, uint16(61000+j), flags|0x10).Bytes())
		}
		for _, ext := range []packet.ExtHeader{packet.HopByHopHeader([]byte{5, 2, 0, 0}), packet.FragmentHeader(0, true, 9)} {
			seeds = append(seeds, nsClient(40012, c.fe).With(func(p *packet.Packet) { p.IPv6.Ext = []packet.ExtHeader{ext} }).Bytes())
		}
		seeds = append(seeds, nsClient(40013, c.fe).With(func(p *packet.Packet) { p.TTL = 1 }).Bytes())
	}
	for _, fe := range []model.L4Addr{fzNP6Empty, fzNP6EmptyU} {
		seeds = append(seeds, nsClient(40014, fe).Bytes())
	}
	q := replyFrom(testBackend{addr: fzRemote6TCP}, 61000, 0x12).With(func(p *packet.Packet) { p.Src, p.Dst = p.Dst, p.Src }).L3()
	for _, k := range []icmpKind{icmpPortUnreach, icmpTooBig, icmpTimeExceeded} {
		seeds = append(seeds, frame(macOf(nodeEthMAC), macOf(node2MAC), icmpMsg("2001:db8:2::1", nsNodeIP6, k, 1280, q[:40+20])))
	}
	echo := nsClient(0, fzNP6Remote).With(func(p *packet.Packet) { p.Proto, p.ICMPType = packet.ICMPv6, 128 })
	return append(seeds, echo.Bytes())
}

// fuzzTarget runs one fuzz target's inputs through hook h: the frame as
// it is, or with its checksums fixed (fix), so that mutated headers also
// come with valid checksums and the checksum property applies to them.
// Conntrack and the other maps persist across the inputs of a worker: a
// flow one input starts, a later one may continue.
func fuzzTarget(f *testing.F, h fuzzHook) {
	n := newFuzzNode(f)
	for _, s := range append(fuzzSeeds(), fuzzSeeds6()...) {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, frame []byte, fix bool) {
		if fix {
			frame = fixChecksums(frame)
		}
		if err := n.check(frame, h); err != nil {
			t.Fatal(err)
		}
	})
}

func FuzzTCIngress(f *testing.F) { fuzzTarget(f, hookTCIngress) }
func FuzzTCEgress(f *testing.F)  { fuzzTarget(f, hookTCEgress) }
func FuzzXDP(f *testing.F)       { fuzzTarget(f, hookXDP) }

// mutate returns a mutation of frame: bits flipped, bytes set to edge
// values, header fields set at random, truncated or extended.
func mutate(rng *rand.Rand, frame []byte) []byte {
	f := bytes.Clone(frame)
	for range 1 + rng.IntN(4) {
		if len(f) == 0 {
			break
		}
		switch rng.IntN(8) {
		case 0:
			i := rng.IntN(len(f))
			f[i] ^= 1 << rng.IntN(8)
		case 1:
			f[rng.IntN(len(f))] = []byte{0, 0xff, 0x7f, 0x80, 1}[rng.IntN(5)]
		case 2: // an IPv4 header field: ihl, total length, flags/offset, protocol
			if len(f) >= 34 {
				switch rng.IntN(4) {
				case 0:
					f[14] = 0x40 | byte(rng.IntN(16))
				case 1:
					binary.BigEndian.PutUint16(f[16:], uint16(rng.IntN(len(f)+64)))
				case 2:
					binary.BigEndian.PutUint16(f[20:], uint16(rng.Uint32()))
				case 3:
					f[23] = []byte{1, 6, 17, 0, 255}[rng.IntN(5)]
				}
			}
		case 3: // a TCP data offset or flags, a UDP length
			if len(f) >= 54 {
				f[14+20+12+rng.IntN(2)] = byte(rng.Uint32())
			}
		case 4:
			f = f[:rng.IntN(len(f)+1)]
		case 5:
			f = append(f, make([]byte, rng.IntN(64))...)
		case 6: // an address or port of a frontend or backend
			if len(f) >= 38 {
				fe := fuzzFrontends()[rng.IntN(len(fuzzFrontends()))].Frontend
				a := fe.Addr.As4()
				copy(f[30:34], a[:])
				binary.BigEndian.PutUint16(f[36:], fe.Port)
			}
		case 7:
			i := rng.IntN(len(f))
			f[i] = byte(rng.Uint32())
		}
	}
	return f
}

// TestFuzzPacketsRandomized runs the fuzz checks on a fixed pseudo-random
// stream of seeds, mutated seeds and random bytes, in plain go test.
func TestFuzzPacketsRandomized(t *testing.T) {
	n := newFuzzNode(t)
	seeds := fuzzSeeds()
	for _, s := range seeds {
		if err := n.check(s); err != nil {
			t.Errorf("seed: %v", err)
		}
	}
	rng := rand.New(rand.NewPCG(11, 2026))
	const rounds = 3000
	for i := range rounds {
		var f []byte
		switch i % 4 {
		case 0, 1:
			f = mutate(rng, seeds[rng.IntN(len(seeds))])
		case 2:
			f = fixChecksums(mutate(rng, seeds[rng.IntN(len(seeds))]))
		case 3:
			f = make([]byte, fuzzMinFrame+rng.IntN(200))
			for j := range f {
				f[j] = byte(rng.Uint32())
			}
			if rng.IntN(2) == 0 { // mostly IPv4, to get past the EtherType
				binary.BigEndian.PutUint16(f[12:], packet.EtherTypeIPv4)
				if len(f) > 14 {
					f[14] = 0x45
				}
			}
		}
		if err := n.check(f); err != nil {
			t.Errorf("round %d: %v", i, err)
		}
	}
	n.expectExercised(t)
}

// expectExercised logs what each hook made of a randomized stream and
// fails t unless tc ingress and XDP each translated some frames and left
// some alone, and tc ingress answered some with an ICMP (ICMPv6) error.
func (n *fuzzNode) expectExercised(t *testing.T) {
	t.Helper()
	for h := range fuzzHook(3) {
		t.Logf("%s: %d unchanged, %d translated, %d answered with an ICMP error", h,
			n.same[h].Load(), n.translated[h].Load(), n.replied[h].Load())
		if h != hookTCEgress && (n.translated[h].Load() == 0 || n.same[h].Load() == 0) {
			t.Errorf("%s: the stream translated no frame, or left none alone: it tests nothing", h)
		}
	}
	if n.replied[hookTCIngress].Load() == 0 {
		t.Error("tc ingress answered no frame with an ICMP error: the stream misses that path")
	}
}

// TestFuzzPackets6Randomized runs the fuzz checks on the IPv6 paths of
// tc and XDP: fuzzSeeds6, then a fixed pseudo-random stream of their
// mutations (half with their checksums fixed), through every hook; the
// ICMPv6 errors tc answers with are checked as IPv4's are
// (checkICMPReply).
func TestFuzzPackets6Randomized(t *testing.T) {
	n := newFuzzNode(t)
	seeds := fuzzSeeds6()
	rng := rand.New(rand.NewPCG(6, 2026))
	for i := range 2000 {
		f := seeds[i%len(seeds)]
		if i >= len(seeds) {
			f = mutate(rng, seeds[rng.IntN(len(seeds))])
			if i%2 == 0 {
				f = fixChecksums(f)
			}
		}
		if err := n.check(f); err != nil {
			t.Errorf("frame %d: %v", i, err)
		}
	}
	n.expectExercised(t)
}

// The checks are not vacuous: they reject what a wrong rewrite makes, of
// either family, and an ICMP (ICMPv6) error quoting other bytes.
func TestFuzzChecksCatchBadRewrites(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		client, vip, be := twinAddr(v6, "10.1.0.50"), twinAddr(v6, fzVIPTCP.Addr.String()), twinAddr(v6, fzLocalTCP.Addr.String())
		in := ether(tcpPacket(client, 40000, vip, 80, 0x02, []byte("payload")))
		dnat := ether(tcpPacket(client, 40000, be, 8080, 0x02, []byte("payload")))
		if err := checkOutput(hookTCIngress, in, tcActOK, dnat, nil); err != nil {
			t.Errorf("a correct DNAT rejected: %v", err)
		}
		payload := bytes.Clone(dnat)
		payload[len(payload)-1] ^= 1
		stale := bytes.Clone(in)
		dst := [2]int{30, 34} // the destination address
		if v6 {
			dst = [2]int{38, 54}
		}
		copy(stale[dst[0]:dst[1]], dnat[dst[0]:dst[1]]) // destination rewritten, checksums not
		for _, c := range []struct {
			name    string
			h       fuzzHook
			verdict uint32
			out     []byte
		}{
			{"payload changed", hookTCIngress, tcActOK, payload},
			{"checksums left stale", hookTCIngress, tcActOK, stale},
			{"length changed", hookTCEgress, tcActOK, dnat[:len(dnat)-1]},
			{"XDP_PASS of a changed frame", hookXDP, xdpPass, dnat},
			{"XDP_ABORTED", hookXDP, 0, in},
			{"unknown tc verdict", hookTCIngress, 1, in},
		} {
			if err := checkOutput(c.h, in, c.verdict, c.out, nil); err == nil {
				t.Errorf("%s: accepted", c.name)
			}
		}
		reply := frame(clientMAC, nodeMAC, icmpMsg(vip, client, icmpPortUnreach, 0, in[14:14+ipHdrLen(v6)+20]))
		badQuote := bytes.Clone(reply)
		badQuote[len(badQuote)-1] ^= 1
		if err := checkOutput(hookTCIngress, in, tcActRedirect, badQuote, nil); err == nil {
			t.Errorf("ICMP reply quoting other bytes: accepted")
		}
		if err := checkOutput(hookTCIngress, in, tcActRedirect, reply, nil); err != nil {
			t.Errorf("a correct ICMP reply rejected: %v", err)
		}
		// Where the kernel's reject comes from the node (rejectSrc),
		// one from the VIP is caught, one from the node is not.
		node := twinAddr(v6, nsNodeIP)
		fromNode := func(dst, client netip.Addr) netip.Addr { return netip.MustParseAddr(node) }
		if err := checkOutput(hookTCIngress, in, tcActRedirect, reply, fromNode); err == nil {
			t.Errorf("a reject from the VIP where the kernel's comes from the node: accepted")
		}
		nodeReply := frame(clientMAC, nodeMAC, icmpMsg(node, client, icmpPortUnreach, 0, in[14:14+ipHdrLen(v6)+20]))
		if err := checkOutput(hookTCIngress, in, tcActRedirect, nodeReply, fromNode); err != nil {
			t.Errorf("a reject from the node's address rejected: %v", err)
		}
	})
}

// TestICMPReplyToLaterFragment: FuzzTCIngress's input (found on 2026-12-03,
// a flow an earlier input started): a later IPv6 fragment of a UDP flow,
// its hop limit run out, that tc answers with an ICMPv6 time exceeded
// quoting its headers and the 8 bytes after its fragment header. The
// check took the answer for a translation of another length.
func TestICMPReplyToLaterFragment(t *testing.T) {
	in, _ := hex.DecodeString("30303030303030303030303086dd6130303000202c0137010db801000000000000000000005020010db8010000000000000000000001113030303030000930303030303030303030303030303030303030303030303030")
	out, _ := hex.DecodeString("30303030303030303030303086dd6000000000403a4020010db801000000000000000000000137010db801000000000000000000005003002323000000006130303000202c0137010db801000000000000000000005020010db801000000000000000000000111303030303000093030303030303030")
	if !isICMPReply(in, out) {
		t.Fatal("isICMPReply = false for an ICMPv6 error about a later fragment")
	}
	if err := checkOutput(hookTCIngress, in, tcActRedirect, out, nil); err != nil {
		t.Fatal(err)
	}
	// The same answer quoting a byte too few is not the error tc builds.
	short := slices.Clone(out[:len(out)-1])
	if err := checkICMPReply(in, short, nil); err == nil {
		t.Error("checkICMPReply accepted a quote a byte short")
	}
}
