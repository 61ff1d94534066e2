package e2e

import (
	"bufio"
	"context"
	"fmt"
	"strconv"
	"strings"
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
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "sluice_service_") || strings.HasPrefix(line, "sluice_service_unprogrammed") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("sample %q: %v", line, err)
		}
		out[line[:i]] = v
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

func svcSeries(family, ns, name, port, proto string) string {
	return fmt.Sprintf(`sluice_service_%s_total{namespace=%q,port=%q,protocol=%q,service=%q}`, family, ns, port, proto, name)
}

// TestServiceMetrics reads the per-Service counters of a real agent
// (--service-metrics) through /metrics after real traffic: connections
// from a client namespace through tc (flows, packets and bytes), from the
// node's cgroup through the socket hooks (flows only: their packets never
// carry the Service's address), and refused connects to a Service
// without endpoints (drops by reason).
func TestServiceMetrics(t *testing.T) {
	e := setup(t, "--service-metrics")
	web := func(family string) string { return svcSeries(family, "default", "web", "http", "TCP") }
	dns := func(family string) string { return svcSeries(family, "default", "dns", "dns", "UDP") }

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
	e.spread(t, webVIP, requests)
	afterTC := e.stableServiceSeries(t)
	flows, packets, bytes := afterTC[web("new_flows")], afterTC[web("packets")], afterTC[web("bytes")]
	if flows != requests {
		t.Errorf("%s = %v after %d connections, want %d", web("new_flows"), flows, requests, requests)
	}
	// Each connection sends at least its SYN, its ACK, the request and
	// the ACK of the reply's FIN to the Service; every one is an IPv4
	// packet of at least 40 bytes.
	if packets < 4*requests || bytes < 40*packets {
		t.Errorf("%s = %v, %s = %v after %d connections: want at least 4 packets each, 40 bytes a packet",
			web("packets"), packets, web("bytes"), bytes, requests)
	}

	// Through the socket hooks: connects and datagrams from the node's
	// cgroup are new flows, and add no packets.
	if got := e.runInCgroup(t, "tcp", webVIP, 5); len(got) != 5 {
		t.Fatalf("socket-balanced requests: %q", got)
	}
	if got := e.runInCgroup(t, "udp", dnsVIP, 3); len(got) != 3 {
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

	// A Service without endpoints: each refused connect is a
	// no_endpoints drop.
	e.write(t, e.addrs, nil)
	e.waitServices(t, drainVIP, func(l string) bool { return strings.Contains(l, "(none") })
	for range 3 {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		c, err := e.lb.Client.DialContext(ctx, "tcp4", drainVIP)
		cancel()
		if err == nil {
			c.Close()
			t.Fatalf("connected to %s, which has no endpoints", drainVIP)
		}
	}
	drops := e.stableServiceSeries(t)
	drop := `sluice_service_drops_total{namespace="default",port="http",protocol="TCP",reason="no_endpoints",service="drain"}`
	if v := drops[drop]; v != 3 {
		t.Errorf("%s = %v after 3 refused connects, want 3; series:\n%v", drop, v, drops)
	}
	if v := drops[svcSeries("new_flows", "default", "drain", "http", "TCP")]; v != 0 {
		t.Errorf("drain's new flows = %v: it never had traffic while it had endpoints", v)
	}

	// sluicectl shows the same counters from the pins.
	cmd := e.agent.NS.Command(t.Context(), e.agent.Bin.Sluicectl, "--bpffs", e.agent.BPFFS, "--names-file", e.agent.NamesFile, "services", "--stats")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("sluicectl services --stats: %v", err)
	}
	t.Logf("$ sluicectl services --stats\n%s", out)
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) < 8 {
			continue
		}
		switch f[1] {
		case "default/web:http":
			if f[4] != fmt.Sprint(afterSock[web("new_flows")]) || f[5] != fmt.Sprint(packets) {
				t.Errorf("web's line %q: want %v flows, %v packets as /metrics says", l, afterSock[web("new_flows")], packets)
			}
		case "default/drain:http":
			if f[7] != "3" {
				t.Errorf("drain's line %q: want 3 drops", l)
			}
		}
	}
}
