package datapath

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Explain asks the tc program attached to a device what it would do with
// one packet: it runs the program itself (BPF_PROG_TEST_RUN) in its
// dry-run mode (bpf/lib/explain.h), against the live maps, which that
// mode only reads, and returns what the program noted. Nothing here
// decides anything: the answer is the program's, so it cannot drift from
// what real packets meet.

// explainMapName is the dry-run record map of the tc program (explain.h);
// the version in its name is the layout of sockExplainRecord.
// explain6MapName holds an IPv6 dry run's addresses (sockExplain6Record).
const (
	explainMapName  = "sluice_expl_v1"
	explain6MapName = "sluice_expl6_v1"
)

// The dry-run mark, cb[0] and cb[1] (EXPLAIN_MAGIC0/1 in explain.h).
const (
	explainMagic0 = 0x736c6578
	explainMagic1 = 0x706c616e
)

// ErrNoExplain says the attached program has no dry-run mode (for the
// packet's family): it was loaded by an agent older than sluicectl
// explain (or, for IPv6, than its IPv6 dry runs).
var ErrNoExplain = errors.New("the attached program has no dry-run mode for this packet's family (an agent older than sluicectl explain: upgrade it; or one that started moments ago and loads it after its first sync: try again)")

// ExplainRequest is the packet to explain: IPv4, or IPv6 (run by the
// IPv6 program's dry twin, its addresses read from sluice_expl6_v1).
type ExplainRequest struct {
	Device string         // the device whose tc program runs it
	Egress bool           // its egress program, not its ingress one
	From   netip.AddrPort // the client; port 0: an ephemeral one
	To     netip.AddrPort // of From's family
	Proto  uint8          // unix.IPPROTO_TCP (a SYN) or unix.IPPROTO_UDP
}

// CheckPacketFamilies says what is wrong with a packet from from to to: an
// address of neither family, IPv4-mapped (no packet carries one: its
// IPv4 address is what goes on the wire), or the two of different
// families.
func CheckPacketFamilies(from, to netip.Addr) error {
	for _, a := range []netip.Addr{from, to} {
		if !a.IsValid() {
			return errors.New("explain: an address is missing")
		}
		if a.Is4In6() {
			return fmt.Errorf("explain: %s is IPv4-mapped: a packet carries the IPv4 address %s", a, a.Unmap())
		}
	}
	if from.Is4() != to.Is4() {
		return fmt.Errorf("explain: %s and %s are of different families (IPv4 and IPv6)", from, to)
	}
	return nil
}

// Explanation is what the program decided about the packet.
type Explanation struct {
	Program   string // the program's name
	ProgramID uint32
	Verdict   string // pass, drop, redirect (the tc verdict), or reject
	RetVal    uint32 // the tc verdict as the program returned it
	Reasons   []string
	// Frontend: the destination is a Service frontend.
	Frontend     bool
	FrontendAddr netip.AddrPort
	SvcFlags     uint32 // the frontend's flags (svc_flags)
	Scoped       bool   // the client was classified and a scope chosen (the next four)
	Scope        uint8  // the scope that served the client (lb_scope)
	ScopeCount   uint32 // that scope's backends
	ServiceID    uint32
	Internal     bool // the client is in the cluster CIDR
	Outside      bool // the client is external and came in through a node device
	ConntrackHit bool // a live conntrack entry of the flow decided
	AffinityHit  bool // the client's session affinity entry decided
	NewFlow      bool // a backend was selected for a new flow
	DNAT         bool
	BackendID    uint32
	Slot         uint16 // the slot that named the backend (0: conntrack)
	Backend      netip.AddrPort
	SNAT         bool
	SNATTo       netip.AddrPort // a reply: its new destination
	Reply        bool           // a reply of a translated flow
	// The socket path (ExplainSocket): what it decided, and the errno a
	// refused socket gets.
	Socket    bool
	StickyHit bool // a UDP socket's stickiness entry decided
	Errno     string
	// NotServed: the agent's socket programs serve another network
	// namespace only (--socket-lb-host-netns-only): the socket passes
	// untranslated. Program is then the attached program, not run.
	NotServed bool
	// Out is the packet as the program left it (its addresses and ports).
	OutSrc, OutDst netip.AddrPort
}

// explainTries bounds the runs repeated because another dry run on the
// same CPU overwrote the record before it was read.
const explainTries = 5

// Explain runs the request's packet through the tc program attached to its
// device in this network namespace, in dry-run mode. It pins the calling
// goroutine's thread to one CPU meanwhile, so that the per-CPU record it
// reads is the run's.
func Explain(req ExplainRequest) (*Explanation, error) {
	ifc, err := net.InterfaceByName(req.Device)
	if err != nil {
		return nil, fmt.Errorf("device %s: %w", req.Device, err)
	}
	prog, name, err := attachedTCProgram(ifc.Index, req.Egress)
	if err != nil {
		return nil, err
	}
	defer prog.Close()
	frame, err := explainFrame(req, ifc.HardwareAddr)
	if err != nil {
		return nil, err
	}
	rec, err := explainMap(prog, explainMapName, binary.Size(sockExplainRecord{}))
	if err != nil {
		return nil, err
	}
	defer rec.Close()
	var rec6 *ebpf.Map
	if req.To.Addr().Is6() {
		if rec6, err = explainMap(prog, explain6MapName, binary.Size(sockExplain6Record{})); err != nil {
			return nil, err
		}
		defer rec6.Close()
	}

	return runExplain(prog, name, rec, rec6, ifc.Index, frame)
}

// runExplain runs frame through prog (named name) in dry-run mode, as if
// it arrived on the device of ifindex, and reads its record from rec (and
// for an IPv6 packet its addresses from rec6, nil for IPv4).
func runExplain(prog *ebpf.Program, name string, rec, rec6 *ebpf.Map, ifindex int, frame []byte) (*Explanation, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cpu, restore, err := pinToCPU()
	if err != nil {
		return nil, err
	}
	defer restore()

	for range explainTries {
		var nonce [8]byte
		if _, err := rand.Read(nonce[:]); err != nil {
			return nil, fmt.Errorf("nonce: %w", err)
		}
		n0, n1 := binary.LittleEndian.Uint32(nonce[:4]), binary.LittleEndian.Uint32(nonce[4:])
		prev, err := readRecord[sockExplainRecord](rec, explainMapName, cpu)
		if err != nil {
			return nil, err
		}
		opts := &ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+256), Context: skbContext(ifindex, n0, n1)}
		ret, err := prog.Run(opts)
		if err != nil {
			return nil, fmt.Errorf("run %s: %w", name, err)
		}
		r, err := readRecord[sockExplainRecord](rec, explainMapName, cpu)
		if err != nil {
			return nil, err
		}
		if r.Nonce != [2]uint32{n0, n1} {
			if r == prev {
				// Nothing wrote it: the program has no dry
				// twin to send the packet to.
				return nil, ErrNoExplain
			}
			continue // another dry run on this CPU meanwhile
		}
		var r6 *sockExplain6Record
		if rec6 != nil {
			v, err := readRecord[sockExplain6Record](rec6, explain6MapName, cpu)
			if err != nil {
				return nil, err
			}
			if v.Nonce != r.Nonce {
				continue // overwritten between the two reads
			}
			r6 = &v
		}
		e := explanation(r, r6, ret, opts.DataOut)
		e.Program = name
		if info, err := prog.Info(); err == nil { // the id is a label only
			if id, ok := info.ID(); ok {
				e.ProgramID = uint32(id)
			}
		}
		return e, nil
	}
	return nil, fmt.Errorf("the dry-run record was overwritten %d times by other dry runs on CPU %d", explainTries, cpu)
}

// readRecord reads CPU cpu's record of the per-CPU array rec (named
// name).
func readRecord[T any](rec *ebpf.Map, name string, cpu int) (T, error) {
	var vals []T
	var zero T
	if err := rec.Lookup(uint32(0), &vals); err != nil {
		return zero, fmt.Errorf("read %s: %w", name, err)
	}
	if cpu >= len(vals) {
		return zero, fmt.Errorf("read %s: no record for CPU %d", name, cpu)
	}
	return vals[cpu], nil
}

// pinToCPU pins the calling (locked) thread to the CPU it runs on and
// returns that CPU and how to restore the thread's affinity.
func pinToCPU() (int, func(), error) {
	var old unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		return 0, nil, fmt.Errorf("get CPU affinity: %w", err)
	}
	cpu := -1
	for i := range 8 * 1024 {
		if old.IsSet(i) {
			cpu = i
			break
		}
	}
	if cpu < 0 {
		return 0, nil, errors.New("get CPU affinity: no CPU")
	}
	var one unix.CPUSet
	one.Set(cpu)
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		return 0, nil, fmt.Errorf("pin to CPU %d: %w", cpu, err)
	}
	// Restoring fails only if those CPUs went offline meanwhile; the
	// thread then keeps the one CPU, which is still a valid affinity.
	return cpu, func() { _ = unix.SchedSetaffinity(0, &old) }, nil
}

// skbContext is the struct __sk_buff BPF_PROG_TEST_RUN starts the program
// with: the device (ifindex, so the program's route lookups and device
// checks are the device's), and in cb[] the dry-run mark and the nonce.
// Only the fields up to cb[] are passed; the kernel zeroes the rest.
func skbContext(ifindex int, n0, n1 uint32) []byte {
	const (
		offIngressIfindex = 36
		offIfindex        = 40
		offCB             = 48
		size              = offCB + 5*4
	)
	b := make([]byte, size)
	binary.LittleEndian.PutUint32(b[offIngressIfindex:], uint32(ifindex))
	binary.LittleEndian.PutUint32(b[offIfindex:], uint32(ifindex))
	for i, v := range []uint32{explainMagic0, explainMagic1, n0, n1} {
		binary.NativeEndian.PutUint32(b[offCB+4*i:], v)
	}
	return b
}

// attachedTCProgram returns Sluice's tc program attached to the device of
// ifindex in the direction: by a tcx link, or a clsact filter (kernels
// without tcx), as attachTC attaches it.
func attachedTCProgram(ifindex int, egress bool) (*ebpf.Program, string, error) {
	dir, want := tcIngress, "sluice_ingress"
	if egress {
		dir, want = tcEgress, "sluice_egress"
	}
	var ids []ebpf.ProgramID
	res, err := link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: dir.attach})
	if err == nil {
		for _, p := range res.Programs {
			ids = append(ids, p.ID)
		}
	}
	if l, err := netlink.LinkByIndex(ifindex); err == nil {
		if filters, err := netlink.FilterList(l, dir.parent); err == nil {
			for _, f := range filters {
				if bf, ok := f.(*netlink.BpfFilter); ok && strings.HasPrefix(bf.Name, filterPrefix) {
					ids = append(ids, ebpf.ProgramID(bf.Id))
				}
			}
		}
	}
	for _, id := range ids {
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue // detached meanwhile
		}
		info, err := p.Info()
		if err == nil && info.Name == want {
			return p, want, nil
		}
		p.Close()
	}
	return nil, "", fmt.Errorf("no %s program attached to ifindex %d: is the agent running on this device, in this network namespace?", want, ifindex)
}

// explainMap returns the dry-run record map name, of size-byte values,
// among prog's maps.
func explainMap(prog *ebpf.Program, name string, size int) (*ebpf.Map, error) {
	info, err := prog.Info()
	if err != nil {
		return nil, fmt.Errorf("program info: %w", err)
	}
	ids, ok := info.MapIDs()
	if !ok {
		return nil, errors.New("program info: no map ids (kernel too old)")
	}
	for _, id := range ids {
		m, err := ebpf.NewMapFromID(id)
		if err != nil {
			continue
		}
		mi, err := m.Info()
		if err == nil && mi.Name == name {
			if mi.Type != ebpf.PerCPUArray || mi.ValueSize != uint32(size) {
				m.Close()
				return nil, fmt.Errorf("%s: %v of %d-byte values, want a per-CPU array of %d", name, mi.Type, mi.ValueSize, size)
			}
			return m, nil
		}
		m.Close()
	}
	return nil, ErrNoExplain
}

// explanation turns the record into an Explanation; r6, an IPv6 run's
// addresses, is nil for IPv4.
func explanation(r sockExplainRecord, r6 *sockExplain6Record, ret uint32, out []byte) *Explanation {
	var a6 sockExplain6Record
	if r6 != nil {
		a6 = *r6
	}
	// addr is an address of the record: its word, or r6's.
	addr := func(w uint32, v6 sockV6addr) netip.Addr {
		if r6 != nil {
			return addrFrom16(v6)
		}
		return addrFromBE32(w)
	}
	names := metricNames()
	e := &Explanation{RetVal: ret, Reasons: []string{}}
	for i := range min(int(r.N_reasons), len(r.Reasons)) {
		if n := int(r.Reasons[i]); n < len(names) {
			e.Reasons = append(e.Reasons, names[n])
		} else {
			e.Reasons = append(e.Reasons, fmt.Sprintf("reason_%d", n))
		}
	}
	e.setFlags(r.Flags)
	if e.Frontend || e.Reply {
		e.FrontendAddr = netip.AddrPortFrom(addr(r.Vip, a6.Vip), portFromBE16(r.Vport))
	}
	e.SvcFlags = r.SvcFlags
	if e.Scoped {
		e.Scope, e.ScopeCount, e.ServiceID = r.Scope, r.Count, r.RevNatId
	}
	if e.DNAT {
		e.BackendID, e.Slot = r.BackendId, r.Slot
		e.Backend = netip.AddrPortFrom(addr(r.BeAddr, a6.BeAddr), portFromBE16(r.BePort))
	}
	if e.SNAT {
		e.SNATTo = netip.AddrPortFrom(addr(r.SnatAddr, a6.SnatAddr), portFromBE16(r.SnatPort))
	}
	e.Verdict = verdictName(ret)
	// A refusal is an ICMP error sent back: the program returns it as a
	// redirect (or passes it up), but what the client meets is a reject.
	// One the kernel would not send (a frame not to this host's MAC, a
	// source of no single host, an error over its rate limits: icmp.h)
	// is dropped, counted under the same reasons (and the last as
	// tc_icmp_ratelimited too).
	if e.Verdict != "drop" && slices.ContainsFunc(e.Reasons, func(s string) bool {
		return s == "tc_no_backend" || s == "tc_unknown_port"
	}) {
		e.Verdict = "reject"
	}
	e.OutSrc, e.OutDst = frameAddrs(out)
	return e
}

// setFlags sets what the dry run's EXPLAIN_F_* flags say about the
// packet or socket, for tc and socket records alike: each program sets
// only the flags of what it does (a socket has no conntrack entry, no
// SNAT and no reply; tc has no sticky socket entry).
func (e *Explanation) setFlags(flags uint32) {
	has := func(f sockExplainFlags) bool { return flags&uint32(f) != 0 }
	e.Frontend = has(sockExplainFlagsEXPLAIN_F_FRONTEND)
	e.Scoped = has(sockExplainFlagsEXPLAIN_F_SCOPE)
	e.Internal = has(sockExplainFlagsEXPLAIN_F_INTERNAL)
	e.Outside = has(sockExplainFlagsEXPLAIN_F_OUTSIDE)
	e.ConntrackHit = has(sockExplainFlagsEXPLAIN_F_CT_HIT)
	e.AffinityHit = has(sockExplainFlagsEXPLAIN_F_AFFINITY_HIT)
	e.StickyHit = has(sockExplainFlagsEXPLAIN_F_STICKY_HIT)
	e.NewFlow = has(sockExplainFlagsEXPLAIN_F_NEW_FLOW)
	e.Reply = has(sockExplainFlagsEXPLAIN_F_REPLY)
	e.DNAT = has(sockExplainFlagsEXPLAIN_F_DNAT)
	e.SNAT = has(sockExplainFlagsEXPLAIN_F_SNAT)
}

// verdictName names a tc verdict (linux/pkt_cls.h).
func verdictName(ret uint32) string {
	switch int32(ret) {
	case -1:
		return "unspec"
	case 0:
		return "pass"
	case 2:
		return "drop"
	case 7:
		return "redirect"
	default:
		return fmt.Sprintf("verdict %d", int32(ret))
	}
}

// The Ethernet types of the frames explain builds and reads.
const (
	ethIPv4 = 0x0800
	ethIPv6 = 0x86dd
)

// frameAddrs returns the TCP/UDP addresses and ports of an Ethernet frame
// of IPv4, or of IPv6 without extension headers (zero values if it is
// neither).
func frameAddrs(b []byte) (src, dst netip.AddrPort) {
	if len(b) < 14+20+4 {
		return
	}
	ip := b[14:]
	var s, d netip.Addr
	var proto uint8
	var hlen int
	switch binary.BigEndian.Uint16(b[12:]) {
	case ethIPv4:
		hlen = int(ip[0]&0x0f) * 4
		if hlen < 20 || len(ip) < hlen+4 {
			return
		}
		s, d, proto = netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20])), ip[9]
	case ethIPv6:
		if hlen = 40; len(ip) < hlen+4 {
			return
		}
		s, d, proto = netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40])), ip[6]
	default:
		return
	}
	if proto != unix.IPPROTO_TCP && proto != unix.IPPROTO_UDP {
		return netip.AddrPortFrom(s, 0), netip.AddrPortFrom(d, 0)
	}
	l4 := ip[hlen:]
	return netip.AddrPortFrom(s, binary.BigEndian.Uint16(l4[0:])), netip.AddrPortFrom(d, binary.BigEndian.Uint16(l4[2:]))
}

// explainFrame builds the request's packet: an Ethernet frame to the
// device's address carrying an IPv4 or IPv6 packet (without extension
// headers) of a TCP SYN or a UDP datagram, checksums right.
func explainFrame(req ExplainRequest, dstMAC net.HardwareAddr) ([]byte, error) {
	if err := CheckPacketFamilies(req.From.Addr(), req.To.Addr()); err != nil {
		return nil, err
	}
	var l4 []byte
	switch req.Proto {
	case unix.IPPROTO_TCP:
		l4 = make([]byte, 20)
		l4[12] = 5 << 4
		l4[13] = 0x02 // SYN: a new connection
		binary.BigEndian.PutUint16(l4[14:], 64240)
	case unix.IPPROTO_UDP:
		l4 = make([]byte, 8+4)
		binary.BigEndian.PutUint16(l4[4:], uint16(len(l4)))
		copy(l4[8:], "sl?\n")
	default:
		return nil, fmt.Errorf("explain: protocol %d: want TCP or UDP", req.Proto)
	}
	sport := req.From.Port()
	if sport == 0 {
		sport = 40000
	}
	binary.BigEndian.PutUint16(l4[0:], sport)
	binary.BigEndian.PutUint16(l4[2:], req.To.Port())

	src, dst := req.From.Addr().AsSlice(), req.To.Addr().AsSlice()
	var ip []byte
	ethType := uint16(ethIPv4)
	if req.To.Addr().Is4() {
		ip = make([]byte, 20)
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(20+len(l4)))
		ip[8] = 64
		ip[9] = req.Proto
		copy(ip[12:], src)
		copy(ip[16:], dst)
		binary.BigEndian.PutUint16(ip[10:], inetChecksum(0, ip))
	} else {
		ethType = ethIPv6
		ip = make([]byte, 40)
		ip[0] = 6 << 4
		binary.BigEndian.PutUint16(ip[4:], uint16(len(l4)))
		ip[6] = req.Proto
		ip[7] = 64 // hop limit
		copy(ip[8:], src)
		copy(ip[24:], dst)
	}

	// The pseudo-header: IPv4's (RFC 793) sums to IPv6's (RFC 8200
	// 8.1), whose length is 32 bits and protocol byte 3 of 4, as both
	// add the same 16-bit words.
	pseudo := append(append(slices.Clone(src), dst...), 0, req.Proto, 0, 0)
	binary.BigEndian.PutUint16(pseudo[len(pseudo)-2:], uint16(len(l4)))
	csum := inetChecksum(inetSum(0, pseudo), l4)
	if req.Proto == unix.IPPROTO_UDP && csum == 0 {
		csum = 0xffff
	}
	off := 16
	if req.Proto == unix.IPPROTO_UDP {
		off = 6
	}
	binary.BigEndian.PutUint16(l4[off:], csum)

	frame := make([]byte, 14, 14+len(ip)+len(l4))
	copy(frame[0:6], dstMAC)
	frame[6] = 0x02 // a locally administered source
	binary.BigEndian.PutUint16(frame[12:], ethType)
	frame = append(append(frame, ip...), l4...)
	return frame, nil
}

// inetSum adds b to the one's complement sum acc (RFC 1071).
func inetSum(acc uint32, b []byte) uint32 {
	for ; len(b) >= 2; b = b[2:] {
		acc += uint32(binary.BigEndian.Uint16(b))
	}
	if len(b) == 1 {
		acc += uint32(b[0]) << 8
	}
	return acc
}

// inetChecksum is the Internet checksum of b on top of the sum acc.
func inetChecksum(acc uint32, b []byte) uint16 {
	acc = inetSum(acc, b)
	for acc > 0xffff {
		acc = acc&0xffff + acc>>16
	}
	return ^uint16(acc)
}

// Candidate is one backend in a slot of a frontend's scope.
type Candidate struct {
	Slot      uint16
	BackendID uint32
	Addr      netip.AddrPort
}

// Candidates returns the backends in the slots of frontend <fe, proto> in
// scope, as the agent wrote them (topology and traffic policies are
// applied in what it writes there), in slot order. An IPv6 frontend's are
// read from the sluice6_* maps (none when an older agent pinned no such
// maps).
func (p *Pinned) Candidates(fe netip.AddrPort, proto, scope uint8) ([]Candidate, error) {
	a := fe.Addr().Unmap()
	v6 := is6(a)
	if v6 && p.services6 == nil {
		return nil, nil
	}
	key := sockLb4Key{Vip: addr4(a), Port: be16(fe.Port()), Proto: proto, Scope: scope}
	readMaster := func(out *sockLb4Service) error {
		if v6 {
			k6 := lb6Key(key, a)
			return p.services6.Lookup(&k6, out)
		}
		return p.services.Lookup(&key, out)
	}
	// Slot n of the master's, in its family's slots array.
	slots := p.slotArr4
	if v6 {
		slots = p.slotArr6
	}
	backend := func(id uint32) (netip.AddrPort, error) {
		if v6 {
			var be sockLb6Backend
			err := p.backends6.Lookup(id, &be)
			if err == nil && !backendPresent(p.backends6, be.Flags) {
				err = ebpf.ErrKeyNotExist
			}
			return netip.AddrPortFrom(addrFrom16(be.Addr), portFromBE16(be.Port)), err
		}
		var be sockLb4Backend
		err := p.backends.Lookup(id, &be)
		if err == nil && !backendPresent(p.backends, be.Flags) {
			err = ebpf.ErrKeyNotExist
		}
		return netip.AddrPortFrom(addrFromBE32(be.Addr), portFromBE16(be.Port)), err
	}
	var master sockLb4Service
	if err := readMaster(&master); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("read frontend %s: %w", fe, err)
	}
	out := make([]Candidate, 0, master.Count)
	for n := uint32(1); n <= master.Count && n <= 0xffff && slots != nil; n++ {
		var id uint32
		if err := slots.Lookup(master.SlotsBase+n-1, &id); err != nil || id == 0 {
			continue // a shrink racing this read, or a range beyond the array
		}
		be, err := backend(id)
		if err != nil {
			continue
		}
		out = append(out, Candidate{Slot: uint16(n), BackendID: id, Addr: be})
	}
	return out, nil
}
