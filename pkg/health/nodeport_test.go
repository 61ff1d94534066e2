package health

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/model"
)

// freePorts returns n distinct loopback ports free when returned
// (testutil.FreePorts).
func freePorts(t *testing.T, n int) []uint16 {
	t.Helper()
	var ports []uint16
	for _, p := range testutil.FreePorts(t, n) {
		ports = append(ports, uint16(p))
	}
	return ports
}

func freePort(t *testing.T) uint16 {
	t.Helper()
	return freePorts(t, 1)[0]
}

// status is kube-proxy's health check body.
type status struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int  `json:"localEndpoints"`
	ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
}

func get(t *testing.T, p uint16) (int, status) {
	t.Helper()
	return getAt(t, "127.0.0.1", p)
}

// getAt asks the health check port p on host, and checks the headers
// kube-proxy sends with every answer: the count is also the
// X-Load-Balancing-Endpoint-Weight, 0 included.
func getAt(t *testing.T, host string, p uint16) (int, status) {
	t.Helper()
	code, hdr, body := getRaw(t, host, p)
	var st status
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("body %q: %v", body, err)
	}
	for k, v := range map[string]string{"Content-Type": "application/json", "X-Content-Type-Options": "nosniff",
		"X-Load-Balancing-Endpoint-Weight": strconv.Itoa(st.LocalEndpoints)} {
		if got := hdr.Values(k); len(got) != 1 || got[0] != v {
			t.Errorf("%s:%d answered %s %q, want %q (kube-proxy's)", host, p, k, got, v)
		}
	}
	return code, st
}

func getRaw(t *testing.T, host string, p uint16) (int, http.Header, string) {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://%s:%d/", host, p))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(body)
}

// TestNodePortServer: the health check port answers on each of the
// server's hosts (and only there) with the count of ready local endpoints
// its Service's frontends carry (model.Service.LocalReady, by address:
// an endpoint of two ports counts once), not the backends they balance
// over (which may be terminating ones).
func TestNodePortServer(t *testing.T) {
	hc := freePort(t)
	s := NewNodePortServer([]string{"127.0.0.1", "127.0.0.2"}, nil, slog.New(slog.DiscardHandler))
	t.Cleanup(s.Close)
	be := func(a string) model.Backend {
		return model.Backend{L4Addr: model.L4Addr{Addr: netip.MustParseAddr(a), Port: 8080, Proto: model.TCP}}
	}
	ready := []netip.Addr{netip.MustParseAddr("10.1.0.1"), netip.MustParseAddr("10.1.0.2")}
	svc := func(fe string, port uint16, bs ...model.Backend) *model.Service {
		return &model.Service{Name: model.ServicePortName{Namespace: "default", Name: "web", Port: fmt.Sprint(port)},
			Kind: model.LoadBalancer, Frontend: model.L4Addr{Addr: netip.MustParseAddr(fe), Port: port, Proto: model.TCP},
			Backends: bs, ExternalLocal: true, HealthCheckNodePort: hc, LocalReady: ready}
	}
	st := model.NewState()
	for _, s := range []*model.Service{svc("192.168.1.1", 30080, be("10.1.0.1"), be("10.1.0.2")), svc("198.51.100.1", 80, be("10.1.0.1"), be("10.1.0.2"))} {
		st.Services.Set(s.Frontend, s)
	}
	if err := s.Sync(st); err != nil {
		t.Fatal(err)
	}
	for _, host := range []string{"127.0.0.1", "127.0.0.2"} {
		code, body := getAt(t, host, hc)
		if code != 200 || body.LocalEndpoints != 2 || body.Service.Name != "web" || body.Service.Namespace != "default" || !body.ServiceProxyHealthy {
			t.Fatalf("%s, with local endpoints: %d %+v", host, code, body)
		}
	}
	if _, err := http.Get(fmt.Sprintf("http://127.0.0.3:%d/", hc)); err == nil {
		t.Error("health check answered on a host it was not given")
	}

	// Terminating local endpoints still serve, but are not ready.
	for _, s := range st.Services.All() {
		s.LocalReady = nil
	}
	if err := s.Sync(st); err != nil {
		t.Fatal(err)
	}
	if code, body := get(t, hc); code != 503 || body.LocalEndpoints != 0 {
		t.Fatalf("without local endpoints: %d %+v", code, body)
	}

	if err := s.Sync(model.NewState()); err != nil {
		t.Fatal(err)
	}
	if _, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/", hc)); err == nil {
		t.Fatal("health check port still served after its Service went away")
	}
}

// TestNodePortServerPerFamily: a dual-stack Service's health check port
// answers each family with that family's ready local endpoints, as
// kube-proxy's two proxiers count them (a pod with an IPv4 and an IPv6
// address is one endpoint, not two), and a single-stack Service answers its
// one family's count on addresses of either.
func TestNodePortServerPerFamily(t *testing.T) {
	ports := freePorts(t, 2)
	dual, single := ports[0], ports[1]
	s := NewNodePortServer([]string{""}, nil, slog.New(slog.DiscardHandler)) // all addresses, both families
	t.Cleanup(s.Close)
	addrs := func(as ...string) []netip.Addr {
		var out []netip.Addr
		for _, a := range as {
			out = append(out, netip.MustParseAddr(a))
		}
		return out
	}
	svc := func(name, fe string, hc uint16, ready []netip.Addr) *model.Service {
		var bs []model.Backend
		for _, a := range ready {
			bs = append(bs, model.Backend{L4Addr: model.L4Addr{Addr: a, Port: 8080, Proto: model.TCP}})
		}
		return &model.Service{Name: model.ServicePortName{Namespace: "default", Name: name, Port: "http"},
			Kind: model.LoadBalancer, Frontend: model.L4Addr{Addr: netip.MustParseAddr(fe), Port: 80, Proto: model.TCP},
			Backends: bs, ExternalLocal: true, HealthCheckNodePort: hc, LocalReady: ready}
	}
	st := model.NewState()
	for _, sv := range []*model.Service{
		// Two dual-stack pods on this node; a third's IPv6 address is not
		// ready (in its EndpointSlice of IPv6 addresses).
		svc("dual", "198.51.100.1", dual, addrs("10.1.0.1", "10.1.0.2", "10.1.0.3")),
		svc("dual", "2001:db8:100::1", dual, addrs("2001:db8:1::1", "2001:db8:1::2")),
		svc("single", "198.51.100.2", single, addrs("10.1.0.4")),
	} {
		st.Services.Set(sv.Frontend, sv)
	}
	if err := s.Sync(st); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		host string
		port uint16
		want int
	}{
		{"127.0.0.1", dual, 3},
		{"[::1]", dual, 2},
		{"127.0.0.1", single, 1},
		{"[::1]", single, 1},
	} {
		code, body := getAt(t, c.host, c.port)
		if code != 200 || body.LocalEndpoints != c.want {
			t.Errorf("%s port %d: %d %+v, want 200 with %d local endpoints", c.host, c.port, code, body, c.want)
		}
	}

	// The IPv6 endpoints leave: the IPv6 answer fails over, the IPv4
	// one still serves.
	st.Services.Get(model.L4Addr{Addr: netip.MustParseAddr("2001:db8:100::1"), Port: 80, Proto: model.TCP}).LocalReady = nil
	if err := s.Sync(st); err != nil {
		t.Fatal(err)
	}
	if code, body := getAt(t, "[::1]", dual); code != 503 || body.LocalEndpoints != 0 {
		t.Errorf("IPv6 without local endpoints: %d %+v", code, body)
	}
	if code, body := getAt(t, "127.0.0.1", dual); code != 200 || body.LocalEndpoints != 3 {
		t.Errorf("IPv4 beside an IPv6 family without local endpoints: %d %+v", code, body)
	}
}

// TestNodePortServerObserves: as the agent's Observer, the server follows
// every programmed state, and a port another process holds is reported
// (logged) without keeping the others from being served.
func TestNodePortServerObserves(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	busy, free := uint16(taken.Addr().(*net.TCPAddr).Port), freePort(t)
	var logs strings.Builder
	s := NewNodePortServer([]string{"127.0.0.1"}, nil, slog.New(slog.NewTextHandler(&logs, nil)))
	t.Cleanup(s.Close)
	st := model.NewState()
	for i, hc := range []uint16{busy, free} {
		fe := model.L4Addr{Addr: netip.AddrFrom4([4]byte{198, 51, 100, byte(i + 1)}), Port: 80, Proto: model.TCP}
		st.Services.Set(fe, &model.Service{Name: model.ServicePortName{Namespace: "default", Name: fmt.Sprint("web", i)},
			Kind: model.LoadBalancer, Frontend: fe, ExternalLocal: true, HealthCheckNodePort: hc,
			Backends:   []model.Backend{{L4Addr: model.L4Addr{Addr: netip.MustParseAddr("10.1.0.1"), Port: 8080, Proto: model.TCP}}},
			LocalReady: []netip.Addr{netip.MustParseAddr("10.1.0.1")}})
	}
	s.ObserveSync(time.Millisecond, nil) // changes nothing
	s.SetProgrammed(st)
	if code, body := get(t, free); code != 200 || body.Service.Name != "web1" {
		t.Errorf("free port: %d %+v", code, body)
	}
	if !strings.Contains(logs.String(), fmt.Sprintf("health check port %d", busy)) {
		t.Errorf("taken port %d not reported; log:\n%s", busy, logs.String())
	}
}

// TestNodePortServerProxyHealth: the answer in each state is kube-proxy's
// (v1.36 hcHandler.ServeHTTP) byte for byte: 200 only with ready local
// endpoints and a healthy proxy, serviceProxyHealthy false while the
// datapath is stale (what /livez says), the count as the load balancing
// weight in every answer, and the Node going away not consulted (that is
// /healthz's).
func TestNodePortServerProxyHealth(t *testing.T) {
	hc := freePort(t)
	now := time.Unix(1_700_000_000, 0)
	var pending time.Time
	p := NewProxier(time.Minute, func() time.Time { return pending })
	p.now = func() time.Time { return now }
	s := NewNodePortServer([]string{"127.0.0.1"}, p, slog.New(slog.DiscardHandler))
	t.Cleanup(s.Close)
	fe := model.L4Addr{Addr: netip.MustParseAddr("198.51.100.1"), Port: 80, Proto: model.TCP}
	sync := func(ready ...string) {
		t.Helper()
		svc := &model.Service{Name: model.ServicePortName{Namespace: "default", Name: "web", Port: "http"},
			Kind: model.LoadBalancer, Frontend: fe, ExternalLocal: true, HealthCheckNodePort: hc}
		for _, a := range ready {
			ip := netip.MustParseAddr(a)
			svc.LocalReady = append(svc.LocalReady, ip)
			svc.Backends = append(svc.Backends, model.Backend{L4Addr: model.L4Addr{Addr: ip, Port: 8080, Proto: model.TCP}})
		}
		st := model.NewState()
		st.Services.Set(fe, svc)
		if err := s.Sync(st); err != nil {
			t.Fatal(err)
		}
	}
	// kube-proxy's body: its template, dedented and trimmed of newlines.
	body := func(count int, healthy bool) string {
		return fmt.Sprintf(`{
	"service": {
		"namespace": "default",
		"name": "web"
	},
	"localEndpoints": %d,
	"serviceProxyHealthy": %v
}`, count, healthy)
	}
	for _, c := range []struct {
		what    string
		ready   []string
		stale   bool
		node    bool // the Node is going away
		code    int
		healthy bool
	}{
		{what: "healthy, local endpoints", ready: []string{"10.1.0.1", "10.1.0.2"}, code: 200, healthy: true},
		{what: "healthy, none", code: 503, healthy: true},
		{what: "stale, local endpoints", ready: []string{"10.1.0.1", "10.1.0.2"}, stale: true, code: 503},
		{what: "stale, none", stale: true, code: 503},
		{what: "Node going away, local endpoints", ready: []string{"10.1.0.1"}, node: true, code: 200, healthy: true},
		{what: "Node going away, stale", ready: []string{"10.1.0.1"}, node: true, stale: true, code: 503},
	} {
		sync(c.ready...)
		pending = time.Time{}
		if c.stale {
			pending = now.Add(-time.Hour)
		}
		p.SetNode(!c.node, "node is being deleted")
		code, _, got := getRaw(t, "127.0.0.1", hc)
		if want := body(len(c.ready), c.healthy); code != c.code || got != want {
			t.Errorf("%s: %d %q, want %d %q", c.what, code, got, c.code, want)
		}
		getAt(t, "127.0.0.1", hc) // the headers
	}
}

// TestNodePortServerNoHosts: a server given no host listens nowhere, as
// kube-proxy's does when no node address is inside --nodeport-addresses at
// its start: not on every address ("" says that), and without a bind
// failure to report or retry. It says so at start.
func TestNodePortServerNoHosts(t *testing.T) {
	hc := freePort(t)
	var logs strings.Builder
	s := NewNodePortServer(nil, nil, slog.New(slog.NewTextHandler(&logs, nil)))
	reported := 0
	s.OnBindFailure(func(model.ServicePortName, uint16, error) { reported++ })
	t.Cleanup(s.Close)
	fe := model.L4Addr{Addr: netip.MustParseAddr("198.51.100.1"), Port: 80, Proto: model.TCP}
	st := model.NewState()
	st.Services.Set(fe, &model.Service{Name: model.ServicePortName{Namespace: "default", Name: "web"}, Kind: model.LoadBalancer,
		Frontend: fe, ExternalLocal: true, HealthCheckNodePort: hc, LocalReady: []netip.Addr{netip.MustParseAddr("10.1.0.1")}})
	for range 2 {
		if err := s.Sync(st); err != nil || reported != 0 {
			t.Fatalf("Sync: %v, %d bind failures reported; want neither", err, reported)
		}
	}
	if c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(hc)))); err == nil {
		_ = c.Close()
		t.Errorf("health check port %d answers on 127.0.0.1, want nowhere", hc)
	}
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "served nowhere") {
		t.Errorf("no warning that the ports are served nowhere; log:\n%s", logs.String())
	}
}
