package e2e

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/agentproc"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
)

// The dual-stack Services of TestDualStackEndToEnd: web has a ClusterIP
// of each family over the same three pods, dns6 is IPv6 only (its
// targetPort named), and drain is dual-stack and loses its endpoints on
// the way.
const (
	web4VIP    = "10.96.0.20:80"
	web6VIP    = "[2001:db8:96::20]:80"
	web4Echo   = "10.96.0.20:9000"
	web6Echo   = "[2001:db8:96::20]:9000"
	dns6VIP    = "[2001:db8:96::21]:53"
	drain4VIP  = "10.96.0.22:80"
	drain6VIP  = "[2001:db8:96::22]:80"
	drain4UDP  = "10.96.0.22:53"
	drain6UDP  = "[2001:db8:96::22]:53"
	drain6Echo = "[2001:db8:96::22]:9000"
)

// brokenService6 is malformed, its second ClusterIP no address: the agent
// must report it, program none of it (not its valid first ClusterIP
// either) and apply everything else.
const brokenService6 = `apiVersion: v1
kind: Service
metadata:
  name: broken6
  namespace: default
spec:
  clusterIP: "2001:db8:96::30"
  clusterIPs: ["2001:db8:96::30", "2001:db8:96::3g"]
  ports:
  - name: http
    protocol: TCP
    port: 80
    targetPort: 8080
`

// setupDualStack starts the agent, with extraArgs, on the LB topology with
// its IPv6 plane, serving HTTP on :8080, TCP echo on :9000 and UDP echo
// on :5353 of every backend address of both families, and the Services
// above with drain over drain's addresses.
func setupDualStack(t *testing.T, extraArgs ...string) (e *env, write func(drain []string)) {
	t.Helper()
	bins, topo, lb := newLB(t, 3)
	v6 := lb.AddIPv6T(t)
	var addrs []string
	for i := range lb.Backends {
		addrs = append(addrs, lb.BackendAddrs[i].String(), v6.BackendAddrs[i].String())
	}
	e = newEnv(t, topo, lb, addrs)
	write = func(drain []string) {
		t.Helper()
		var v6only []string
		for _, a := range e.addrs {
			if strings.Contains(a, ":") {
				v6only = append(v6only, a)
			}
		}
		docs := agentproc.Services(
			agentproc.Service{Name: "web", ClusterIP: "10.96.0.20", ClusterIP6: "2001:db8:96::20", Endpoints: e.addrs,
				Ports: []agentproc.Port{agentproc.TCP("http", 80, 8080), agentproc.TCP("echo", 9000, 9000)}},
			agentproc.Service{Name: "dns6", ClusterIP: "2001:db8:96::21", Endpoints: v6only,
				Ports: []agentproc.Port{agentproc.UDP("dns", 53, 5353).Named()}},
			agentproc.Service{Name: "drain", ClusterIP: "10.96.0.22", ClusterIP6: "2001:db8:96::22", Endpoints: drain,
				Ports: []agentproc.Port{agentproc.TCP("http", 80, 8080), agentproc.UDP("dns", 53, 5353), agentproc.TCP("echo", 9000, 9000)}},
		)
		if err := agentproc.WriteFile(e.manifest, agentproc.Manifest(append([]string{brokenService6}, docs...)...)); err != nil {
			t.Fatal(err)
		}
	}
	write(e.addrs)
	e.startAgent(t, bins, topo, "e2e6", extraArgs)
	return e, write
}

// A dual-stack Service works over each family as its IPv4 half does: the
// IPv6 twins of TestClusterIPEndToEnd's subtests (same names, same
// helpers and assertions), from a client namespace (per packet, tc) and
// from a process on the node (socket layer), and of TestServiceMetrics.
func TestDualStackEndToEnd(t *testing.T) {
	e, write := setupDualStack(t, "--service-metrics")

	// 11 frontends (web's 2 ports and drain's 3 in each family, dns6);
	// 18 backends (each pod's address of each family, on 3 ports).
	t.Run("ReadyAndProgrammed", func(t *testing.T) {
		e.readyAndProgrammed(t, []string{web4VIP + "/TCP", web6VIP + "/TCP", web6Echo + "/TCP", dns6VIP + "/UDP",
			drain4VIP + "/TCP", drain6VIP + "/TCP", drain6UDP + "/UDP", drain6Echo + "/TCP"}, 11, 18)
	})

	t.Run("MalformedObjectReportedRestApplied", func(t *testing.T) {
		// The rest was applied: ReadyAndProgrammed saw every frontend.
		e.malformedReported(t, "default/broken6", "2001:db8:96::30")
	})

	// First, while no Service had traffic.
	t.Run("ServiceMetrics", func(t *testing.T) {
		checkServiceMetrics(t, e, serviceMetricsCase{
			web: web6VIP, dns: dns6VIP, drain: drain6VIP, dnsService: "dns6", ipHeader: 40,
			emptyDrain: func() { write(nil) },
		})
		// An IPv6 packet counts 40 bytes of header and its payload
		// length: each of 5 datagrams ("q0".."q4") through tc is 40 + 8
		// (UDP header) + 2 bytes. Replies are not counted.
		dns := func(family string) string { return svcSeries(family, "default", "dns6", "dns", "UDP") }
		before := e.stableServiceSeries(t)
		e.udpFromClient(t, dns6VIP, 5)
		after := e.stableServiceSeries(t)
		for family, want := range map[string]float64{"new_flows": 5, "packets": 5, "bytes": 5 * (40 + 8 + 2)} {
			if d := after[dns(family)] - before[dns(family)]; d != want {
				t.Errorf("%s grew by %v for 5 datagrams of 2 bytes from the client, want %v", dns(family), d, want)
			}
		}
		write(e.addrs) // back, for the subtests below
		e.waitServices(t, drain6VIP, func(l string) bool { return strings.Count(l, ":8080") == 3 })
	})

	t.Run("UDPNamedTargetPort", func(t *testing.T) { e.udpReachesAll(t, dns6VIP) })

	// A process on the node, in the agent's cgroup: the socket layer
	// connects it straight to a backend and still reports the VIP.
	t.Run("SocketLBFromNodeCgroup/IPv6", func(t *testing.T) { e.socketLBFromNodeCgroup(t, web6VIP, dns6VIP) })
	t.Run("SocketLBFromNodeCgroup/IPv4", func(t *testing.T) { e.socketLBFromNodeCgroup(t, web4VIP, drain4UDP) })

	// TestClusterIPEndToEnd/RemovedBackendKeepsEstablishedConnection over
	// IPv6: a backend that leaves gets no new connection, and one
	// established to it goes on (conntrack keeps its translation).
	t.Run("RemovedBackendKeepsEstablishedConnection", func(t *testing.T) {
		removed := e.backends[2]
		onRemoved, other := e.echoOnAndBeside(t, drain6Echo, removed)
		defer onRemoved.Close()
		defer other.Close()

		write(e.addrs[:4]) // backends 0 and 1, both families
		e.waitServices(t, drain6Echo, func(l string) bool {
			return !strings.Contains(l, e.addrs[5]) && strings.Count(l, ":9000") == 3 // frontend + 2 backends
		})
		for i := range 30 {
			c := e.lb.Client.MustDialEcho(t, drain6Echo, 3*time.Second)
			c.Close()
			if c.Backend == removed {
				t.Fatalf("new connection %d over IPv6 reached removed backend %s", i, removed)
			}
		}
		if who, err := onRemoved.Say("still there"); err != nil || who != removed {
			t.Errorf("established IPv6 connection to %s after its removal: backend %q, err %v", removed, who, err)
		}
		if who, err := other.Say("still there"); err != nil || who != other.Backend {
			t.Errorf("established IPv6 connection to %s: backend %q, err %v", other.Backend, who, err)
		}
		write(e.addrs) // back, for the subtests below
		e.waitServices(t, drain6Echo, func(l string) bool { return strings.Count(l, ":9000") == 4 })
	})

	// A node process's connected UDP socket to a backend that leaves is
	// ended (ECONNABORTED), over each family (bpf/sockdestroy.c, or
	// netlink SOCK_DESTROY on a kernel without the kfunc).
	t.Run("BackendRemoval", func(t *testing.T) {
		held := []*heldUDP{e.holdUDP(t, drain4UDP, e.backends[1:]...), e.holdUDP(t, drain6UDP, e.backends[1:]...)}
		before := socketTerminations(t, e.agent)
		write(e.addrs[:2]) // backend 1's two addresses
		e.waitServices(t, drain6VIP, func(l string) bool {
			return strings.Contains(l, e.addrs[1]) && !strings.Contains(l, e.addrs[3]) && !strings.Contains(l, e.addrs[5])
		})
		counts := e.spread(t, drain6VIP, 30)
		if counts[e.backends[0]] != 30 {
			t.Errorf("after removal of backends 2 and 3: %v, want all 30 on %s", counts, e.backends[0])
		}
		for _, h := range held {
			if h.peer != h.vip {
				t.Errorf("connected UDP socket to %s reports peer %s", h.vip, h.peer)
			}
			if got := h.ended(); got != "aborted" {
				t.Errorf("connected UDP socket to %s on %s, which left: %s, want it ended with ECONNABORTED", h.vip, h.who, got)
			}
		}
		// Counted once the flush that destroyed them is done.
		want := before + float64(len(held))
		testutil.EventuallyTrue(t, "the destroyed sockets to be counted", 5*time.Second, func() bool {
			return socketTerminations(t, e.agent) >= want
		})
		if got := socketTerminations(t, e.agent); got != want {
			t.Errorf("sluice_socket_terminations_total{result=\"destroyed\"} went from %v to %v, want %v", before, got, want)
		}
	})

	t.Run("EmptiedService", func(t *testing.T) {
		write(nil)
		e.waitServices(t, drain6VIP, func(l string) bool { return strings.Contains(l, "(none") })
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		c, err := e.lb.Client.DialContext(ctx, "tcp6", drain6VIP)
		if err == nil {
			c.Close()
			t.Fatal("connected to a Service without endpoints over IPv6")
		}
		// ICMPv6 port unreachable ends the connect at once: refused, not
		// a black hole that would run into the deadline.
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("connect from the client: %v, want connection refused", err)
		}
		if out := e.runInCgroupErr(t, "tcp", drain6VIP, 1); !strings.Contains(out, "connection refused") {
			t.Errorf("connect from the node: %q, want connection refused", out)
		}
	})

	// Last before the cleanup, the subtests that send many connections
	// to web: a new connection to drain, whose pods and ports are web's,
	// could find a pod's reply tuple held by a closed connection to web,
	// and was dropped when drain had no other pod to try (tc_ct_clash)
	// until that entry expired. A SYN now reopens a closed flow's tuple
	// (ct_reopens, TestCTClosedReplyTupleReopens), and one that clashes
	// with an open flow leaves from another client port (lb4_remap,
	// TestTCClashRemap); the order stays.
	for _, vip := range []string{web4VIP, web6VIP} {
		t.Run("TCPSpreadsUniformly/"+vip, func(t *testing.T) { e.spreadsUniformly(t, vip) })
	}

	// Stopping the agent leaves both families' traffic alone, as
	// kube-proxy's exit leaves its rules: the IPv6 programs, which the
	// attached entries tail-call, stay in their pinned program arrays
	// (an unpinned one is emptied by the kernel when the agent's last
	// reference goes). Established connections over both families go on,
	// and new ones are translated while no agent runs.
	t.Run("SurvivesAgentStopAndRestart", func(t *testing.T) {
		keep := map[string]*topology.EchoConn{}
		for _, vip := range []string{web4Echo, web6Echo} {
			keep[vip] = e.lb.Client.MustDialEcho(t, vip, 3*time.Second)
			defer keep[vip].Close()
		}
		// IPv6 requests run throughout the stop and the restart.
		before, traffic := e.stopUnderTraffic(t, web6VIP)
		restarted := false
		defer func() {
			// The later subtests need the agent, whatever failed here.
			if !restarted {
				_ = e.agent.Start()
				_ = e.agent.WaitReady(30 * time.Second)
			}
		}()
		for _, vip := range []string{web4VIP, web6VIP} {
			counts := e.spread(t, vip, 12)
			if n := counts[e.backends[0]] + counts[e.backends[1]] + counts[e.backends[2]]; n != 12 {
				t.Errorf("%s while the agent is stopped: %v", vip, counts)
			}
		}
		for vip, c := range keep {
			if who, err := c.Say("agent down"); err != nil || who != c.Backend {
				t.Errorf("established connection to %s while the agent is down: %q %v", vip, who, err)
			}
		}
		for _, pin := range []string{"sluice6_services_v2", "sluice6_tc_v1"} {
			if _, err := os.Stat(filepath.Join(e.agent.BPFFS, "sluice", pin)); err != nil {
				t.Errorf("pins gone after SIGTERM: %v", err)
			}
		}
		restarted = true
		e.restartUnchanged(t, before, traffic)
		for vip, c := range keep {
			if who, err := c.Say("agent back"); err != nil || who != c.Backend {
				t.Errorf("established connection to %s after the restart: %q %v", vip, who, err)
			}
		}
	})

	// `sluice cleanup` removes the IPv6 maps and the IPv6 programs in
	// their pinned program arrays, which outlive the agent, as well as
	// IPv4's; neither family's VIP answers after it.
	t.Run("CleanupRemovesEverything", func(t *testing.T) { e.cleanupRemovesEverything(t, "sluice6_", web6VIP, web4VIP) })
}

// socketTerminations is the agent's count of the sockets it destroyed,
// over its method (sluice_socket_terminations_total{result="destroyed"}).
func socketTerminations(t *testing.T, a *agentproc.Agent) float64 {
	t.Helper()
	m, err := a.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, l := range strings.Split(m, "\n") {
		if !strings.HasPrefix(l, "sluice_socket_terminations_total{") || !strings.Contains(l, `result="destroyed"`) {
			continue
		}
		f := strings.Fields(l)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("/metrics: %q: %v", l, err)
		}
		sum += v
	}
	return sum
}
