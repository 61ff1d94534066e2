package datapath

import (
	"context"
	"errors"
	"net/http"
	"net/netip"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/model"
)

// TestTC6EndToEnd runs real IPv6 traffic through the tc programs, as
// TestTCEndToEnd does IPv4's: a client namespace reaches an IPv6 ClusterIP
// routed to the node of topology.LB's IPv6 plane, whose client-facing
// device runs tc (DNAT at its ingress, reverse NAT of the backends'
// replies at its egress); the backends are namespaces of their own behind
// the node; UDP too. A Service without endpoints refuses with ICMPv6 port
// unreachable, which the client's TCP and connected UDP socket see as
// ECONNREFUSED.
func TestTC6EndToEnd(t *testing.T) {
	d := newTestDatapath(t)
	lb, err := topology.NewT(t).BuildLB(2)
	if err != nil {
		t.Fatal(err)
	}
	v6, err := lb.AddIPv6()
	if err != nil {
		t.Fatal(err)
	}
	names, err := lb.ServeHTTP(8080, "backend-")
	if err != nil {
		t.Fatal(err)
	}
	if err := lb.ServeEchoes(9090, 5353, names); err != nil {
		t.Fatal(err)
	}
	vip := l4("2001:db8:96::30", 80, model.TCP)
	vipU := l4("2001:db8:96::30", 53, model.UDP)
	empty := l4("2001:db8:96::31", 80, model.TCP)
	emptyU := l4("2001:db8:96::31", 53, model.UDP)
	var bes, besU []model.L4Addr
	for _, a := range v6.BackendAddrs {
		bes = append(bes, model.L4Addr{Addr: a, Port: 8080, Proto: model.TCP})
		besU = append(besU, model.L4Addr{Addr: a, Port: 5353, Proto: model.UDP})
	}
	applyServices(t, d, clusterIP(vip, bes...), clusterIP(vipU, besU...), clusterIP(empty), clusterIP(emptyU))
	if err := lb.Node.Do(func() error { return d.AttachDevices([]string{lb.NodeDev}) }); err != nil {
		t.Fatal(err)
	}

	// At least 16 connections, and on until both backends answered (at
	// most 64): a fair pick leaves one of two unreached in 16 once in
	// 32,768 runs, in 64 once in 4.6e18, and a passing run stops at 16.
	client := lb.Client.HTTPClient(3 * time.Second)
	seen := map[string]bool{}
	n := 0
	for ; n < 64 && (n < 16 || !seen[names[0]] || !seen[names[1]]); n++ {
		resp, err := client.Get("http://" + netip.AddrPortFrom(vip.Addr, vip.Port).String() + "/")
		if err != nil {
			t.Fatalf("GET through %s: %v", vip, err)
		}
		seen[resp.Header.Get("X-Backend")] = true
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET through %s: %s", vip, resp.Status)
		}
	}
	if len(seen) != 2 || !seen[names[0]] || !seen[names[1]] {
		t.Errorf("%d connections reached %v, want %v", n, seen, names)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	c, err := lb.Client.DialContext(ctx, "tcp6", netip.AddrPortFrom(empty.Addr, empty.Port).String())
	if err == nil {
		c.Close()
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("TCP connect to %s (no endpoints): %v, want ECONNREFUSED", empty, err)
	}

	// UDP, as TestTCEndToEnd's: a backend's echo, from the VIP; a
	// Service without endpoints refuses a connected socket.
	u := dialFrom(t, lb.Client, "udp6", vipU, 3*time.Second)
	for range 3 {
		if _, err := u.Write([]byte("q")); err != nil {
			t.Fatal(err)
		}
		u.SetReadDeadline(time.Now().Add(3 * time.Second))
		buf := make([]byte, 100)
		n, err := u.Read(buf) // a connected socket takes only the VIP's datagrams
		if err != nil || !slices.ContainsFunc(names, func(name string) bool { return string(buf[:n]) == name+" q" }) {
			t.Fatalf("UDP through %s: %q, %v; want a backend's echo", vipU, buf[:n], err)
		}
	}
	r := dialFrom(t, lb.Client, "udp6", emptyU, 3*time.Second)
	if _, err := r.Write([]byte("q")); err != nil {
		t.Fatal(err)
	}
	r.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := r.Read(make([]byte, 10)); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("UDP to %s (no endpoints): %v, want ECONNREFUSED", emptyU, err)
	}

	cs := expectCounted(t, d, "tc_dnat_new", "tc_dnat_ct", "tc_rev_nat", "tc_no_backend")
	for _, bad := range []string{"tc_rewrite_err", "tc_malformed", "tc6_ext_hdr", "tc6_udp_no_csum"} {
		if cs[bad] != 0 {
			t.Errorf("%s = %d", bad, cs[bad])
		}
	}
}
