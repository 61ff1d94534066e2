package main

import (
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/sluice-lb/sluice/pkg/datapath"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// staleUDPEnder is an agent Observer that ends, once, after the first
// sync that succeeded, the UDP state another proxy left on the node
// (datapath.EndStaleUDP, audit 6 finding 6): kube-proxy's conntrack
// entries of UDP to the frontends Sluice now serves, and the connected UDP
// sockets socket load balancing covers whose peer is still such a
// frontend (connected before Sluice took the node over). After that sync
// the frontends are in the maps: a packet then new to netfilter goes where
// Sluice's per-packet path sends it, and a socket connected again is
// translated by connect4.
//
// Once only, not at every sync: Sluice's own flows never leave such
// entries (netfilter sees their packets translated already, or not NATed
// at all) and no socket it covers connects to a frontend untranslated, so
// a later pass would find only what a Service created since met before
// it existed, at the cost of a walk of the node's conntrack table and of
// every network namespace's sockets.
//
// In the sync, before the agent records it (appliedN, inSync): readiness
// waits for the pass, deliberately. Ready then means that the node's UDP
// clients no longer ride another proxy's DNAT to an endpoint no one
// follows, which is what a rollout node by node waits for before it moves
// on; the pass is bounded (the conntrack table is streamed, in one
// netlink buffer's memory, and each namespace's UDP sockets walked once),
// seconds on a node near nf_conntrack_max, well inside the DaemonSet's
// startup probe. A goroutine would also run it beside later syncs, which
// change the maps it reads.
type staleUDPEnder struct {
	end    func(cgroup string, frontends map[netip.AddrPort]bool) datapath.StaleUDP
	cgroup string // where socket load balancing is attached; empty: off
	// observe records the counts (metrics.ObserveStaleUDP).
	observe func(conntrackDeleted int, method string, destroyed, failed int)
	log     *slog.Logger

	once       sync.Once
	programmed *model.State // the newest state programmed
	// failedUDP are the UDP frontends the newest sync left out, failing
	// permanently (agent.FailureObserver).
	failedUDP []string
}

func (e *staleUDPEnder) SetProgrammed(s *model.State) { e.programmed = s }

// SetFailures keeps the UDP frontends the sync left out: the pass, which
// runs once, does not cover them (they are not Sluice's frontends then),
// and says so; their clients keep what kube-proxy left until they
// connect again.
func (e *staleUDPEnder) SetFailures(failures []*reconciler.FrontendError) {
	e.failedUDP = e.failedUDP[:0]
	for _, f := range failures {
		if !f.Remove && f.Frontend.Proto == model.UDP {
			e.failedUDP = append(e.failedUDP, f.Frontend.String())
		}
	}
}

func (e *staleUDPEnder) ObserveSync(_ time.Duration, err error) {
	if err != nil || e.programmed == nil {
		return
	}
	e.once.Do(func() {
		start := time.Now()
		res := e.end(e.cgroup, datapath.UDPFrontends(e.programmed))
		e.observe(res.ConntrackDeleted, string(res.Sockets.Method), res.Sockets.Destroyed, res.Sockets.Failed)
		args := []any{"udp_frontends", res.Frontends, "conntrack_deleted", res.ConntrackDeleted,
			"sockets_ended", res.Sockets.Destroyed, "sockets_failed", res.Sockets.Failed,
			"socket_method", res.Sockets.Method, "namespaces", res.Sockets.Namespaces,
			"took", time.Since(start).Round(time.Millisecond)}
		if len(e.failedUDP) > 0 {
			// Once only: a frontend that failed now never gets the pass.
			args = append(args, "udp_frontends_failed", len(e.failedUDP), "not_covered", e.failedUDP)
		}
		if res.ConntrackErr != nil {
			args = append(args, "conntrack_err", res.ConntrackErr)
		}
		if res.Sockets.Err != nil {
			args = append(args, "sockets_err", res.Sockets.Err)
		}
		msg := "ended the UDP flows another proxy (kube-proxy) had translated to Service frontends"
		if res.ConntrackErr != nil || res.Sockets.Err != nil || len(e.failedUDP) > 0 {
			e.log.Warn(msg+", not all: clients connected before Sluice may keep sending where it had", args...)
			return
		}
		e.log.Info(msg, args...)
	})
}
