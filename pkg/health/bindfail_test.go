package health

import (
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"syscall"
	"testing"

	"github.com/sluice-lb/sluice/pkg/model"
)

// A health check port that cannot be bound is told to OnBindFailure's
// function once, however many Syncs retry it, and again only once the port
// was bound or dropped in between: kube-proxy's
// FailedToStartServiceHealthcheck event, without one per sync.
func TestNodePortServerBindFailureOnce(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	busy := uint16(taken.Addr().(*net.TCPAddr).Port)
	type report struct {
		svc  model.ServicePortName
		port uint16
		err  error
	}
	var reports []report
	s := NewNodePortServer([]string{"127.0.0.1"}, nil, slog.New(slog.DiscardHandler))
	s.OnBindFailure(func(svc model.ServicePortName, port uint16, err error) {
		reports = append(reports, report{svc, port, err})
	})
	t.Cleanup(s.Close)
	web := model.ServicePortName{Namespace: "default", Name: "web"}
	fe := model.L4Addr{Addr: netip.MustParseAddr("198.51.100.1"), Port: 80, Proto: model.TCP}
	st := model.NewState()
	st.Services.Set(fe, &model.Service{Name: web, Kind: model.LoadBalancer, Frontend: fe, ExternalLocal: true, HealthCheckNodePort: busy})
	empty := model.NewState()
	sync := func(st *model.State, wantErr bool, wantReports int) {
		t.Helper()
		if err := s.Sync(st); (err != nil) != wantErr {
			t.Fatalf("Sync: %v, want an error: %v", err, wantErr)
		}
		if len(reports) != wantReports {
			t.Fatalf("%d failures reported, want %d: %v", len(reports), wantReports, reports)
		}
	}

	for range 3 { // retried at every Sync, reported once
		sync(st, true, 1)
	}
	if r := reports[0]; r.svc != web || r.port != busy || !errors.Is(r.err, syscall.EADDRINUSE) {
		t.Errorf("reported %+v, want %v, port %d, EADDRINUSE", r, web, busy)
	}
	// Dropped while unbound, then asked for again: reported again.
	sync(empty, false, 1)
	sync(st, true, 2)
	// Freed: bound at the next Sync, nothing reported.
	if err := taken.Close(); err != nil {
		t.Fatal(err)
	}
	sync(st, false, 2)
	// Given up, taken by another process, asked for again: reported.
	sync(empty, false, 2)
	if taken, err = net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(busy)))); err != nil {
		t.Skipf("port %d taken by another process meanwhile: %v", busy, err)
	}
	defer taken.Close()
	sync(st, true, 3)
	sync(st, true, 3)
}
