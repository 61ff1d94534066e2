package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
)

// TestNodePortsFollowLocal: where NodePorts are served as the interfaces'
// addresses change, as kube-proxy's GetNodeIPs reads them on every sync:
// with primary (no CIDRs) the node IP of each family only while an
// interface holds it (its /32 or /128, which kube-proxy matches against
// the interfaces), with CIDRs every local address inside them, and with a
// family taking every address of its own every one of that family, never
// a loopback one but 127.0.0.1 with --localhost-nodeports. The health
// checks keep listening where the start put them.
func TestNodePortsFollowLocal(t *testing.T) {
	a := netip.MustParseAddr
	p := netip.MustParsePrefix
	nodeIPs := []netip.Addr{a("192.168.0.2"), a("2001:db8::2")}
	for _, c := range []struct {
		name      string
		cidrs     []netip.Prefix
		local     []netip.Addr
		addrs     string
		localhost bool
	}{
		{"primary, both node IPs local", nil, []netip.Addr{a("127.0.0.1"), a("192.168.0.2"), a("192.168.1.2"), a("::1"), a("2001:db8::2")}, "[192.168.0.2 2001:db8::2]", true},
		{"primary, the IPv6 node IP on no interface", nil, []netip.Addr{a("127.0.0.1"), a("192.168.0.2"), a("2001:db8::3")}, "[192.168.0.2]", true},
		{"primary, no node IP on an interface", nil, []netip.Addr{a("127.0.0.1"), a("10.0.0.1")}, "[]", true},
		{"a CIDR: the addresses inside it now", []netip.Prefix{p("192.168.7.0/24"), p("::/0")},
			[]netip.Addr{a("192.168.0.2"), a("192.168.7.12"), a("192.168.7.13"), a("2001:db8::2")}, "[192.168.7.12 192.168.7.13 2001:db8::2]", true},
		{"a CIDR, its address gone", []netip.Prefix{p("192.168.7.0/24"), p("::/0")},
			[]netip.Addr{a("192.168.0.2"), a("192.168.7.13"), a("::1")}, "[192.168.7.13]", true},
		{"all: every address now, 127.0.0.1 with localhost NodePorts", []netip.Prefix{p("0.0.0.0/0"), p("::/0")},
			[]netip.Addr{a("127.0.0.1"), a("127.0.0.2"), a("10.9.9.9"), a("::1"), a("fd00::9")}, "[127.0.0.1 10.9.9.9 fd00::9]", true},
		{"all, no localhost NodePorts", []netip.Prefix{p("0.0.0.0/0"), p("::/0")},
			[]netip.Addr{a("127.0.0.1"), a("10.9.9.9")}, "[10.9.9.9]", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			np := nodePortsFor(c.cidrs, nodeIPs, c.local, c.localhost)
			if got := fmt.Sprint(np.Addrs); got != c.addrs {
				t.Errorf("NodePorts on %s, want %s", got, c.addrs)
			}
			if c.cidrs == nil {
				if got, want := fmt.Sprint(np.HealthHosts), "[192.168.0.2 2001:db8::2]"; got != want {
					t.Errorf("health checks on %s, want %s (where they listened from the start)", got, want)
				}
			}
		})
	}
}

// fakeSetter records the addresses a source is given.
type fakeSetter struct{ got chan []netip.Addr }

// hangBound bounds the test's waits on the watch, which a regression could
// leave waiting forever: it only turns such a hang into a failure (a
// passing run never waits for it).
const hangBound = time.Minute

// recvWithin receives from c, failing the test if nothing comes within
// hangBound.
func recvWithin[T any](t *testing.T, c <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(hangBound):
		t.Fatalf("%s: nothing within %v", what, hangBound)
		panic("unreachable")
	}
}

// sendWithin sends v on c, failing the test if it is not taken within
// hangBound.
func sendWithin[T any](t *testing.T, c chan<- T, v T, what string) {
	t.Helper()
	select {
	case c <- v:
	case <-time.After(hangBound):
		t.Fatalf("%s: not taken within %v", what, hangBound)
	}
}

func (f *fakeSetter) SetNodeAddresses(addrs []netip.Addr) { f.got <- addrs }

// TestNodePortWatch: the watch gives the source the served addresses
// when an address change makes them differ (and logs what was added and
// removed), not when they stay the same; a subscription that ends is
// logged and made again, and the addresses read again then, since changes
// may have been lost; a subscription that fails is retried. Each step is
// driven by the test's channels, not by time; a source given an unchanged
// set is told by the next value it gets (its channel is buffered: such a
// regression fails, it does not hang).
func TestNodePortWatch(t *testing.T) {
	defer func(d, r time.Duration) { nodeAddrDebounce, nodeAddrRetry = d, r }(nodeAddrDebounce, nodeAddrRetry)
	nodeAddrDebounce, nodeAddrRetry = 0, 0
	a := netip.MustParseAddr

	// reads hands the watch the addresses of each read.
	reads := make(chan []netip.Addr)
	type sub struct {
		c       chan struct{}
		stopped chan struct{}
	}
	subs := make(chan sub, 4)
	failSubscribe := make(chan bool, 4)
	var logBuf bytes.Buffer
	var logMu sync.Mutex
	log := slog.New(slog.NewTextHandler(writerFunc(func(b []byte) (int, error) {
		logMu.Lock()
		defer logMu.Unlock()
		return logBuf.Write(b)
	}), nil))
	w := &nodePortWatch{
		read: func() (nodePorts, error) { return nodePorts{Addrs: <-reads}, nil },
		subscribe: func() (*addrChanges, error) {
			if <-failSubscribe {
				return nil, errors.New("no netlink today")
			}
			s := sub{make(chan struct{}), make(chan struct{})}
			subs <- s
			var once sync.Once
			return &addrChanges{c: s.c, stop: func() { once.Do(func() { close(s.stopped) }) },
				err: func() error { return errors.New("ENOBUFS") }}, nil
		},
		log:    log,
		served: []netip.Addr{a("192.168.0.2")},
	}
	failSubscribe <- false
	w.changes, _ = w.subscribe()
	first := <-subs
	set := &fakeSetter{got: make(chan []netip.Addr, 4)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); w.run(ctx, set) }()

	// An address added.
	sendWithin(t, first.c, struct{}{}, "a change")
	sendWithin(t, reads, []netip.Addr{a("192.168.0.2"), a("192.168.7.12")}, "the read after a change")
	if got := fmt.Sprint(recvWithin(t, set.got, "the source's addresses")); got != "[192.168.0.2 192.168.7.12]" {
		t.Fatalf("source given %s", got)
	}
	// A change that leaves the served set as it is: nothing given (it
	// would be what the source is seen given next).
	sendWithin(t, first.c, struct{}{}, "a change")
	sendWithin(t, reads, []netip.Addr{a("192.168.0.2"), a("192.168.7.12")}, "the read after a change")
	// The subscription ends (an overrun socket), the next fails: the
	// watch subscribes again and reads what it may have missed: the
	// address removed.
	close(first.c)
	failSubscribe <- true
	failSubscribe <- false
	second := recvWithin(t, subs, "the subscription made again")
	recvWithin(t, first.stopped, "the ended subscription stopped")
	sendWithin(t, reads, []netip.Addr{a("192.168.0.2")}, "the read after subscribing again")
	if got := fmt.Sprint(recvWithin(t, set.got, "the source's addresses")); got != "[192.168.0.2]" {
		t.Fatalf("source given %s after the subscription was made again", got)
	}
	cancel()
	recvWithin(t, done, "the watch's end")
	recvWithin(t, second.stopped, "the last subscription stopped")

	logMu.Lock()
	out := logBuf.String()
	logMu.Unlock()
	for _, want := range []string{
		`msg="NodePort addresses changed" added=[192.168.7.12] removed=[] addresses="[192.168.0.2 192.168.7.12]"`,
		`msg="following the node's addresses: the subscription ended; subscribing again" err=ENOBUFS`,
		`msg="following the node's addresses: subscribe failed; retrying" err="no netlink today"`,
		`msg="NodePort addresses changed" added=[] removed=[192.168.7.12] addresses=[192.168.0.2]`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %s:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "NodePort addresses changed"); n != 2 {
		t.Errorf("%d changes logged, want 2:\n%s", n, out)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

// TestSubscribeAddrs: the subscription of the real watch, in a network
// namespace of the test's: an address added there is told,
// and stop ends it (its netlink goroutine drained, the socket closed).
func TestSubscribeAddrs(t *testing.T) {
	testutil.Privileged(t)
	topo := topology.NewT(t)
	ns := topo.AddNST(t, "addrs")
	var changes *addrChanges
	if err := ns.Do(func() (err error) { changes, err = subscribeAddrs(); return err }); err != nil {
		t.Fatal(err)
	}
	defer changes.stop()
	if err := ns.AddAddr("lo", netip.MustParsePrefix("192.168.7.12/32")); err != nil {
		t.Fatal(err)
	}
	if _, ok := <-changes.c; !ok {
		t.Fatalf("subscription ended: %v", changes.err())
	}
	changes.stop()
	for range changes.c { // closed by stop
	}
}

// TestWatchNodePortsWarnsNoneInRanges: at start, CIDRs with no local
// address inside them are warned of, as a primary node IP on no interface
// is: no NodePorts until an address inside them comes. Ranges that hold
// one (127.0.0.0/8: lo's) are not.
func TestWatchNodePortsWarnsNoneInRanges(t *testing.T) {
	const warned = `msg="no local address inside --nodeport-addresses: no NodePorts until one is"`
	for _, c := range []struct {
		cidr      string
		localhost bool
		warn      bool
	}{
		{"203.0.113.0/24", true, true},
		{"127.0.0.0/8", true, false},
	} {
		var logs bytes.Buffer
		plan := nodePortPlan{cidrs: []netip.Prefix{netip.MustParsePrefix(c.cidr), netip.MustParsePrefix("::1/128")}, localhost: c.localhost}
		w, np, err := watchNodePorts(plan, slog.New(slog.NewTextHandler(&logs, nil)))
		if err != nil {
			t.Fatalf("%s: %v", c.cidr, err)
		}
		w.stop()
		if strings.Contains(logs.String(), warned) != c.warn {
			t.Errorf("%s: NodePorts on %v, warned %v, want %v:\n%s", c.cidr, np.Addrs, !c.warn, c.warn, logs.String())
		}
	}
}

// TestNodePortPlanSkipsGoneDevice: with no node IP and no CIDR, NodePorts
// are on the devices' addresses, and a device that is gone (a pod's veth
// once named) is skipped: the others' addresses are still read, where a
// failed read would keep the served addresses frozen.
func TestNodePortPlanSkipsGoneDevice(t *testing.T) {
	testutil.Privileged(t)
	topo := topology.NewT(t)
	ns := topo.AddNST(t, "npgone")
	if err := ns.AddBridge("sl-np0"); err != nil {
		t.Fatal(err)
	}
	if err := ns.AddAddr("sl-np0", netip.MustParsePrefix("192.0.2.5/24")); err != nil {
		t.Fatal(err)
	}
	plan := nodePortPlan{devices: []string{"sl-gone0", "sl-np0"}}
	var np nodePorts
	if err := ns.Do(func() (err error) { np, err = plan.read(); return err }); err != nil {
		t.Fatal(err)
	}
	if want := []netip.Addr{netip.MustParseAddr("192.0.2.5")}; !slices.Equal(np.Addrs, want) {
		t.Fatalf("NodePorts on %v, want %v", np.Addrs, want)
	}
}
