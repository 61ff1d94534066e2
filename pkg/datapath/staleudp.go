package datapath

// Ending, once at the agent's start, the UDP state kube-proxy left behind
// (audit 6, finding 6).
//
// When Sluice takes over a node from kube-proxy, a UDP socket connected to
// a ClusterIP (or another UDP frontend) before the socket programs covered
// it keeps its peer, the VIP: connect4 (connect6) translates at connect
// only. Its datagrams are DNATed by the netfilter conntrack entry
// kube-proxy's rule made at its first packet (original destination the
// VIP, reply source the endpoint kube-proxy picked then), and that entry,
// which the traffic refreshes, outlives kube-proxy's rules: when its
// endpoint goes, the client blackholes. kube-proxy itself deletes such UDP
// entries when their endpoint stops serving
// (pkg/proxy/conntrack/cleanup.go); Cilium ends such sockets. Sluice does
// both, once, after its first full programming (the frontends are in the
// maps, a new connect is translated):
//
//   - the host's netfilter conntrack entries of UDP whose original
//     destination is one of Sluice's UDP frontends and whose reply source
//     is not that destination (someone DNATed them: kube-proxy) are
//     deleted. A packet of the flow is then new to netfilter, which has no
//     rule for it any more, and goes where Sluice's per-packet path sends
//     it. The node's namespace only: a pod's traffic to a ClusterIP is
//     NATed in the node's conntrack, not the pod's;
//   - the connected UDP sockets whose peer is still a UDP frontend, among
//     those socket load balancing covers (of a process in its cgroup; in
//     the host's namespace only with --socket-lb-host-netns-only), are
//     ended (bpf/sockdestroy.c's sluice_sock_destroy_frontends, or
//     SOCK_DESTROY, the cgroup from sock_diag's INET_DIAG_CGROUP_ID): the
//     application's next call fails with ECONNABORTED
//     and it connects again, through connect4 (connect6).
//
// Not on every sync: Sluice's own flows never leave such conntrack
// entries (netfilter sees them after Sluice translated them, with the
// backend as destination, or untranslated and not NATed, reply source the
// VIP), and no socket it covers connects to a VIP without connect4
// translating it. An entry not NATed (reply source the original
// destination) is left alone, and so is TCP: a TCP connection kube-proxy
// DNATed keeps working until its endpoint goes, then resets, as it does
// when kube-proxy itself is migrated.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/pkg/model"
)

// StaleUDP is what EndStaleUDP did.
type StaleUDP struct {
	// Frontends is how many UDP frontends were looked for.
	Frontends int
	// ConntrackDeleted is how many netfilter conntrack entries were
	// deleted (both families).
	ConntrackDeleted int
	// ConntrackErr is why the conntrack entries could not all be
	// searched or deleted, if so.
	ConntrackErr error
	// Sockets is what was done to the connected UDP sockets whose peer is
	// a frontend (Destroyed, Failed; Backends is 0); its Err says what
	// went wrong. Method is SockDestroyNone when no socket was judged
	// (socket load balancing off, or the kernel cannot end sockets).
	Sockets SocketTermination
}

// UDPFrontends returns the UDP frontends of s (ClusterIPs, ExternalIPs,
// LoadBalancer IPs and the NodePorts on node addresses, both families).
func UDPFrontends(s *model.State) map[netip.AddrPort]bool {
	out := map[netip.AddrPort]bool{}
	for k := range s.Services.Keys() {
		if k.Proto == model.UDP {
			out[netip.AddrPortFrom(k.Addr.Unmap(), k.Port)] = true
		}
	}
	return out
}

// EndStaleUDP deletes the netfilter conntrack entries and ends the
// connected sockets that still send the UDP frontends' traffic where
// someone else (kube-proxy) translated it, as the file's comment says. It
// runs in the calling thread's network namespace, the node's, and judges
// the sockets socket load balancing covers as attached to cgroup (empty:
// none). Run it once, after the first apply of the state whose UDP
// frontends (UDPFrontends) are frontends.
func (d *Datapath) EndStaleUDP(cgroup string, frontends map[netip.AddrPort]bool) StaleUDP {
	res := StaleUDP{Frontends: len(frontends)}
	if len(frontends) == 0 {
		return res
	}
	res.ConntrackDeleted, res.ConntrackErr = DeleteStaleUDPConntrack(frontends)
	res.Sockets = d.endFrontendSockets(cgroup, frontends)
	return res
}

// staleUDPFlow says whether flow is a UDP flow to one of frontends that
// someone DNATed: its reply comes from elsewhere than its original
// destination.
func staleUDPFlow(frontends map[netip.AddrPort]bool, flow *netlink.ConntrackFlow) bool {
	if flow.Forward.Protocol != unix.IPPROTO_UDP {
		return false
	}
	dst, ok := netip.AddrFromSlice(flow.Forward.DstIP)
	if !ok {
		return false
	}
	orig := netip.AddrPortFrom(dst.Unmap(), flow.Forward.DstPort)
	if !frontends[orig] {
		return false
	}
	src, ok := netip.AddrFromSlice(flow.Reverse.SrcIP)
	if !ok {
		return false
	}
	return netip.AddrPortFrom(src.Unmap(), flow.Reverse.SrcPort) != orig
}

// DeleteStaleUDPConntrack deletes the calling thread's namespace's
// netfilter conntrack entries of UDP flows to frontends that were DNATed
// elsewhere (staleUDPFlow), of both families, and returns how many.
// Without conntrack in the kernel (nothing NATed there ever), it deletes
// nothing and fails nothing. The table is streamed, an entry judged and
// deleted as it comes (deleteStaleUDPConntrack): a node near
// nf_conntrack_max (a million entries and more) is walked in the memory
// of one netlink buffer, not of its whole table as
// netlink.ConntrackDeleteFilters would load it.
func DeleteStaleUDPConntrack(frontends map[netip.AddrPort]bool) (int, error) {
	var n int
	var errs []error
	for _, fam := range []uint8{unix.AF_INET, unix.AF_INET6} {
		k, err := deleteStaleUDPConntrack(fam, frontends)
		n += k
		if err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EPROTONOSUPPORT) {
			errs = append(errs, fmt.Errorf("netfilter conntrack of family %d: %w", fam, err))
		}
	}
	return n, errors.Join(errs...)
}

// conntrackRequest is a ctnetlink request of operation (IPCTNL_MSG_CT_*)
// on the conntrack table of family.
func conntrackRequest(family uint8, operation, flags int) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest(int(netlink.ConntrackTable)<<8|operation, flags)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: family, Version: nl.NFNETLINK_V0})
	return req
}

// deleteStaleUDPConntrack dumps the conntrack table of family and
// deletes each entry staleUDPFlow matches as the dump reads it (another
// netlink socket; ctnetlink's dump goes on from where it was). An entry
// gone meanwhile counts as deleted.
func deleteStaleUDPConntrack(family uint8, frontends map[netip.AddrPort]bool) (int, error) {
	var n, failed int
	var firstErr error
	dump := conntrackRequest(family, nl.IPCTNL_MSG_CT_GET, unix.NLM_F_DUMP)
	err := dump.ExecuteIter(unix.NETLINK_NETFILTER, 0, func(msg []byte) bool {
		flow, ok := parseConntrackTuples(msg)
		if !ok || !staleUDPFlow(frontends, flow) {
			return true
		}
		del := conntrackRequest(family, nl.IPCTNL_MSG_CT_DELETE, unix.NLM_F_ACK)
		del.AddRawData(msg[4:]) // the entry's attributes, after its struct nfgenmsg
		if _, err := del.Execute(unix.NETLINK_NETFILTER, 0); err != nil && !errors.Is(err, unix.ENOENT) {
			failed++
			if firstErr == nil {
				firstErr = err
			}
			return true
		}
		n++
		return true
	})
	if failed > 0 {
		err = errors.Join(err, fmt.Errorf("delete %d conntrack entries: %w", failed, firstErr))
	}
	return n, err
}

// parseConntrackTuples reads, of one ctnetlink entry (a struct nfgenmsg
// and its attributes), what staleUDPFlow judges: the original tuple's
// protocol and destination and the reply tuple's source. ok is false for
// a message too short to be an entry.
func parseConntrackTuples(msg []byte) (flow *netlink.ConntrackFlow, ok bool) {
	if len(msg) < 4 {
		return nil, false
	}
	flow = &netlink.ConntrackFlow{FamilyType: msg[0]}
	eachAttr(msg[4:], func(typ uint16, v []byte) {
		var tpl *netlink.IPTuple
		switch typ {
		case nl.CTA_TUPLE_ORIG:
			tpl = &flow.Forward
		case nl.CTA_TUPLE_REPLY:
			tpl = &flow.Reverse
		default:
			return
		}
		eachAttr(v, func(typ uint16, v []byte) {
			switch typ {
			case nl.CTA_TUPLE_IP:
				eachAttr(v, func(typ uint16, v []byte) {
					switch typ {
					case nl.CTA_IP_V4_SRC, nl.CTA_IP_V6_SRC:
						tpl.SrcIP = append([]byte(nil), v...)
					case nl.CTA_IP_V4_DST, nl.CTA_IP_V6_DST:
						tpl.DstIP = append([]byte(nil), v...)
					}
				})
			case nl.CTA_TUPLE_PROTO:
				eachAttr(v, func(typ uint16, v []byte) {
					switch {
					case typ == nl.CTA_PROTO_NUM && len(v) >= 1:
						tpl.Protocol = v[0]
					case typ == nl.CTA_PROTO_SRC_PORT && len(v) >= 2:
						tpl.SrcPort = binary.BigEndian.Uint16(v)
					case typ == nl.CTA_PROTO_DST_PORT && len(v) >= 2:
						tpl.DstPort = binary.BigEndian.Uint16(v)
					}
				})
			}
		})
	})
	return flow, true
}

// eachAttr calls fn with the type (flags masked off) and value of each
// netlink attribute in b, stopping at the first malformed one.
func eachAttr(b []byte, fn func(typ uint16, v []byte)) {
	for len(b) >= 4 {
		n := int(binary.NativeEndian.Uint16(b))
		if n < 4 || n > len(b) {
			return
		}
		fn(binary.NativeEndian.Uint16(b[2:])&nl.NLA_TYPE_MASK, b[4:n])
		b = b[min((n+3)&^3, len(b)):]
	}
}

// endFrontendSockets ends the connected UDP sockets whose peer is one of
// frontends, of a process in cgroup or below, in every network namespace
// (the calling thread's only with SocketLBHostNetnsOnly: the caller keeps
// its goroutine on its thread, or runs where every thread is, the node's
// namespace).
func (d *Datapath) endFrontendSockets(cgroup string, frontends map[netip.AddrPort]bool) SocketTermination {
	t := d.maps.sockTerm
	if cgroup == "" || t == nil || t.method == SockDestroyNone {
		return SocketTermination{Method: SockDestroyNone}
	}
	var st unix.Stat_t
	if err := unix.Stat(cgroup, &st); err != nil {
		return SocketTermination{Method: t.method, Err: fmt.Errorf("cgroup %s: %w", cgroup, err)}
	}
	cgroupID := st.Ino // a cgroup2 directory's inode number is its cgroup id
	t.frontMu.Lock()
	defer t.frontMu.Unlock()
	method := t.method
	// bpf: the frontends iterator, loaded for this pass and closed after
	// it. If it does not load, the pass falls back to SOCK_DESTROY where
	// the kernel has it, and skips the sockets otherwise; either way the
	// load error is returned (the start's line is at Warn).
	var iter *frontendsIter
	var loadErr error
	if method == SockDestroyBPF {
		if iter, loadErr = loadFrontendsIter(t, cgroupID); loadErr != nil {
			if haveNetlinkDestroy() != nil {
				return SocketTermination{Method: SockDestroyNone, Err: loadErr}
			}
			method = SockDestroyNetlink
			loadErr = fmt.Errorf("%w (fell back to netlink SOCK_DESTROY)", loadErr)
		} else {
			defer func() { _ = iter.close() }() // BPF descriptors only; run once
		}
	}
	res := SocketTermination{Method: method}
	var scope map[uint64]bool // netlink: the cgroups socket load balancing covers; nil: every one
	if method == SockDestroyNetlink && cgroupID != cgroupRootID {
		var err error
		if scope, err = cgroupsBelow(cgroup); err != nil {
			res.Err = errors.Join(loadErr, err)
			return res
		}
	}
	namespaces := networkNamespaces()
	if d.cfg.SocketLBHostNetnsOnly {
		// The caller's, the node's: its thread's namespace, held open
		// while the pass runs, so that no thread's exit can hide it.
		self, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			res.Err = errors.Join(loadErr, fmt.Errorf("the node's network namespace: %w", err))
			return res
		}
		defer func() { _ = self.Close() }() // opened to read only
		namespaces = []string{fmt.Sprintf("/proc/self/fd/%d", self.Fd())}
	}
	errs := []error{loadErr}
	for _, ns := range namespaces {
		var err error
		if method == SockDestroyBPF {
			err = inNetns(ns, func() error { return readIter(iter.iter, &res) })
		} else {
			err = inNetns(ns, func() error { return destroyNetlinkFrontends(frontends, scope, d.maps.translated, &res) })
		}
		// A namespace listed that is gone (its process exited) is none
		// to judge; the node's, with SocketLBHostNetnsOnly, must be.
		if err != nil && (d.cfg.SocketLBHostNetnsOnly || !errors.Is(err, os.ErrNotExist)) {
			errs = append(errs, fmt.Errorf("network namespace %s: %w", ns, err))
		} else if err == nil {
			res.Namespaces++
		}
	}
	res.Err = errors.Join(errs...)
	return res
}

// cgroupRootID is the cgroup id of the cgroup2 root.
const cgroupRootID = 1

// cgroupsBelow returns the ids of the cgroup2 directory dir and of every
// cgroup below it.
func cgroupsBelow(dir string) (map[uint64]bool, error) {
	ids := map[uint64]bool{}
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			if p != dir && errors.Is(err, fs.ErrNotExist) {
				return nil // a cgroup removed meanwhile
			}
			return err
		}
		if !e.IsDir() {
			return nil
		}
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			if errors.Is(err, unix.ENOENT) {
				return filepath.SkipDir
			}
			return err
		}
		ids[st.Ino] = true
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("cgroups below %s: %w", dir, err)
	}
	return ids, nil
}

// diagUDP is a connected UDP socket as sock_diag lists it.
type diagUDP struct {
	id udpSocketID
	// cgroup is its cgroup's id (INET_DIAG_CGROUP_ID, Linux 5.7);
	// hasCgroup says whether the kernel gave it.
	cgroup    uint64
	hasCgroup bool
}

// inetDiagCgroupID is INET_DIAG_CGROUP_ID, an attribute of a socket in
// sock_diag's answer.
const inetDiagCgroupID = 21

// connectedUDP lists the calling thread's namespace's connected UDP
// sockets of family (AF_INET or AF_INET6), with their cgroups.
func connectedUDP(family uint8) ([]diagUDP, error) {
	b := make([]byte, 56) // struct inet_diag_req_v2
	b[0] = family
	b[1] = unix.IPPROTO_UDP
	binary.NativeEndian.PutUint32(b[4:], 1<<tcpEstablished)
	binary.NativeEndian.PutUint32(b[48:], noCookie[0])
	binary.NativeEndian.PutUint32(b[52:], noCookie[1])
	req := nl.NewNetlinkRequest(nl.SOCK_DIAG_BY_FAMILY, unix.NLM_F_DUMP)
	req.AddRawData(b)
	var out []diagUDP
	var bad error
	err := req.ExecuteIter(unix.NETLINK_INET_DIAG, nl.SOCK_DIAG_BY_FAMILY, func(msg []byte) bool {
		s, err := parseDiagUDP(msg)
		if err != nil {
			bad = err
			return false
		}
		out = append(out, s)
		return true
	})
	if err == nil {
		err = bad
	}
	return out, err
}

// parseDiagUDP reads one answer of connectedUDP: a struct inet_diag_msg
// and its attributes.
func parseDiagUDP(msg []byte) (diagUDP, error) {
	const msgLen = 72 // struct inet_diag_msg
	if len(msg) < msgLen {
		return diagUDP{}, fmt.Errorf("sock_diag answer of %d bytes, shorter than struct inet_diag_msg", len(msg))
	}
	family := msg[0]
	addrAt := func(at int) netip.Addr {
		if family == unix.AF_INET {
			return netip.AddrFrom4([4]byte(msg[at : at+4]))
		}
		return netip.AddrFrom16([16]byte(msg[at : at+16])).Unmap()
	}
	s := diagUDP{id: udpSocketID{
		family: family,
		src:    netip.AddrPortFrom(addrAt(8), binary.BigEndian.Uint16(msg[4:])),
		dst:    netip.AddrPortFrom(addrAt(24), binary.BigEndian.Uint16(msg[6:])),
		ifidx:  binary.NativeEndian.Uint32(msg[40:]),
		cookie: [2]uint32{binary.NativeEndian.Uint32(msg[44:]), binary.NativeEndian.Uint32(msg[48:])},
	}}
	for a := msg[msgLen:]; len(a) >= 4; {
		n := int(binary.NativeEndian.Uint16(a))
		if n < 4 || n > len(a) {
			break
		}
		if binary.NativeEndian.Uint16(a[2:]) == inetDiagCgroupID && n >= 12 {
			s.cgroup, s.hasCgroup = binary.NativeEndian.Uint64(a[4:]), true
		}
		a = a[min((n+3)&^3, len(a)):]
	}
	return s, nil
}

// translated says whether connect4 (connect6) translated the socket
// cookie to its peer b (its sock_rev entry): b is then the backend Sluice
// picked, though it be a frontend too (an ExternalIP equal to a
// hostNetwork backend's node address and port, an EndpointSlice naming
// another Service's VIP).
func (m *Maps) translated(cookie uint64, b netip.AddrPort) bool {
	_, ok := m.translatedTo(cookie, b)
	return ok
}

// destroyNetlinkFrontends ends, with SOCK_DESTROY, the connected UDP
// sockets of the calling thread's namespace whose peer is one of
// frontends (an IPv4-mapped peer of a dual-stack socket as the IPv4
// address), of a cgroup in scope (nil: any), that connect4 (connect6) did
// not translate there (translated).
func destroyNetlinkFrontends(frontends map[netip.AddrPort]bool, scope map[uint64]bool,
	translated func(cookie uint64, peer netip.AddrPort) bool, res *SocketTermination) error {
	var errs []error
	noCgroup := 0
	for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
		socks, err := connectedUDP(family)
		if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
			errs = append(errs, fmt.Errorf("list UDP sockets of family %d: %w", family, err))
			continue
		}
		for _, s := range socks {
			switch frontendSocket(s, frontends, scope) {
			case frontendSocketSkip:
				continue
			case frontendSocketNoCgroup:
				noCgroup++
				continue
			}
			if translated(uint64(s.id.cookie[1])<<32|uint64(s.id.cookie[0]), s.id.dst) {
				continue
			}
			if err := netlinkDestroyUDP(s.id); err != nil {
				count(res, sockdestroySockTermVerdictSOCK_TERM_FAILED)
				errs = append(errs, fmt.Errorf("destroy UDP socket %s -> %s: %w", s.id.src, s.id.dst, err))
				continue
			}
			count(res, sockdestroySockTermVerdictSOCK_TERM_DESTROYED)
		}
	}
	if noCgroup > 0 {
		errs = append(errs, fmt.Errorf("%d UDP sockets connected to a frontend left open: the kernel gives no socket's cgroup "+
			"(sock_diag's INET_DIAG_CGROUP_ID, Linux 5.7) to tell whether socket load balancing's cgroup covers them", noCgroup))
	}
	return errors.Join(errs...)
}

// What destroyNetlinkFrontends does with a connected UDP socket.
const (
	frontendSocketSkip     = iota // its peer is no frontend, or its cgroup is out of scope
	frontendSocketEnd             // its peer is a frontend, its cgroup in scope (or any)
	frontendSocketNoCgroup        // its peer is a frontend; a scope is set, and its cgroup unknown
)

// frontendSocket judges s for destroyNetlinkFrontends: its peer among
// frontends, its cgroup in scope (nil: any). Before Linux 5.7 sock_diag
// gives no socket's cgroup: with a scope set (--cgroup not the root),
// such a socket is left open, and said so (frontendSocketNoCgroup), not
// skipped in silence.
func frontendSocket(s diagUDP, frontends map[netip.AddrPort]bool, scope map[uint64]bool) int {
	switch {
	case !frontends[s.id.dst]:
		return frontendSocketSkip
	case scope == nil:
		return frontendSocketEnd
	case !s.hasCgroup:
		return frontendSocketNoCgroup
	case !scope[s.cgroup]:
		return frontendSocketSkip
	}
	return frontendSocketEnd
}
