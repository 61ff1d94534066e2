package metrics

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
	"github.com/sluice-lb/sluice/pkg/reconciler/fakedp"
)

func l4(addr string, port uint16) model.L4Addr {
	return model.L4Addr{Addr: netip.MustParseAddr(addr), Port: port, Proto: model.TCP}
}

func TestCountsAndFillRatio(t *testing.T) {
	s := model.NewState()
	shared := model.Backend{L4Addr: l4("10.0.0.1", 80)}
	s.Services.Set(l4("10.96.0.1", 80), &model.Service{Frontend: l4("10.96.0.1", 80),
		Backends: []model.Backend{shared, {L4Addr: l4("10.0.0.2", 80)}}})
	s.Services.Set(l4("10.96.0.2", 80), &model.Service{Frontend: l4("10.96.0.2", 80),
		Backends: []model.Backend{shared}})
	s.Services.Set(l4("10.96.0.3", 80), &model.Service{Frontend: l4("10.96.0.3", 80)})
	// An IPv6 Service: its entries fill the IPv6 maps, each as large as
	// the IPv4 one.
	s.Services.Set(l4("2001:db8:96::1", 80), &model.Service{Frontend: l4("2001:db8:96::1", 80),
		Backends: []model.Backend{{L4Addr: l4("2001:db8::1", 80)}, {L4Addr: l4("2001:db8::2", 80)}}})

	if got, want := CountState(s), (Counts{Services: 4, Backends: 4, ServiceEntries: 9, Backends6: 2, ServiceEntries6: 3}); got != want {
		t.Fatalf("CountState = %+v, want %+v", got, want)
	}
	for _, counter := range []bool{false, true} {
		m := New()
		if counter {
			// The backends as the agent counts them: the reconciler's.
			rec := reconciler.New(fakedp.New(100, 10, 60), nil)
			if err := rec.Apply(s); err != nil {
				t.Fatal(err)
			}
			m.SetBackendCounter(rec.BackendCounts)
		}
		m.SetProgrammed(s)
		if counter && m.backendRefs != nil {
			t.Errorf("with a backend counter, SetProgrammed keeps its own map of %d backends", len(m.backendRefs))
		}
		checkCountsAndFillRatio(t, m)
	}
}

// checkCountsAndFillRatio checks the gauges of TestCountsAndFillRatio's
// state.
func checkCountsAndFillRatio(t *testing.T, m *Metrics) {
	t.Helper()
	m.SetCapacity(func() (int, int, int) { return 100, 10, 60 })

	want := `
# HELP sluice_backends Distinct backends programmed.
# TYPE sluice_backends gauge
sluice_backends 4
# HELP sluice_map_fill_ratio Fraction of a BPF map's capacity in use.
# TYPE sluice_map_fill_ratio gauge
sluice_map_fill_ratio{map="backends"} 0.2
sluice_map_fill_ratio{map="backends6"} 0.2
sluice_map_fill_ratio{map="rev_nat"} 0.04
sluice_map_fill_ratio{map="services"} 0.1
sluice_map_fill_ratio{map="services6"} 0.05
# HELP sluice_services Service frontends programmed.
# TYPE sluice_services gauge
sluice_services 4
`
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want),
		"sluice_backends", "sluice_services", "sluice_map_fill_ratio"); err != nil {
		t.Fatal(err)
	}
}

func TestSyncAndProgrammingLatency(t *testing.T) {
	m := New()
	m.ObserveSync(3*time.Millisecond, nil)
	m.ObserveSync(time.Millisecond, errors.New("map full"))
	if got := testutil.ToFloat64(m.SyncErrors); got != 1 {
		t.Errorf("sync errors = %v, want 1", got)
	}
	if got := testutil.CollectAndCount(m.SyncDuration); got != 1 {
		t.Errorf("sync duration series = %d, want 1", got)
	}

	now := time.Now()
	// A trigger in the future (clock skew) and a zero one are not recorded.
	m.ObserveProgrammed(now, []model.Trigger{{At: now.Add(-1500 * time.Millisecond)}, {At: now.Add(time.Second)}, {}})
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	for _, line := range []string{
		"sluice_network_programming_duration_seconds_count 1",
		"sluice_network_programming_duration_seconds_sum 1.5",
		`sluice_syncs_total{result="error"} 1`,
		`sluice_syncs_total{result="success"} 1`,
		"go_goroutines ",
	} {
		if !strings.Contains(body, line) {
			t.Errorf("scrape lacks %q", line)
		}
	}
}

func TestSocketTermination(t *testing.T) {
	m := New()
	m.DeclareSocketTermination("bpf")
	if got := testutil.ToFloat64(m.SocketTerminations.WithLabelValues("bpf", "destroyed")); got != 0 {
		t.Errorf("declared counter = %v", got)
	}
	m.ObserveSocketTermination("bpf", 2, 1, 3, 0)
	m.ObserveSocketTermination("bpf", 1, 0, 0, 1)
	for _, c := range []struct {
		got  float64
		want float64
		what string
	}{
		{testutil.ToFloat64(m.SocketTerminations.WithLabelValues("bpf", "destroyed")), 3, "destroyed"},
		{testutil.ToFloat64(m.SocketTerminations.WithLabelValues("bpf", "failed")), 1, "failed"},
		{testutil.ToFloat64(m.SocketsSpared.WithLabelValues("unconnected")), 3, "spared unconnected"},
		{testutil.ToFloat64(m.SocketsSpared.WithLabelValues("still_backend")), 1, "spared still a backend"},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}
}

// TestStaleUDP: the start's pass over kube-proxy's UDP state adds its
// deleted conntrack entries to their counter and its ended sockets to the
// socket terminations of its method; a pass that ended none adds no
// series of a method.
func TestStaleUDP(t *testing.T) {
	m := New()
	m.ObserveStaleUDP(3, "netlink", 0, 0)
	if n := testutil.CollectAndCount(m.SocketTerminations); n != 0 {
		t.Errorf("a pass that ended no socket made %d socket termination series", n)
	}
	m.ObserveStaleUDP(2, "bpf", 4, 1)
	for _, c := range []struct {
		got, want float64
		what      string
	}{
		{testutil.ToFloat64(m.StaleUDPConntrackDeleted), 5, "conntrack entries deleted"},
		{testutil.ToFloat64(m.SocketTerminations.WithLabelValues("bpf", "destroyed")), 4, "destroyed"},
		{testutil.ToFloat64(m.SocketTerminations.WithLabelValues("bpf", "failed")), 1, "failed"},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}
}

// Only failing Service ports have a series, one per reason, counting their
// frontends; a later sync without failures removes them.
func TestUnprogrammedServices(t *testing.T) {
	m := New()
	big := model.ServicePortName{Namespace: "default", Name: "big", Port: "http"}
	m.SetFailures([]*reconciler.FrontendError{
		{Service: big, Frontend: l4("10.96.0.1", 80), Err: fmt.Errorf("%w (no room)", reconciler.ErrCapacity)},
		{Service: big, Frontend: l4("192.168.1.1", 30080), Err: fmt.Errorf("%w (no room)", reconciler.ErrCapacity)},
		{Service: model.ServicePortName{Namespace: "default", Name: "flaky"}, Frontend: l4("10.96.0.2", 80), Err: errors.New("EIO")},
	})
	want := `
# HELP sluice_service_unprogrammed_frontends Frontends of a Service port the last sync could not program, by reason: capacity or invalid (permanent: retried when the desired state changes) or write (retried with backoff). Only failing Service ports have a series.
# TYPE sluice_service_unprogrammed_frontends gauge
sluice_service_unprogrammed_frontends{reason="capacity",service="default/big:http"} 2
sluice_service_unprogrammed_frontends{reason="write",service="default/flaky"} 1
`
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want), "sluice_service_unprogrammed_frontends"); err != nil {
		t.Fatal(err)
	}
	m.SetFailures(nil)
	if n, err := testutil.GatherAndCount(m.Registry, "sluice_service_unprogrammed_frontends"); err != nil || n != 0 {
		t.Errorf("%d series (%v) once nothing fails, want 0", n, err)
	}
}

// TestCountsFollowChanges: states that say what changed since the one
// before (model.State.BaseGen) are counted by their changes, and must
// count what CountState counts; so must a state that does not say so.
// The odd frontends are IPv6, with IPv6 backends.
func TestCountsFollowChanges(t *testing.T) {
	m := New()
	frontend := func(i int) model.L4Addr {
		if i%2 == 1 {
			return l4(fmt.Sprintf("2001:db8:96::%d", i), 80)
		}
		return l4(fmt.Sprintf("10.96.0.%d", i), 80)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var prev *model.State
	for round := range 300 {
		s := model.NewState()
		s.Gen = model.NewGeneration()
		for i := range 20 {
			fe := frontend(i)
			if prev != nil && prev.Services.Get(fe) != nil && rng.IntN(4) > 0 {
				s.Services.Set(fe, prev.Services.Get(fe))
				continue
			}
			if rng.IntN(3) == 0 {
				continue
			}
			svc := &model.Service{Frontend: fe}
			for range rng.IntN(5) {
				b := l4(fmt.Sprintf("10.0.0.%d", rng.IntN(12)), 80)
				if i%2 == 1 {
					b = l4(fmt.Sprintf("2001:db8::%d", rng.IntN(12)), 80)
				}
				svc.Backends = append(svc.Backends, model.Backend{L4Addr: b})
			}
			svc.Backends = model.SortBackends(svc.Backends)
			s.Services.Set(fe, svc)
		}
		if prev != nil && rng.IntN(10) > 0 {
			s.BaseGen = prev.Gen
			for i := range 20 {
				fe := frontend(i)
				if s.Services.Get(fe) != prev.Services.Get(fe) {
					s.Changed = append(s.Changed, fe)
				}
			}
		}
		m.SetProgrammed(s)
		if got, want := m.counts, CountState(s); got != want {
			t.Fatalf("round %d: counted %+v, want %+v", round, got, want)
		}
		prev = s
	}
}
