package lifecycle

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/agentproc"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
)

// The maps a --max-* flag sizes, and a Service beside web, dns and echo
// (3 Services, 9 backends: 3 addresses x :8080, :5353/UDP and :9000; 12
// service entries: a master and 3 slots each) that the size of the row's
// small value leaves out: it needs one more of what the flag bounds.
var fullRows = []struct {
	flag         string
	v6           bool // the Services, the load and "more" are IPv6
	small, large string
	extra        agentproc.Service
	// port is the extra Service's backends' HTTP port (8080: web's
	// backends).
	port    uint16
	mapName string // the map the flag sizes, pinned
	// smallSize and largeSize are its sizes.
	smallSize, largeSize uint32
}{
	{
		// 3 backends of its own (:8081): 9 in use of 9.
		flag: "max-backends", small: "9", large: "64", port: 8081,
		mapName: "sluice_backends_v2", smallSize: 2*9 + 1025, largeSize: 2*64 + 1025,
	},
	{
		// The same in the IPv6 backends map.
		flag: "max-backends", v6: true, small: "9", large: "64", port: 8081,
		mapName: "sluice6_backends_v2", smallSize: 2*9 + 1025, largeSize: 2*64 + 1025,
	},
	{
		// web's backends, but 4 entries more: 12 in use of 12.
		flag: "max-service-entries", small: "12", large: "64", port: 8080,
		mapName: "sluice_slots_v1", smallSize: 2 * 12, largeSize: 2 * 64,
	},
	{
		// web's backends, a frontend more: 3 in use of 3. The flag
		// sizes the rev_nat maps and the services hashes (the
		// masters) alike.
		flag: "max-services", small: "3", large: "64", port: 8080,
		mapName: "sluice_services_v2", smallSize: 3, largeSize: 64,
	},
}

// extraService is the Service a row's small size leaves out, at
// moreVIP, on the backends' HTTP port.
func (e *env) extraService(port uint16) agentproc.Service {
	return agentproc.Service{Name: "more", ClusterIP: moreIP[e.v6], Endpoints: e.addrs,
		Ports: []agentproc.Port{agentproc.TCP("http", 80, int(port))}}
}

// moreIP is extraService's ClusterIP in each family.
var moreIP = map[bool]string{false: "10.96.1.1", true: "2001:db8:96::20"}

func (e *env) moreVIP() string { return net.JoinHostPort(moreIP[e.v6], "80") }

// TestRaiseFullMapsUnderLoad: an agent whose maps are full (a --max-*
// flag too small for the manifest: the Service "more" is not programmed,
// /readyz and the metric say so, naming it) is restarted with a size
// that fits, as its error tells the operator to, under load on the
// Services that are programmed: the maps are resized under that load
// and "more" is programmed by the new agent's first apply. Every Service
// answers, /readyz is "ok" with nothing reported, the metric has no
// series, and not one connection failed (long-lived ones stay on their
// backends). One row for each of --max-backends, --max-service-entries
// and --max-services, and --max-backends over IPv6.
func TestRaiseFullMapsUnderLoad(t *testing.T) {
	for _, row := range fullRows {
		t.Run(row.flag+map[bool]string{true: "/IPv6"}[row.v6], func(t *testing.T) {
			e := setupFamily(t, row.v6)
			if row.port != 8080 {
				if _, err := e.lb.ServeHTTP(row.port, "backend-"); err != nil {
					t.Fatal(err)
				}
			}
			e.writeServices(t, e.extraService(row.port))
			cur := agentproc.Shared(t)
			a := e.agent(t, cur, []string{e.lb.NodeDev}, "--"+row.flag+"="+row.small)
			startReady(t, a)
			// Full: ready, "more" reported for capacity, and it
			// alone.
			testutil.Eventually(t, "the agent to report more for capacity", 10*time.Second, func() error {
				return e.reportsOnly(a, "default/more:http")
			})
			if !strings.Contains(a.Log.String(), "service not programmed") {
				t.Errorf("the agent's log has no line for the Service not programmed")
			}
			if got := e.pinnedSize(t, row.mapName); got != row.smallSize {
				t.Fatalf("%s has %d entries with --%s=%s, want %d", row.mapName, got, row.flag, row.small, row.smallSize)
			}

			l := e.startLoad(t, 2*time.Millisecond)
			what := fmt.Sprintf("--%s=%s to %s, maps full%s", row.flag, row.small, row.large, map[bool]string{true: ", IPv6"}[row.v6])
			replace(t, l, a, cur, withFlag(a.Args, row.flag, row.large))
			l.stop(t, what)

			if got := e.pinnedSize(t, row.mapName); got != row.largeSize {
				t.Errorf("after %s, %s has %d entries, want %d", what, row.mapName, got, row.largeSize)
			}
			if err := e.reportsOnly(a); err != nil {
				t.Error(err)
			}
			for _, vip := range []string{e.moreVIP(), e.webVIP()} {
				if who, err := topology.WhoAnswered(e.lb.Client.HTTPClient(3*time.Second), "http://"+vip+"/"); err != nil {
					t.Errorf("%s after %s: %q, %v", vip, what, who, err)
				}
			}
			if c, err := e.lb.Client.DialEcho(t.Context(), e.echoVIP()); err != nil {
				t.Errorf("echo after %s: %v", what, err)
			} else {
				c.Close()
			}
		})
	}
}

// reportsOnly returns nil if the agent's /readyz is ready and reports
// exactly the Service ports services as not programmed for capacity, and
// its metrics have a failure series for each of them and no other ("ok"
// and no series if none).
func (e *env) reportsOnly(a *agentproc.Agent, services ...string) error {
	body, err := a.Get(a.MetricsAddr, "/readyz?verbose") // the health address counts them only
	if err != nil {
		return err
	}
	lines := strings.Split(strings.TrimSpace(body), "\n")
	if lines[0] != "ok" {
		return fmt.Errorf("/readyz: %q", body)
	}
	var reported []string
	for _, l := range lines[1:] {
		if f := strings.Fields(l); len(f) >= 3 && f[0] == "capacity:" && f[1] == "service" {
			reported = append(reported, f[2])
		} else if l != "not programmed:" {
			return fmt.Errorf("/readyz: %q", body)
		}
	}
	if strings.Join(reported, ",") != strings.Join(services, ",") {
		return fmt.Errorf("/readyz reports %v, want %v:\n%s", reported, services, body)
	}
	m, err := a.Metrics()
	if err != nil {
		return err
	}
	var series []string
	for _, l := range strings.Split(m, "\n") {
		if strings.HasPrefix(l, "sluice_service_unprogrammed_frontends{") {
			series = append(series, l)
		}
	}
	var want []string
	for _, s := range services {
		want = append(want, fmt.Sprintf(`sluice_service_unprogrammed_frontends{reason="capacity",service=%q} 1`, s))
	}
	if strings.Join(series, "\n") != strings.Join(want, "\n") {
		return fmt.Errorf("/metrics has failure series %q, want %q", series, want)
	}
	return nil
}

// TestShrinkBelowProgrammedRefusedUnderLoad: an agent restarted with a
// --max-backends or --max-service-entries smaller than what its maps hold
// is refused before it changes anything, saying which flag and what size
// keeps every Service; the previous agent's datapath goes on meanwhile,
// and an agent started again with the size the maps have takes over. Not
// one connection fails across the three, and no pin changed size.
func TestShrinkBelowProgrammedRefusedUnderLoad(t *testing.T) {
	for _, row := range []struct {
		flag, from, to, want string
		mapName              string
	}{
		{"max-backends", "64", "4", "--max-backends=4 is too small for the 9 backends in sluice_backends_v2 programmed now: start the agent with --max-backends=9 or more", "sluice_backends_v2"},
		{"max-service-entries", "64", "8", "--max-service-entries=8 is too small for the 12 service entries in sluice_services_v2 programmed now: start the agent with --max-service-entries=12 or more", "sluice_services_v2"},
	} {
		t.Run(row.flag, func(t *testing.T) {
			e := setup(t)
			cur := agentproc.Shared(t)
			a := e.agent(t, cur, []string{e.lb.NodeDev}, "--"+row.flag+"="+row.from)
			startReady(t, a)
			size := e.pinnedSize(t, row.mapName)
			args := a.Args
			what := fmt.Sprintf("--%s=%s refused", row.flag, row.to)

			l := e.startLoad(t, 2*time.Millisecond)
			time.Sleep(2 * time.Second) // load on the first agent
			if err := a.Stop(); err != nil {
				t.Fatalf("agent did not exit cleanly: %v", err)
			}
			a.Args = withFlag(args, row.flag, row.to)
			if err := a.Start(); err != nil {
				t.Fatal(err)
			}
			waitExited(t, a, fmt.Sprintf("the agent with --%s=%s", row.flag, row.to))
			if !strings.Contains(a.Log.String(), row.want) {
				t.Errorf("the refused agent's log does not say %q:\n%s", row.want, a.Log.String())
			}
			if got := e.pinnedSize(t, row.mapName); got != size {
				t.Errorf("after %s, %s has %d entries, want the %d it had", what, row.mapName, got, size)
			}
			time.Sleep(2 * time.Second) // load on the datapath alone
			a.Args = args
			startReady(t, a)
			time.Sleep(2 * time.Second) // load on the agent started again
			l.stop(t, what)
			if err := e.reportsOnly(a); err != nil {
				t.Error(err)
			}
		})
	}
}

// waitExited waits until a (what, for the failure) has exited.
func waitExited(t *testing.T, a *agentproc.Agent, what string) {
	t.Helper()
	if err := testutil.Poll(30*time.Second, func() error {
		if a.Exited() == nil {
			return fmt.Errorf("still running")
		}
		return nil
	}); err != nil {
		t.Fatalf("%s did not stop: %v", what, err)
	}
}

// startReady starts a and waits until it is ready.
func startReady(t *testing.T, a *agentproc.Agent) {
	t.Helper()
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	if err := a.WaitReady(60 * time.Second); err != nil {
		t.Fatalf("%v\n%s", err, a.Log.String())
	}
}
