package datapath

// Ending the connected UDP sockets of backends that left (issue 11 item 6,
// the audit's B5).
//
// connect4 (connect6) translates a socket once, so a connected UDP socket
// keeps sending to its backend after the backend has left its Service,
// for as long as the application keeps the socket. When the reconciler
// removes UDP backends it flushes their conntrack (FlushConntrack); the
// same call ends the sockets connected to them, in every network
// namespace on the node, so that the application's next call fails
// (ECONNABORTED) and it connects again, to a backend that is there. Which
// sockets qualify is bpf/sockdestroy.c's comment: connected, to a flushed
// backend, through a VIP (sluice_sock_rev, or sluice6_sock_rev for an
// IPv6 backend), whose Service no longer has the backend. Unconnected
// sockets are never ended (they select again by themselves); they are
// counted, as spared.
//
// IPv6 backends (issue 10) are flushed in passes of their own
// (sluice6_ct_flush), each followed by the same search. The family that
// decides is the backend's: a dual-stack (AF_INET6) socket connected to
// ::ffff:a.b.c.d reached an IPv4 backend through the IPv4 Service, and is
// ended after the IPv4 flush, as an AF_INET socket to it would be.
//
// Two methods (Features.SockDestroy): the iterator of bpf/sockdestroy.c
// calling bpf_sock_destroy (Linux 6.5+), or, below that, sock_diag's
// SOCK_DESTROY with the same rules applied here. TCP is left alone: a
// connection to a pod that is gone fails by itself, and one to a
// terminating pod should drain, as it does with kube-proxy.
//
// Sockets are per network namespace, and an iterator (like a sock_diag
// socket) sees those of the namespace it was created in. The namespaces
// are found where the runtime and the processes keep them: the agent's
// own, every process's (/proc/*/ns/net, all of them with hostPID) and the
// named ones (/run/netns, where CNI runtimes pin pod sandboxes).

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/pkg/model"
)

// SocketTermination is what one flush did to the sockets of its backends.
type SocketTermination struct {
	Method SockDestroyMethod
	// Backends is how many UDP backends were flushed.
	Backends int
	// Namespaces is how many network namespaces were searched.
	Namespaces int
	// Destroyed sockets were connected to a flushed backend through a
	// VIP whose Service no longer has it; Failed ones too, but the kernel
	// refused to end them.
	Destroyed, Failed int
	// SparedUnconnected sockets are unconnected and had sent to a
	// flushed backend through a VIP: they select again by themselves.
	// SparedStillBackend sockets are connected to a flushed backend that
	// their VIP's Service still has.
	SparedUnconnected, SparedStillBackend int
	// Err is what went wrong, if anything (some namespaces may have been
	// searched all the same).
	Err error
}

// sockTerminator ends sockets, by one of the methods.
type sockTerminator struct {
	method SockDestroyMethod
	prog   *ebpf.Program // bpf: sluice_sock_destroy
	iter   *link.Iter    // bpf: the iterator link of prog
	// bpf: what sluice_sock_destroy_frontends (staleudp.go: run once, at
	// the start) is loaded from when it runs, and closed after: not at
	// Open, so that it neither stays loaded for the agent's life nor, if
	// it fails to load, costs the start or the iterator above.
	spec    *ebpf.CollectionSpec
	opts    *ebpf.CollectionOptions
	frontMu sync.Mutex // held while the frontends iterator is loaded and runs
}

func loadSockTerminator(spec *ebpf.CollectionSpec, opts *ebpf.CollectionOptions) (*sockTerminator, error) {
	var objs struct {
		SluiceSockDestroy *ebpf.Program `ebpf:"sluice_sock_destroy"`
	}
	if err := spec.LoadAndAssign(&objs, opts); err != nil {
		return nil, fmt.Errorf("load socket destroy iterator: %w", verifierDetail(err))
	}
	t := &sockTerminator{method: SockDestroyBPF, prog: objs.SluiceSockDestroy, spec: spec, opts: opts}
	var err error
	if t.iter, err = link.AttachIter(link.IterOptions{Program: t.prog}); err != nil {
		_ = t.Close() // BPF descriptors only; err says why
		return nil, fmt.Errorf("attach socket destroy iterator: %w", err)
	}
	return t, nil
}

// frontendsIter is the iterator of sluice_sock_destroy_frontends, judging
// by cgroupID; close closes it and its program.
type frontendsIter struct {
	prog *ebpf.Program
	iter *link.Iter
}

func (f *frontendsIter) close() error {
	var errs []error
	if f.iter != nil {
		errs = append(errs, f.iter.Close())
	}
	return errors.Join(append(errs, f.prog.Close())...)
}

// loadFrontendsIter loads and attaches sluice_sock_destroy_frontends with
// frontends_cgroup_id set to cgroupID. A variable for tests to make it
// fail.
var loadFrontendsIter = func(t *sockTerminator, cgroupID uint64) (*frontendsIter, error) {
	var objs struct {
		Prog     *ebpf.Program  `ebpf:"sluice_sock_destroy_frontends"`
		CgroupID *ebpf.Variable `ebpf:"frontends_cgroup_id"`
	}
	if err := t.spec.LoadAndAssign(&objs, t.opts); err != nil {
		return nil, fmt.Errorf("load socket destroy iterator of frontends: %w", verifierDetail(err))
	}
	f := &frontendsIter{prog: objs.Prog}
	if err := objs.CgroupID.Set(cgroupID); err != nil {
		_ = f.close() // BPF descriptors only; err says why
		return nil, fmt.Errorf("set the socket iterator's cgroup: %w", err)
	}
	var err error
	if f.iter, err = link.AttachIter(link.IterOptions{Program: f.prog}); err != nil {
		_ = f.close() // BPF descriptors only; err says why
		return nil, fmt.Errorf("attach socket destroy iterator of frontends: %w", err)
	}
	return f, nil
}

func (t *sockTerminator) Close() error {
	if t == nil {
		return nil
	}
	var errs []error
	if t.iter != nil {
		errs = append(errs, t.iter.Close())
	}
	if t.prog != nil {
		errs = append(errs, t.prog.Close())
	}
	return errors.Join(errs...)
}

// OnSocketTermination makes every flush that ends or spares sockets, or
// fails to, report what it did to f (the agent's log and metrics).
func (m *Maps) OnSocketTermination(f func(SocketTermination)) { m.onSockTerm = f }

// terminateSockets ends the connected sockets of the UDP backends in keys,
// which are in sluice_ct_flush while it runs (flushBatch).
func (m *Maps) terminateSockets(keys []sockCtBackendKey) {
	m.terminateUDP(udpBackends(keys, func(k sockCtBackendKey) (uint8, netip.AddrPort) {
		return k.Proto, netip.AddrPortFrom(addrFromBE32(k.Addr), portFromBE16(k.Port))
	}))
}

// terminateSockets6 is terminateSockets for IPv6 backends, in
// sluice6_ct_flush.
func (m *Maps) terminateSockets6(keys []tcCt6BackendKey) {
	m.terminateUDP(udpBackends(keys, func(k tcCt6BackendKey) (uint8, netip.AddrPort) {
		return k.Proto, netip.AddrPortFrom(netip.AddrFrom16(k.Addr.Addr), portFromBE16(k.Port))
	}))
}

// udpBackends returns the UDP backends among keys, whose protocol and
// address of returns.
func udpBackends[K any](keys []K, of func(K) (uint8, netip.AddrPort)) map[netip.AddrPort]bool {
	udp := map[netip.AddrPort]bool{}
	for _, k := range keys {
		if proto, b := of(k); proto == uint8(model.UDP) {
			udp[b] = true
		}
	}
	return udp
}

// terminateUDP ends the connected sockets of the UDP backends udp, which
// are in their family's flush set while it runs.
func (m *Maps) terminateUDP(udp map[netip.AddrPort]bool) {
	t := m.sockTerm
	if t == nil || t.method == SockDestroyNone || len(udp) == 0 {
		return
	}
	res := SocketTermination{Method: t.method, Backends: len(udp)}
	var errs []error
	for _, ns := range networkNamespaces() {
		var err error
		if t.method == SockDestroyBPF {
			err = inNetns(ns, func() error { return t.runIter(&res) })
		} else {
			err = inNetns(ns, func() error { return m.destroyNetlink(udp, &res) })
		}
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("network namespace %s: %w", ns, err))
		} else if err == nil {
			res.Namespaces++
		}
	}
	res.Err = errors.Join(errs...)
	if m.onSockTerm != nil && (res.Destroyed+res.Failed+res.SparedUnconnected+res.SparedStillBackend > 0 || res.Err != nil) {
		m.onSockTerm(res)
	}
}

// runIter runs the iterator in the calling thread's network namespace and
// counts the sockets it reports.
func (t *sockTerminator) runIter(res *SocketTermination) error {
	return readIter(t.iter, res)
}

// readIter runs the iterator it in the calling thread's network namespace
// and counts the sockets it reports.
func readIter(it *link.Iter, res *SocketTermination) error {
	r, err := it.Open()
	if err != nil {
		return fmt.Errorf("open socket iterator: %w", err)
	}
	defer func() { _ = r.Close() }() // read to its end below, or failed already
	out, err := io.ReadAll(r)
	if err != nil {
		return fmt.Errorf("read socket iterator: %w", err)
	}
	for len(out) > 0 {
		n, v, err := sockTermRecord(out)
		if err != nil {
			return err
		}
		count(res, v)
		out = out[n:]
	}
	return nil
}

// The iterator's records: struct sock_term_rec, or for an IPv6 backend
// struct sock_term6_rec, which begins with one whose V6 is set.
var (
	sockTermRecSize   = int(unsafe.Sizeof(sockdestroySockTermRec{}))
	sockTerm6RecSize  = int(unsafe.Sizeof(sockdestroySockTerm6Rec{}))
	sockTermVerdictAt = int(unsafe.Offsetof(sockdestroySockTermRec{}.Verdict))
	sockTermV6At      = int(unsafe.Offsetof(sockdestroySockTermRec{}.V6))
)

// sockTermRecord returns the size and verdict of the record that out
// begins with.
func sockTermRecord(out []byte) (int, sockdestroySockTermVerdict, error) {
	n := sockTermRecSize
	if len(out) >= n && out[sockTermV6At] != 0 {
		n = sockTerm6RecSize
	}
	if len(out) < n {
		return 0, 0, fmt.Errorf("socket iterator wrote %d bytes at the end, not a whole %d-byte record", len(out), n)
	}
	return n, sockdestroySockTermVerdict(out[sockTermVerdictAt]), nil
}

func count(res *SocketTermination, v sockdestroySockTermVerdict) {
	switch v {
	case sockdestroySockTermVerdictSOCK_TERM_DESTROYED:
		res.Destroyed++
	case sockdestroySockTermVerdictSOCK_TERM_FAILED:
		res.Failed++
	case sockdestroySockTermVerdictSOCK_TERM_SPARED_UNCONNECTED:
		res.SparedUnconnected++
	case sockdestroySockTermVerdictSOCK_TERM_SPARED_STILL_BACKEND:
		res.SparedStillBackend++
	}
}

// tcpEstablished is a connected UDP socket's state (tcp_states.h).
const tcpEstablished = 1

// destroyNetlink applies bpf/sockdestroy.c's rules to the UDP sockets of
// the calling thread's network namespace, as sock_diag lists them, and
// ends those that qualify with SOCK_DESTROY. The AF_INET6 sockets are
// listed whatever the family of the flushed backends: a dual-stack one
// connected to ::ffff:a.b.c.d reached an IPv4 backend, and is judged as an
// AF_INET socket to it would be.
func (m *Maps) destroyNetlink(flushed map[netip.AddrPort]bool, res *SocketTermination) error {
	var families []uint8
	for b := range flushed {
		if b.Addr().Is4() {
			families = append(families, unix.AF_INET)
			break
		}
	}
	families = append(families, unix.AF_INET6)
	var errs []error
	for _, family := range families {
		socks, err := netlink.SocketDiagUDP(family)
		if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
			errs = append(errs, fmt.Errorf("list UDP sockets of family %d: %w", family, err))
			continue
		}
		for _, s := range socks {
			if err := m.destroyNetlinkSocket(s, flushed, res); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// destroyNetlinkSocket judges one socket s of destroyNetlink, and ends it
// if it qualifies.
func (m *Maps) destroyNetlinkSocket(s *netlink.Socket, flushed map[netip.AddrPort]bool, res *SocketTermination) error {
	cookie := uint64(s.ID.Cookie[1])<<32 | uint64(s.ID.Cookie[0])
	if s.State != tcpEstablished {
		for b := range flushed {
			if _, ok := m.translatedTo(cookie, b); ok {
				count(res, sockdestroySockTermVerdictSOCK_TERM_SPARED_UNCONNECTED)
				break
			}
		}
		return nil
	}
	// The peer is the backend, unmapped if a dual-stack socket has it
	// IPv4-mapped.
	dst, ok := netip.AddrFromSlice(s.ID.Destination)
	if !ok {
		return nil
	}
	b := netip.AddrPortFrom(dst.Unmap(), s.ID.DestinationPort)
	if !flushed[b] {
		return nil
	}
	vip, ok := m.translatedTo(cookie, b)
	if !ok {
		return nil
	}
	if m.stillBackend(vip, b) {
		count(res, sockdestroySockTermVerdictSOCK_TERM_SPARED_STILL_BACKEND)
		return nil
	}
	src, _ := netip.AddrFromSlice(s.ID.Source)
	err := netlinkDestroyUDP(udpSocketID{
		family: s.Family,
		src:    netip.AddrPortFrom(src.Unmap(), s.ID.SourcePort),
		dst:    b,
		ifidx:  s.ID.Interface,
		cookie: s.ID.Cookie,
	})
	if err != nil {
		count(res, sockdestroySockTermVerdictSOCK_TERM_FAILED)
		return fmt.Errorf("destroy UDP socket %s -> %s: %w", src, dst, err)
	}
	count(res, sockdestroySockTermVerdictSOCK_TERM_DESTROYED)
	return nil
}

// translatedTo returns the VIP that connect or sendmsg sent socket cookie
// from to backend b, from the sock_rev map of b's family (connect6 keeps
// a dual-stack socket's IPv4-mapped one in the IPv4 map): whether it did.
func (m *Maps) translatedTo(cookie uint64, b netip.AddrPort) (netip.AddrPort, bool) {
	if is6(b.Addr()) {
		k := sockSock6RevKey{Cookie: cookie, Addr: v6addr(b.Addr()), Port: be16(b.Port())}
		var v sockSock6RevEntry
		if m.sockRev6 == nil || m.sockRev6.Lookup(&k, &v) != nil {
			return netip.AddrPort{}, false
		}
		return netip.AddrPortFrom(addrFrom16(v.Vip), portFromBE16(v.Port)), true
	}
	k := sockSockRevKey{Cookie: cookie, Addr: be32(b.Addr()), Port: be16(b.Port())}
	var v sockSockRevEntry
	if err := m.sockRev.Lookup(&k, &v); err != nil {
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(addrFromBE32(v.Vip), portFromBE16(v.Port)), true
}

// stillBackend reports whether the UDP Service of vip still has backend b
// in one of its slots.
func (m *Maps) stillBackend(vip, b netip.AddrPort) bool {
	p := Pinned{stateMaps: m.stateMaps()}
	cands, err := p.Candidates(vip, uint8(model.UDP), uint8(sockLbScopeLB_SCOPE_DEFAULT))
	if err != nil {
		return false
	}
	for _, c := range cands {
		if c.Addr == b {
			return true
		}
	}
	return false
}

// noCookie matches a socket whatever its cookie (INET_DIAG_NOCOOKIE).
var noCookie = [2]uint32{^uint32(0), ^uint32(0)}

// udpSocketID names one UDP socket of family (AF_INET or AF_INET6) for
// sock_diag.
type udpSocketID struct {
	family   uint8
	src, dst netip.AddrPort
	ifidx    uint32
	cookie   [2]uint32
}

// netlinkDestroyUDP ends the UDP socket id of the calling thread's network
// namespace with SOCK_DESTROY (struct inet_diag_req_v2).
func netlinkDestroyUDP(id udpSocketID) error {
	b := make([]byte, 56)
	b[0] = id.family
	b[1] = unix.IPPROTO_UDP
	binary.BigEndian.PutUint16(b[8:], id.src.Port())
	binary.BigEndian.PutUint16(b[10:], id.dst.Port())
	copy(b[12:28], diagAddr(id.family, id.src.Addr()))
	copy(b[28:44], diagAddr(id.family, id.dst.Addr()))
	binary.NativeEndian.PutUint32(b[44:], id.ifidx)
	binary.NativeEndian.PutUint32(b[48:], id.cookie[0])
	binary.NativeEndian.PutUint32(b[52:], id.cookie[1])
	req := nl.NewNetlinkRequest(nl.SOCK_DESTROY, unix.NLM_F_ACK)
	req.AddRawData(b)
	_, err := req.Execute(unix.NETLINK_INET_DIAG, 0)
	return err
}

// diagAddr is a as a socket of family has it for sock_diag: 4 bytes for
// AF_INET, 16 for AF_INET6, IPv4-mapped for a dual-stack socket's IPv4
// peer (which the kernel then looks up among the IPv4 sockets).
func diagAddr(family uint8, a netip.Addr) []byte {
	if family == unix.AF_INET {
		b := a.Unmap().As4()
		return b[:]
	}
	b := a.As16()
	return b[:]
}

// networkNamespaces returns a path to each network namespace on the node
// that the agent can see, each once: its own first, then those of
// processes, then the named ones.
func networkNamespaces() []string {
	seen := map[[2]uint64]bool{}
	var out []string
	add := func(p string) {
		var st unix.Stat_t
		if unix.Stat(p, &st) != nil {
			return
		}
		id := [2]uint64{st.Dev, st.Ino}
		if !seen[id] {
			seen[id] = true
			out = append(out, p)
		}
	}
	add("/proc/self/ns/net")
	if procs, err := os.ReadDir("/proc"); err == nil {
		for _, e := range procs {
			if strings.Trim(e.Name(), "0123456789") == "" {
				add(filepath.Join("/proc", e.Name(), "ns", "net"))
			}
		}
	}
	for _, dir := range []string{"/run/netns", "/var/run/netns"} {
		if names, err := os.ReadDir(dir); err == nil {
			for _, e := range names {
				add(filepath.Join(dir, e.Name()))
			}
		}
	}
	return out
}

// inNetns runs fn on an OS thread of its own that has joined the network
// namespace at path. If the thread cannot go back, it is not given back
// to the Go runtime (its goroutine ends locked to it).
func inNetns(path string, fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			done <- err
			return
		}
		defer func() { _ = orig.Close() }() // opened to read only
		target, err := os.Open(path)
		if err != nil {
			runtime.UnlockOSThread()
			done <- err
			return
		}
		err = unix.Setns(int(target.Fd()), unix.CLONE_NEWNET)
		_ = target.Close() // opened to read only; entered or not, it is done with
		if err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("enter: %w", err)
			return
		}
		fnErr := fn()
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			done <- errors.Join(fnErr, fmt.Errorf("leave: %w", err))
			return // still locked: the thread dies with the goroutine
		}
		runtime.UnlockOSThread()
		done <- fnErr
	}()
	return <-done
}
