package topology

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil"
)

// The IPv6 plane of a dual-stack LB carries traffic as the IPv4 one does:
// the node reaches every backend over both families, a backend's route to
// the client's subnet goes through the node, and the client reaches no
// backend directly.
func TestLBIPv6Plane(t *testing.T) {
	testutil.Privileged(t)
	topo := NewT(t)
	lb := topo.BuildLBT(t, 2)
	v6 := lb.AddIPv6T(t)
	if again, err := lb.AddIPv6(); err != nil || again != v6 {
		t.Fatalf("AddIPv6 again = %v, %v; want the same plane", again, err)
	}
	names, err := lb.ServeHTTP(8080, "be-")
	if err != nil {
		t.Fatal(err)
	}
	hc := lb.Node.HTTPClient(3 * time.Second)
	for i, a := range v6.BackendAddrs {
		for _, host := range []string{a.String(), lb.BackendAddrs[i].String()} {
			got, err := WhoAnswered(hc, "http://"+net.JoinHostPort(host, "8080")+"/")
			if err != nil || got != names[i] {
				t.Errorf("GET %s from the node: %q, %v; want %q", host, got, err, names[i])
			}
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	srv, err := lb.Node.Listen("tcp6", net.JoinHostPort(v6.NodeAddr.String(), "7000"))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	c, err := lb.Backends[1].DialContext(ctx, "tcp6", srv.Addr().String())
	if err != nil {
		t.Fatalf("backend 2 to the node's address on the client's subnet: %v", err)
	}
	c.Close()
	c, err = lb.Client.DialContext(ctx, "tcp6", srv.Addr().String())
	if err != nil {
		t.Fatalf("client to the node over IPv6: %v", err)
	}
	c.Close()
	if c, err := lb.Client.DialContext(ctx, "tcp6", net.JoinHostPort(v6.BackendAddrs[0].String(), "8080")); err == nil {
		c.Close()
		t.Error("client reached a backend directly over IPv6; it should have no route there")
	}
}
