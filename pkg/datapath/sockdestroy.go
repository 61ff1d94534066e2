package datapath

// Ending the connected UDP sockets of backends that left (issue 11 item 6,
// the audit's B5).
//
// connect4 translates a socket once, so a connected UDP socket keeps
// sending to its backend after the backend has left its Service, for as
// long as the application keeps the socket. When the reconciler removes
// UDP backends it flushes their conntrack (FlushConntrack); the same call
// ends the sockets connected to them, in every network namespace on the
// node, so that the application's next call fails (ECONNABORTED) and it
// connects again, to a backend that is there. Which sockets qualify is
// bpf/sockdestroy.c's comment: connected, to a flushed backend, through a
// VIP (sluice_sock_rev), whose Service no longer has the backend.
// Unconnected sockets are never ended (they select again by themselves);
// they are counted, as spared.
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
}

func loadSockTerminator(spec *ebpf.CollectionSpec, opts *ebpf.CollectionOptions) (*sockTerminator, error) {
	var objs sockdestroyPrograms
	if err := spec.LoadAndAssign(&objs, opts); err != nil {
		return nil, fmt.Errorf("load socket destroy iterator: %w", verifierDetail(err))
	}
	it, err := link.AttachIter(link.IterOptions{Program: objs.SluiceSockDestroy})
	if err != nil {
		_ = objs.Close() // BPF descriptors only; err says why
		return nil, fmt.Errorf("attach socket destroy iterator: %w", err)
	}
	return &sockTerminator{method: SockDestroyBPF, prog: objs.SluiceSockDestroy, iter: it}, nil
}

func (t *sockTerminator) Close() error {
	if t == nil {
		return nil
	}
	var errs []error
	if t.iter != nil {
		errs = append(errs, t.iter.Close())
	}
	return errors.Join(append(errs, t.prog.Close())...)
}

// OnSocketTermination makes every flush that ends or spares sockets, or
// fails to, report what it did to f (the agent's log and metrics).
func (m *Maps) OnSocketTermination(f func(SocketTermination)) { m.onSockTerm = f }

// terminateSockets ends the connected sockets of the UDP backends in keys,
// which are in sluice_ct_flush while it runs (flushBatch).
func (m *Maps) terminateSockets(keys []sockCtBackendKey) {
	t := m.sockTerm
	if t == nil || t.method == SockDestroyNone {
		return
	}
	udp := map[sockCtBackendKey]bool{}
	for _, k := range keys {
		if k.Proto == uint8(model.UDP) {
			udp[k] = true
		}
	}
	if len(udp) == 0 {
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
	r, err := t.iter.Open()
	if err != nil {
		return fmt.Errorf("open socket iterator: %w", err)
	}
	defer func() { _ = r.Close() }() // read to its end below, or failed already
	out, err := io.ReadAll(r)
	if err != nil {
		return fmt.Errorf("read socket iterator: %w", err)
	}
	const size = 16 // struct sock_term_rec (_Static_assert in C)
	if len(out)%size != 0 {
		return fmt.Errorf("socket iterator wrote %d bytes, not whole %d-byte records", len(out), size)
	}
	for ; len(out) > 0; out = out[size:] {
		count(res, sockdestroySockTermVerdict(out[14]))
	}
	return nil
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
// ends those that qualify with SOCK_DESTROY.
func (m *Maps) destroyNetlink(flushed map[sockCtBackendKey]bool, res *SocketTermination) error {
	socks, err := netlink.SocketDiagUDP(unix.AF_INET)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return fmt.Errorf("list UDP sockets: %w", err)
	}
	var errs []error
	for _, s := range socks {
		cookie := uint64(s.ID.Cookie[1])<<32 | uint64(s.ID.Cookie[0])
		if s.State != tcpEstablished {
			for b := range flushed {
				if m.translatedTo(cookie, b) != nil {
					count(res, sockdestroySockTermVerdictSOCK_TERM_SPARED_UNCONNECTED)
					break
				}
			}
			continue
		}
		dst, ok := netip.AddrFromSlice(s.ID.Destination.To4())
		if !ok {
			continue
		}
		b := sockCtBackendKey{Addr: be32(dst), Port: be16(s.ID.DestinationPort), Proto: uint8(model.UDP)}
		if !flushed[b] {
			continue
		}
		rev := m.translatedTo(cookie, b)
		if rev == nil {
			continue
		}
		if m.stillBackend(rev, b) {
			count(res, sockdestroySockTermVerdictSOCK_TERM_SPARED_STILL_BACKEND)
			continue
		}
		src, _ := netip.AddrFromSlice(s.ID.Source.To4())
		err := netlinkDestroyUDP(udpSocketID{
			src:    netip.AddrPortFrom(src, s.ID.SourcePort),
			dst:    netip.AddrPortFrom(dst, s.ID.DestinationPort),
			ifidx:  s.ID.Interface,
			cookie: s.ID.Cookie,
		})
		if err != nil {
			count(res, sockdestroySockTermVerdictSOCK_TERM_FAILED)
			errs = append(errs, fmt.Errorf("destroy UDP socket %s -> %s: %w", src, dst, err))
			continue
		}
		count(res, sockdestroySockTermVerdictSOCK_TERM_DESTROYED)
	}
	return errors.Join(errs...)
}

// translatedTo returns the sluice_sock_rev entry of socket cookie for
// backend b, or nil: connect4 or sendmsg4 sent it there from a VIP.
func (m *Maps) translatedTo(cookie uint64, b sockCtBackendKey) *sockSockRevEntry {
	k := sockSockRevKey{Cookie: cookie, Addr: b.Addr, Port: b.Port}
	var v sockSockRevEntry
	if err := m.sockRev.Lookup(&k, &v); err != nil {
		return nil
	}
	return &v
}

// stillBackend reports whether the UDP Service of the VIP in rev still
// has backend b in one of its slots.
func (m *Maps) stillBackend(rev *sockSockRevEntry, b sockCtBackendKey) bool {
	key := sockLb4Key{Vip: rev.Vip, Port: rev.Port, Proto: uint8(model.UDP)}
	var master sockLb4Service
	if err := m.services.Lookup(&key, &master); err != nil {
		return false
	}
	for slot := uint32(1); slot <= master.Count && slot <= 0xffff; slot++ {
		key.Slot = uint16(slot)
		var sv sockLb4Service
		var be sockLb4Backend
		if m.services.Lookup(&key, &sv) != nil || m.backends.Lookup(sv.BackendId, &be) != nil {
			continue
		}
		if be.Addr == b.Addr && be.Port == b.Port {
			return true
		}
	}
	return false
}

// noCookie matches a socket whatever its cookie (INET_DIAG_NOCOOKIE).
var noCookie = [2]uint32{^uint32(0), ^uint32(0)}

// udpSocketID names one UDP socket for sock_diag.
type udpSocketID struct {
	src, dst netip.AddrPort
	ifidx    uint32
	cookie   [2]uint32
}

// netlinkDestroyUDP ends the IPv4 UDP socket id of the calling thread's
// network namespace with SOCK_DESTROY (struct inet_diag_req_v2).
func netlinkDestroyUDP(id udpSocketID) error {
	b := make([]byte, 56)
	b[0] = unix.AF_INET
	b[1] = unix.IPPROTO_UDP
	binary.BigEndian.PutUint16(b[8:], id.src.Port())
	binary.BigEndian.PutUint16(b[10:], id.dst.Port())
	src, dst := id.src.Addr().As4(), id.dst.Addr().As4()
	copy(b[12:16], src[:])
	copy(b[28:32], dst[:])
	binary.NativeEndian.PutUint32(b[44:], id.ifidx)
	binary.NativeEndian.PutUint32(b[48:], id.cookie[0])
	binary.NativeEndian.PutUint32(b[52:], id.cookie[1])
	req := nl.NewNetlinkRequest(nl.SOCK_DESTROY, unix.NLM_F_ACK)
	req.AddRawData(b)
	_, err := req.Execute(unix.NETLINK_INET_DIAG, 0)
	return err
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
