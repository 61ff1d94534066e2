package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil"
)

// serviceSeries returns the sluice_service_* samples of /metrics, by
// series as the exposition format spells it.
func (e *env) serviceSeries(t *testing.T) map[string]float64 {
	t.Helper()
	body, err := e.agent.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	out, err := testutil.Samples(strings.NewReader(body), func(line string) bool {
		return strings.HasPrefix(line, "sluice_service_") && !strings.HasPrefix(line, "sluice_service_unprogrammed")
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// stableServiceSeries waits until two reads a moment apart agree (the last
// packets of closed connections have been counted) and returns them.
func (e *env) stableServiceSeries(t *testing.T) map[string]float64 {
	t.Helper()
	var last map[string]float64
	testutil.Eventually(t, "the per-Service counters to settle", 10*time.Second, func() error {
		cur := e.serviceSeries(t)
		if last != nil && fmt.Sprint(cur) == fmt.Sprint(last) {
			return nil
		}
		last = cur
		time.Sleep(300 * time.Millisecond)
		return fmt.Errorf("still moving: %v", cur)
	})
	return last
}

// synsSent is how many TCP SYNs the client namespace has sent: its
// connects (ActiveOpens) and retransmissions (RetransSegs, all of which
// are SYNs while only refused connects are under way), both families'.
func (e *env) synsSent(t *testing.T) float64 {
	t.Helper()
	out, err := e.lb.Client.Command(t.Context(), "cat", "/proc/net/snmp").Output()
	if err != nil {
		t.Fatalf("/proc/net/snmp in the client: %v", err)
	}
	var names []string
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) == 0 || f[0] != "Tcp:" {
			continue
		}
		if names == nil {
			names = f
			continue
		}
		var n float64
		for i, name := range names {
			if i < len(f) && (name == "ActiveOpens" || name == "RetransSegs") {
				v, err := strconv.ParseFloat(f[i], 64)
				if err != nil {
					t.Fatalf("/proc/net/snmp: %s %q: %v", name, f[i], err)
				}
				n += v
			}
		}
		return n
	}
	t.Fatalf("/proc/net/snmp in the client has no Tcp counters:\n%s", out)
	return 0
}

func svcSeries(family, ns, name, port, proto string) string {
	return fmt.Sprintf(`sluice_service_%s_total{namespace=%q,port=%q,protocol=%q,service=%q}`, family, ns, port, proto, name)
}

// TestServiceMetrics reads the per-Service counters of a real agent
// (--service-metrics) through /metrics after real traffic over IPv4
// (checkServiceMetrics; TestDualStackEndToEnd/ServiceMetrics is its IPv6
// twin).
func TestServiceMetrics(t *testing.T) {
	e := setup(t, "--service-metrics")
	checkServiceMetrics(t, e, serviceMetricsCase{
		web: webVIP, dns: dnsVIP, drain: drainVIP, dnsService: "dns", ipHeader: 20,
		emptyDrain: func() { e.write(t, e.addrs, nil) },
	})
}

// serviceMetricsCase is what checkServiceMetrics drives, over one IP
// family: the VIPs of web (TCP HTTP, port http), dns (UDP echo, port dns,
// of Service dnsService) and drain (TCP HTTP, port http), Services of
// e's over its three backends that had no traffic yet; the size of an
// IP header of the family; and how to take drain's endpoints away.
type serviceMetricsCase struct {
	web, dns, drain string
	dnsService      string
	ipHeader        int
	emptyDrain      func()
}

// checkServiceMetrics sends traffic to c's Services and reads their
// counters: connections from a client namespace through tc (flows,
// packets and bytes), from the node's cgroup through the socket hooks
// (flows only: their packets never carry the Service's address), and
// refused connects to a Service without endpoints (drops by reason).
func checkServiceMetrics(t *testing.T, e *env, c serviceMetricsCase) {
	t.Helper()
	web := func(family string) string { return svcSeries(family, "default", "web", "http", "TCP") }
	dns := func(family string) string { return svcSeries(family, "default", c.dnsService, "dns", "UDP") }

	// Every programmed Service port has its series from the start, at
	// zero; no drop series before a drop.
	before := e.stableServiceSeries(t)
	for _, s := range []string{web("new_flows"), web("packets"), web("bytes"), dns("new_flows")} {
		if v, ok := before[s]; !ok || v != 0 {
			t.Errorf("%s = %v (present %v) before any traffic, want 0", s, v, ok)
		}
	}

	// Through tc: 20 HTTP requests from the client namespace, each on
	// a connection of its own.
	const requests = 20
	e.spread(t, c.web, requests)
	afterTC := e.stableServiceSeries(t)
	flows, packets, bytes := afterTC[web("new_flows")], afterTC[web("packets")], afterTC[web("bytes")]
	if flows != requests {
		t.Errorf("%s = %v after %d connections, want %d", web("new_flows"), flows, requests, requests)
	}
	// Each connection sends at least its SYN, its ACK, the request and
	// the ACK of the reply's FIN to the Service; every one is an IP
	// header and a TCP header of at least 20 bytes.
	if minBytes := float64(c.ipHeader + 20); packets < 4*requests || bytes < minBytes*packets {
		t.Errorf("%s = %v, %s = %v after %d connections: want at least 4 packets each, %v bytes a packet",
			web("packets"), packets, web("bytes"), bytes, requests, minBytes)
	}

	// Through the socket hooks: connects and datagrams from the node's
	// cgroup are new flows, and add no packets.
	if got := e.runInCgroup(t, "tcp", c.web, 5); len(got) != 5 {
		t.Fatalf("socket-balanced requests: %q", got)
	}
	if got := e.runInCgroup(t, "udp", c.dns, 3); len(got) != 3 {
		t.Fatalf("socket-balanced datagrams: %q", got)
	}
	afterSock := e.stableServiceSeries(t)
	if d := afterSock[web("new_flows")] - flows; d != 5 {
		t.Errorf("%s grew by %v for 5 socket-balanced connects, want 5", web("new_flows"), d)
	}
	if afterSock[web("packets")] != packets {
		t.Errorf("%s moved from %v to %v with socket-balanced traffic only", web("packets"), packets, afterSock[web("packets")])
	}
	if v := afterSock[dns("new_flows")]; v != 3 {
		t.Errorf("%s = %v after 3 socket-balanced datagrams, want 3", dns("new_flows"), v)
	}

	// A Service without endpoints: each SYN of 3 refused connects is a
	// no_endpoints drop. Over IPv4 that is one SYN a connect; over IPv6
	// often two, the client taking the ICMPv6 error for a soft one until
	// its SYN's first retransmission (see the README), so the client's
	// own count of the SYNs it sent says how many. The 3 go at once:
	// each may take that second.
	c.emptyDrain()
	e.waitServices(t, c.drain, func(l string) bool { return strings.Contains(l, "(none") })
	synsBefore := e.synsSent(t)
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			if conn, err := e.lb.Client.DialContext(ctx, network("tcp", c.drain), c.drain); err == nil {
				conn.Close()
				t.Errorf("connected to %s, which has no endpoints", c.drain)
			}
		})
	}
	wg.Wait()
	syns := e.synsSent(t) - synsBefore
	drops := e.stableServiceSeries(t)
	drop := `sluice_service_drops_total{namespace="default",port="http",protocol="TCP",reason="no_endpoints",service="drain"}`
	if v := drops[drop]; v != syns || syns < 3 {
		t.Errorf("%s = %v after 3 refused connects that sent %v SYNs, want as many; series:\n%v", drop, v, syns, drops)
	}
	if v := drops[svcSeries("new_flows", "default", "drain", "http", "TCP")]; v != 0 {
		t.Errorf("drain's new flows = %v: it never had traffic while it had endpoints", v)
	}

	// sluicectl shows the same counters from the pins, on the lines of
	// the frontends that had the traffic.
	cmd := e.agent.NS.Command(t.Context(), e.agent.Bin.Sluicectl, "--bpffs", e.agent.BPFFS, "--names-file", e.agent.NamesFile, "services", "--stats")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("sluicectl services --stats: %v", err)
	}
	t.Logf("$ sluicectl services --stats\n%s", out)
	lines := 0
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) < 8 {
			continue
		}
		switch f[0] {
		case c.web + "/TCP":
			lines++
			if f[4] != fmt.Sprint(afterSock[web("new_flows")]) || f[5] != fmt.Sprint(packets) {
				t.Errorf("web's line %q: want %v flows, %v packets as /metrics says", l, afterSock[web("new_flows")], packets)
			}
		case c.drain + "/TCP":
			lines++
			if f[7] != fmt.Sprint(syns) {
				t.Errorf("drain's line %q: want %v drops", l, syns)
			}
		}
	}
	if lines != 2 {
		t.Errorf("sluicectl services --stats has %d lines for %s/TCP and %s/TCP, want one each", lines, c.web, c.drain)
	}
}
