package datapath

// Socket load balancing for the host's network namespace only
// (--socket-lb-host-netns-only, Cilium's socketLB.hostNamespaceOnly).
//
// The socket programs run for every socket of the cgroup they are
// attached to, whatever its network namespace: with the cgroup2 root
// (the DaemonSet's), every pod's too. kube-proxy translates in the host's
// namespace only, after anything a pod does to its own traffic, and two
// kinds of pod depend on that: a service mesh's sidecar, whose iptables
// REDIRECT inside the pod must see the ClusterIP (istio/istio#27619), and
// a cluster nested in a pod (kind), whose own ClusterIPs (10.96.0.1) the
// outer cluster's Services would capture. With the option the forward
// hooks translate only sockets of the namespace Open runs in (the
// agent's, hostNetwork: the host's), by its cookie in the programs'
// host_netns_cookie (bpf/lib/socklb.h); a pod's connection then leaves it
// for the VIP, and tc translates it per packet where it runs.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"golang.org/x/sys/unix"
)

// varHostNetnsCookie is the socket programs' constant for
// Config.SocketLBHostNetnsOnly: 0, every namespace's sockets.
const varHostNetnsCookie = "host_netns_cookie"

// varAgentNetnsCookie is the socket programs' cookie of the agent's
// namespace, set whatever SocketLBHostNetnsOnly says: a socket of
// another one (a pod's) is served by a two-scope frontend's internal
// scope only if the family has a local traffic detector
// (have_cluster_cidr, have_cluster_cidr6), as kube-proxy serves a pod's
// packet (bpf/lib/socklb.h sock_internal_client).
const varAgentNetnsCookie = "agent_netns_cookie"

// NetnsCookie returns the cookie of the calling thread's network
// namespace, what bpf_get_netns_cookie gives the programs for a socket
// there (SO_NETNS_COOKIE, Linux 5.14): the socket path's client key
// (ExplainSocket) and the namespace it serves with
// --socket-lb-host-netns-only (configureHostNetns). A goroutine that
// has joined another namespace (setns) must keep its OS thread locked
// (runtime.LockOSThread) until it has the cookie: the Go scheduler may
// otherwise move it to a thread of another namespace in between.
func NetnsCookie() (uint64, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("network namespace cookie: socket: %w", err)
	}
	defer func() { _ = unix.Close(fd) }() // read only: nothing to lose
	c, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	if err != nil {
		return 0, fmt.Errorf("network namespace cookie (SO_NETNS_COOKIE, Linux 5.14): %w", err)
	}
	return c, nil
}

// configureHostNetns sets the socket object's agent_netns_cookie to the
// cookie of the namespace the caller runs in (the node's), and its
// host_netns_cookie to the same with cfg.SocketLBHostNetnsOnly, else 0.
func configureHostNetns(spec *ebpf.CollectionSpec, cfg Config) error {
	own, err := NetnsCookie()
	if err != nil {
		return fmt.Errorf("socket load balancing: the agent's network namespace: %w", err)
	}
	var cookie uint64
	if cfg.SocketLBHostNetnsOnly {
		cookie = own
	}
	if err := setVariable(spec, "the socket object", varHostNetnsCookie, cookie); err != nil {
		return err
	}
	return setVariable(spec, "the socket object", varAgentNetnsCookie, own)
}

// AttachedHostNetns is what the agent's socket program attached to a
// hook says about --socket-lb-host-netns-only.
type AttachedHostNetns struct {
	Program   string // the attached program's name (sluice_connect4)
	ProgramID uint32
	// Cookie is its host_netns_cookie: the namespace it serves alone,
	// or 0 (every namespace's sockets; also an agent older than the
	// option, whose program has no such constant).
	Cookie uint64
	// Consts are the program's other load-time constants a dry run of
	// the socket path must share (explainConsts), as the agent set them;
	// one its build lacks is left out (the dry run's default then, what
	// such an agent did).
	Consts map[string][]byte
}

// explainConsts are the socket programs' constants that decide what a
// socket gets, besides host_netns_cookie: the agent's namespace and its
// local traffic detectors (a pod's scope, sock_internal_client), and
// the node's primary addresses (an unbound socket's source).
var explainConsts = []string{varAgentNetnsCookie, "have_cluster_cidr", "have_cluster_cidr6", "node_ip4", "node_ip6"}

// attachedHostNetns reads host_netns_cookie of the program behind the
// pinned link links/cgroup_<hook> under dir: the running agent's value,
// which this build's copy of the object (ExplainSocket's) does not know.
// It is read from the program's .rodata map at the offset that map's own
// BTF gives, so an agent of another build is read right. No pinned link
// (no socket programs attached) is nil.
func attachedHostNetns(dir, hook string) (*AttachedHostNetns, error) {
	pin := filepath.Join(dir, "links", "cgroup_"+hook)
	l, err := loadPinnedLink(pin)
	if err != nil || l == nil {
		return nil, err
	}
	defer l.Close()
	li, err := l.Info()
	if err != nil {
		return nil, fmt.Errorf("info of pinned link %s: %w", pin, err)
	}
	prog, err := ebpf.NewProgramFromID(li.Program)
	if err != nil {
		return nil, fmt.Errorf("program %d of pinned link %s: %w", li.Program, pin, err)
	}
	defer prog.Close()
	pi, err := prog.Info()
	if err != nil {
		return nil, fmt.Errorf("info of program %d (%s): %w", li.Program, hook, err)
	}
	a := &AttachedHostNetns{Program: pi.Name, ProgramID: uint32(li.Program)}
	ids, ok := pi.MapIDs()
	if !ok {
		return nil, fmt.Errorf("program %s (id %d): no map ids (kernel too old)", pi.Name, li.Program)
	}
	for _, id := range ids {
		vals, err := rodataVars(id, append([]string{varHostNetnsCookie}, explainConsts...))
		if err != nil {
			return nil, fmt.Errorf("program %s (id %d): %w", pi.Name, li.Program, err)
		}
		if c, found := vals[varHostNetnsCookie]; found {
			if len(c) != 8 {
				return nil, fmt.Errorf("program %s (id %d): %s is %d bytes, want 8", pi.Name, li.Program, varHostNetnsCookie, len(c))
			}
			a.Cookie = binary.NativeEndian.Uint64(c)
			delete(vals, varHostNetnsCookie)
			a.Consts = vals
			break
		}
	}
	return a, nil
}

// rodataU64 reads the 8-byte variable name of the map id if that map is
// a data section (.rodata) whose BTF declares it: found is false for any
// other map, and for a section without the variable.
func rodataU64(id ebpf.MapID, name string) (v uint64, found bool, err error) {
	vals, err := rodataVars(id, []string{name})
	if err != nil {
		return 0, false, err
	}
	b, found := vals[name]
	if !found {
		return 0, false, nil
	}
	if len(b) != 8 {
		return 0, false, fmt.Errorf("map %d: %s is %d bytes, want 8", id, name, len(b))
	}
	return binary.NativeEndian.Uint64(b), true, nil
}

// rodataVars reads the variables names of the map id, if that map is a
// data section (.rodata) whose BTF declares them: each one declared, by
// name, as its bytes; none for any other map.
func rodataVars(id ebpf.MapID, names []string) (map[string][]byte, error) {
	m, err := ebpf.NewMapFromID(id)
	if err != nil {
		return nil, fmt.Errorf("map %d: %w", id, err)
	}
	defer m.Close()
	mi, err := m.Info()
	if err != nil {
		return nil, fmt.Errorf("info of map %d: %w", id, err)
	}
	btfID, ok := mi.BTFID()
	if mi.Type != ebpf.Array || mi.MaxEntries != 1 || !ok || !strings.HasSuffix(mi.Name, ".rodata") {
		return nil, nil
	}
	h, err := btf.NewHandleFromID(btfID)
	if err != nil {
		return nil, fmt.Errorf("BTF %d of map %s: %w", btfID, mi.Name, err)
	}
	defer func() { _ = h.Close() }() // read only: nothing to lose
	spec, err := h.Spec(nil)
	if err != nil {
		return nil, fmt.Errorf("BTF %d of map %s: %w", btfID, mi.Name, err)
	}
	var ds *btf.Datasec
	if err := spec.TypeByName(".rodata", &ds); err != nil {
		if errors.Is(err, btf.ErrNotFound) {
			return nil, nil
		}
		return nil, fmt.Errorf("BTF %d of map %s: %w", btfID, mi.Name, err)
	}
	var buf []byte
	vals := map[string][]byte{}
	for _, vs := range ds.Vars {
		v, ok := vs.Type.(*btf.Var)
		if !ok || !slices.Contains(names, v.Name) {
			continue
		}
		if vs.Offset+vs.Size > mi.ValueSize {
			return nil, fmt.Errorf("map %s: %s is %d bytes at offset %d of %d", mi.Name, v.Name, vs.Size, vs.Offset, mi.ValueSize)
		}
		if buf == nil {
			buf = make([]byte, mi.ValueSize)
			if err := m.Lookup(uint32(0), buf); err != nil {
				return nil, fmt.Errorf("read map %s: %w", mi.Name, err)
			}
		}
		vals[v.Name] = slices.Clone(buf[vs.Offset : vs.Offset+vs.Size])
	}
	return vals, nil
}
