package main

import (
	"bytes"
	"errors"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/pkg/datapath"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// TestStaleUDPEnderOnce: the agent ends the UDP state another proxy left
// once, after the first sync that succeeded, with that sync's UDP
// frontends and the socket load balancing cgroup; it counts and logs what
// was done, at Warn if part of it failed. A failed sync does not run it,
// nor does any sync after.
func TestStaleUDPEnderOnce(t *testing.T) {
	var calls []map[netip.AddrPort]bool
	var cgroups []string
	var observed [][4]any
	var logs bytes.Buffer
	e := &staleUDPEnder{
		end: func(cgroup string, frontends map[netip.AddrPort]bool) datapath.StaleUDP {
			calls = append(calls, frontends)
			cgroups = append(cgroups, cgroup)
			return datapath.StaleUDP{Frontends: len(frontends), ConntrackDeleted: 3,
				Sockets: datapath.SocketTermination{Method: datapath.SockDestroyBPF, Destroyed: 2, Failed: 1, Err: errors.New("namespace x: boom")}}
		},
		cgroup: "/sys/fs/cgroup",
		observe: func(deleted int, method string, destroyed, failed int) {
			observed = append(observed, [4]any{deleted, method, destroyed, failed})
		},
		log: slog.New(slog.NewTextHandler(&logs, nil)),
	}
	st := model.NewState()
	udp := model.L4Addr{Addr: netip.MustParseAddr("10.96.0.10"), Port: 53, Proto: model.UDP}
	tcp := model.L4Addr{Addr: netip.MustParseAddr("10.96.0.10"), Port: 53, Proto: model.TCP}
	np := model.L4Addr{Addr: netip.MustParseAddr("fd00::5"), Port: 30053, Proto: model.UDP}
	for _, fe := range []model.L4Addr{udp, tcp, np} {
		st.Services.Set(fe, &model.Service{Frontend: fe})
	}

	e.ObserveSync(time.Millisecond, nil) // nothing programmed yet
	e.SetProgrammed(st)
	e.ObserveSync(time.Millisecond, errors.New("transient"))
	if len(calls) != 0 {
		t.Fatalf("ran %d times before a sync succeeded", len(calls))
	}
	e.ObserveSync(time.Millisecond, nil)
	e.ObserveSync(time.Millisecond, nil)
	if len(calls) != 1 {
		t.Fatalf("ran %d times, want once", len(calls))
	}
	want := map[netip.AddrPort]bool{netip.MustParseAddrPort("10.96.0.10:53"): true, netip.MustParseAddrPort("[fd00::5]:30053"): true}
	if len(calls[0]) != len(want) || !calls[0][netip.MustParseAddrPort("10.96.0.10:53")] || !calls[0][netip.MustParseAddrPort("[fd00::5]:30053")] {
		t.Errorf("frontends %v, want the UDP ones %v", calls[0], want)
	}
	if cgroups[0] != "/sys/fs/cgroup" {
		t.Errorf("cgroup %q", cgroups[0])
	}
	if len(observed) != 1 || observed[0] != [4]any{3, "bpf", 2, 1} {
		t.Errorf("observed %v, want [3 bpf 2 1]", observed)
	}
	out := logs.String()
	if strings.Count(out, "\n") != 1 || !strings.Contains(out, "level=WARN") || !strings.Contains(out, "conntrack_deleted=3") ||
		!strings.Contains(out, "sockets_ended=2") || !strings.Contains(out, "boom") {
		t.Errorf("log:\n%s\nwant one Warn line with the counts and the error", out)
	}
}

// TestStaleUDPEnderFailedFrontends: a UDP frontend the first sync left
// out (failing permanently) is not in the once-only pass: the start's
// line says so, at Warn, naming it; a TCP one is not named.
func TestStaleUDPEnderFailedFrontends(t *testing.T) {
	var logs bytes.Buffer
	e := &staleUDPEnder{
		end: func(string, map[netip.AddrPort]bool) datapath.StaleUDP {
			return datapath.StaleUDP{Sockets: datapath.SocketTermination{Method: datapath.SockDestroyBPF}}
		},
		observe: func(int, string, int, int) {},
		log:     slog.New(slog.NewTextHandler(&logs, nil)),
	}
	bad := model.L4Addr{Addr: netip.MustParseAddr("10.96.0.12"), Port: 53, Proto: model.UDP}
	badTCP := model.L4Addr{Addr: netip.MustParseAddr("10.96.0.13"), Port: 80, Proto: model.TCP}
	e.SetFailures([]*reconciler.FrontendError{{Frontend: bad, Err: errors.New("full")}, {Frontend: badTCP, Err: errors.New("full")}})
	e.SetProgrammed(model.NewState())
	e.ObserveSync(time.Millisecond, nil)
	out := logs.String()
	if !strings.Contains(out, "level=WARN") || !strings.Contains(out, "udp_frontends_failed=1") ||
		!strings.Contains(out, bad.String()) || strings.Contains(out, badTCP.String()) {
		t.Errorf("log:\n%s\nwant a Warn line naming %s, and only it, as not covered", out, bad)
	}
}
