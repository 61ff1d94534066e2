package datapath

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// Session affinity on the socket path, with real sockets: the client is the
// network namespace (bpf_get_netns_cookie), so every connect from one
// namespace reaches one backend, whatever socket or port it uses, and two
// namespaces are two clients. The socket programs are attached to a cgroup
// of the test's own, which the test process joins; each namespace holds the
// backend addresses on its loopback device, with a server on each that
// names itself.

// sockAffFamily is the socket tests' affinity Services of one family: a
// TCP and a UDP frontend over the same backends, reached by sockets of
// domain.
type sockAffFamily struct {
	name     string
	domain   int
	vip, udp model.L4Addr
	bes      []string
}

var (
	sockAff4 = sockAffFamily{"ipv4", unix.AF_INET, l4("10.96.0.40", 80, model.TCP), l4("10.96.0.41", 53, model.UDP),
		[]string{"10.200.1.1", "10.200.1.2", "10.200.1.3", "10.200.1.4"}}
	sockAff6 = sockAffFamily{"ipv6", unix.AF_INET6, l4("2001:db8:96::40", 80, model.TCP), l4("2001:db8:96::41", 53, model.UDP),
		[]string{"2001:db8:201::1", "2001:db8:201::2", "2001:db8:201::3", "2001:db8:201::4"}}
)

// affinityNS is a namespace with the backends of both families' affinity
// Services (TCP 8080, UDP 5353) on its loopback device.
func affinityNS(t *testing.T, name string) *topology.NS {
	t.Helper()
	ns := topology.NewNS(t, name)
	bes := append(slices.Clone(sockAff4.bes), sockAff6.bes...)
	addLoopbackAddrs(t, ns, bes...)
	for _, a := range bes {
		if _, err := ns.ServeTCPEcho(net.JoinHostPort(a, "8080"), a); err != nil {
			t.Fatal(err)
		}
		if _, err := ns.ServeUDPEcho(net.JoinHostPort(a, "5353"), a); err != nil {
			t.Fatal(err)
		}
	}
	return ns
}

// sockConnect opens a new TCP connection from ns to f's VIP and returns
// the backend that answered.
func sockConnect(t *testing.T, ns *topology.NS, f sockAffFamily) string {
	t.Helper()
	return sockAnswer(t, ns, f.domain, unix.SOCK_STREAM, func(fd int) (string, error) {
		if err := unix.Connect(fd, sockaddrIn(f.domain, f.vip)); err != nil {
			return "", fmt.Errorf("connect %s: %w", f.vip, err)
		}
		if _, err := unix.Write(fd, []byte("hi\n")); err != nil {
			return "", err
		}
		line, err := bufio.NewReader(fdReader(fd)).ReadString('\n')
		if err != nil {
			return "", fmt.Errorf("read from %s: %w", f.vip, err)
		}
		return line, nil
	})
}

// sockSendto sends one datagram from a new unconnected UDP socket in ns to
// f's UDP VIP and returns the backend that answered.
func sockSendto(t *testing.T, ns *topology.NS, f sockAffFamily) string {
	t.Helper()
	return sockAnswer(t, ns, f.domain, unix.SOCK_DGRAM, func(fd int) (string, error) {
		tv := unix.NsecToTimeval(int64(2 * time.Second))
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			return "", err
		}
		if err := unix.Sendto(fd, []byte("hi"), 0, sockaddrIn(f.domain, f.udp)); err != nil {
			return "", fmt.Errorf("sendto %s: %w", f.udp, err)
		}
		buf := make([]byte, 100)
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return "", fmt.Errorf("recvfrom %s: %w", f.udp, err)
		}
		return string(buf[:n]), nil
	})
}

// sockAnswer opens a new socket of domain and typ in ns, has exchange
// send over it and return the answer, and returns the answer's first word:
// the name of the backend that answered (the echo servers of affinityNS
// prefix their answers with it).
func sockAnswer(t *testing.T, ns *topology.NS, domain, typ int, exchange func(fd int) (string, error)) string {
	t.Helper()
	var name string
	err := ns.Do(func() error {
		fd, err := unix.Socket(domain, typ|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		answer, err := exchange(fd)
		if err != nil {
			return err
		}
		name, _, _ = strings.Cut(answer, " ")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return name
}

// fdReader reads a socket, for buffered reads.
type fdReader int

func (f fdReader) Read(p []byte) (int, error) { return unix.Read(int(f), p) }

// applySockAffinity programs f's TCP and UDP affinity Services with
// backends bes.
func applySockAffinity(t *testing.T, r *reconciler.Reconciler, f sockAffFamily, bes ...string) {
	t.Helper()
	var tcp, udp []model.L4Addr
	for _, b := range bes {
		tcp = append(tcp, l4(b, 8080, model.TCP))
		udp = append(udp, l4(b, 5353, model.UDP))
	}
	st := model.NewState()
	for _, s := range []*model.Service{affinityService(f.vip, time.Hour, tcp...), affinityService(f.udp, time.Hour, udp...)} {
		s.Backends = model.SortBackends(s.Backends)
		st.Services.Set(s.Frontend, s)
	}
	if err := r.Apply(st); err != nil {
		t.Fatal(err)
	}
}

func TestSockAffinity(t *testing.T) {
	d := newTestDatapath(t)
	joinSockCgroup(t, d)
	// One reconciler, as one agent: ids are one space over both families.
	r := reconciler.New(d.Maps(), nil)
	for _, f := range []sockAffFamily{sockAff4, sockAff6} {
		t.Run(f.name, func(t *testing.T) { testSockAffinity(t, d, r, f) })
	}
	expectCounted(t, d, "sock_xlate")
}

func testSockAffinity(t *testing.T, d *Datapath, r *reconciler.Reconciler, f sockAffFamily) {
	nsA, nsB := affinityNS(t, "affa-"+f.name), affinityNS(t, "affb-"+f.name)

	apply := func(bes ...string) { applySockAffinity(t, r, f, bes...) }
	apply(f.bes...)

	// sticky: every connection from one namespace reaches one backend.
	sticky := func(ns *topology.NS) string {
		t.Helper()
		first := sockConnect(t, ns, f)
		for i := range 16 {
			if got := sockConnect(t, ns, f); got != first {
				t.Fatalf("%s: connection %d reached %s, the first %s", ns.Name, i+1, got, first)
			}
		}
		return first
	}
	a, b := sticky(nsA), sticky(nsB)

	// Unconnected UDP: every new socket of a namespace, and every
	// datagram of it, reaches that namespace's UDP backend.
	udpFirst := sockSendto(t, nsA, f)
	for i := range 8 {
		if got := sockSendto(t, nsA, f); got != udpFirst {
			t.Fatalf("UDP socket %d from %s reached %s, the first %s", i+1, nsA.Name, got, udpFirst)
		}
	}

	// Two clients, two entries, each keyed by its namespace's cookie.
	es := sockAffEntries(t, d, f)
	cookieA, cookieB := netnsCookie(t, nsA), netnsCookie(t, nsB)
	if len(es) != 2 || es[cookieA].Backend.Addr().String() != a || es[cookieB].Backend.Addr().String() != b {
		t.Fatalf("affinity entries of %s: %+v; want %s's (cookie %d) on %s and %s's (cookie %d) on %s",
			f.vip, es, nsA.Name, cookieA, a, nsB.Name, cookieB, b)
	}

	// Independent: namespace A is moved to a backend other than B's (its
	// entry rewritten as the datapath writes one); B stays where it was.
	other := ""
	for _, x := range f.bes {
		if x != b {
			other = x
			break
		}
	}
	ks := mustDump(t, d.Maps())
	for s, id := range ks.Slots[reconciler.DefaultScope(f.vip)] {
		if ks.Backends[id].Addr.String() == other {
			e := es[cookieA]
			e.BackendID, e.Slot, e.Backend = id, uint16(s), netip.AddrPortFrom(addr(other), 8080)
			putSockAffEntry(t, d, e)
		}
	}
	if got := sockConnect(t, nsA, f); got != other {
		t.Fatalf("%s: reached %s, its entry names %s", nsA.Name, got, other)
	}
	if got := sockConnect(t, nsB, f); got != b {
		t.Errorf("%s: reached %s after %s's affinity changed, was stuck to %s", nsB.Name, got, nsA.Name, b)
	}

	// A's backend leaves: A selects among the others, never it, and
	// keeps what it selected; B, on another backend, stays.
	var rest []string
	for _, x := range f.bes {
		if x != other {
			rest = append(rest, x)
		}
	}
	apply(rest...)
	moved := sockConnect(t, nsA, f)
	if moved == other {
		t.Fatalf("%s: reached %s, which left", nsA.Name, other)
	}
	for i := range 8 {
		if got := sockConnect(t, nsA, f); got != moved {
			t.Fatalf("%s: connection %d reached %s after reselecting %s", nsA.Name, i+1, got, moved)
		}
	}
	if got := sockConnect(t, nsB, f); got != b {
		t.Errorf("%s: reached %s, was stuck to %s, which stayed", nsB.Name, got, b)
	}
}

// sockAffEntries returns the socket path's affinity entries of f's TCP
// frontend by netns cookie, failing t on an entry keyed otherwise.
func sockAffEntries(t *testing.T, d *Datapath, f sockAffFamily) map[uint64]AffinityEntry {
	t.Helper()
	all, err := d.Maps().Affinity()
	if err != nil {
		t.Fatal(err)
	}
	out := map[uint64]AffinityEntry{}
	for _, e := range all {
		if e.Frontend == reconciler.DefaultScope(f.vip) {
			if e.NetnsCookie == 0 || e.Client.IsValid() {
				t.Errorf("socket path entry not keyed by a namespace: %+v", e)
			}
			out[e.NetnsCookie] = e
		}
	}
	return out
}

// putSockAffEntry writes e, a socket path entry, into its family's map as
// the datapath writes one.
func putSockAffEntry(t *testing.T, d *Datapath, e AffinityEntry) {
	t.Helper()
	master, err := serviceKey(e.Frontend, 0)
	if err != nil {
		t.Fatal(err)
	}
	kind := uint32(sockAffinityClientAFFINITY_CLIENT_NETNS)
	be := e.Backend
	if be.Addr().Is4() {
		k := sockLb4AffinityKey{Client: e.NetnsCookie, Master: master, Kind: kind}
		v := sockLb4Affinity{Expires: e.Expires, BackendId: uint32(e.BackendID), Addr: be32(be.Addr()), Port: be16(be.Port()), Slot: e.Slot}
		err = d.Maps().affinity.Put(&k, &v)
	} else {
		k := sockLb6AffinityKey{Master: lb6Key(master, e.Frontend.Addr), Kind: kind}
		binary.NativeEndian.PutUint64(k.Client.Addr[:8], e.NetnsCookie)
		v := sockLb6Affinity{Expires: e.Expires, BackendId: uint32(e.BackendID), Addr: v6addr(be.Addr()), Port: be16(be.Port()), Slot: e.Slot}
		err = d.Maps().affinity6.Put(&k, &v)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// netnsCookie returns the cookie of ns, as the kernel reports it for a
// socket there (SO_NETNS_COOKIE): what bpf_get_netns_cookie gives the
// socket programs.
func netnsCookie(t *testing.T, ns *topology.NS) uint64 {
	t.Helper()
	var c uint64
	err := ns.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		c, err = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
		return err
	})
	if err != nil {
		t.Fatalf("SO_NETNS_COOKIE in %s: %v", ns.Name, err)
	}
	return c
}

// TestSockAffinityTwoScopes: at the socket, with a local traffic
// detector (--cluster-cidr; the test's namespace is not the one the
// datapath was opened in, so its sockets are a pod's, internal only
// with one: sockscope_test.go), every client is internal, so
// an externalTrafficPolicy Local frontend with session affinity keeps it
// in its internal scope: a namespace sticks to one of all the endpoints
// (never held to the external scope's one), under the internal scope's
// master key. Over each family (sockAff4, sockAff6: the IPv6 one in
// sluice6's affinity map).
func TestSockAffinityTwoScopes(t *testing.T) {
	for _, f := range []sockAffFamily{sockAff4, sockAff6} {
		t.Run(f.name, func(t *testing.T) {
			d := openTestWith(t, smallConfig, func(c *Config) {
				c.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32")}
			})
			joinSockCgroup(t, d)
			ns := affinityNS(t, "afftwo")
			s := &model.Service{Name: model.ServicePortName{Namespace: "test", Name: "two"}, Kind: model.NodePort, Frontend: f.vip,
				Backends: []model.Backend{{L4Addr: l4(f.bes[0], 8080, model.TCP)}}, ExternalLocal: true, TwoScopes: true,
				AffinityTimeout: time.Hour}
			for _, b := range f.bes {
				s.InternalBackends = append(s.InternalBackends, model.Backend{L4Addr: l4(b, 8080, model.TCP)})
			}
			st := model.NewState()
			st.Services.Set(s.Frontend, s)
			if err := reconciler.New(d.Maps(), nil).Apply(st); err != nil {
				t.Fatal(err)
			}

			// Clients of the internal scope spread over all four
			// endpoints, so a namespace that reached the same one 16
			// times is stuck to it.
			first := sockConnect(t, ns, f)
			for i := range 16 {
				if got := sockConnect(t, ns, f); got != first {
					t.Fatalf("connection %d reached %s, the first %s", i+1, got, first)
				}
			}
			all, err := d.Maps().Affinity()
			if err != nil {
				t.Fatal(err)
			}
			in := reconciler.Frontend{L4Addr: f.vip, Scope: reconciler.ScopeInternal}
			if len(all) != 1 || all[0].Frontend != in || all[0].NetnsCookie != netnsCookie(t, ns) || all[0].Backend.Addr().String() != first {
				t.Fatalf("affinity entries %+v: want one, of %s, for %s's namespace, on %s", all, in, ns.Name, first)
			}
		})
	}
}
