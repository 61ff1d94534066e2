package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ExplainSocket asks the socket path what its connect4 (or sendmsg4)
// program would do for a socket of this node. A cgroup sock_addr program
// cannot be run by BPF_PROG_TEST_RUN, nor can a syscall program read the
// LPM tries the selection reads (sleepable programs may not), so sock.c
// has a raw tracepoint program, sluice_sock_explain, attached to nothing,
// that calls the same selection code (bpf/lib/socklb.h) in a dry-run mode
// writing nothing but its own record map. The agent never loads it:
// ExplainSocket loads it from this build's copy of the socket object
// against the maps the agent pinned, runs it once and closes it. So any
// agent whose pinned layouts this build reads can be asked, without an
// agent upgrade or a program left in the kernel; the cost is that the
// program's load-time constants are this load's, which is why the
// caller's source address is passed in (node_ip4 is the only one the
// selection reads), and why host_netns_cookie (--socket-lb-host-netns-only)
// is read from the agent's attached program (attachedHostNetns) before
// anything is run. The other constants that decide (explainConsts: the
// agent's namespace and local traffic detectors, which give a pod's
// socket its scope, and the node's primary addresses, an unbound
// socket's source) are read from it too and set in this load.
//
// An IPv6 socket is connect6's (sendmsg6's): the same program runs the
// IPv6 selection over the sluice6_* maps, or for an IPv4-mapped
// destination (::ffff:a.b.c.d, a dual-stack socket reaching an IPv4
// address) the IPv4 one, as connect6 does; the answer then names the
// IPv4 service. An unset source is node_ip6 for IPv6, which this load
// does not know either: it is read from the agent's program, as for
// IPv4.

// The dry-run program of the socket path and its record (sock.c).
const (
	sockExplainProg = "sluice_sock_explain"
	sockExplainMap  = "sluice_sockx_v1"
)

// SocketExplainRequest is the socket to explain: an IPv4 socket
// (connect4) if To is IPv4, else an IPv6 one (connect6).
type SocketExplainRequest struct {
	// From is the socket's source address, of To's family (IPv4 or
	// IPv4-mapped for an IPv4-mapped To). Unset: an unbound socket,
	// which the programs judge by the node's primary address of To's
	// family (the agent's node_ip4, node_ip6: bpf/sock.c sock4_src), not
	// by the source the kernel picks after the connect; with no agent's
	// program to read it from, the one the route to To picks.
	From  netip.Addr
	To    netip.AddrPort
	Proto uint8 // unix.IPPROTO_TCP or unix.IPPROTO_UDP
	// Unconnected asks about sendmsg4 (sendmsg6) of an unconnected UDP
	// socket (a new one: no stickiness entry yet) rather than connect4.
	Unconnected bool
}

// CheckSocketFamilies says what is wrong with a socket of source from
// (unset: the route's) reaching to: a source of another family. An
// IPv4-mapped destination is reached from an IPv4 source (or an
// IPv4-mapped one, which is the same).
func CheckSocketFamilies(from, to netip.Addr) error {
	if !to.IsValid() {
		return errors.New("explain: the destination is missing")
	}
	if from.IsValid() && from.Unmap().Is4() != to.Unmap().Is4() {
		return fmt.Errorf("explain: source %s and destination %s are of different families (IPv4 and IPv6)", from, to)
	}
	if from.IsValid() && from.Is4In6() && !to.Is4In6() {
		return fmt.Errorf("explain: source %s is IPv4-mapped: an IPv4 socket's source is %s", from, from.Unmap())
	}
	return nil
}

// Where a socket dry run's source came from (SocketExplanation.SourceFrom).
const (
	SourceGiven  = "given" // the request's From
	SourceNodeIP = "node"  // the agent's node_ip4/node_ip6: an unbound socket's, as the programs take it
	SourceRoute  = "route" // the route to To's: no agent's program to read the node's address from
)

// Which namespace a socket dry run's socket counted as in
// (SocketExplanation.Netns), as sock_internal_client (lib/socklb.h)
// decides a two-scope frontend's scope by it.
const (
	NetnsAgent = "agent" // the agent's: the node's own socket
	NetnsOther = "other" // another: a pod's
	// NetnsAny: no agent namespace known (no agent's program attached,
	// or one that set no agent_netns_cookie): every socket counts as
	// the node's.
	NetnsAny = "any"
)

// SocketExplanation is ExplainSocketDetail's answer: the dry run's
// Explanation, and what it judged the socket by.
type SocketExplanation struct {
	*Explanation
	// Source is the source address the selection was given (the
	// record's), unset if none (the agent has no node address of the
	// family, or no route to To); SourceFrom says where it was looked
	// for.
	Source     netip.Addr
	SourceFrom string
	// Netns is the namespace the socket counted as in; Detector whether
	// the family's local traffic detector (have_cluster_cidr,
	// have_cluster_cidr6) is set, which serves another namespace's socket
	// as the agent's for a two-scope frontend.
	Netns    string
	Detector bool
}

// ExplainSocket runs the request through the socket path's selection in
// dry-run mode against the maps pinned under bpffs/sluice. The client is
// the calling thread's network namespace (the socket path's client of
// session affinity). If the agent's program on the hook serves another
// namespace only (--socket-lb-host-netns-only: the caller is in a pod's),
// nothing is run: the answer is NotServed, the socket passes untranslated
// and the packet path (Explain) decides.
func ExplainSocket(bpffs string, req SocketExplainRequest) (*Explanation, error) {
	d, err := ExplainSocketDetail(bpffs, req)
	if err != nil {
		return nil, err
	}
	return d.Explanation, nil
}

// ExplainSocketDetail is ExplainSocket, also saying the source and the
// namespace the dry run judged the socket by (unset when NotServed).
func ExplainSocketDetail(bpffs string, req SocketExplainRequest) (*SocketExplanation, error) {
	if err := CheckSocketFamilies(req.From, req.To.Addr()); err != nil {
		return nil, err
	}
	if req.Proto != unix.IPPROTO_TCP && req.Proto != unix.IPPROTO_UDP {
		return nil, fmt.Errorf("explain: protocol %d: want TCP or UDP", req.Proto)
	}
	if req.Unconnected && req.Proto != unix.IPPROTO_UDP {
		return nil, errors.New("explain: an unconnected socket is UDP")
	}
	if bpffs == "" {
		bpffs = DefaultBPFFS
	}
	netns, err := NetnsCookie()
	if err != nil {
		return nil, err
	}
	// --socket-lb-host-netns-only is the agent's load-time constant,
	// not this load's: read from the program attached to the hook.
	hook := req.Hook()
	att, err := attachedHostNetns(filepath.Join(bpffs, "sluice"), hook)
	if err != nil {
		return nil, fmt.Errorf("the socket path's %s program: %w", hook, err)
	}
	if att != nil && att.Cookie != 0 && att.Cookie != netns {
		return &SocketExplanation{Explanation: &Explanation{Program: att.Program, ProgramID: att.ProgramID, Socket: true, NotServed: true,
			Verdict: "pass", Reasons: []string{}}}, nil
	}
	var consts map[string][]byte
	if att != nil {
		consts = att.Consts
	}
	src, srcFrom := req.From, SourceGiven
	switch {
	case src.IsValid():
	case hasNodeIP(consts, req.To.Addr()):
		srcFrom = SourceNodeIP
	default:
		src, srcFrom = routeSource(req.To.Addr().Unmap()), SourceRoute
	}
	coll, err := loadSockExplain(filepath.Join(bpffs, "sluice"), consts)
	if err != nil {
		return nil, err
	}
	defer coll.Close()
	prog, rec := coll.Programs[sockExplainProg], coll.Maps[sockExplainMap]
	if prog == nil || rec == nil {
		return nil, fmt.Errorf("load %s: program or %s missing", sockExplainProg, sockExplainMap)
	}

	var sticky, v6 uint64
	if req.Unconnected {
		sticky = 1
	}
	var s4, d4 uint32
	var s6, d6 [16]byte
	to := req.To.Addr()
	if to.Is4() {
		d4 = be32(to)
	} else {
		v6, d6 = 1, to.As16()
	}
	switch {
	case !src.IsValid():
	case src.Unmap().Is4():
		s4 = be32(src.Unmap()) // an IPv4-mapped destination's too
	default:
		s6 = src.As16()
	}
	// The arguments as sock.c reads them, in host order: an address or
	// port in network order is the value be32/be16 give, an IPv6 one
	// its bytes as memory. Always all eight: the program reads them.
	ne := binary.NativeEndian
	args := []uint64{
		netns, 0,
		uint64(s4) | uint64(d4)<<32,
		uint64(be16(req.To.Port())) | uint64(req.Proto)<<16 | sticky<<24 | v6<<32,
		ne.Uint64(s6[:8]), ne.Uint64(s6[8:]),
		ne.Uint64(d6[:8]), ne.Uint64(d6[8:]),
	}
	cpu, err := firstCPU()
	if err != nil {
		return nil, err
	}
	// The record map is this load's own: no other run writes it, so
	// running on a chosen CPU and reading that CPU's record is enough.
	if _, err := prog.Run(&ebpf.RunOptions{Context: args, Flags: unix.BPF_F_TEST_RUN_ON_CPU, CPU: uint32(cpu)}); err != nil {
		return nil, fmt.Errorf("run %s: %w", sockExplainProg, err)
	}
	var vals []sockSockExplainCtx
	if err := rec.Lookup(uint32(0), &vals); err != nil {
		return nil, fmt.Errorf("read %s: %w", sockExplainMap, err)
	}
	if cpu >= len(vals) {
		return nil, fmt.Errorf("read %s: no record for CPU %d", sockExplainMap, cpu)
	}
	out := vals[cpu]
	if out.Flags&uint32(sockExplainFlagsEXPLAIN_F_DRY) == 0 {
		return nil, fmt.Errorf("%s left no record on CPU %d", sockExplainProg, cpu)
	}
	e := sockExplanation(out)
	e.Program = sockExplainProg
	d := &SocketExplanation{Explanation: e, SourceFrom: srcFrom, Netns: sockNetns(consts, netns),
		Detector: constSet(consts, detectorConst(req.To.Addr()))}
	if out.V6 != 0 && out.Vip == 0 {
		d.Source = addrFrom16(out.Src6)
	} else {
		d.Source = addrFromBE32(out.Src)
	}
	if d.Source.IsUnspecified() {
		d.Source = netip.Addr{}
	}
	return d, nil
}

// sockNetns is the namespace of cookie netns as the programs of consts
// (the agent's) count it: the agent's (agent_netns_cookie), another, or
// with no agent's namespace known, any (every socket the node's).
func sockNetns(consts map[string][]byte, netns uint64) string {
	c, ok := consts[varAgentNetnsCookie]
	if !ok || len(c) != 8 || binary.NativeEndian.Uint64(c) == 0 {
		return NetnsAny
	}
	if binary.NativeEndian.Uint64(c) == netns {
		return NetnsAgent
	}
	return NetnsOther
}

// detectorConst names the local traffic detector of the family that
// serves a socket reaching to (an IPv4-mapped destination's is IPv4's).
func detectorConst(to netip.Addr) string {
	if to.Unmap().Is4() {
		return "have_cluster_cidr"
	}
	return "have_cluster_cidr6"
}

// constSet says whether consts hold name and it is not all zero.
func constSet(consts map[string][]byte, name string) bool {
	for _, b := range consts[name] {
		if b != 0 {
			return true
		}
	}
	return false
}

// Hook names the hook whose program decides the request's socket:
// connect4 or connect6 (sendmsg4, sendmsg6) by the destination's family
// (an IPv4-mapped one is an IPv6 socket's).
func (req SocketExplainRequest) Hook() string {
	hook := "connect"
	if req.Unconnected {
		hook = "sendmsg"
	}
	if req.To.Addr().Is6() {
		return hook + "6"
	}
	return hook + "4"
}

// sockAddrs are the frontend and the backend of a socket dry run's
// record: IPv4 ones, or for an IPv6 socket IPv6 ones, unless its
// destination was IPv4-mapped (an IPv4 service: sock.c sets the IPv4
// destination then).
func sockAddrs(x sockSockExplainCtx) (fe, be netip.Addr) {
	if x.V6 != 0 && x.Vip == 0 {
		return addrFrom16(x.Vip6), addrFrom16(x.BeAddr6)
	}
	return addrFromBE32(x.Vip), addrFromBE32(x.BeAddr)
}

// hasNodeIP says whether consts (the agent's) hold the node_ip4 or
// node_ip6 an unbound socket reaching to is judged by (sock.c): an
// IPv4-mapped destination's is node_ip4. The dry run, given no source,
// then takes it as the program does.
func hasNodeIP(consts map[string][]byte, to netip.Addr) bool {
	name := "node_ip6"
	if to.Unmap().Is4() {
		name = "node_ip4"
	}
	_, ok := consts[name]
	return ok
}

// loadSockExplain loads the dry-run program with the maps it reads
// replaced by the pins under dir (sized as the agent made them); its
// record map and .rodata are its own, with consts (the agent's
// explainConsts, by name) set in the latter.
func loadSockExplain(dir string, consts map[string][]byte) (*ebpf.Collection, error) {
	spec, err := loadSock()
	if err != nil {
		return nil, err
	}
	vars := map[string]*ebpf.VariableSpec{}
	for name, b := range consts {
		vs, ok := spec.Variables[name]
		if !ok {
			continue // not in this build's object: its default
		}
		if int(vs.Size()) != len(b) {
			return nil, fmt.Errorf("the agent's %s is %d bytes, this build's %d", name, len(b), vs.Size())
		}
		if err := vs.Set(b); err != nil {
			return nil, fmt.Errorf("set %s: %w", name, err)
		}
		vars[name] = vs
	}
	ps := spec.Programs[sockExplainProg]
	if ps == nil {
		return nil, fmt.Errorf("program %s missing from the socket object", sockExplainProg)
	}
	cs := &ebpf.CollectionSpec{
		Maps:     map[string]*ebpf.MapSpec{},
		Programs: map[string]*ebpf.ProgramSpec{sockExplainProg: ps},
		// Applied to .rodata (the program reads it) at load.
		Variables: vars,
		Types:     spec.Types,
	}
	repl := map[string]*ebpf.Map{}
	closeAll := func() {
		for _, m := range repl {
			m.Close()
		}
	}
	for _, ins := range ps.Instructions {
		name := ins.Reference()
		ms, ok := spec.Maps[name]
		if !ok || cs.Maps[name] != nil {
			continue
		}
		ms = ms.Copy()
		cs.Maps[name] = ms
		if ms.Pinning != ebpf.PinByName {
			continue // the record map, .rodata: this load's own
		}
		m, err := openPinnedMap(dir, name, ms)
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("the socket path's maps: %w", err)
		}
		repl[name] = m
		info, err := m.Info()
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("info of pinned map %s: %w", name, err)
		}
		// The agent's sizes and preallocation (prealloc.go), which
		// this reader does not know.
		ms.MaxEntries, ms.Flags = info.MaxEntries, info.Flags
		ms.Pinning = ebpf.PinNone
	}
	defer closeAll()
	coll, err := ebpf.NewCollectionWithOptions(cs, ebpf.CollectionOptions{MapReplacements: repl})
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", sockExplainProg, verifierDetail(err))
	}
	return coll, nil
}

// firstCPU is the first CPU the calling thread may run on (one that is
// online).
func firstCPU() (int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return 0, fmt.Errorf("get CPU affinity: %w", err)
	}
	for i := range 8 * 1024 {
		if set.IsSet(i) {
			return i, nil
		}
	}
	return 0, errors.New("get CPU affinity: no CPU")
}

// routeSource is the source address the route to dst picks (the zero
// Addr if none).
func routeSource(dst netip.Addr) netip.Addr {
	routes, err := netlink.RouteGet(dst.AsSlice())
	if err != nil || len(routes) == 0 {
		return netip.Addr{}
	}
	a, ok := netip.AddrFromSlice(routes[0].Src)
	if !ok {
		return netip.Addr{}
	}
	return a.Unmap()
}

// sockExplanation turns the dry run's context into an Explanation.
func sockExplanation(x sockSockExplainCtx) *Explanation {
	e := &Explanation{Reasons: []string{}, Socket: true}
	if names := metricNames(); int(x.Reason) < len(names) {
		e.Reasons = append(e.Reasons, names[x.Reason])
	}
	fe, be := sockAddrs(x)
	e.setFlags(x.Flags)
	if e.Frontend {
		e.FrontendAddr = netip.AddrPortFrom(fe, portFromBE16(x.Port))
		e.SvcFlags = x.SvcFlags
	}
	if e.Scoped {
		e.Scope, e.ScopeCount, e.ServiceID = x.Scope, x.Count, x.RevNatId
	}
	if e.DNAT {
		e.BackendID, e.Slot = x.BackendId, x.Slot
		e.Backend = netip.AddrPortFrom(be, portFromBE16(x.BePort))
	}
	switch {
	case x.Err == -int32(unix.ECONNREFUSED):
		e.Verdict, e.Errno = "reject", "ECONNREFUSED"
	case x.Err == -int32(unix.EHOSTUNREACH):
		e.Verdict, e.Errno = "drop", "EHOSTUNREACH"
	case x.Err != 0:
		e.Verdict, e.Errno = "refuse", unix.ErrnoName(unix.Errno(-x.Err))
	case e.DNAT:
		e.Verdict = "connect to backend"
	default:
		e.Verdict = "pass"
	}
	return e
}
